#include "reports/report.hpp"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fmt/format.h>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <unistd.h>

#include "models/config_error.hpp"
#include "models/model_loader.hpp"
#include "planner/units.hpp"
#include "reports/sweep_output.hpp"

namespace longseq {

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;


std::string quoted(const std::string& text) {
  std::string out = "\"";
  for (char c : text) out += c == '"' ? '\'' : c;
  return out + "\"";
}

// Every figure is drawn twice by one script: PNG, then SVG.
std::string script_wrap(const std::string& stem, const std::string& body) {
  return fmt::format(
      "set terminal pngcairo size 1100,680 noenhanced font ',11'\nset output '{0}.png'\n{1}\n"
      "set terminal svg size 1100,680 noenhanced font ',11'\nset output '{0}.svg'\nreplot\nunset output\n",
      stem, body);
}

// Rows grouped into series by every axis except `except`, in first-seen order.
std::vector<std::pair<std::string, std::vector<const Json*>>> series_of(const Json& rows, const std::string& except) {
  std::vector<std::pair<std::string, std::vector<const Json*>>> series;
  for (const auto& row : rows) {
    std::string key;
    for (const auto& [axis, value] : row["axes"].items())
      if (axis != except) key += fmt::format("{}{}={}", key.empty() ? "" : ", ", axis, value.get<std::string>());
    if (key.empty()) key = "predicted";
    auto found = std::find_if(series.begin(), series.end(), [&](const auto& s) { return s.first == key; });
    if (found == series.end()) series.push_back({key, {&row}});
    else found->second.push_back(&row);
  }
  return series;
}

std::string row_label(const Json& row) {
  std::string label;
  for (const auto& [axis, value] : row["axes"].items()) {
    if (!label.empty()) label += ' ';
    label += value.get<std::string>();
  }
  return label.empty() ? row.value("plan", std::string("plan")) : label;
}

bool usable(const Json& row) { return row.value("error", std::string()).empty() && row.contains("gpu_peak_gib"); }

// Runs gnuplot on every STEM.gp in `staging`, then moves the staging directory into place as
// DIR/figures (replacing an older one) only when all were drawn. Throws ConfigError naming the
// script that failed.
fs::path figures_draw(const fs::path& dir, const fs::path& staging, const std::vector<std::string>& stems, const std::string& gnuplot_command) {
  std::error_code error;
  for (const auto& stem : stems) {
    const std::string command = fmt::format("cd {} && {} {}.gp > {}.log 2>&1", quoted(staging.string()), gnuplot_command, stem, stem);
    if (std::system(command.c_str()) != 0) {
      const std::string log = file_read_text((staging / (stem + ".log")).string());
      fs::remove_all(staging, error);
      throw ConfigError(stem + ".gp", "", fmt::format("gnuplot failed: {}", log.substr(0, 400)));
    }
    fs::remove(staging / (stem + ".log"), error);
  }
  const fs::path figures_dir = dir / "figures";
  fs::remove_all(figures_dir, error);
  fs::rename(staging, figures_dir, error);
  if (error) throw ConfigError(figures_dir.string(), "", "cannot move the figures into place");
  return figures_dir;
}

fs::path staging_make(const fs::path& dir) {
  const fs::path staging = dir / fmt::format("figures.partial-{}", getpid());
  std::error_code error;
  fs::remove_all(staging, error);
  fs::create_directories(staging, error);
  if (error) throw ConfigError(staging.string(), "", "cannot create the figures directory");
  return staging;
}

// A run's result (`longseq run --json`, or `longseq launch`'s run.json): the loss per step (beside
// the one-rank replica's when it was compared) and the measured peak of every rank against the
// planner's prediction.
ReportOutcome run_report_write(const fs::path& dir, const fs::path& run_path, const std::string& gnuplot_command) {
  Json run;
  try {
    run = Json::parse(file_read_text(run_path.string()));
  } catch (const Json::parse_error& error) {
    throw ConfigError(run_path.string(), "", fmt::format("malformed JSON: {}", error.what()));
  }
  if (!run.contains("steps") || !run["steps"].is_array() || run["steps"].empty() || !run.contains("predicted_peak_mib"))
    throw ConfigError(run_path.string(), "steps", "not a longseq run result (write one with `longseq run --json` or `longseq launch`)");
  const fs::path staging = staging_make(dir);
  const bool compared = run["steps"][0].contains("loss_on_one_rank");
  std::string data;
  for (const auto& step : run["steps"])
    data += fmt::format("{} {} {}\n", step["step"].get<int64_t>(), step["loss"].get<double>(), step.value("loss_on_one_rank", 0.0));
  file_write_text((staging / "loss.dat").string(), data);
  file_write_text((staging / "loss.gp").string(),
                  script_wrap("loss", fmt::format("set title 'Training loss per step: {}, {} tokens, {} rank(s) (MEASURED)'\n"
                                                  "set xlabel 'step'\nset xtics 1\nset ylabel 'loss'\nset grid\nset key top right\n"
                                                  "plot 'loss.dat' using 1:2 with linespoints lw 2 title '{} rank(s)'{}",
                                                  run.value("model", std::string()), run.value("seqlen", 0), run.value("ranks", 1),
                                                  run.value("ranks", 1),
                                                  compared ? ", '' using 1:3 with linespoints dt 2 title 'one unsharded rank'" : "")));
  const fs::path figures_dir = figures_draw(dir, staging, {"loss"}, gnuplot_command);

  std::string markdown = fmt::format("# Run: {} at {} tokens\n\n", run.value("model", std::string()), run.value("seqlen", 0));
  markdown += fmt::format("MEASURED on {}; the PREDICTION is the planner's (runtime profile `{}`) for the same plan.\n\n",
                          run.value("measured_on", std::string("the machine that wrote run.json")),
                          run.value("profile", std::string("native")));
  markdown += fmt::format("Plan: {}; {} rank(s) = Ulysses sp={} x data parallel dp={}.\n\n", run.value("plan", std::string("?")),
                          run.value("ranks", 1), run.value("sp", 1), run.value("dp", 1));
  markdown += "## Loss\n\n![Loss per step](figures/loss.png)\n\n([SVG](figures/loss.svg))\n\n";
  markdown += compared ? "| step | loss | loss on one rank | seconds | tokens/s |\n|---:|---:|---:|---:|---:|\n"
                       : "| step | loss | seconds | tokens/s |\n|---:|---:|---:|---:|\n";
  for (const auto& step : run["steps"]) {
    markdown += fmt::format("| {} | {:.4f} |", step["step"].get<int64_t>(), step["loss"].get<double>());
    if (compared) markdown += fmt::format(" {:.4f} |", step["loss_on_one_rank"].get<double>());
    markdown += fmt::format(" {:.3f} | {:.0f} |\n", step["seconds"].get<double>(), step["tokens_per_s"].get<double>());
  }
  const double predicted = run["predicted_peak_mib"].get<double>();
  markdown += fmt::format("\n## Peak device memory per rank\n\nPREDICTED: {:.3f} MiB ({}).\n\n| rank | MEASURED MiB | difference |\n|---:|---:|---:|\n",
                          predicted, run.value("predicted_peak_moment", std::string()));
  const Json per_rank = run.contains("measured_peak_mib_per_rank") ? run["measured_peak_mib_per_rank"]
                                                                   : Json::array({run.value("measured_peak_mib", 0.0)});
  for (size_t rank = 0; rank < per_rank.size(); ++rank) {
    const double measured = per_rank[rank].get<double>();
    markdown += fmt::format("| {} | {:.3f} | {:+.2f}% |\n", rank, measured, measured > 0 ? 100.0 * (predicted - measured) / measured : 0.0);
  }
  if (run.contains("measured_outside_arena_mib"))
    markdown += fmt::format("\nOutside the arena (CUDA context, cuBLAS workspace, NCCL buffers): MEASURED {:.1f} MiB (cudaMemGetInfo "
                            "after the last step, rank 0), PREDICTED {:.1f} MiB.\n",
                            run["measured_outside_arena_mib"].get<double>(), run["predicted_outside_arena_mib"].get<double>());
  if (run.contains("budget_mib")) markdown += fmt::format("\nBudget: {:.1f} MiB per rank.\n", run["budget_mib"].get<double>());
  ReportOutcome outcome;
  outcome.figures.push_back((figures_dir / "loss.png").string());
  outcome.report_path = (dir / "report.md").string();
  file_write_text(outcome.report_path, markdown);
  return outcome;
}

}  // namespace

