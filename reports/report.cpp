#include "reports/report.hpp"

#include <cmath>
#include <filesystem>
#include <fmt/format.h>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <optional>

#include "io/checked_input.hpp"
#include "io/config_error.hpp"
#include "models/model_loader.hpp"
#include "io/output_files.hpp"
#include "io/process.hpp"
#include "planner/units.hpp"
#include "reports/sweep_output.hpp"

namespace longseq {

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;


// A label inside a gnuplot data file: data is never evaluated (no backquote substitution), but a
// double quote or a line break would end the field or the line.
std::string data_label(const std::string& text) {
  std::string out = "\"";
  for (char c : text) out += c == '"' ? '\'' : static_cast<unsigned char>(c) < 0x20 ? ' ' : c;
  return out + "\"";
}

// Every figure is drawn twice by one script: PNG, then SVG. The title is text from the user's
// files, so it never enters the script: gnuplot gets it as ARG1 (`gnuplot -c SCRIPT TITLE`), a
// string variable that is not parsed (backquotes inside a script's double quotes would run as
// commands). Scripts contain only longseq's own constant text and numbers.
std::string script_wrap(const std::string& stem, const std::string& body) {
  return fmt::format(
      "set terminal pngcairo size 1100,680 noenhanced font ',11'\nset output '{0}.png'\nset title ARG1\n{1}\n"
      "set terminal svg size 1100,680 noenhanced font ',11'\nset output '{0}.svg'\nreplot\nunset output\n",
      stem, body);
}

// The per-GPU breakdown columns of a sweep row (sweep_output.cpp writes them), with their labels.
const std::vector<std::pair<std::string, std::string>> kBreakdownColumns = {
    {"model_states_gib", "model states"},           {"zero_buffers_gib", "ZeRO buffers"},
    {"activation_checkpoints_gib", "checkpoints"}, {"layer_working_set_gib", "layer working set"},
    {"logits_and_loss_gib", "logits and loss"},     {"inputs_gib", "inputs"},
    {"runtime_overheads_gib", "runtime"},           {"calibrated_overhead_gib", "calibrated overhead"}};

struct Figure {
  std::string stem, caption, title;  // title: the figure's title, handed to gnuplot as data
  std::string note;                  // said under the figure in report.md ("" for none)
};

// An axis value as a legend shows it: a model by its name (not the card or config.json path the
// scenario gave), every other axis as written.
std::string axis_shown(const JsonView& row, const std::string& axis) {
  if (axis == "model" && !row.string_or("model", "").empty()) return row["model"].string();
  return row["axes"][axis].string();
}

// Rows grouped into series by every axis except `except`, in first-seen order.
std::vector<std::pair<std::string, std::vector<JsonView>>> series_of(const JsonView& rows, const std::string& except) {
  std::vector<std::pair<std::string, std::vector<JsonView>>> series;
  for (size_t i = 0; i < rows.size(); ++i) {
    const JsonView row = rows[i];
    std::string key;
    const JsonView axes = row["axes"];
    if (!axes.is_object()) axes.fail("expected an object of axis values");
    for (const auto& [axis, value] : axes.raw().items())
      if (axis != except) key += fmt::format("{}{}={}", key.empty() ? "" : ", ", axis, axis_shown(row, axis));
    if (key.empty()) key = "predicted";
    auto found = std::find_if(series.begin(), series.end(), [&](const auto& s) { return s.first == key; });
    if (found == series.end()) series.push_back({key, {row}});
    else found->second.push_back(row);
  }
  return series;
}

std::string row_label(const JsonView& row) {
  std::string label;
  const JsonView axes = row["axes"];
  if (!axes.is_object()) axes.fail("expected an object of axis values");
  for (const auto& [axis, unused] : axes.raw().items()) {
    if (!label.empty()) label += ' ';
    const std::string text = axes[axis].string();
    const std::optional<int64_t> tokens = axis == "seqlen" ? integer_parse(text) : std::nullopt;
    label += axis == "gpus" ? text + (text == "1" ? " GPU" : " GPUs") : tokens ? seqlen_format(*tokens) + " tokens" : axis_shown(row, axis);
  }
  return label.empty() ? row.string_or("plan", "plan") : label;
}

bool usable(const JsonView& row) { return row.string_or("error", "").empty() && row.has("gpu_peak_gib"); }

// A title broken at spaces into lines of at most `width` characters, so that a long one stays
// inside the figure (gnuplot starts a new title line at each newline).
std::string title_wrap(const std::string& title, size_t width = 120) {
  std::string wrapped;
  size_t line_length = 0, start = 0;
  while (start < title.size()) {
    size_t end = title.find(' ', start);
    if (end == std::string::npos) end = title.size();
    const std::string word = title.substr(start, end - start);
    if (line_length > 0 && line_length + 1 + word.size() > width) {
      wrapped += '\n';
      line_length = 0;
    } else if (line_length > 0) {
      wrapped += ' ';
      ++line_length;
    }
    wrapped += word;
    line_length += word.size();
    start = end + 1;
  }
  return wrapped;
}

// Runs gnuplot (an argument vector, no shell) on every figure's STEM.gp in `staging`, then moves
// the drawn files into DIR/figures (replacing files of the same names, nothing else) only when
// all were drawn. Throws ConfigError naming the script that failed.
fs::path figures_draw(const fs::path& dir, const fs::path& staging, const std::vector<Figure>& figures,
                      const std::string& gnuplot_command) {
  std::error_code error;
  for (const auto& figure : figures) {
    const fs::path log = staging / (figure.stem + ".log");
    ProcessOptions options;
    options.working_directory = staging.string();
    options.output_path = log.string();
    const ProcessResult result = process_run({gnuplot_command, "-c", figure.stem + ".gp", title_wrap(figure.title)}, options);
    if (result.exit_code != 0) {
      std::string text = fs::exists(log) ? file_read_text(log.string()) : std::string();
      staging_directory_discard(staging);
      if (result.forwarded_signal) throw ConfigError(figure.stem + ".gp", "", "gnuplot was interrupted");
      if (result.exit_code == 127 && text.empty()) text = fmt::format("cannot run '{}' (scripts/setup.sh installs gnuplot-nox)", gnuplot_command);
      throw ConfigError(figure.stem + ".gp", "", fmt::format("gnuplot failed: {}", text.substr(0, 400)));
    }
    fs::remove(log, error);
  }
  const fs::path figures_dir = dir / "figures";
  try {
    staging_directory_commit(staging, figures_dir);
  } catch (...) {
    staging_directory_discard(staging);
    throw;
  }
  return figures_dir;
}

// A run result's values, read and checked before anything is written.
struct RunResult {
  struct Step {
    int64_t step;
    double loss, loss_on_one_rank, seconds, tokens_per_s;
  };
  std::vector<Step> steps;
  bool compared = false;  // steps carry the one-rank replica's loss
  std::string model, measured_on, profile, plan, predicted_peak_moment;
  int64_t seqlen = 0, ranks = 1, sp = 1, dp = 1;
  double predicted = 0;
  std::vector<double> per_rank;
  std::optional<double> measured_outside_arena_mib, budget_mib;  // a GPU run's; a budgeted run's
  double predicted_outside_arena_mib = 0;
};

RunResult run_result_read(const JsonView& run) {
  if (!run.is_object() || !run.has("steps") || !run["steps"].raw().is_array() || run["steps"].size() == 0 ||
      !run.has("predicted_peak_mib"))
    throw ConfigError(run.source(), "steps", "not a longseq run result (write one with `longseq run --json` or `longseq launch`)");
  RunResult result;
  const JsonView steps = run["steps"];
  result.compared = steps[0].has("loss_on_one_rank");
  for (size_t i = 0; i < steps.size(); ++i) {
    const JsonView step = steps[i];
    result.steps.push_back({step["step"].integer(), step["loss"].number(),
                            result.compared ? step["loss_on_one_rank"].number() : 0.0, step["seconds"].number(),
                            step["tokens_per_s"].number()});
  }
  result.model = run.string_or("model", "");
  result.seqlen = run.integer_or("seqlen", 0);
  result.ranks = run.integer_or("ranks", 1);
  result.predicted = run["predicted_peak_mib"].number();
  if (run.has("measured_peak_mib_per_rank"))
    for (size_t rank = 0; rank < run["measured_peak_mib_per_rank"].size(); ++rank)
      result.per_rank.push_back(run["measured_peak_mib_per_rank"][rank].number());
  else
    result.per_rank.push_back(run.number_or("measured_peak_mib", 0.0));
  result.measured_on = run.string_or("measured_on", "the machine that wrote run.json");
  result.profile = run.string_or("profile", "native");
  result.plan = run.string_or("plan", "?");
  result.predicted_peak_moment = run.string_or("predicted_peak_moment", "");
  result.sp = run.integer_or("sp", 1);
  result.dp = run.integer_or("dp", 1);
  if (run.has("measured_outside_arena_mib")) result.measured_outside_arena_mib = run["measured_outside_arena_mib"].number();
  result.predicted_outside_arena_mib = run.number_or("predicted_outside_arena_mib", 0.0);
  if (run.has("budget_mib")) result.budget_mib = run["budget_mib"].number();
  // What a run can be: as `longseq run` bounds its flags (ranks up to 2^20), one peak per rank.
  auto in_range = [&](const char* key, int64_t value, int64_t low, int64_t high) {
    if (value < low || value > high) throw ConfigError(run.source(), key, fmt::format("{} is out of range [{}, {}]", value, low, high));
  };
  in_range("ranks", result.ranks, 1, int64_t{1} << 20);
  in_range("sp", result.sp, 1, result.ranks);
  in_range("dp", result.dp, 1, result.ranks);
  in_range("seqlen", result.seqlen, 0, int64_t{10'000'000'000'000});
  if (run.has("measured_peak_mib_per_rank") && static_cast<int64_t>(result.per_rank.size()) != result.ranks)
    throw ConfigError(run.source(), "measured_peak_mib_per_rank",
                      fmt::format("{} peaks for {} ranks (one per rank)", result.per_rank.size(), result.ranks));
  return result;
}

// A run's result (`longseq run --json`, or `longseq launch`'s run.json): the loss per step (beside
// the one-rank replica's when it was compared) and the measured peak of every rank against the
// planner's prediction.
ReportOutcome run_report_write(const fs::path& dir, const fs::path& run_path, const std::string& gnuplot_command) {
  const Json document = json_parse(file_read_text(run_path.string()), run_path.string());
  const JsonView run(document, run_path.string());
  const RunResult result = run_result_read(run);
  const auto& steps = result.steps;
  const auto& per_rank = result.per_rank;
  const bool compared = result.compared;
  const std::string& model = result.model;
  const int64_t seqlen = result.seqlen, ranks = result.ranks;
  const double predicted = result.predicted;

  const fs::path staging = staging_directory_create(dir / "figures");
  std::string data;
  for (const RunResult::Step& step : steps) data += fmt::format("{} {} {}\n", step.step, step.loss, step.loss_on_one_rank);
  file_write_text((staging / "loss.dat").string(), data);
  file_write_text((staging / "loss.gp").string(),
                  script_wrap("loss", fmt::format("set xlabel 'step'\nset xtics 1\nset ylabel 'loss'\nset grid\nset key top right\n"
                                                  "plot 'loss.dat' using 1:2 with linespoints lw 2 title '{} rank(s)'{}",
                                                  ranks, compared ? ", '' using 1:3 with linespoints dt 2 title 'one unsharded rank'" : "")));
  const fs::path figures_dir =
      figures_draw(dir, staging,
                   {{"loss", "", fmt::format("Training loss per step: {}, {} tokens, {} rank(s) (MEASURED)", model, seqlen, ranks), ""}},
                   gnuplot_command);

  std::string markdown = fmt::format("# Run: {} at {} tokens\n\n", model, seqlen);
  markdown += fmt::format("MEASURED on {}; the PREDICTION is the planner's (runtime profile `{}`) for the same plan.\n\n",
                          result.measured_on, result.profile);
  markdown += fmt::format("Plan: {}; {} rank(s) = Ulysses sp={} x data parallel dp={}.\n\n", result.plan, ranks, result.sp, result.dp);
  markdown += "## Loss\n\n![Loss per step](figures/loss.png)\n\n([SVG](figures/loss.svg))\n\n";
  markdown += compared ? "| step | loss | loss on one rank | seconds | tokens/s |\n|---:|---:|---:|---:|---:|\n"
                       : "| step | loss | seconds | tokens/s |\n|---:|---:|---:|---:|\n";
  for (const RunResult::Step& step : steps) {
    markdown += fmt::format("| {} | {:.4f} |", step.step, step.loss);
    if (compared) markdown += fmt::format(" {:.4f} |", step.loss_on_one_rank);
    markdown += fmt::format(" {:.3f} | {:.0f} |\n", step.seconds, step.tokens_per_s);
  }
  markdown += fmt::format("\n## Peak device memory per rank\n\nPREDICTED: {:.3f} MiB ({}).\n\n| rank | MEASURED MiB | difference |\n|---:|---:|---:|\n",
                          predicted, result.predicted_peak_moment);
  for (size_t rank = 0; rank < per_rank.size(); ++rank) {
    const double measured = per_rank[rank];
    markdown += fmt::format("| {} | {:.3f} | {:+.2f}% |\n", rank, measured, measured > 0 ? 100.0 * (predicted - measured) / measured : 0.0);
  }
  if (result.measured_outside_arena_mib)
    markdown += fmt::format("\nOutside the arena (CUDA context, cuBLAS workspace, NCCL buffers): MEASURED {:.1f} MiB (cudaMemGetInfo "
                            "after the last step, rank 0), PREDICTED {:.1f} MiB.\n",
                            *result.measured_outside_arena_mib, result.predicted_outside_arena_mib);
  if (result.budget_mib) markdown += fmt::format("\nBudget: {:.1f} MiB per rank.\n", *result.budget_mib);
  ReportOutcome outcome;
  outcome.figures.push_back((figures_dir / "loss.png").string());
  outcome.report_path = (dir / "report.md").string();
  output_directory_record(dir, {"report.md", "figures"});
  file_write_text(outcome.report_path, markdown);
  return outcome;
}

// A sweep result's rows, read and checked once, before anything is written.
// A step time as a figure's label: seconds, minutes, hours or days, two or three digits.
std::string step_label(double seconds) {
  if (seconds < 120) return fmt::format("{:.0f} s", seconds);
  if (seconds < 2 * 3600) return fmt::format("{:.0f} min", seconds / 60);
  if (seconds < 2 * 86400) return fmt::format("{:.1f} h", seconds / 3600);
  return fmt::format("{:.1f} d", seconds / 86400);
}

struct SweepTableRow {
  JsonView json;
  bool usable;
  int64_t gpus, seqlen, seqlen_shortest, seqlen_longest;
  std::string mode, step, label;
  std::optional<double> published;
  double published_fail, gpu_peak_gib;
};

struct SweepTable {
  std::vector<SweepTableRow> rows;
  std::set<int64_t> gpu_counts;
  bool max_mode = false, has_published = false, has_steps = false;
};

// Tick positions for a log axis over [low, high] at 1, 2 and 5 times each power of ten, so that an
// axis spanning less than a decade still has labelled ticks.
std::string log_ticks(double low, double high) {
  std::string ticks;
  for (double decade = std::pow(10.0, std::floor(std::log10(std::max(low, 1.0)))); decade <= high; decade *= 10)
    for (double step : {1.0, 2.0, 5.0})
      if (decade * step >= low && decade * step <= high) ticks += fmt::format("{}{:.0f}", ticks.empty() ? "" : ", ", decade * step);
  return ticks;
}

// The bottom margin (in character heights) a legend below the plot needs: the x label, then a line
// per titled entry (gnuplot's "set key below" stacks them), so it never covers the x label.
int key_margin(const std::string& plot) {
  int titled = 0;
  for (size_t at = plot.find(" title "); at != std::string::npos; at = plot.find(" title ", at + 1)) ++titled;
  return 5 + titled;
}

// A figure against GPU count, both axes logarithmic (as the ALST paper draws its scaling), the
// x range padded around the counts swept, the key below: the gnuplot commands before `plot`.
std::string against_gpus_log_log(const std::set<int64_t>& gpu_counts, const std::string& ylabel, const std::string& plot) {
  return fmt::format("set logscale x 2\nset logscale y 10\nset xrange [{}:{}]\nset xlabel 'GPUs'\nset ylabel '{}'\nset format y '%.0s%c'\n"
                     "set key below box\nset bmargin {}\nset grid\nplot {}",
                     static_cast<double>(*gpu_counts.begin()) / 1.3, static_cast<double>(*gpu_counts.rbegin()) * 1.3, ylabel,
                     key_margin(plot), plot);
}

// A bar chart stays legible (and gnuplot quick) up to this many bars; a larger sweep is drawn
// from evenly spaced rows, and the figure's caption says so (every row stays in the table).
constexpr size_t kMostBars = 60;

struct BarRows {
  std::vector<const SweepTableRow*> rows;
  std::string caption_note;  // "" when every usable row is drawn
};

BarRows bar_rows(const std::vector<SweepTableRow>& table) {
  std::vector<const SweepTableRow*> usable;
  for (const SweepTableRow& row : table)
    if (row.usable) usable.push_back(&row);
  BarRows bars;
  // Rows where nothing fits draw no bar: the caption names them, since "does not fit" is an answer.
  std::string unfit;
  for (const SweepTableRow& row : table)
    if (!row.usable) unfit += (unfit.empty() ? "" : ", ") + row.label;
  const std::string unfit_note = unfit.empty() ? "" : fmt::format("No plan fits (no bar): {}.", unfit);
  if (usable.size() <= kMostBars) {
    bars.rows = usable;
    bars.caption_note = unfit_note;
    return bars;
  }
  for (size_t i = 0; i < kMostBars; ++i) bars.rows.push_back(usable[i * usable.size() / kMostBars]);
  bars.caption_note = fmt::format("{} of {} rows drawn, evenly spaced; every row is in the table below.{}{}", kMostBars, usable.size(),
                                  unfit_note.empty() ? "" : " ", unfit_note);
  return bars;
}

SweepTable sweep_table_read(const JsonView& rows) {
  SweepTable table;
  for (size_t i = 0; i < rows.size(); ++i) {
    const JsonView row = rows[i];
    SweepTableRow entry{row, usable(row), row["gpus"].integer(1, int64_t{1} << 40), row["seqlen"].integer(),
                        row.has("seqlen_shortest") ? row["seqlen_shortest"].integer() : 0,
                        row.has("seqlen_longest") ? row["seqlen_longest"].integer() : 0, row["mode"].string(),
                        row.string_or("step", ""), row_label(row), std::nullopt, 0.0, row.number_or("gpu_peak_gib", 0.0)};
    if (row.has("published")) entry.published = row["published"].number();
    entry.published_fail = row.number_or("published_fail", entry.published.value_or(0.0));
    for (const auto& [column, label] : kBreakdownColumns) (void)row.number_or(column, 0.0);
    if (entry.usable) {
      table.gpu_counts.insert(entry.gpus);
      table.max_mode |= entry.mode == "max_seqlen";
      table.has_published |= entry.published.has_value();
      table.has_steps |= !entry.step.empty();
    }
    table.rows.push_back(entry);
  }
  return table;
}

// results.json's top level, checked: the rows and the scenario's text fields the report prints.
void sweep_header_check(const JsonView& results) {
  if (!results.is_object() || !results.has("rows") || !results["rows"].raw().is_array() || !results.has("scenario"))
    throw ConfigError(results.source(), "rows", "not a longseq sweep result (run `longseq sweep` first)");
  const JsonView scenario = results["scenario"];
  for (const char* key : {"reproduces", "name", "published_source", "published_figure", "runtime_profile", "description"})
    (void)scenario.string_or(key, "");
  if (scenario.has("figures"))
    for (size_t i = 0; i < scenario["figures"].size(); ++i) (void)scenario["figures"][i].string();
}

}  // namespace

