#include "executor/job_launch.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include <fstream>
#include <sstream>

#include "io/checked_input.hpp"
#include "io/config_error.hpp"

namespace longseq {

namespace {

// Text that goes into the batch script or onto mpirun's command line: a control character (a
// newline above all) would end the line it is on and start a shell line of the input's choosing.
void script_text_check(const std::string& text, const std::string& source, const std::string& key, const std::string& what) {
  for (unsigned char c : text)
    if (c < 0x20 || c == 0x7f)
      throw ConfigError(source, key, fmt::format("{} holds a control character (byte 0x{:02x}); it would end a line of the job's script", what, c));
}

// Slurm reads #SBATCH lines itself, with no shell quoting: only words of these characters are
// passed to it, and nothing of the user's goes there otherwise.
bool slurm_word(const std::string& text, const std::string& extra_characters) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [&](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || extra_characters.find(c) != std::string::npos;
  });
}

}  // namespace

void launch_request_check(const LaunchRequest& request) {
  script_text_check(request.scenario_path, request.scenario_path, "", "the scenario's path");
  script_text_check(request.scenario_name, request.scenario_path, "name", "the scenario's name");
  script_text_check(request.plan_path, request.plan_path, "", "the plan file's path");
  script_text_check(request.output_directory, "--output", "", "the output directory");
  script_text_check(request.hostfile, "--hostfile", "", "the hostfile's path");
  script_text_check(request.longseq_binary, "longseq", "", "the path of the longseq binary");
  script_text_check(request.partition, "--partition", "", "the partition");
  script_text_check(request.time_limit, "--time", "", "the time limit");
  for (const std::string& word : request.mpirun_extra) script_text_check(word, "--mpirun-arg", "", "an mpirun argument");
  // Slurm's own formats (sbatch(1)): [days-]hours:minutes:seconds and its shorter forms; partition
  // names, a comma-separated list of them.
  if (!slurm_word(request.time_limit, ":-"))
    throw ConfigError("--time", "", fmt::format("'{}' is not a Slurm time limit (digits, ':' and '-', e.g. 01:30:00 or 1-00:00:00)", request.time_limit));
  if (!request.partition.empty() && !slurm_word(request.partition, "_-.,"))
    throw ConfigError("--partition", "", fmt::format("'{}' is not a Slurm partition name (letters, digits, '_', '-', '.', ',')", request.partition));
}

JobLayout job_layout(const LaunchRequest& request) {
  launch_request_check(request);
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
    const std::string where = fmt::format("{}:{}", path, line_number);
    // A host name or address (RFC 1123 names, IPv4, IPv6 in brackets or not): anything else is not
    // a hostfile (a binary file, a script given by mistake).
    if (host.size() > 253 || !std::all_of(host.begin(), host.end(), [](char c) {
          return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_' || c == ':' || c == '[' || c == ']';
        }))
      throw ConfigError(where, "", "the line does not start with a host name (an Open MPI hostfile has 'HOST slots=N' lines)");
    int64_t host_slots = 1;
    while (words >> word) {
      if (word.rfind("slots=", 0) == 0) {
        // Up to 2^20 slots per host, as for --ranks.
        const std::optional<int64_t> count = integer_parse(word.substr(6), 1, 1 << 20);
        if (!count) throw ConfigError(where, "", fmt::format("'{}' is not a positive slot count", word));
        host_slots = *count;
      } else if (word.rfind("max_slots=", 0) != 0 && word.rfind("max-slots=", 0) != 0 && word.rfind("count=", 0) != 0) {
        throw ConfigError(where, "", fmt::format("'{}' is not a hostfile setting (slots=N, max_slots=N)", word.substr(0, 40)));
      }
    }
    slots += host_slots;
  }
  if (slots == 0) throw ConfigError(path, "", "the hostfile lists no hosts");
  return slots;
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
  // The output directory is launch's own (checked, and listed in its manifest): a rerun's job replaces its run.json.
  arguments.insert(arguments.end(), {"--json-out", request.output_directory + "/run.json", "--overwrite"});
  return arguments;
}

std::string mpirun_command(const LaunchRequest& request, const JobLayout& layout) {
  std::string command;
  for (const auto& argument : mpirun_arguments(request, layout)) command.append(command.empty() ? "" : " ").append(shell_quote(argument));
  return command;
}

std::string slurm_job_name(const std::string& name) {
  std::string job_name = "longseq-";
  for (char c : name) job_name.push_back(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ? c : '_');
  return job_name;
}

std::string sbatch_script(const LaunchRequest& request, const JobLayout& layout) {
  launch_request_check(request);  // no line of the script is made of unchecked text
  // sbatch reads --output's value from its #SBATCH line without a shell, and expands '%' patterns in it.
  if (request.output_directory.find_first_of(" \t'\"\\%#") != std::string::npos)
    throw ConfigError("--output", "", fmt::format("{}: a Slurm job's log goes to #SBATCH --output, which cannot carry blanks, quotes, "
                                                  "backslashes, '%' or '#'; choose a directory without them", request.output_directory));
  std::string script = "#!/bin/bash\n";
  script += fmt::format("# Written by longseq launch for {}: {} rank(s) (Ulysses sp={}, data parallel dp={}) on {} node(s) of {}.\n",
                        shell_quote(request.plan_path.empty() ? request.scenario_path : request.plan_path), layout.ranks, layout.sp,
                        layout.dp, layout.nodes, layout.ranks_per_node);
  if (layout.sp_spans_nodes) script += "# The Ulysses groups span nodes: their all-to-alls cross the inter-node network.\n";
  script += fmt::format("#SBATCH --job-name={}\n", slurm_job_name(request.scenario_name));
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
