#include "cli/commands.hpp"

#include <fmt/format.h>
#include <iostream>
#include <optional>
#include <nlohmann/json.hpp>

#include "io/text_escape.hpp"
#include "models/model_loader.hpp"
#include "planner/validation.hpp"

namespace longseq {

struct ValidateCommandArgs {
  std::string points;
  std::string profile;  // empty: per row (see point_validate)
  std::optional<double> reserve_gib;
  bool fit_reserve = false;
  bool json = false;
};

std::shared_ptr<ValidateCommandArgs> validate_command_register(CLI::App& app) {
  auto args = std::make_shared<ValidateCommandArgs>();
  CLI::App* command = app.add_subcommand(
      "validate",
      "Predict every figure of a published-measurements CSV (the format of tests/data/published_points.csv, whose header defines every column) and "
      "print predicted vs published with the relative error, then the median and worst error per figure kind");
  command->add_option("--points,-p", args->points, "CSV of published points (tests/data/published_points.csv: the ALST, FPDT, HF-blog, TRL and adapter rows; tests/data/ring_published.csv: the ring-attention rows)")->required();
  command->add_option("--profile", args->profile,
                      "runtime profile for every row (default: megatron-deepspeed for FPDT rows, deepspeed-hf otherwise)");
  command->add_option("--reserve-gib", args->reserve_gib,
                      "replace the profiles' calibrated reserve (GiB) for every row: how the fit was made and how "
                      "sensitive the errors are to it")
      ->check(CLI::Range(0.0, 1024.0));
  command->add_flag("--fit-reserve", args->fit_reserve,
                    "fit each runtime profile's calibrated reserve to the CSV's memory figures (maximum lengths and "
                    "peaks) and show the evidence and the fit's sensitivity instead of the table; slow (a minute)");
  command->add_flag("--json", args->json, "print JSON (per row, with its CSV line, and the summary)");
  return args;
}

namespace {

std::string figure_value_format(FigureKind kind, double value) {
  switch (kind) {
    case FigureKind::figure_max_seqlen: return fmt::format("{:.0f}", value);
    case FigureKind::figure_mfu: return fmt::format("{:.3f}", value);
    case FigureKind::figure_attention_time: return fmt::format("{:.4f}", value);
    default: return fmt::format("{:.1f}", value);
  }
}

std::string published_format(const FigureComparison& figure) {
  if (figure.kind == FigureKind::figure_max_seqlen && figure.published_fail > 0)
    return fmt::format("[{:.0f},{:.0f})", figure.published, figure.published_fail);
  return figure_value_format(figure.kind, figure.published);
}

}  // namespace

namespace {

// The fit's grid: 0 to 40 GiB (half a card of the largest here) in steps of 0.5 GiB.
constexpr double kReserveFitMaxGib = 40.0;

// The fit of each profile's reserve with the evidence behind it, then how the profile's errors
// move when the reserve moves around the fit.
int reserve_fit_print(const ValidateCommandArgs& args, const std::vector<PublishedPoint>& points) {
  std::cerr << "longseq validate: fitting the calibrated reserve (each row at 81 reserves)...\n";
  const std::vector<ReserveFit> fits = reserve_fit(points, kReserveFitMaxGib, 0.5);
  nlohmann::json json_fits = nlohmann::json::array();
  for (const auto& fit : fits) {
    nlohmann::json evidence = nlohmann::json::array();
    if (!args.json) {
      fmt::print("runtime profile {}: calibrated reserve fitted to {:g} GiB (least total distance to the rows' intervals)\n",
                 fit.profile, fit.reserve_gib);
      fmt::print("  {:>5}  {:<20} {:<22} {:>5}  {:<16} {}\n", "line", "source", "model", "gpus", "figure", "reserves reproducing it (GiB)");
    }
    for (const auto& e : fit.evidence) {
      std::string interval = !e.informative ? "none in 0-40 (uninformative)"
                             : e.low_gib == e.high_gib ? fmt::format("{:.1f}", e.low_gib)
                                                       : fmt::format("{:.1f} to {:.1f}", e.low_gib, e.high_gib);
      if (e.host_bound_below_gib > 0)
        interval += fmt::format(" (host memory sets a maximum too long below {:.1f}: a bound from above only)", e.host_bound_below_gib);
      if (!args.json)
        fmt::print("  {:>5}  {:<20.20} {:<22.22} {:>5}  {:<16} {}\n", e.point.line, e.point.source, e.point.model, e.point.gpus,
                   figure_kind_name(e.kind), interval);
      nlohmann::json entry = {{"line", e.point.line}, {"figure", figure_kind_name(e.kind)}, {"informative", e.informative}};
      if (e.informative) entry["reserve_gib"] = {e.low_gib, e.high_gib};
      if (e.host_bound_below_gib > 0) entry["host_bound_below_gib"] = e.host_bound_below_gib;
      evidence.push_back(entry);
    }
    // Sensitivity: the profile's own rows with its reserve moved by -4..+4 GiB (grid points of the fit).
    nlohmann::json sensitivity = nlohmann::json::array();
    if (!args.json) fmt::print("  sensitivity (this profile's rows):  reserve GiB   max_seqlen median   peak_memory median\n");
    for (double delta : {-4.0, -2.0, -1.0, 0.0, 1.0, 2.0, 4.0}) {
      const double reserve = fit.reserve_gib + delta;
      if (reserve < 0 || reserve > kReserveFitMaxGib) continue;
      const ReserveSensitivity errors = reserve_fit_sensitivity(fit, reserve);
      if (!args.json)
        fmt::print("  {:>48.1f} {:>18.1f}% {:>19.1f}%\n", reserve, 100.0 * errors.max_seqlen_median_abs_error,
                   100.0 * errors.peak_memory_median_abs_error);
      sensitivity.push_back({{"reserve_gib", reserve}, {"max_seqlen_median_abs_error", errors.max_seqlen_median_abs_error},
                             {"peak_memory_median_abs_error", errors.peak_memory_median_abs_error}});
    }
    if (!args.json) fmt::print("\n");
    json_fits.push_back({{"runtime_profile", fit.profile}, {"reserve_gib", fit.reserve_gib}, {"evidence", evidence}, {"sensitivity", sensitivity}});
  }
  if (args.json)
    std::cout << json_text(nlohmann::json{{"schema_version", 1}, {"command", "validate"}, {"kind", "calibrated reserve fit"},
                                          {"points", args.points}, {"fits", json_fits}})
              << "\n";
  return 0;
}

}  // namespace

int validate_command_run(const ValidateCommandArgs& args) {
  if (!args.profile.empty()) runtime_profile_load(args.profile);  // a bad name fails before any row
  std::string profile_label = args.profile.empty() ? "per row: fsdp2-accelerate for fsdp2, unsloth for rows from Unsloth, hf-trainer for hf_bf16, lora, qlora and adam8bit, megatron-deepspeed for FPDT, deepspeed-hf otherwise" : args.profile;
  if (args.reserve_gib) profile_label += fmt::format("; calibrated reserve replaced by {:g} GiB", *args.reserve_gib);
  const std::vector<PublishedPoint> points = published_points_parse(file_read_text(args.points), args.points);
  if (args.fit_reserve) return reserve_fit_print(args, points);
  std::vector<PointValidation> validations;
  for (const auto& point : points) validations.push_back(point_validate(point, args.profile, args.reserve_gib));
  const std::vector<FigureSummary> summaries = validation_summarize(validations);

  if (args.json) {
    nlohmann::json rows = nlohmann::json::array();
    for (const auto& validation : validations) {
      nlohmann::json row = {{"line", validation.point.line}, {"source", validation.point.source},
                            {"model", validation.point.model}, {"gpus", validation.point.gpus}};
      // The same keys on every row (docs/json/validate.schema.json): a skipped row has its reason
      // and no plan or figures.
      row["skipped"] = validation.skipped_reason.empty() ? nlohmann::json(nullptr) : nlohmann::json(validation.skipped_reason);
      row["plan"] = nullptr;
      row["runtime_profile"] = nullptr;
      row["figures"] = nlohmann::json::array();
      if (validation.skipped_reason.empty()) {
        row["plan"] = validation.plan;
        row["runtime_profile"] = validation.profile;
        for (const auto& figure : validation.figures) {
          nlohmann::json entry = {{"figure", figure_kind_name(figure.kind)}, {"published", figure.published},
                                  {"predicted", figure.predicted}, {"relative_error", figure.relative_error},
                                  {"published_fail", figure.published_fail > 0 ? nlohmann::json(figure.published_fail) : nullptr},
                                  {"binding_constraint", figure.binding_constraint.empty() ? nlohmann::json(nullptr)
                                                                                           : nlohmann::json(figure.binding_constraint)}};
          row["figures"].push_back(entry);
        }
      }
      rows.push_back(row);
    }
    nlohmann::json summary = nlohmann::json::array();
    for (const auto& s : summaries)
      summary.push_back({{"figure", figure_kind_name(s.kind)}, {"rows", s.count}, {"median_abs_error", s.median_abs_error},
                         {"worst_abs_error", s.worst_abs_error}, {"worst_line", s.worst_line}});
    std::cout << json_text(nlohmann::json{{"schema_version", 1}, {"command", "validate"}, {"kind", "prediction vs published"},
                                          {"points", args.points}, {"runtime_profile", profile_label}, {"rows", rows}, {"summary", summary}})
              << "\n";
    return 0;
  }

  fmt::print("longseq validate: PREDICTIONS (runtime profile: {}) against the published figures in {}\n\n", profile_label, args.points);
  fmt::print("{:>5}  {:<20} {:<22} {:>5}  {:<17} {:>20} {:>12} {:>8}\n", "line", "source", "model", "gpus", "figure",
             "published", "predicted", "error");
  std::string skipped;
  for (const auto& validation : validations) {
    const PublishedPoint& point = validation.point;
    if (!validation.skipped_reason.empty()) {
      skipped += fmt::format("  line {:>3} {:<20} {}: {}\n", point.line, point.source, point.model, validation.skipped_reason);
      continue;
    }
    for (const auto& figure : validation.figures)
      fmt::print("{:>5}  {:<20.20} {:<22.22} {:>5}  {:<17} {:>20} {:>12} {:>+7.1f}%\n", point.line, point.source, point.model,
                 point.gpus, figure_kind_name(figure.kind), published_format(figure),
                 figure_value_format(figure.kind, figure.predicted), 100.0 * figure.relative_error);
  }
  if (!skipped.empty()) fmt::print("\nskipped rows:\n{}", skipped);
  fmt::print("\nsummary (|relative error|; a predicted maximum inside a published [fits, fails) bracket counts as 0)\n");
  fmt::print("  {:<17} {:>5} {:>10} {:>10} {:>6}\n", "figure", "rows", "median", "worst", "line");
  for (const auto& s : summaries)
    fmt::print("  {:<17} {:>5} {:>9.1f}% {:>9.1f}% {:>6}\n", figure_kind_name(s.kind), s.count, 100.0 * s.median_abs_error,
               100.0 * s.worst_abs_error, s.worst_line);
  return 0;
}

}  // namespace longseq
