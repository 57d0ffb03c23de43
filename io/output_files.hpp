// output_files.hpp: every file and directory longseq writes, by one rule: it never replaces what
// it did not write unless the user says --overwrite, and a reader never sees half a file.
//
// Single files (--emit-out, --plan-out, --json-out): checked before any work, so a refusal costs
// nothing. A new file or a replaced one is written to a temporary made exclusively beside it
// (mkstemp: never a user's FILE.partial, never through a symlink planted there) and moved into
// place whole; an existing regular file is replaced only with --overwrite (a symlink to one keeps
// the link and replaces its target); a character device or a FIFO is written directly (never
// replaced by a regular file), as is standard output under any of its names; a directory, a
// block device, a socket, a dangling link and an input the command reads are refused.
//
// Directories (sweep -o, report, launch --output): a manifest, .longseq-outputs, lists what
// longseq wrote there. A directory holding anything else needs --overwrite, and even then only
// longseq's own names are replaced; a file with one of longseq's names that the manifest does not
// list is a user's and is treated as such. Paths are resolved once (symlinks and "..", as the
// system will resolve them), so the directory checked is the directory written.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace longseq {

// ---- Single files ----

enum class OutputFileKind {
  output_file_new,              // nothing there yet: created (never replacing what appears meanwhile)
  output_file_replace,          // a regular file, --overwrite given: replaced whole
  output_file_device,           // a character device or FIFO: written directly
  output_file_standard_stream,  // this process's stdout or stderr under another name: written to it
};

struct OutputFileTarget {
  std::string path;  // as given, for messages
  std::string flag;  // the flag that named it, for messages ("--emit-out")
  bool overwrite = false;
  OutputFileKind kind = OutputFileKind::output_file_new;
  std::filesystem::path write_path;  // where the bytes go: a symlink's target, else the path
  int stream_fd = -1;                // for output_file_standard_stream
  bool streams_to_terminal_or_pipe() const {
    return kind == OutputFileKind::output_file_device || kind == OutputFileKind::output_file_standard_stream;
  }
};

// Decides where `path` (given by `flag`) is written, before any work. `inputs` are files the
// command reads: writing over one is refused even with --overwrite. Throws ConfigError naming the
// flag, the path and the reason.
OutputFileTarget output_file_check(const std::string& path, const std::string& flag, bool overwrite,
                                   const std::vector<std::string>& inputs = {});

// Writes `content` to a checked target (see the file comment). Throws ConfigError; a failed write
// leaves no temporary and nothing half-written at the target.
void output_file_write(const OutputFileTarget& target, const std::string& content);

// Writes `content` to standard output and reports a failed write (a full disk, a closed stream)
// as a ConfigError instead of exiting 0 with nothing written.
void standard_output_write(const std::string& content);

// ---- Directories ----

// The manifest's file name in every directory longseq writes.
inline constexpr const char* kOutputManifestName = ".longseq-outputs";

// The output directory as the system resolves it (absolute; symlinks of its existing part and
// "." / ".." resolved): the one the checks read and the writes use.
std::filesystem::path output_directory_resolve(const std::string& path);

// Checks the output directory `path` given by `flag` (e.g. "--out") before any work: refused
// when it is a file, or, without `overwrite`, when it holds an entry that is not one of
// `own_names` (what this command writes; "slurm-*" matches a prefix) listed in its manifest.
// With `overwrite` only longseq's names are ever replaced. Creates nothing. Throws ConfigError.
void output_directory_check(const std::string& path, bool overwrite, const std::string& flag,
                            const std::vector<std::string>& own_names);

// For a command that writes a few names into a directory of other files (report: report.md and
// figures beside the results it reads): refused, without `overwrite`, when one of `names` exists
// and the directory's manifest does not list it. Throws ConfigError.
void output_names_check(const std::string& directory, const std::vector<std::string>& names, bool overwrite,
                        const std::string& flag);

// Adds `names` to `directory`'s manifest (created when missing), written whole.
void output_directory_record(const std::filesystem::path& directory, const std::vector<std::string>& names);

// A new, empty directory beside `target` (target.partial-XXXXXX, made by mkdtemp, so it cannot
// be anything that existed before; target's parent is created when missing). Throws ConfigError
// when it cannot be made.
std::filesystem::path staging_directory_create(const std::filesystem::path& target);

// Moves every file of `staging` into `target` (created when missing), each by one rename over an
// entry of the same name, records them in target's manifest, then removes the emptied staging
// directory. Throws ConfigError.
void staging_directory_commit(const std::filesystem::path& staging, const std::filesystem::path& target);

// Removes a staging directory made by staging_directory_create (after a failure); never throws.
void staging_directory_discard(const std::filesystem::path& staging) noexcept;

// Writes a whole file that longseq owns (inside a staging directory or a checked output
// directory): to a temporary made exclusively beside it, renamed over `path` only when complete.
// Throws ConfigError when it cannot be written.
void file_write_text(const std::string& path, const std::string& content);

}  // namespace longseq