ReportOutcome report_write(const std::string& results_dir, const std::string& gnuplot_command) {
  const fs::path dir(results_dir);
  const fs::path results_path = dir / "results.json";
  // A run's result (longseq launch's run.json) gets the run report; a sweep's, the sweep report.
  if (!fs::exists(results_path) && fs::exists(dir / "run.json")) return run_report_write(dir, dir / "run.json", gnuplot_command);
  Json results;
  try {
    results = Json::parse(file_read_text(results_path.string()));
  } catch (const Json::parse_error& error) {
    throw ConfigError(results_path.string(), "", fmt::format("malformed JSON: {}", error.what()));
  }
  if (!results.contains("rows") || !results["rows"].is_array() || !results.contains("scenario"))
    throw ConfigError(results_path.string(), "rows", "not a longseq sweep result (run `longseq sweep` first)");
  const Json& rows = results["rows"];
  const Json& scenario = results["scenario"];
  const std::string title = scenario.value("reproduces", std::string()).empty() ? scenario.value("name", std::string("sweep"))
                                                                                 : scenario["reproduces"].get<std::string>();
  const std::string published_source = scenario.value("published_source", std::string());
  // The scenario may name the figures it wants; otherwise every one that applies is drawn.
  std::set<std::string> wanted;
  if (scenario.contains("figures"))
    for (const auto& name : scenario["figures"]) wanted.insert(name.get<std::string>());
  auto want = [&](const char* name) { return wanted.empty() || wanted.count(name) > 0; };

  const fs::path staging = staging_make(dir);

  struct Figure {
    std::string stem, caption;
  };
  std::vector<Figure> figures;
  std::set<std::string> gpu_counts;
  bool max_mode = false, has_published = false, has_steps = false;
  for (const auto& row : rows) {
    if (!usable(row)) continue;
    gpu_counts.insert(std::to_string(row["gpus"].get<int64_t>()));
    max_mode |= row["mode"] == "max_seqlen";
    has_published |= row.contains("published");
    has_steps |= !row["step"].get<std::string>().empty();
  }

  // Maximum sequence length against GPU count, log-log, as the ALST paper draws its scaling.
  if (want("max_seqlen_vs_gpus") && max_mode && gpu_counts.size() >= 2) {
    std::set<double> gpu_values;
    for (const auto& count : gpu_counts) gpu_values.insert(std::stod(count));
    // Per series: a block of predictions, then a block of its published points (value to
    // value_fail as an error bar where the source gives a bracket), drawn in the series' colour.
    std::string data, plot;
    int index = 0, series_number = 0;
    bool published_titled = false;
    for (const auto& [name, members] : series_of(rows, "gpus")) {
      ++series_number;
      std::string predicted, published;
      for (const Json* row : members) {
        if (usable(*row) && (*row)["seqlen"].get<int64_t>() > 0)
          predicted += fmt::format("{} {}\n", (*row)["gpus"].get<int64_t>(), (*row)["seqlen"].get<int64_t>());
        if (row->contains("published"))
          published += fmt::format("{} {} {}\n", (*row)["gpus"].get<int64_t>(), (*row)["published"].get<double>(),
                                   row->value("published_fail", (*row)["published"].get<double>()));
      }
      data += predicted + "\n\n";
      plot += fmt::format("{}'max_seqlen_vs_gpus.dat' index {} using 1:2 with linespoints lt {} lw 2 pt 7 title {}",
                          plot.empty() ? "" : ", ", index++, series_number,
                          quoted(name == "predicted" ? "predicted (longseq)" : name + " (predicted)"));
      if (published.empty()) continue;
      data += published + "\n\n";
      plot += fmt::format(", 'max_seqlen_vs_gpus.dat' index {} using 1:2:2:3 with yerrorbars lt {} pt 9 ps 2 {}", index++,
                          series_number,
                          published_titled ? "notitle" : "title 'published (triangles; bars: [fits, fails) brackets)'");
      published_titled = true;
    }
    file_write_text((staging / "max_seqlen_vs_gpus.dat").string(), data);
    file_write_text((staging / "max_seqlen_vs_gpus.gp").string(),
               script_wrap("max_seqlen_vs_gpus",
                           fmt::format("set title {}\nset logscale x 2\nset logscale y 10\nset xrange [{}:{}]\nset xlabel 'GPUs'\n"
                                       "set ylabel 'maximum sequence length (tokens)'\nset format y '%.0s%c'\n"
                                       "set key top left box opaque\nset grid\nplot {}",
                                       quoted(title + " — PREDICTION (longseq)"), *gpu_values.begin() / 1.3,
                                       *gpu_values.rbegin() * 1.3, plot)));
    figures.push_back({"max_seqlen_vs_gpus", "Maximum sequence length vs GPU count (predicted; published points where cited)"});
  }

  // The feature ladder as bars, predicted beside published.
  if (want("ablation") && max_mode && has_steps) {
    std::string data;
    for (const auto& row : rows)
      if (usable(row))
        data += fmt::format("{} {} {}\n", quoted(row_label(row)), row["seqlen"].get<int64_t>(),
                            row.contains("published") ? fmt::format("{}", row["published"].get<double>()) : "NaN");
    file_write_text((staging / "ablation.dat").string(), data);
    file_write_text((staging / "ablation.gp").string(),
               script_wrap("ablation",
                           fmt::format("set title {}\nset style data histograms\nset style histogram clustered gap 1\n"
                                       "set style fill solid 0.85 border -1\nset logscale y 10\nset format y '%.0s%c'\n"
                                       "set ylabel 'maximum sequence length (tokens)'\nset xtics rotate by -25\nset grid ytics\n"
                                       "set key top left\nplot 'ablation.dat' using 2:xtic(1) title 'predicted (longseq)', "
                                       "'' using 3 title 'published (source in report.md)'",
                                       quoted(title + " — feature ladder"))));
    figures.push_back({"ablation", "Feature ladder: maximum sequence length per step (predicted beside published)"});
  }

  // Per-GPU memory at the peak, stacked by component.
  if (want("memory_breakdown")) {
    const std::vector<std::pair<std::string, std::string>> categories = {
        {"model_states_gib", "model states"},   {"zero_buffers_gib", "ZeRO buffers"},
        {"activation_checkpoints_gib", "checkpoints"}, {"layer_working_set_gib", "layer working set"},
        {"logits_and_loss_gib", "logits and loss"},   {"inputs_gib", "inputs"},
        {"runtime_overheads_gib", "runtime"},         {"calibrated_overhead_gib", "calibrated overhead"}};
    std::string data;
    for (const auto& row : rows) {
      if (!usable(row)) continue;
      data += quoted(row_label(row) + ", " + seqlen_format(row["seqlen"].get<int64_t>()));
      for (const auto& [column, name] : categories) data += fmt::format(" {:.4f}", row.value(column, 0.0));
      data += "\n";
    }
    if (!data.empty()) {
      std::string plot;
      for (size_t i = 0; i < categories.size(); ++i)
        plot += fmt::format("{}'memory_breakdown.dat' using {}{} title {}", i ? ", " : "", i + 2, i ? "" : ":xtic(1)",
                            quoted(categories[i].second));
      file_write_text((staging / "memory_breakdown.dat").string(), data);
      file_write_text((staging / "memory_breakdown.gp").string(),
                 script_wrap("memory_breakdown",
                             fmt::format("set title {}\nset style data histograms\nset style histogram rowstacked\n"
                                         "set style fill solid 0.85 border -1\nset boxwidth 0.75\nset ylabel 'GiB per GPU at the peak'\n"
                                         "set xtics rotate by -30 font ',9'\nset key outside right\nset grid ytics\nplot {}",
                                         quoted(title + " — predicted per-GPU memory"), plot)));
      figures.push_back({"memory_breakdown", "Predicted per-GPU memory at the peak, by component"});
    }
  }

  // Predicted against published, with the line of agreement.
  if (want("predicted_vs_published") && has_published) {
    std::string data;
    double low = 1e300, high = 0;
    const bool lengths = scenario.value("published_figure", std::string("max_seqlen")) == "max_seqlen";
    for (const auto& row : rows) {
      if (!row.contains("published") || !usable(row)) continue;
      const double published = row["published"].get<double>();
      const double predicted = lengths ? static_cast<double>(row["seqlen"].get<int64_t>()) : row["gpu_peak_gib"].get<double>();
      if (lengths && predicted <= 0) continue;
      data += fmt::format("{} {} {}\n", published, predicted, quoted(row_label(row)));
      low = std::min({low, published, predicted});
      high = std::max({high, published, predicted});
    }
    if (!data.empty()) {
      const std::string unit = lengths ? "maximum sequence length (tokens)" : "peak memory (GiB)";
      file_write_text((staging / "predicted_vs_published.dat").string(), data);
      file_write_text((staging / "predicted_vs_published.gp").string(),
                 script_wrap("predicted_vs_published",
                             fmt::format("set title {}\n{}set xrange [{}:{}]\nset yrange [{}:{}]\nset xlabel 'published {}'\n"
                                         "set ylabel 'predicted {}'\nset grid\nset key top left\n"
                                         "plot x with lines lc rgb 'gray' title 'y = x', "
                                         "'predicted_vs_published.dat' using 1:2 with points pt 7 ps 1.6 title 'rows', "
                                         "'' using 1:2:3 with labels offset 1,0.8 font ',8' notitle",
                                         quoted(title + " — predicted vs published"),
                                         lengths ? "set logscale xy 10\nset format x '%.0s%c'\nset format y '%.0s%c'\n" : "",
                                         low * 0.7, high * 1.4, low * 0.7, high * 1.4, unit, unit)));
      figures.push_back({"predicted_vs_published", "Predicted vs published, with y = x"});
    }
  }

  std::vector<std::string> stems;
  for (const auto& figure : figures) stems.push_back(figure.stem);
  const fs::path figures_dir = figures_draw(dir, staging, stems, gnuplot_command);
  ReportOutcome outcome;
  std::string markdown = fmt::format("# {}\n\nPREDICTIONS of longseq (runtime profile `{}`), not measurements.\n\n",
                                     scenario.value("name", std::string("sweep")), scenario.value("runtime_profile", std::string()));
  if (!scenario.value("description", std::string()).empty()) markdown += scenario["description"].get<std::string>() + "\n\n";
  if (!scenario.value("reproduces", std::string()).empty()) markdown += "Reproduces: " + scenario["reproduces"].get<std::string>() + "\n\n";
  if (!published_source.empty()) markdown += "Published values overlaid: " + published_source + "\n\n";
  for (const auto& figure : figures) {
    markdown += fmt::format("## {}\n\n![{}](figures/{}.png)\n\n([SVG](figures/{}.svg))\n\n", figure.caption, figure.caption,
                            figure.stem, figure.stem);
    outcome.figures.push_back((figures_dir / (figure.stem + ".png")).string());
  }
  markdown += "## Results\n\n" + sweep_markdown_table(results) +
              "\nAll columns, machine-readable: [results.csv](results.csv), [results.json](results.json).\n";
  outcome.report_path = (dir / "report.md").string();
  file_write_text(outcome.report_path, markdown);
  return outcome;
}

}  // namespace longseq
