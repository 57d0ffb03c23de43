// commands.hpp: the `longseq` subcommands. Each registers its flags on the CLI11 app (the
// returned arguments are filled by the parse and must outlive it) and runs to an exit code.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>

namespace longseq {

struct PlanCommandArgs;      // `longseq plan`: predict a plan, or search for the best one
struct ValidateCommandArgs;  // `longseq validate`: predictions against published measurements
struct BenchCommandArgs;     // `longseq bench`: how long the plan search takes
struct SweepCommandArgs;     // `longseq sweep`: run a scenario file's sweep
struct ReportCommandArgs;    // `longseq report`: figures and report.md from a sweep
struct RunCommandArgs;       // `longseq run`: train with real kernels, measured vs predicted
struct LaunchCommandArgs;    // `longseq launch`: a run scenario as an mpirun or Slurm job

std::shared_ptr<PlanCommandArgs> plan_command_register(CLI::App& app);
int plan_command_run(const PlanCommandArgs& args);

std::shared_ptr<ValidateCommandArgs> validate_command_register(CLI::App& app);
int validate_command_run(const ValidateCommandArgs& args);

std::shared_ptr<BenchCommandArgs> bench_command_register(CLI::App& app);
int bench_command_run(const BenchCommandArgs& args);

std::shared_ptr<SweepCommandArgs> sweep_command_register(CLI::App& app);
int sweep_command_run(const SweepCommandArgs& args);

std::shared_ptr<ReportCommandArgs> report_command_register(CLI::App& app);
int report_command_run(const ReportCommandArgs& args);

std::shared_ptr<RunCommandArgs> run_command_register(CLI::App& app);
int run_command_run(const RunCommandArgs& args);

std::shared_ptr<LaunchCommandArgs> launch_command_register(CLI::App& app);
int launch_command_run(const LaunchCommandArgs& args);

}  // namespace longseq
