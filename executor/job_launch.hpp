// job_launch.hpp: a run scenario as a job on a cluster. From the rank count, the ranks per node
// and the plan's Ulysses degree it lays the job out (nodes, sequence groups, data parallelism),
// refuses layouts that cannot work before anything is submitted, and writes the mpirun command
// line and the Slurm batch script that `longseq launch` runs or submits.
//
// Ranks are placed node by node (Open MPI --map-by ppr:R:node) and Ulysses groups are runs of sp
// consecutive ranks (cli/run_command.cpp), so a group stays inside a node when sp divides the
// ranks per node, and spans whole nodes when the ranks per node divide sp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/text_escape.hpp"  // shell_quote

namespace longseq {

struct LaunchRequest {
  std::string scenario_path;     // as given; the job runs `longseq run` on it
  std::string plan_path;         // instead of a scenario: the job runs `longseq run --plan` on this plan file
  std::string scenario_name;     // the job's name
  int64_t ranks = 1;             // world size
  int64_t ranks_per_node = 1;    // one rank per GPU (or CPU slot) of a node
  int64_t sp = 0;                // the plan's Ulysses degree (0: the run decides: every rank, or --auto's pick)
  std::string hostfile;          // mpirun across machines (empty: this machine, or Slurm's allocation)
  std::string output_directory;  // run.json (and for Slurm the batch script and its log) go here
  std::string longseq_binary;    // the longseq executable every rank runs
  std::string time_limit = "00:30:00";
  std::string partition;                  // Slurm partition (empty: the cluster's default)
  std::vector<std::string> mpirun_extra;  // passed to mpirun as given, e.g. --allow-run-as-root
  std::string device = "cpu";             // "cuda": every rank runs `longseq run --device cuda` on its own GPU
};

struct JobLayout {
  int64_t ranks = 1, nodes = 1, ranks_per_node = 1, sp = 1, dp = 1;
  bool sp_spans_nodes = false;  // Ulysses all-to-alls cross the inter-node network
};

// Refuses text that cannot go into a job's script or command line as one safe line: a control
// character anywhere (a newline would start a shell line of its own), a --time or --partition
// outside Slurm's formats. job_layout and sbatch_script call it; throws ConfigError naming the
// flag or the file's key.
void launch_request_check(const LaunchRequest& request);

// Throws ConfigError naming the flag (or hostfile) and the reason for a layout that cannot run.
JobLayout job_layout(const LaunchRequest& request);

// Slots in an Open MPI hostfile ("host slots=N" per line, '#' comments; a host without slots= is
// one slot). Throws ConfigError for a missing file or a malformed line.
int64_t hostfile_slots(const std::string& path);

// The command every launch runs (locally, or inside the batch script), rank 0 writing its result
// to output_directory/run.json: as an argument vector (what `longseq launch` executes, no shell),
// and as one shell-quoted line (what it prints and what the batch script runs).
std::vector<std::string> mpirun_arguments(const LaunchRequest& request, const JobLayout& layout);
std::string mpirun_command(const LaunchRequest& request, const JobLayout& layout);
std::string sbatch_script(const LaunchRequest& request, const JobLayout& layout);

// The #SBATCH --job-name: "longseq-" and the name with anything but letters, digits, '-', '_'
// and '.' replaced by '_' (Slurm reads the line without a shell).
std::string slurm_job_name(const std::string& name);

}  // namespace longseq
