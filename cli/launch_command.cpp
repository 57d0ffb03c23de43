// launch_command.cpp: `longseq launch SCENARIO.yaml` runs a run scenario as a multi-rank job:
// mpirun on this machine, mpirun across the machines of a hostfile, or a Slurm batch job. The
// layout is checked before anything runs or is submitted; --dry-run prints what would happen.
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>

#include "cli/commands.hpp"
#include "executor/job_launch.hpp"
#include "io/config_error.hpp"
#include "models/model_loader.hpp"
#include "io/output_files.hpp"
#include "io/process.hpp"
#include "planner/plan_file.hpp"
#include "planner/scenario.hpp"

namespace longseq {

struct LaunchCommandArgs {
  std::string scenario;
  std::string plan_file;
  int64_t ranks = 0, ranks_per_node = 0, sp = 0;
  std::string hostfile, output, time_limit = "00:30:00", partition;
  std::vector<std::string> mpirun_extra;
  bool slurm = false, wait = false, dry_run = false, overwrite = false;
  std::string device = "cpu";
};

std::shared_ptr<LaunchCommandArgs> launch_command_register(CLI::App& app) {
  auto args = std::make_shared<LaunchCommandArgs>();
  CLI::App* command = app.add_subcommand("launch", "Run a run scenario as a multi-rank job: mpirun here, across a hostfile, or under Slurm");
  command->add_option("scenario", args->scenario, "a scenario file with a run: section (or --plan)");
  command->add_option("--plan", args->plan_file,
                      "instead of a scenario: a plan file from `longseq plan ... --plan-out FILE`; the job runs exactly that plan "
                      "on its rank count");
  command->add_option("--ranks", args->ranks, "world size (default: the scenario's cluster.gpus, else its plan.sp, else 1)")
      ->check(CLI::Range(1, 1 << 20));
  command->add_option("--ranks-per-node", args->ranks_per_node,
                      "ranks on each node, one per GPU (default: the scenario's cluster.gpus_per_node, else all on one node)")
      ->check(CLI::Range(1, 1 << 20));
  command->add_option("--sp", args->sp, "Ulysses degree (default: the scenario's plan.sp, else the run decides)")->check(CLI::Range(1, 1 << 20));
  command->add_option("--hostfile", args->hostfile, "an Open MPI hostfile: run across its machines");
  command->add_flag("--slurm", args->slurm, "write a Slurm batch script into the output directory and submit it with sbatch");
  command->add_flag("--wait", args->wait, "with --slurm: wait for the job to finish (sbatch --wait) and print its result");
  command->add_option("--time", args->time_limit, "Slurm time limit (default 00:30:00)");
  command->add_option("--partition", args->partition, "Slurm partition (default: the cluster's)");
  command->add_option("--output", args->output, "where run.json (and the batch script and Slurm log) go (default: launch-<scenario name>)");
  command->add_option("--mpirun-arg", args->mpirun_extra, "an extra mpirun argument, e.g. --mpirun-arg=--allow-run-as-root (repeatable)")
      ->allow_extra_args(false);
  command->add_option("--device", args->device, "cpu (default) or cuda: one GPU per rank (longseq run --device cuda)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  command->add_flag("--dry-run", args->dry_run, "print the layout and what would run or be submitted; write nothing");
  command->add_flag("--overwrite", args->overwrite,
                    "use an --output directory that holds other files, replacing only longseq's (run.json, job.sbatch); one "
                    "holding only an earlier launch's files is reused without it");
  return args;
}

namespace {

// The names a launch's output directory holds: the job's result and batch script, Slurm's logs of
// the job, and what `longseq report` draws from the result.
std::vector<std::string> launch_output_names() { return {"run.json", "job.sbatch", "slurm-*", "report.md", "figures"}; }

// The path of the running longseq binary: every rank runs the same one.
std::string this_binary() {
  std::error_code error;
  const auto path = std::filesystem::read_symlink("/proc/self/exe", error);
  return error ? std::string("longseq") : path.string();
}

}  // namespace

int launch_command_run(const LaunchCommandArgs& args) {
  if (args.scenario.empty() == args.plan_file.empty())
    throw ConfigError(args.plan_file.empty() ? "scenario" : "--plan", "", "give a run scenario or --plan FILE (one of them)");
  if (args.wait && !args.slurm) throw ConfigError("--wait", "", "needs --slurm");
  if (args.slurm && !args.hostfile.empty()) throw ConfigError("--hostfile", "", "not with --slurm: Slurm's allocation decides the machines");

  LaunchRequest request;
  std::string job_name;
  if (!args.plan_file.empty()) {
    // The plan decides ranks, sp and device; flags that would contradict it are refused.
    const PlanFile plan = plan_file_read(args.plan_file);
    if (args.ranks > 0 && args.ranks != plan.ranks)
      throw ConfigError("--ranks", "", fmt::format("the plan {} is for {} rank(s)", args.plan_file, plan.ranks));
    if (args.sp > 0 && args.sp != plan.plan.sp) throw ConfigError("--sp", "", fmt::format("the plan {} has sp={}", args.plan_file, plan.plan.sp));
    if (args.device != "cpu" && args.device != plan.device)
      throw ConfigError("--device", "", fmt::format("the plan {} is for device {}", args.plan_file, plan.device));
    job_name = "plan-" + std::filesystem::path(args.plan_file).stem().string();
    request.plan_path = std::filesystem::absolute(args.plan_file).string();
    request.scenario_name = job_name;
    request.ranks = plan.ranks;
    request.ranks_per_node = args.ranks_per_node > 0 ? args.ranks_per_node : plan.ranks;
    request.sp = plan.plan.sp;
    request.device = plan.device;
  } else {
    const Scenario scenario = scenario_load(args.scenario);
    if (!scenario.run) throw ConfigError(args.scenario, "run", "this scenario has no run: section (longseq launch runs run scenarios)");
    job_name = scenario.name;
    request.scenario_path = std::filesystem::absolute(args.scenario).string();
    request.scenario_name = scenario.name;
    request.ranks = args.ranks > 0 ? args.ranks : scenario.gpus.value_or(scenario.plan.sp.value_or(1));
    request.ranks_per_node = args.ranks_per_node > 0 ? args.ranks_per_node : scenario.gpus_per_node.value_or(request.ranks);
    request.sp = args.sp > 0 ? args.sp : scenario.plan.sp.value_or(0);
    request.device = args.device;
  }
  request.hostfile = args.hostfile;
  request.output_directory = std::filesystem::absolute(args.output.empty() ? "launch-" + job_name : args.output).string();
  request.longseq_binary = this_binary();
  request.time_limit = args.time_limit;
  request.partition = args.partition;
  request.mpirun_extra = args.mpirun_extra;
  const JobLayout layout = job_layout(request);  // refuses bad layouts before anything is written
  if (layout.nodes > 1 && !args.slurm && args.hostfile.empty())
    throw ConfigError("--ranks-per-node", "", fmt::format("{} nodes need machines: give --hostfile or --slurm", layout.nodes));

  std::error_code error;
  if (!args.dry_run) {  // the output directory is checked and made before anything is printed or run
    output_directory_check(request.output_directory, args.overwrite, "--output", launch_output_names());
    std::filesystem::create_directories(request.output_directory, error);
    if (error) throw ConfigError("--output", "", fmt::format("cannot create {}: {}", request.output_directory, error.message()));
    // What this launch and its job write here: a rerun replaces them, and nothing else without --overwrite.
    output_directory_record(request.output_directory, launch_output_names());
  }
  fmt::print("longseq launch {}: {} rank(s) = Ulysses sp={} x data parallel dp={}, {} node(s) of {} rank(s){}\n", job_name,
             layout.ranks, layout.sp, layout.dp, layout.nodes, layout.ranks_per_node,
             layout.sp_spans_nodes ? " (Ulysses groups span nodes)" : "");
  const std::string script_path = request.output_directory + "/job.sbatch";
  if (args.dry_run) {
    if (args.slurm)
      fmt::print("would write {} and submit it with sbatch:\n{}", script_path, sbatch_script(request, layout));
    else
      fmt::print("would run:\n{}\n", mpirun_command(request, layout));
    return 0;
  }
  const std::string result_path = request.output_directory + "/run.json";
  // An earlier result in a directory the user asked to overwrite must not pass for this job's.
  std::filesystem::remove(result_path, error);
  if (!args.slurm) {
    fmt::print("running: {}\n", mpirun_command(request, layout));
    std::fflush(stdout);
    // No shell: mpirun gets its arguments as a vector. SIGINT/SIGTERM to launch reach mpirun,
    // which stops its ranks; if launch itself is killed, mpirun gets SIGTERM (PR_SET_PDEATHSIG).
    const ProcessResult result = process_run(mpirun_arguments(request, layout));
    if (result.forwarded_signal) {
      std::cerr << fmt::format("longseq: error: launch: interrupted by signal {}; the job was stopped and wrote no result\n",
                               result.forwarded_signal);
      return 128 + result.forwarded_signal;
    }
    if (result.exit_code != 0) {
      std::cerr << fmt::format("longseq: error: launch: the job failed (exit {}){}\n", result.exit_code,
                               result.exit_code == 127 ? ": cannot run mpirun (scripts/setup.sh installs openmpi-bin)"
                                                       : "; see the messages above");
      return result.exit_code == 2 ? 2 : 1;
    }
    fmt::print("results: {}\n", result_path);
    return 0;
  }
  file_write_text(script_path, sbatch_script(request, layout));
  std::string submitted;
  ProcessOptions capture;
  capture.captured_stdout = &submitted;
  std::vector<std::string> sbatch = {"sbatch", "--parsable"};
  if (args.wait) sbatch.push_back("--wait");
  sbatch.push_back(script_path);
  const ProcessResult result = process_run(sbatch, capture);
  const std::string job_id = submitted.substr(0, submitted.find_first_of(";\n"));
  if (job_id.empty()) {
    std::filesystem::remove(script_path, error);
    throw ConfigError("--slurm", "", fmt::format("sbatch did not accept the job (exit {})", result.exit_code));
  }
  fmt::print("submitted Slurm job {}; results: {}, log: {}/slurm-{}.out\n", job_id, result_path, request.output_directory, job_id);
  if (args.wait) {
    if (result.forwarded_signal)
      fmt::print("stopped waiting (signal {}); job {} is still Slurm's: `scancel {}` stops it\n", result.forwarded_signal, job_id, job_id);
    else
      fmt::print("job {} {}\n", job_id, result.exit_code == 0 ? "finished" : fmt::format("failed (exit {})", result.exit_code));
    return result.exit_code == 0 ? 0 : 1;
  }
  return 0;
}

}  // namespace longseq
