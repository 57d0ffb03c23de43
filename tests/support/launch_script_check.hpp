// launch_script_check.hpp: what every mpirun command line and Slurm batch script longseq writes
// must be, whatever the request held: each shell line reads back (tests/support/shell_words.hpp)
// as exactly the argument vector longseq meant, the script has no line but its own fixed ones and
// that command, and every #SBATCH value is one word Slurm reads as written. Used by the launch
// tests and the fuzz harness (tests/fuzz/fuzz_launch_script.cpp).
#pragma once

#include <string>
#include <vector>

#include "executor/job_launch.hpp"
#include "tests/support/shell_words.hpp"

namespace longseq::test {

// Empty when the command line and the script are as they must be; else what is wrong.
inline std::string launch_script_problem(const LaunchRequest& request, const JobLayout& layout) {
  std::string problem;
  const std::vector<std::string> arguments = mpirun_arguments(request, layout);
  const auto words = shell_words(mpirun_command(request, layout), &problem);
  if (!words) return "mpirun command: " + problem;
  if (*words != arguments) return "mpirun command: a shell reads other words than the arguments";
  LaunchRequest inside = request;  // the batch script runs without the hostfile
  inside.hostfile.clear();
  const std::vector<std::string> inside_arguments = mpirun_arguments(inside, layout);
  const std::vector<std::string> lines = text_lines(sbatch_script(request, layout));
  if (lines.empty() || lines.front() != "#!/bin/bash") return "script: no #!/bin/bash first line";
  std::vector<std::string> commands;
  for (size_t i = 1; i < lines.size(); ++i) {
    const std::string& line = lines[i];
    if (line.rfind("#SBATCH ", 0) == 0) {
      const std::string option = line.substr(8);
      if (option.rfind("--", 0) != 0 || option.find('=') == std::string::npos) return "script: a malformed #SBATCH line: " + line;
      for (char c : option)
        if (c == ' ' || c == '\t' || c == '\'' || c == '"' || c == '\\' || c == '#' || static_cast<unsigned char>(c) < 0x20)
          return "script: an #SBATCH value Slurm would not read as one word: " + line;
    } else if (line.empty() || line.front() != '#') {
      commands.push_back(line);
    }
  }
  if (commands.size() != 3 || commands[0] != "set -euo pipefail" || commands[1] != "export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}")
    return "script: shell lines other than its own three";
  const auto script_words = shell_words(commands[2], &problem);
  if (!script_words) return "script's mpirun line: " + problem;
  if (*script_words != inside_arguments) return "script's mpirun line: a shell reads other words than the arguments";
  return "";
}

}  // namespace longseq::test
