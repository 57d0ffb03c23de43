// sweep_command.cpp: `longseq sweep SCENARIO.yaml [-o DIR]` and `longseq report DIR`.
#include <chrono>
#include <cstdio>
#include <optional>
#include <fmt/format.h>
#include <unistd.h>

#include "cli/commands.hpp"
#include "io/config_error.hpp"
#include "io/output_files.hpp"
#include "planner/scenario.hpp"
#include "reports/report.hpp"
#include "reports/sweep_output.hpp"

namespace longseq {

struct SweepCommandArgs {
  std::string scenario;
  std::optional<std::string> out_dir;  // not given: the scenario's, else out/<name>
  bool quiet = false, overwrite = false;
};

struct ReportCommandArgs {
  std::string results_dir;
  bool overwrite = false;
};

std::shared_ptr<SweepCommandArgs> sweep_command_register(CLI::App& app) {
  auto args = std::make_shared<SweepCommandArgs>();
  CLI::App* command = app.add_subcommand(
      "sweep", "Run a scenario's sweep (predictions) and write results.csv, results.json and results.md");
  command->add_option("scenario", args->scenario, "scenario YAML (see scenarios/README.md)")->required();
  command->add_option("-o,--out", args->out_dir, "output directory (default: the scenario's output.directory, else out/<name>)");
  command->add_flag("-q,--quiet", args->quiet, "no progress on stderr");
  command->add_flag("--overwrite", args->overwrite,
                    "write into an output directory that holds other files, replacing only results.{csv,json,md} (nothing else is "
                    "touched); a directory of an earlier sweep is replaced without it");
  return args;
}

int sweep_command_run(const SweepCommandArgs& args) {
  const Scenario scenario = scenario_load(args.scenario);
  if (scenario.run)
    throw ConfigError(args.scenario, "run", "this is a run scenario (it trains with the executor): run it with `longseq run " +
                                                args.scenario + "` or `longseq launch`; sweep takes planning scenarios");
  const std::string out_dir = args.out_dir                           ? *args.out_dir
                              : !scenario.output_directory.empty() ? scenario.output_directory
                                                                   : "out/" + scenario.name;
  // Errors name where the directory came from: the flag, or the scenario's key.
  const std::string out_flag =
      !args.out_dir && !scenario.output_directory.empty() ? args.scenario + ": key 'output.directory'" : "--out";
  output_directory_check(out_dir, args.overwrite, out_flag, sweep_output_names());  // before the work, not after it
  const bool tty = isatty(fileno(stderr));
  const auto start = std::chrono::steady_clock::now();
  // Progress only for sweeps that take a while: after the first second, at most once a second
  // (on a terminal redrawn in place, in a log one line each time).
  auto last_report = start;
  bool reported = false;
  auto progress = [&](size_t done, size_t total) {
    const auto now = std::chrono::steady_clock::now();
    if (args.quiet || now - last_report < std::chrono::seconds(1)) return;
    last_report = now;
    reported = true;
    if (tty) fmt::print(stderr, "\r[{}/{}] {}", done, total, scenario.name);
    else fmt::print(stderr, "[{}/{}] {}\n", done, total, scenario.name);
  };
  const std::vector<SweepRow> rows = scenario_run(scenario, progress);
  if (reported && tty) fmt::print(stderr, "\n");
  sweep_results_write(scenario, rows, out_dir, args.overwrite, out_flag);
  size_t fits = 0, errors = 0;
  for (const auto& row : rows) {
    fits += row.fits;
    errors += !row.error.empty();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  fmt::print("{}: {} points ({} fit, {} could not be planned) in {:.2f} s; PREDICTIONS written to {}/results.{{csv,json,md}}\n",
             scenario.name, rows.size(), fits, errors, seconds, out_dir);
  return 0;
}

std::shared_ptr<ReportCommandArgs> report_command_register(CLI::App& app) {
  auto args = std::make_shared<ReportCommandArgs>();
  CLI::App* command = app.add_subcommand("report", "Draw a sweep's figures (PNG and SVG, with gnuplot) and write report.md");
  command->add_option("results_dir", args->results_dir, "a directory written by `longseq sweep` or `longseq launch`")->required();
  command->add_flag("--overwrite", args->overwrite,
                    "replace a report.md or figures/ there that longseq did not write (without it they are refused; an earlier "
                    "report's are replaced)");
  return args;
}

int report_command_run(const ReportCommandArgs& args) {
  const ReportOutcome outcome = report_write(args.results_dir, "gnuplot", args.overwrite);
  for (const auto& figure : outcome.figures) fmt::print("figure: {}\n", figure);
  fmt::print("report: {}\n", outcome.report_path);
  return 0;
}

}  // namespace longseq
