#include "io/process.hpp"

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <fmt/format.h>
#include <fstream>
#include <sstream>
#include <string>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "io/config_error.hpp"

namespace longseq {

namespace {


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

namespace {

double meminfo_bytes(const std::string& wanted_key) {
  std::ifstream meminfo("/proc/meminfo");
  std::string key, unit;
  double kib = 0;
  while (meminfo >> key >> kib >> unit)
    if (key == wanted_key) return kib * 1024.0;
  return static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
}

}  // namespace

double machine_memory_available_bytes() { return meminfo_bytes("MemAvailable:"); }

double machine_memory_total_bytes() { return meminfo_bytes("MemTotal:"); }

namespace {

double status_bytes(const std::string& wanted_key) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(wanted_key, 0) != 0) continue;
    std::istringstream fields(line.substr(wanted_key.size()));
    double kib = 0;
    fields >> kib;
    return kib * 1024.0;
  }
  return 0;
}

}  // namespace

double process_resident_bytes() { return status_bytes("VmRSS:"); }

double process_high_water_bytes() { return status_bytes("VmHWM:"); }

}  // namespace longseq
