// process.hpp: running another program (gnuplot, mpirun, sbatch) without a shell. (Outputs are
// written by the rules of io/output_files.hpp.)
//
// Why: text from the user (a directory name, a scenario's title) used to reach /bin/sh through
// system(), so `longseq report 'x$(touch y)'` ran `touch`. Here a program gets an argument vector
// (execvp: no word splitting, no substitution).
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

// This machine's memory that a new allocation can use without swapping: MemAvailable from
// /proc/meminfo (Linux), else the physical memory (sysconf). Bytes.
double machine_memory_available_bytes();

// This machine's physical memory: MemTotal from /proc/meminfo, else sysconf. Bytes.
double machine_memory_total_bytes();

// This process's resident memory now (VmRSS) and its high-water mark (VmHWM), from
// /proc/self/status; 0 where the system does not say (not Linux). Bytes.
double process_resident_bytes();
double process_high_water_bytes();

}  // namespace longseq