ReportOutcome report_write(const std::string& results_dir, const std::string& gnuplot_command, bool overwrite) {
  // The directory as the system resolves it ("x/.." is x's parent): the one checked is the one written.
  const fs::path dir = output_directory_resolve(results_dir);
  std::error_code error;
  if (!fs::is_directory(dir, error)) throw ConfigError(results_dir, "", "is not a directory (give the directory `longseq sweep` or `longseq launch` wrote)");
  // The report's own names beside the results: a user's report.md or figures/ is not replaced.
  output_names_check(dir.string(), {"report.md", "figures"}, overwrite, results_dir);
  output_directory_check((dir / "figures").string(), overwrite, results_dir + "/figures", {"*"});
  const fs::path results_path = dir / "results.json";
  // A run's result (longseq launch's run.json) gets the run report; a sweep's, the sweep report.
  if (!fs::exists(results_path) && fs::exists(dir / "run.json")) return run_report_write(dir, dir / "run.json", gnuplot_command);
  const std::string source = results_path.string();
  const Json document = json_parse(file_read_text(source), source);
  const JsonView results(document, source);
  sweep_header_check(results);
  const JsonView rows = results["rows"];
  const JsonView scenario = results["scenario"];
  // Every figure's title names the scenario and what the figure shows; what it reproduces is said
  // once, in report.md.
  const std::string title = scenario.string_or("name", "sweep");
  const std::string published_source = scenario.string_or("published_source", "");
  // The scenario may name the figures it wants; otherwise every one that applies is drawn.
  std::set<std::string> wanted;
  if (scenario.has("figures"))
    for (size_t i = 0; i < scenario["figures"].size(); ++i) wanted.insert(scenario["figures"][i].string());
  auto want = [&](const char* name) { return wanted.empty() || wanted.count(name) > 0; };

  const SweepTable sweep = sweep_table_read(rows);
  const std::vector<SweepTableRow>& table = sweep.rows;
  const std::set<int64_t>& gpu_counts = sweep.gpu_counts;
  const bool max_mode = sweep.max_mode, has_published = sweep.has_published, has_steps = sweep.has_steps;
  const auto rows_of = [&](const std::vector<JsonView>& members) {
    std::vector<const SweepTableRow*> out;
    for (const JsonView& member : members)
      for (const SweepTableRow& row : table)
        if (&row.json.raw() == &member.raw()) out.push_back(&row);
    return out;
  };

  const fs::path staging = staging_directory_create(dir / "figures");
  std::vector<Figure> figures;
  try {
    // Maximum sequence length against GPU count, log-log, as the ALST paper draws its scaling.
    if (want("max_seqlen_vs_gpus") && max_mode && gpu_counts.size() >= 2) {
      // Per series: a block of predictions headed by the series' name (its title, read as data
      // by `title columnheader`), then a block of its published points (value to value_fail as
      // an error bar where the source gives a bracket), drawn in the series' colour.
      std::string data, plot, plan_change_note;
      int index = 0, series_number = 0;
      bool published_titled = false;
      for (const auto& [name, members] : series_of(rows, "gpus")) {
        ++series_number;
        std::string predicted, band, published, step_labels;
        // A curve whose plan changes from point to point (the ALST preset offloads the weights on
        // one GPU only, paper §5.2) bends where it does: the caption says so.
        std::set<std::string> plans_without_sp;
        for (const SweepTableRow* row : rows_of(members))
          if (row->usable) plans_without_sp.insert(row->json.string_or("plan", "").substr(row->json.string_or("plan", "").find(' ') + 1));
        if (plans_without_sp.size() > 1 && plan_change_note.empty())
          plan_change_note = "The plan changes along a curve besides its degree, and the curve bends where it does: the table's plan "
                             "column shows where (e.g. the ALST preset offloads the weights on one GPU only, paper §5.2).";
        for (const SweepTableRow* row : rows_of(members)) {
          if (row->usable && row->seqlen > 0) predicted += fmt::format("{} {}\n", row->gpus, row->seqlen);
          // Each point's step, beside it: a length whose step takes days is no length to train at
          // (issue 41, item 6: the ring figure's 207M tokens take 8.7 days a step).
          if (row->usable && row->seqlen > 0 && row->json.number_or("step_s", 0) > 0)
            step_labels += fmt::format("{} {} \"{}\"\n", row->gpus, row->seqlen, step_label(row->json.number_or("step_s", 0)));
          // The band, where both ends are lengths: a low end of 0 (nothing fits with every estimate
          // high) has no place on a log axis and would stretch it down to one token.
          if (row->usable && row->seqlen_longest > 0 && row->seqlen_shortest > 0)
            band += fmt::format("{} {} {}\n", row->gpus, row->seqlen_shortest, row->seqlen_longest);
          if (row->published) published += fmt::format("{} {} {}\n", row->gpus, *row->published, row->published_fail);
        }
        // The band first, so that the line and the points are drawn over it.
        if (!band.empty()) {
          data += band + "\n\n";
          plot += fmt::format("{}'max_seqlen_vs_gpus.dat' index {} using 1:2:3 with filledcurves lt {} fs transparent solid 0.15 noborder {}",
                              plot.empty() ? "" : ", ", index++, series_number,
                              series_number == 1
                                  ? fmt::format("title 'band{}: estimates at their high ends + calibrated reserve, to sourced terms alone'",
                                                name == "predicted" ? "" : " of " + name)
                                  : fmt::format("title 'band of {}'", name));
        }
        data += data_label(name == "predicted" ? "predicted (longseq)" : name + " (predicted)") + "\n" + predicted + "\n\n";
        plot += fmt::format("{}'max_seqlen_vs_gpus.dat' index {} using 1:2 with linespoints lt {} lw 2 pt 7 title columnheader(1)",
                            plot.empty() ? "" : ", ", index++, series_number);
        if (!step_labels.empty()) {
          data += step_labels + "\n\n";
          plot += fmt::format(", 'max_seqlen_vs_gpus.dat' index {} using 1:2:3 with labels offset 0,1 font ',8' tc lt {} notitle", index++,
                              series_number);
        }
        if (published.empty()) continue;
        data += published + "\n\n";
        plot += fmt::format(", 'max_seqlen_vs_gpus.dat' index {} using 1:2:2:3 with yerrorbars lt {} pt 9 ps 2 {}", index++,
                            series_number,
                            published_titled ? "notitle" : "title 'published (triangles; bars: [fits, fails) brackets)'");
        published_titled = true;
      }
      file_write_text((staging / "max_seqlen_vs_gpus.dat").string(), data);
      file_write_text((staging / "max_seqlen_vs_gpus.gp").string(),
                      script_wrap("max_seqlen_vs_gpus", against_gpus_log_log(gpu_counts, "maximum sequence length (tokens)", plot)));
      figures.push_back({"max_seqlen_vs_gpus", "Maximum sequence length vs GPU count (predicted, each point labelled with its step time; "
                         "published points where cited)",
                         title + ": maximum sequence length vs GPUs (PREDICTION; labels: step time there)", plan_change_note});
    }

    // Tokens/s against GPU count, per series, each point labelled with its cost of a billion tokens
    // where the scenario is priced: what a purchase is weighed by, beside the length it buys.
    if (want("throughput_vs_gpus") && gpu_counts.size() >= 2) {
      std::string data, plot;
      int index = 0, series_number = 0;
      bool priced = false;
      for (const auto& [name, members] : series_of(rows, "gpus")) {
        ++series_number;
        std::string points, costs;
        for (const SweepTableRow* row : rows_of(members)) {
          const double tokens_per_s = row->json.number_or("tokens_per_s", 0);
          if (!row->usable || !(tokens_per_s > 0)) continue;
          points += fmt::format("{} {}\n", row->gpus, tokens_per_s);
          if (const double cost = row->json.number_or("cost_per_billion_tokens", 0); cost > 0)
            costs += fmt::format("{} {} \"{:.0f}\"\n", row->gpus, tokens_per_s, cost);
        }
        if (points.empty()) continue;
        data += data_label(name == "predicted" ? "predicted (longseq)" : name + " (predicted)") + "\n" + points + "\n\n";
        plot += fmt::format("{}'throughput_vs_gpus.dat' index {} using 1:2 with linespoints lt {} lw 2 pt 7 title columnheader(1)",
                            plot.empty() ? "" : ", ", index++, series_number);
        if (costs.empty()) continue;
        priced = true;
        data += costs + "\n\n";
        plot += fmt::format(", 'throughput_vs_gpus.dat' index {} using 1:2:3 with labels offset 0,1 font ',8' tc lt {} notitle", index++,
                            series_number);
      }
      if (!plot.empty()) {
        file_write_text((staging / "throughput_vs_gpus.dat").string(), data);
        file_write_text((staging / "throughput_vs_gpus.gp").string(),
                        script_wrap("throughput_vs_gpus", against_gpus_log_log(gpu_counts, "tokens/s (cluster)", plot)));
        figures.push_back({"throughput_vs_gpus",
                           priced ? "Tokens/s vs GPU count at each point's length (predicted; labels: the cost of a billion tokens)"
                                  : "Tokens/s vs GPU count at each point's length (predicted)",
                           title + (priced ? ": tokens/s vs GPUs (PREDICTION; labels: cost of 1B tokens)" : ": tokens/s vs GPUs (PREDICTION)"),
                           ""});
      }
    }

    // Tokens/s against the card, where the sweep compares cards: a point per card and series at
    // that point's own length, labelled with the length, the step time there (and the cost of a
    // billion tokens where the scenario is priced), since a purchase weighs the speed and the
    // length a card buys.
    std::vector<std::string> cards;
    for (const SweepTableRow& row : table)
      if (row.json.has("axes") && row.json["axes"].has("gpu") && std::find(cards.begin(), cards.end(), row.json.string_or("gpu", "")) == cards.end())
        cards.push_back(row.json.string_or("gpu", ""));
    if (want("throughput_vs_card") && cards.size() >= 2) {
      const auto series = series_of(rows, "gpu");
      std::string data, plot;
      int index = 0, series_number = 0;
      bool priced = false;
      double low = 1e300, high = 0;
      for (const auto& [name, members] : series) {
        ++series_number;
        // Side by side within a card's slot, so that the series' labels do not overlap.
        const double shift = series.size() < 2 ? 0.0 : 0.5 * (static_cast<double>(series_number - 1) / static_cast<double>(series.size() - 1) - 0.5);
        std::string points;
        for (const SweepTableRow* row : rows_of(members)) {
          const double tokens_per_s = row->json.number_or("tokens_per_s", 0);
          if (!row->usable || row->seqlen <= 0 || !(tokens_per_s > 0)) continue;
          const auto card = std::find(cards.begin(), cards.end(), row->json.string_or("gpu", "")) - cards.begin();
          const double cost = row->json.number_or("cost_per_billion_tokens", 0);
          priced |= cost > 0;
          const double step_s = row->json.number_or("step_s", 0);
          points += fmt::format("{} {} {}\n", static_cast<double>(card) + shift, tokens_per_s,
                                data_label(seqlen_format(row->seqlen) + (step_s > 0 ? ", " + step_label(step_s) : std::string()) +
                                           (cost > 0 ? fmt::format(", {:.0f}", cost) : std::string())));
          low = std::min(low, tokens_per_s);
          high = std::max(high, tokens_per_s);
        }
        if (points.empty()) continue;
        data += data_label(name == "predicted" ? "predicted (longseq)" : name + " (predicted)") + "\n" + points + "\n\n";
        plot += fmt::format("{}'throughput_vs_card.dat' index {} using 1:2 with points lt {} pt 7 ps 1.5 title columnheader(1), "
                            "'' index {} using 1:2:3 with labels offset 0,1 font ',8' tc lt {} notitle",
                            plot.empty() ? "" : ", ", index, series_number, index, series_number);
        ++index;
      }
      if (!plot.empty()) {
        // The cards' names are the user's text: they reach gnuplot as data (the last block, read
        // for its tick labels and drawn as nothing), never as script.
        for (size_t i = 0; i < cards.size(); ++i) data += fmt::format("{} {}\n", i, data_label(cards[i]));
        plot += fmt::format(", 'throughput_vs_card.dat' index {} using 1:({}):xtic(2) with points ps 0 notitle", index, low);
        file_write_text((staging / "throughput_vs_card.dat").string(), data);
        file_write_text((staging / "throughput_vs_card.gp").string(),
                        script_wrap("throughput_vs_card",
                                    fmt::format("set xrange [-0.6:{}]\nset xlabel 'GPU'\nset logscale y 10\n"
                                                "set yrange [{}:{}]\nset ytics ({})\nset ylabel 'tokens/s (cluster)'\nset format y '%.0s%c'\n"
                                                "set key below box\nset bmargin {}\nset grid ytics\nplot {}",
                                                static_cast<double>(cards.size()) - 0.4, low / 2, high * 3, log_ticks(low / 2, high * 3),
                                                key_margin(plot), plot)));
        const std::string labels = priced ? "labels: the length, its step time, the cost of a billion tokens" : "labels: the length, its step time";
        figures.push_back({"throughput_vs_card", "Tokens/s per GPU card at each point's length (predicted; " + labels + ")",
                           title + ": tokens/s vs GPU (PREDICTION; " + labels + ")",
                           "A point per card and series where a length fits; each is at its own maximum (or the scenario's "
                           "length), so read the speed beside the length it is labelled with."});
      }
    }

    // The feature ladder as bars, predicted beside published.
    if (want("ablation") && max_mode && has_steps) {
      const BarRows bars = bar_rows(table);
      // Where every row is drawn, a point no plan fits keeps its place, empty and named (issue 41,
      // item 9: such points vanished without a mark).
      std::vector<const SweepTableRow*> drawn = bars.rows;
      if (table.size() <= kMostBars) {
        drawn.clear();
        for (const SweepTableRow& row : table) drawn.push_back(&row);
      }
      std::string data;
      bool any_published = false;
      size_t longest_label = 0;
      for (const SweepTableRow* row : drawn) {
        any_published |= row->published.has_value();
        // No length fits: no bar (a zero has no place on the log axis), and the point's label says so
        // rather than the bar vanishing unmarked.
        const bool bar = row->usable && row->seqlen > 0;
        const std::string label = bar ? row->label : row->label + (row->usable ? " (no length fits)" : " (no plan fits)");
        longest_label = std::max(longest_label, label.size());
        data += fmt::format("{} {} {}\n", data_label(label),
                            bar ? std::to_string(row->seqlen) : "NaN",
                            row->published ? fmt::format("{}", *row->published) : "NaN");
      }
      file_write_text((staging / "ablation.dat").string(), data);
      file_write_text((staging / "ablation.gp").string(),
                      script_wrap("ablation",
                                  std::string("set style data histograms\nset style histogram clustered gap 1\n")
                                  + "set style fill solid 0.85 border -1\nset logscale y 10\nset format y '%.0s%c'\n"
                                  "set ylabel 'maximum sequence length (tokens)'\nset xlabel 'sweep point'\n"
                                  "set xtics rotate by -25\nset grid ytics\n" +
                                  // Tic labels slanted at 25 degrees take about a line per four characters past twelve.
                                  fmt::format("set key below\nset bmargin {}\n", 8 + (longest_label > 12 ? (longest_label - 12) / 4 : 0)) +
                                  "plot 'ablation.dat' using 2:xtic(1) title 'predicted (longseq)'" +
                                      std::string(any_published ? ", '' using 3 title 'published (source in report.md)'" : "")));
      figures.push_back({"ablation", "Maximum sequence length per sweep point (predicted beside published)",
                         title + ": maximum sequence length per point (PREDICTION)", bars.caption_note});
    }

    // Per-GPU memory at the peak, stacked by component.
    if (want("memory_breakdown")) {
      const auto& categories = kBreakdownColumns;
      const BarRows bars = bar_rows(table);
      std::string data;
      for (const SweepTableRow* row : bars.rows) {
        // The length is appended unless it is one of the point's axes, already in its label.
        const bool length_in_label = row->json.has("axes") && row->json["axes"].has("seqlen");
        data += data_label(length_in_label ? row->label : row->label + ", " + (row->seqlen > 0 ? seqlen_format(row->seqlen) : std::string("-")));
        for (const auto& [column, name] : categories) data += fmt::format(" {:.4f}", row->json.number_or(column, 0.0));
        data += "\n";
      }
      if (!data.empty()) {
        std::string plot;
        for (size_t i = 0; i < categories.size(); ++i)
          plot += fmt::format("{}'memory_breakdown.dat' using {}{} title '{}'", i ? ", " : "", i + 2, i ? "" : ":xtic(1)",
                              categories[i].second);
        file_write_text((staging / "memory_breakdown.dat").string(), data);
        file_write_text((staging / "memory_breakdown.gp").string(),
                        script_wrap("memory_breakdown",
                                    fmt::format("set style data histograms\nset style histogram rowstacked\n"
                                                "set style fill solid 0.85 border -1\nset boxwidth 0.75\nset ylabel 'GiB per GPU at the peak'\n"
                                                "set xlabel 'sweep point (its axis values, then the length)'\n"
                                                "set xtics rotate by -45 font ',{}'\nset key outside right\nset grid ytics\nplot {}",
                                                bars.rows.size() > 20 ? 7 : 9,
                                                plot)));
        const bool some_fit_nothing = std::any_of(bars.rows.begin(), bars.rows.end(), [](const SweepTableRow* row) { return row->seqlen <= 0; });
        std::string note = bars.caption_note;
        if (some_fit_nothing)
          note += std::string(note.empty() ? "" : " ") + "A length of '-' means no length fits: that bar is the predicted memory at the "
                  "shortest length, more than the card holds.";
        figures.push_back({"memory_breakdown", "Predicted per-GPU memory at the peak, by component",
                           title + ": predicted per-GPU memory at the peak", note});
      }
    }

    // Host memory per node where it is what binds at some point: the bars against the node's
    // usable host memory, since the GPU chart alone cannot show why those points stop.
    const bool host_binds = std::any_of(table.begin(), table.end(), [](const SweepTableRow& row) {
      return row.usable && row.json.string_or("binding_constraint", "").find("host memory") != std::string::npos;
    });
    if (want("host_memory") && host_binds) {
      const BarRows bars = bar_rows(table);
      std::string data;
      for (const SweepTableRow* row : bars.rows)
        data += fmt::format("{} {:.2f} {:.2f}\n", data_label(row->label), row->json.number_or("host_per_node_gib", 0.0),
                            row->json.number_or("host_capacity_gib", 0.0));
      file_write_text((staging / "host_memory.dat").string(), data);
      file_write_text((staging / "host_memory.gp").string(),
                      script_wrap("host_memory",
                                  std::string("set style data histograms\nset style fill solid 0.85 border -1\nset boxwidth 0.75\n"
                                              "set ylabel 'GiB of host memory per node'\nset xlabel 'sweep point'\nset yrange [0:*]\n"
                                              "set xtics rotate by -45 font ',9'\nset key below\nset bmargin 7\nset grid ytics\n"
                                              "plot 'host_memory.dat' using 2:xtic(1) title 'predicted per node', "
                                              "'' using 0:3 with linespoints lw 2 pt 7 title 'usable per node'")));
      figures.push_back({"host_memory", "Predicted host memory per node against the node's usable host memory (it binds at some points)",
                         title + ": host memory per node (PREDICTION)", bars.caption_note});
    }

    // Predicted against published, with the line of agreement.
    if (want("predicted_vs_published") && has_published) {
      std::string data;
      double low = 1e300, high = 0;
      const bool lengths = scenario.string_or("published_figure", "max_seqlen") == "max_seqlen";
      for (const SweepTableRow& row : table) {
        if (!row.published || !row.usable) continue;
        const double published = *row.published;
        const double predicted = lengths ? static_cast<double>(row.seqlen) : row.gpu_peak_gib;
        if ((lengths && predicted <= 0) || published <= 0) continue;
        data += fmt::format("{} {} {}\n", published, predicted, data_label(row.label));
        low = std::min({low, published, predicted});
        high = std::max({high, published, predicted});
      }
      if (!data.empty()) {
        const std::string unit = lengths ? "maximum sequence length (tokens)" : "peak memory (GiB)";
        file_write_text((staging / "predicted_vs_published.dat").string(), data);
        file_write_text((staging / "predicted_vs_published.gp").string(),
                        script_wrap("predicted_vs_published",
                                    fmt::format("{}set xrange [{}:{}]\nset yrange [{}:{}]\nset xlabel 'published {}'\n"
                                                "set ylabel 'predicted {}'\nset grid\nset key below\nset bmargin 6\n"
                                                "plot x with lines lc rgb 'gray' lw 2 title 'y = x (predicted equals published)', "
                                                "'predicted_vs_published.dat' using 1:2 with points pt 7 ps 1.6 "
                                                "title 'a published figure (label: its row of the sweep)', "
                                                "'' using 1:2:3 with labels offset 1,0.8 font ',8' notitle",
                                                lengths ? fmt::format("set logscale xy 10\nset format x '%.0s%c'\nset format y '%.0s%c'\n"
                                                                      "set xtics ({0})\nset ytics ({0})\n",
                                                                      log_ticks(low * 0.7, high * 1.4))
                                                        : "",
                                                low * 0.7, high * 1.4, low * 0.7, high * 1.4, unit, unit)));
        figures.push_back({"predicted_vs_published", "Predicted vs published, with y = x", title + ": predicted vs published", ""});
      }
    }
  } catch (...) {
    staging_directory_discard(staging);
    throw;
  }

  const fs::path figures_dir = figures_draw(dir, staging, figures, gnuplot_command);
  ReportOutcome outcome;
  std::string markdown = fmt::format("# {}\n\nPREDICTIONS of longseq (runtime profile `{}`), not measurements.\n\n",
                                     scenario.string_or("name", "sweep"), scenario.string_or("runtime_profile", ""));
  if (!scenario.string_or("description", "").empty()) markdown += scenario["description"].string() + "\n\n";
  if (!scenario.string_or("reproduces", "").empty()) markdown += "Reproduces: " + scenario["reproduces"].string() + "\n\n";
  if (!published_source.empty()) markdown += "Published values overlaid: " + published_source + "\n\n";
  for (const auto& figure : figures) {
    markdown += fmt::format("## {}\n\n![{}](figures/{}.png)\n\n([SVG](figures/{}.svg))\n\n", figure.caption, figure.caption,
                            figure.stem, figure.stem);
    if (!figure.note.empty()) markdown += figure.note + "\n\n";
    outcome.figures.push_back((figures_dir / (figure.stem + ".png")).string());
  }
  markdown += "## Results\n\n" + sweep_markdown_table(document, source) +
              "\nAll columns, machine-readable: [results.csv](results.csv), [results.json](results.json).\n";
  outcome.report_path = (dir / "report.md").string();
  output_directory_record(dir, {"report.md", "figures"});
  file_write_text(outcome.report_path, markdown);
  return outcome;
}

void run_result_check(const std::string& json_text, const std::string& source) {
  const Json document = json_parse(json_text, source);
  (void)run_result_read(JsonView(document, source));
}

void sweep_result_check(const std::string& json_text, const std::string& source) {
  const Json document = json_parse(json_text, source);
  const JsonView results(document, source);
  sweep_header_check(results);
  (void)sweep_table_read(results["rows"]);
  (void)series_of(results["rows"], "gpus");
  (void)sweep_markdown_table(document, source);
}

}  // namespace longseq
