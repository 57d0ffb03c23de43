#include "models/process.hpp"

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "models/config_error.hpp"

namespace longseq {

namespace {

namespace fs = std::filesystem;

// The child being waited for, for the signal handler (one child at a time: longseq runs its
// helpers one after another).
volatile sig_atomic_t running_child_pid = 0;
volatile sig_atomic_t forwarded_signal = 0;

extern "C" void signal_forward(int signal_number) {
  forwarded_signal = signal_number;
  if (running_child_pid > 0) kill(static_cast<pid_t>(running_child_pid), signal_number);
}

}  // namespace

ProcessResult process_run(const std::vector<std::string>& argv, const ProcessOptions& options) {
  if (argv.empty()) return {127, 0};
  // Everything the child needs is prepared before fork: after it only async-signal-safe calls.
  std::vector<char*> arguments;
  for (const auto& argument : argv) arguments.push_back(const_cast<char*>(argument.c_str()));
  arguments.push_back(nullptr);
  int pipe_ends[2] = {-1, -1};
  if (options.captured_stdout && pipe(pipe_ends) != 0) return {127, 0};
  int output_fd = -1;
  if (!options.output_path.empty()) {
    output_fd = open(options.output_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (output_fd < 0) return {127, 0};
  }
  const pid_t parent = getpid();

  struct sigaction forward = {}, old_interrupt = {}, old_terminate = {};
  forward.sa_handler = signal_forward;
  sigemptyset(&forward.sa_mask);
  forwarded_signal = 0;
  sigaction(SIGINT, &forward, &old_interrupt);
  sigaction(SIGTERM, &forward, &old_terminate);

  const pid_t child = fork();
  if (child == 0) {
    // The child: default signal handling, die with the parent, then the program.
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(127);  // the parent died before prctl took effect
    if (!options.working_directory.empty() && chdir(options.working_directory.c_str()) != 0) _exit(127);
    if (output_fd >= 0) {
      dup2(output_fd, STDOUT_FILENO);
      dup2(output_fd, STDERR_FILENO);
    }
    if (pipe_ends[1] >= 0) {
      dup2(pipe_ends[1], STDOUT_FILENO);
      close(pipe_ends[0]);
      close(pipe_ends[1]);
    }
    execvp(arguments[0], arguments.data());
    _exit(127);
  }
  ProcessResult result;
  if (child < 0) {
    result.exit_code = 127;
  } else {
    running_child_pid = child;
    if (pipe_ends[1] >= 0) {
      close(pipe_ends[1]);
      pipe_ends[1] = -1;
      char buffer[4096];
      for (;;) {
        const ssize_t count = read(pipe_ends[0], buffer, sizeof buffer);
        if (count > 0) options.captured_stdout->append(buffer, static_cast<size_t>(count));
        else if (count == 0 || errno != EINTR) break;
      }
    }
    int status = 0;
    while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
    }
    running_child_pid = 0;
    result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 1;
  }
  result.forwarded_signal = forwarded_signal;
  sigaction(SIGINT, &old_interrupt, nullptr);
  sigaction(SIGTERM, &old_terminate, nullptr);
  for (int fd : pipe_ends)
    if (fd >= 0) close(fd);
  if (output_fd >= 0) close(output_fd);
  return result;
}

void output_directory_check(const std::string& path, bool overwrite, const std::string& flag, const std::vector<std::string>& own_names) {
  if (path.empty()) throw ConfigError(flag, "", "the output directory is empty text");
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  if (!fs::exists(status)) return;
  if (!fs::is_directory(status)) throw ConfigError(flag, "", fmt::format("{} is a file, not a directory (nothing was written)", path));
  if (overwrite) return;
  // A directory holding only longseq's own names is an earlier result of the same command: a rerun
  // replaces it. Anything else there is someone's, and needs --overwrite (and is then kept).
  auto own = [&](const std::string& name) {
    return std::any_of(own_names.begin(), own_names.end(), [&](const std::string& pattern) {
      return pattern.ends_with('*') ? name.starts_with(pattern.substr(0, pattern.size() - 1)) : name == pattern;
    });
  };
  for (const auto& entry : fs::directory_iterator(path, error))
    if (!own(entry.path().filename().string()))
      throw ConfigError(flag, "", fmt::format("{} holds files longseq did not write ({}); give --overwrite to replace longseq's files "
                                              "in it (nothing else there is touched)", path, entry.path().filename().string()));
  if (error) throw ConfigError(flag, "", fmt::format("cannot list {}: {}", path, error.message()));
}

fs::path staging_directory_create(const fs::path& target) {
  const fs::path absolute = fs::absolute(target).lexically_normal();
  const fs::path base = absolute.has_filename() ? absolute : absolute.parent_path();
  std::error_code error;
  fs::create_directories(base.parent_path(), error);
  if (error) throw ConfigError(target.string(), "", fmt::format("cannot create the directory it goes in: {}", error.message()));
  std::string pattern = base.string() + ".partial-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr)
    throw ConfigError(target.string(), "", fmt::format("cannot create a staging directory beside it: {}", std::strerror(errno)));
  return pattern;
}

void staging_directory_commit(const fs::path& staging, const fs::path& target) {
  std::error_code error;
  fs::create_directories(target, error);
  if (error) throw ConfigError(target.string(), "", fmt::format("cannot create the directory: {}", error.message()));
  std::vector<fs::path> staged;  // listed first: the directory is not changed while it is read
  for (const auto& entry : fs::directory_iterator(staging, error)) staged.push_back(entry.path());
  if (error) throw ConfigError(staging.string(), "", fmt::format("cannot list the staged files: {}", error.message()));
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
