#include "executor/job_launch.hpp"

#include <fmt/format.h>

#include <fstream>
#include <sstream>

#include "models/checked_input.hpp"
#include "models/config_error.hpp"

namespace longseq {

JobLayout job_layout(const LaunchRequest& request) {
  JobLayout layout;
  if (request.ranks < 1) throw ConfigError("--ranks", "", "must be at least 1");
  if (request.ranks_per_node < 1) throw ConfigError("--ranks-per-node", "", "must be at least 1");
  layout.ranks = request.ranks;
  layout.ranks_per_node = std::min(request.ranks_per_node, request.ranks);
  layout.nodes = (request.ranks + layout.ranks_per_node - 1) / layout.ranks_per_node;
  if (request.ranks % layout.ranks_per_node != 0)
    throw ConfigError("--ranks", "", fmt::format("{} ranks do not fill nodes of {} evenly (ranks must be a multiple of --ranks-per-node)",
                                                 request.ranks, layout.ranks_per_node));
  layout.sp = request.sp > 0 ? request.sp : request.ranks;
  if (request.ranks % layout.sp != 0)
    throw ConfigError("--ranks", "", fmt::format("{} ranks do not split into Ulysses groups of sp={}", request.ranks, layout.sp));
  layout.dp = request.ranks / layout.sp;
  if (layout.sp <= layout.ranks_per_node) {
    if (layout.ranks_per_node % layout.sp != 0)
      throw ConfigError("--ranks-per-node", "", fmt::format("Ulysses groups of sp={} would straddle nodes of {} ranks (sp must divide the ranks per node, or be a multiple of it)",
                                                            layout.sp, layout.ranks_per_node));
  } else {
    if (layout.sp % layout.ranks_per_node != 0)
      throw ConfigError("--ranks-per-node", "", fmt::format("Ulysses groups of sp={} would cover part of a node of {} ranks (sp must divide the ranks per node, or be a multiple of it)",
                                                            layout.sp, layout.ranks_per_node));
    layout.sp_spans_nodes = true;
  }
  if (!request.hostfile.empty()) {
    const int64_t slots = hostfile_slots(request.hostfile);
    if (slots < request.ranks)
      throw ConfigError(request.hostfile, "slots", fmt::format("{} slot(s) for {} ranks: more ranks than the hostfile's GPUs", slots, request.ranks));
  }
  return layout;
}

int64_t hostfile_slots(const std::string& path) {
  std::ifstream file(path);
  if (!file) throw ConfigError(path, "", "cannot open the hostfile");
  int64_t slots = 0, line_number = 0;
  std::string line;
  while (std::getline(file, line)) {
    ++line_number;
    line = line.substr(0, line.find('#'));
    std::istringstream words(line);
    std::string host, word;
    if (!(words >> host)) continue;
    int64_t host_slots = 1;
    while (words >> word) {
      if (word.rfind("slots=", 0) == 0) {
        // Up to 2^20 slots per host, as for --ranks.
        const std::optional<int64_t> count = integer_parse(word.substr(6), 1, 1 << 20);
        if (!count) throw ConfigError(fmt::format("{}:{}", path, line_number), "", fmt::format("'{}' is not a positive slot count", word));
        host_slots = *count;
      }
    }
    slots += host_slots;
  }
  if (slots == 0) throw ConfigError(path, "", "the hostfile lists no hosts");
  return slots;
}

std::string shell_quote(const std::string& word) {
  if (!word.empty() && word.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=:,+%@") == std::string::npos)
    return word;
  std::string quoted = "'";
  for (char c : word) {
    if (c == '\'')
      quoted.append("'\\''");  // close the quote, an escaped quote, reopen
    else
      quoted.push_back(c);
  }
  quoted.push_back('\'');
  return quoted;
}

std::vector<std::string> mpirun_arguments(const LaunchRequest& request, const JobLayout& layout) {
  std::vector<std::string> arguments = {"mpirun", "-np", std::to_string(layout.ranks), "--map-by",
                                        fmt::format("ppr:{}:node", layout.ranks_per_node)};
  if (!request.hostfile.empty()) arguments.insert(arguments.end(), {"--hostfile", request.hostfile});
  arguments.insert(arguments.end(), request.mpirun_extra.begin(), request.mpirun_extra.end());
  if (!request.plan_path.empty()) {
    // The plan file says everything: sp, device, length, budget.
    arguments.insert(arguments.end(), {request.longseq_binary, "run", "--plan", request.plan_path});
  } else {
    arguments.insert(arguments.end(), {request.longseq_binary, "run", request.scenario_path});
    if (request.sp > 0) arguments.insert(arguments.end(), {"--sp", std::to_string(request.sp)});  // otherwise the run's own choice
    if (request.device != "cpu") arguments.insert(arguments.end(), {"--device", request.device});
  }
  // Rank 0 writes the result whole (a temporary file renamed into place), so an interrupted job
  // leaves no run.json rather than an empty or truncated one (as a shell redirect would).
  arguments.insert(arguments.end(), {"--json-out", request.output_directory + "/run.json"});
  return arguments;
}

std::string mpirun_command(const LaunchRequest& request, const JobLayout& layout) {
  std::string command;
  for (const auto& argument : mpirun_arguments(request, layout)) command.append(command.empty() ? "" : " ").append(shell_quote(argument));
  return command;
}

std::string sbatch_script(const LaunchRequest& request, const JobLayout& layout) {
  std::string script = "#!/bin/bash\n";
  script += fmt::format("# Written by longseq launch for {}: {} rank(s) (Ulysses sp={}, data parallel dp={}) on {} node(s) of {}.\n",
                        request.scenario_path, layout.ranks, layout.sp, layout.dp, layout.nodes, layout.ranks_per_node);
  if (layout.sp_spans_nodes) script += "# The Ulysses groups span nodes: their all-to-alls cross the inter-node network.\n";
  script += fmt::format("#SBATCH --job-name=longseq-{}\n", request.scenario_name);
  script += fmt::format("#SBATCH --nodes={}\n", layout.nodes);
  script += fmt::format("#SBATCH --ntasks-per-node={}\n", layout.ranks_per_node);
  // One core per rank on the CPU; on GPUs also one GPU per rank (the run picks it by node-local rank,
  // so Slurm must not hide the node's other GPUs from it: --gpus-per-node, not --gpus-per-task).
  script += "#SBATCH --cpus-per-task=1\n";
  if (request.device == "cuda") script += fmt::format("#SBATCH --gpus-per-node={}\n", layout.ranks_per_node);
  script += fmt::format("#SBATCH --time={}\n", request.time_limit);
  script += fmt::format("#SBATCH --output={}/slurm-%j.out\n", request.output_directory);
  if (!request.partition.empty()) script += fmt::format("#SBATCH --partition={}\n", request.partition);
  script += "set -euo pipefail\n";
  script += "export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}\n";
  // Inside the allocation Open MPI takes the nodes from Slurm: no hostfile.
  LaunchRequest inside = request;
  inside.hostfile.clear();
  script += mpirun_command(inside, layout) + "\n";
  return script;
}

}  // namespace longseq
