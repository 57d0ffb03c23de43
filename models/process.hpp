// process.hpp: running another program (gnuplot, mpirun, sbatch) without a shell, and writing
// outputs into directories without ever deleting what longseq did not create.
//
// Why: text from the user (a directory name, a scenario's title) used to reach /bin/sh through
// system(), so `longseq report 'x$(touch y)'` ran `touch`; and output directories were replaced
// with remove_all, deleting whatever a user kept there. Here a program gets an argument vector
// (execvp: no word splitting, no substitution), and outputs are written whole into a fresh
// staging directory and renamed into place one file at a time, over longseq's own file names only.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace longseq {

struct ProcessOptions {
  std::string working_directory;          // empty: this process's
  std::string output_path;                // stdout and stderr go to this file; empty: inherited
  std::string* captured_stdout = nullptr;  // or: stdout is captured here (stderr inherited)
};

struct ProcessResult {
  int exit_code = 0;        // the program's exit status; 128+N when killed by signal N; 127 when it could not be started
  int forwarded_signal = 0;  // SIGINT or SIGTERM that longseq received and passed on while waiting (0: none)
};

// Runs argv[0] (looked up on PATH) with argv, waits for it and returns how it ended. While it
// runs, SIGINT and SIGTERM sent to longseq are forwarded to it, and it is sent SIGTERM if longseq
// itself dies (PR_SET_PDEATHSIG), so no job outlives the command that started it.
ProcessResult process_run(const std::vector<std::string>& argv, const ProcessOptions& options = {});

// Checks the output directory `path` given by `flag` (e.g. "--out") before any work: refused
// when it is a file, or when it holds an entry whose name is not one of `own_names` (what this
// command writes; "slurm-*" matches a prefix) unless `overwrite` — and even then only the names
// longseq writes are replaced, nothing else is touched. Creates nothing. Throws ConfigError.
void output_directory_check(const std::string& path, bool overwrite, const std::string& flag,
                            const std::vector<std::string>& own_names);

// A new, empty directory beside `target` (target.partial-XXXXXX, made by mkdtemp, so it cannot
// be anything that existed before; target's parent is created when missing). Throws ConfigError
// when it cannot be made.
std::filesystem::path staging_directory_create(const std::filesystem::path& target);

// Moves every file of `staging` into `target` (created when missing), each by one rename over an
// entry of the same name, then removes the emptied staging directory. Throws ConfigError.
void staging_directory_commit(const std::filesystem::path& staging, const std::filesystem::path& target);

// Removes a staging directory made by staging_directory_create (after a failure); never throws.
void staging_directory_discard(const std::filesystem::path& staging) noexcept;

}  // namespace longseq
