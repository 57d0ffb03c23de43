#include "io/output_files.hpp"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>

#include "io/config_error.hpp"

namespace longseq {

namespace fs = std::filesystem;

namespace {

bool same_file(const struct stat& a, const struct stat& b) { return a.st_dev == b.st_dev && a.st_ino == b.st_ino; }

// Writes all of `content` to `fd`, through short writes and interrupted calls; errno on failure.
bool write_all(int fd, const std::string& content) {
  size_t written = 0;
  while (written < content.size()) {
    const ssize_t count = write(fd, content.data() + written, content.size() - written);
    if (count < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    written += static_cast<size_t>(count);
  }
  return true;
}

// A temporary beside `target`, created exclusively (O_EXCL by mkstemp): hidden, named after the
// target, never an existing file or link. Returns its descriptor and fills `temporary_path`.
int temporary_beside(const fs::path& target, std::string& temporary_path) {
  const fs::path directory = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::string name = ".";
  name.append(target.filename().string()).append(".longseq-XXXXXX");
  temporary_path = (directory / name).string();
  return mkstemp(temporary_path.data());
}

// The permissions a new file gets from open(2) with 0666: the process's umask applied.
mode_t new_file_mode() {
  const mode_t mask = umask(0);
  umask(mask);
  return 0666 & ~mask;
}

// Writes `content` into a new temporary beside `target` with `mode`; returns its path. Throws
// ConfigError (naming `source`) and leaves no temporary when it cannot.
std::string temporary_write(const fs::path& target, const std::string& content, mode_t mode, const std::string& source) {
  std::string temporary;
  const int fd = temporary_beside(target, temporary);
  if (fd < 0) throw ConfigError(source, "", fmt::format("cannot create a file beside {}: {}", target.string(), std::strerror(errno)));
  const bool written = write_all(fd, content) && fchmod(fd, mode) == 0;
  const int saved_errno = errno;
  if (close(fd) != 0 || !written) {
    unlink(temporary.c_str());
    throw ConfigError(source, "", fmt::format("cannot write {}: {}", target.string(), std::strerror(written ? errno : saved_errno)));
  }
  return temporary;
}

std::string flag_source(const std::string& flag, const std::string& path) { return flag.empty() ? path : flag; }

}  // namespace

// ---- Single files ----

OutputFileTarget output_file_check(const std::string& path, const std::string& flag, bool overwrite, const std::vector<std::string>& inputs) {
  OutputFileTarget target;
  target.path = path;
  target.flag = flag;
  target.overwrite = overwrite;
  const std::string source = flag_source(flag, path);
  if (path.empty()) throw ConfigError(source, "", "is empty text; give a file path");
  struct stat status = {};
  if (stat(path.c_str(), &status) != 0) {
    if (errno != ENOENT) throw ConfigError(source, "", fmt::format("cannot write {}: {}", path, std::strerror(errno)));
    struct stat link_status = {};
    if (lstat(path.c_str(), &link_status) == 0)
      throw ConfigError(source, "", fmt::format("{} is a symbolic link to a missing file; longseq does not write through it", path));
    const fs::path parent = fs::path(path).has_parent_path() ? fs::path(path).parent_path() : fs::path(".");
    struct stat parent_status = {};
    if (stat(parent.c_str(), &parent_status) != 0 || !S_ISDIR(parent_status.st_mode))
      throw ConfigError(source, "", fmt::format("directory {} does not exist", parent.string()));
    // Tried now, as the write will do it: a temporary beside it, made and removed (a read-only or
    // special file system is refused before the work, not after it).
    std::string probe;
    const int fd = temporary_beside(fs::path(path), probe);
    if (fd < 0) throw ConfigError(source, "", fmt::format("cannot write {}: {}", path, std::strerror(errno)));
    close(fd);
    unlink(probe.c_str());
    target.kind = OutputFileKind::output_file_new;
    target.write_path = path;
    return target;
  }
  // This process's stdout or stderr under another name (/dev/stdout, /proc/self/fd/1, a link to
  // the terminal): written to the stream itself, as the user meant.
  for (int fd : {STDOUT_FILENO, STDERR_FILENO}) {
    struct stat stream = {};
    if (fstat(fd, &stream) == 0 && same_file(stream, status)) {
      target.kind = OutputFileKind::output_file_standard_stream;
      target.stream_fd = fd;
      return target;
    }
  }
  if (S_ISDIR(status.st_mode)) throw ConfigError(source, "", fmt::format("{} is a directory, not a file", path));
  if (S_ISCHR(status.st_mode) || S_ISFIFO(status.st_mode)) {
    target.kind = OutputFileKind::output_file_device;
    target.write_path = path;
    return target;
  }
  if (!S_ISREG(status.st_mode))
    throw ConfigError(source, "", fmt::format("{} is a {}; longseq writes regular files, character devices and FIFOs", path,
                                              S_ISBLK(status.st_mode) ? "block device" : S_ISSOCK(status.st_mode) ? "socket" : "special file"));
  for (const std::string& input : inputs) {
    struct stat input_status = {};
    if (!input.empty() && stat(input.c_str(), &input_status) == 0 && same_file(input_status, status))
      throw ConfigError(source, "", fmt::format("{} is {}, which this command reads; longseq never writes over its input", path, input));
  }
  if (!overwrite)
    throw ConfigError(source, "", fmt::format("{} exists; give --overwrite to replace it (nothing was written)", path));
  target.kind = OutputFileKind::output_file_replace;
  std::error_code error;
  target.write_path = fs::canonical(path, error);  // a link stays a link; its target is replaced
  if (error) throw ConfigError(source, "", fmt::format("cannot resolve {}: {}", path, error.message()));
  return target;
}

void output_file_write(const OutputFileTarget& target, const std::string& content) {
  const std::string source = flag_source(target.flag, target.path);
  switch (target.kind) {
    case OutputFileKind::output_file_standard_stream:
      std::cout.flush();
      std::fflush(nullptr);
      if (!write_all(target.stream_fd, content)) throw ConfigError(source, "", fmt::format("cannot write {}: {}", target.path, std::strerror(errno)));
      return;
    case OutputFileKind::output_file_device: {
      // No O_CREAT, no O_TRUNC: the device or FIFO that was checked, never a new regular file.
      const int fd = open(target.write_path.c_str(), O_WRONLY | O_NOCTTY | O_CLOEXEC);
      if (fd < 0) throw ConfigError(source, "", fmt::format("cannot open {}: {}", target.path, std::strerror(errno)));
      const bool written = write_all(fd, content);
      const int saved_errno = errno;
      close(fd);
      if (!written) throw ConfigError(source, "", fmt::format("cannot write {}: {}", target.path, std::strerror(saved_errno)));
      return;
    }
    case OutputFileKind::output_file_new: {
      const std::string temporary = temporary_write(target.write_path, content, new_file_mode(), source);
      // link(2) never replaces: a file that appeared at the path while longseq worked is kept.
      if (link(temporary.c_str(), target.write_path.c_str()) == 0) {
        unlink(temporary.c_str());
        return;
      }
      const int link_errno = errno;
      if (link_errno == EEXIST && !target.overwrite) {
        unlink(temporary.c_str());
        throw ConfigError(source, "", fmt::format("{} appeared while longseq worked; it was kept and nothing was written "
                                                  "(give --overwrite to replace it)", target.path));
      }
      if (link_errno != EEXIST && link_errno != EPERM && link_errno != EOPNOTSUPP) {
        unlink(temporary.c_str());
        throw ConfigError(source, "", fmt::format("cannot write {}: {}", target.path, std::strerror(link_errno)));
      }
      // A file system without hard links (or --overwrite): the temporary is moved into place.
      if (rename(temporary.c_str(), target.write_path.c_str()) != 0) {
        const int saved_errno = errno;
        unlink(temporary.c_str());
        throw ConfigError(source, "", fmt::format("cannot write {}: {}", target.path, std::strerror(saved_errno)));
      }
      return;
    }
    case OutputFileKind::output_file_replace: {
      struct stat existing = {};
      const mode_t mode = stat(target.write_path.c_str(), &existing) == 0 ? (existing.st_mode & 07777) : new_file_mode();
      const std::string temporary = temporary_write(target.write_path, content, mode, source);
      if (rename(temporary.c_str(), target.write_path.c_str()) != 0) {
        const int saved_errno = errno;
        unlink(temporary.c_str());
        throw ConfigError(source, "", fmt::format("cannot write {}: {}", target.path, std::strerror(saved_errno)));
      }
      return;
    }
  }
}

void standard_output_write(const std::string& content) {
  std::cout << content;
  std::cout.flush();
  if (!std::cout || std::fflush(stdout) != 0 || std::ferror(stdout))
    throw ConfigError("standard output", "", fmt::format("cannot write: {}", std::strerror(errno)));
}

void file_write_text(const std::string& path, const std::string& content) {
  struct stat existing = {};
  const mode_t mode = stat(path.c_str(), &existing) == 0 && S_ISREG(existing.st_mode) ? (existing.st_mode & 07777) : new_file_mode();
  const std::string temporary = temporary_write(path, content, mode, path);
  if (rename(temporary.c_str(), path.c_str()) != 0) {
    const int saved_errno = errno;
    unlink(temporary.c_str());
    throw ConfigError(path, "", fmt::format("cannot write file: {}", std::strerror(saved_errno)));
  }
}

// ---- Directories ----

namespace {

std::set<std::string> manifest_read(const fs::path& directory) {
  std::set<std::string> names;
  std::ifstream file(directory / kOutputManifestName);
  std::string line;
  while (std::getline(file, line))
    if (!line.empty() && line.front() != '#') names.insert(line);
  return names;
}

// A name is longseq's when it matches one of `patterns` ("slurm-*" matches a prefix).
bool name_matches(const std::string& name, const std::vector<std::string>& patterns) {
  return std::any_of(patterns.begin(), patterns.end(), [&](const std::string& pattern) {
    return pattern.ends_with('*') ? name.starts_with(pattern.substr(0, pattern.size() - 1)) : name == pattern;
  });
}

bool name_listed(const std::string& name, const std::set<std::string>& manifest) {
  return std::any_of(manifest.begin(), manifest.end(), [&](const std::string& entry) {
    return entry.ends_with('*') ? name.starts_with(entry.substr(0, entry.size() - 1)) : name == entry;
  });
}

}  // namespace

fs::path output_directory_resolve(const std::string& path) {
  std::error_code error;
  fs::path resolved = fs::weakly_canonical(fs::absolute(path), error);
  if (error) resolved = fs::absolute(path).lexically_normal();
  // A trailing separator leaves an empty file name: the directory itself.
  if (!resolved.has_filename() && resolved.has_parent_path() && resolved != resolved.root_path()) resolved = resolved.parent_path();
  return resolved;
}

void output_directory_check(const std::string& path, bool overwrite, const std::string& flag, const std::vector<std::string>& own_names) {
  if (path.empty()) throw ConfigError(flag, "", "the output directory is empty text");
  const fs::path directory = output_directory_resolve(path);
  const std::string shown = directory.string() == fs::absolute(path).string() ? path : fmt::format("{} (that is, {})", path, directory.string());
  std::error_code error;
  const fs::file_status status = fs::status(directory, error);
  // A link whose target is missing: creating the directory through it would fail as "File exists".
  if (!fs::exists(status) && fs::is_symlink(fs::symlink_status(directory, error)))
    throw ConfigError(flag, "", fmt::format("{} is a symbolic link to {}, which does not exist: create that directory or give another "
                                            "path (nothing was written)", shown, fs::read_symlink(directory, error).string()));
  if (!fs::exists(status)) return;
  if (!fs::is_directory(status)) throw ConfigError(flag, "", fmt::format("{} is a file, not a directory (nothing was written)", shown));
  if (overwrite) return;
  // A directory holding only names longseq's manifest lists is an earlier result: a rerun replaces
  // it. Anything else there is someone's, and needs --overwrite (and is then kept).
  const std::set<std::string> manifest = manifest_read(directory);
  for (const auto& entry : fs::directory_iterator(directory, error)) {
    const std::string name = entry.path().filename().string();
    if (name == kOutputManifestName) continue;
    if (name_matches(name, own_names) && name_listed(name, manifest)) continue;
    throw ConfigError(flag, "", fmt::format("{} holds {} that longseq did not write ({}); give --overwrite to replace longseq's files "
                                            "in it (nothing else there is touched)", shown,
                                            name_matches(name, own_names) ? "a file named like longseq's" : "files", name));
  }
  if (error) throw ConfigError(flag, "", fmt::format("cannot list {}: {}", shown, error.message()));
}

void output_names_check(const std::string& directory_path, const std::vector<std::string>& names, bool overwrite, const std::string& flag) {
  if (overwrite) return;
  const fs::path directory = output_directory_resolve(directory_path);
  const std::set<std::string> manifest = manifest_read(directory);
  for (const std::string& name : names) {
    std::error_code error;
    if (fs::exists(fs::symlink_status(directory / name, error)) && !name_listed(name, manifest))
      throw ConfigError(flag, "", fmt::format("{} holds {}, which longseq did not write; give --overwrite to replace it (nothing was written)",
                                              directory_path, name));
  }
}

void output_directory_record(const fs::path& directory, const std::vector<std::string>& names) {
  std::set<std::string> manifest = manifest_read(directory);
  const size_t before = manifest.size();
  manifest.insert(names.begin(), names.end());
  if (manifest.size() == before && fs::exists(directory / kOutputManifestName)) return;
  std::string text = "# Written by longseq: the files it wrote in this directory. It replaces these on a rerun and nothing else\n"
                     "# without --overwrite.\n";
  for (const std::string& name : manifest) text += name + "\n";
  file_write_text((directory / kOutputManifestName).string(), text);
}

fs::path staging_directory_create(const fs::path& target) {
  const fs::path base = output_directory_resolve(target.string());
  std::error_code error;
  fs::create_directories(base.parent_path(), error);
  if (error) throw ConfigError(target.string(), "", fmt::format("cannot create the directory it goes in: {}", error.message()));
  std::string pattern = base.string() + ".partial-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr)
    throw ConfigError(target.string(), "", fmt::format("cannot create a staging directory beside it: {}", std::strerror(errno)));
  return pattern;
}

void staging_directory_commit(const fs::path& staging, const fs::path& target_path) {
  const fs::path target = output_directory_resolve(target_path.string());
  std::error_code error;
  fs::create_directories(target, error);
  if (error) throw ConfigError(target.string(), "", fmt::format("cannot create the directory: {}", error.message()));
  std::vector<fs::path> staged;  // listed first: the directory is not changed while it is read
  for (const auto& entry : fs::directory_iterator(staging, error)) staged.push_back(entry.path());
  if (error) throw ConfigError(staging.string(), "", fmt::format("cannot list the staged files: {}", error.message()));
  std::vector<std::string> names;
  for (const fs::path& file : staged) names.push_back(file.filename().string());
  // Listed before they move: a file of longseq's there is always in the manifest.
  output_directory_record(target, names);
  for (const fs::path& file : staged) {
    const fs::path destination = target / file.filename();
    // rename(2) replaces a file of the same name atomically; it refuses to replace a directory
    // with a file, so a user's directory of that name is never replaced.
    fs::rename(file, destination, error);
    if (error) throw ConfigError(destination.string(), "", fmt::format("cannot move the new file into place: {}", error.message()));
  }
  fs::remove(staging, error);  // empty now; remove() never deletes a non-empty directory
}

void staging_directory_discard(const fs::path& staging) noexcept {
  std::error_code error;
  fs::remove_all(staging, error);
}

}  // namespace longseq
