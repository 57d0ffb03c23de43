#include "reports/sweep_output.hpp"

#include <filesystem>
#include <fmt/format.h>
#include <cmath>

#include "io/text_escape.hpp"
#include "io/checked_input.hpp"
#include "io/config_error.hpp"
#include "io/output_files.hpp"
#include "models/layer_inventory.hpp"
#include "models/model_loader.hpp"
#include "planner/memory_model.hpp"
#include "planner/units.hpp"
#include "reports/memory_report.hpp"

namespace longseq {

namespace {

const std::vector<std::string> kCategories = {kCategoryModelStates, kCategoryZero,    kCategoryCheckpoints, kCategoryLayer,
                                              kCategoryLoss,        kCategoryInputs,  kCategoryRuntime,     kCategoryCalibrated};

std::string csv_escape(const std::string& text) {
  if (text.find_first_of(",\"\n") == std::string::npos) return text;
  std::string quoted = "\"";
  for (char c : text) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
  return quoted + "\"";
}

std::string json_cell_to_text(const nlohmann::json& value) {
  if (value.is_null()) return "";
  if (value.is_string()) return value.get<std::string>();
  if (value.is_boolean()) return value.get<bool>() ? "true" : "false";
  if (value.is_number_integer()) return value.dump();  // int64 or uint64, as written
  if (value.is_number()) return fmt::format("{:.6g}", value.get<double>());
  return value.dump();  // a list or an object in a hand-edited file: shown, not trusted
}


}  // namespace

const std::vector<std::string>& sweep_output_names() {
  static const std::vector<std::string> names = {"results.csv", "results.json", "results.md", "report.md", "figures"};
  return names;
}

const std::vector<std::string>& sweep_columns() {
  static const std::vector<std::string> columns = [] {
    std::vector<std::string> names = {"model", "gpu", "gpus", "nodes", "step", "framework", "plan", "sp", "ring", "dp", "zero_stage",
                                      "offload_optimizer", "offload_params", "activation_checkpointing",
                                      "checkpoint_offload", "tiled_mlp", "tiled_loss", "fpdt_chunk_tokens", "mode", "seqlen",
                                      "seqlen_shortest", "seqlen_longest", "fits", "binding_constraint", "gpu_peak_gib", "gpu_capacity_gib", "host_per_node_gib",
                                      "host_capacity_gib"};
    for (const auto& category : kCategories) names.push_back(std::string(category) + "_gib");
    for (const char* name : {"step_s", "tflops_hardware", "tflops_megatron", "mfu", "tokens_per_s", "cost_per_billion_tokens", "published",
                             "published_fail", "error"})
      names.push_back(name);
    return names;
  }();
  return columns;
}

nlohmann::json sweep_results_to_json(const Scenario& scenario, const std::vector<SweepRow>& rows) {
  nlohmann::json rows_json = nlohmann::json::array();
  for (const SweepRow& row : rows) {
    nlohmann::json json;
    json["model"] = row.model;
    json["gpu"] = row.gpu;
    json["gpus"] = row.gpus;
    json["nodes"] = row.nodes;
    json["step"] = row.step;
    json["framework"] = row.framework;
    nlohmann::json axes = nlohmann::json::object();
    for (const auto& [axis, value] : row.axes) axes[axis] = value;
    json["axes"] = axes;
    if (row.plan) {
      const PlanOptions& plan = *row.plan;
      json["plan"] = plan_describe(plan);
      json["tp"] = plan.tp;
      json["pp"] = plan.pp;
      json["ep"] = plan.ep;
      json["vpp"] = plan.vpp;
      json["sp"] = plan.sp;
      json["ring"] = plan.ring;
      json["dp"] = row.gpus / plan.model_parallel_ranks();
      json["zero_stage"] = plan.zero_stage;
      json["offload_optimizer"] = plan.offload_optimizer;
      json["offload_params"] = plan.offload_params;
      json["activation_checkpointing"] = plan.activation_checkpointing;
      json["checkpoint_offload"] = plan.checkpoint_offload;
      json["tiled_mlp"] = plan.tiled_mlp;
      json["tiled_loss"] = plan.tiled_loss;
      json["fpdt_chunk_tokens"] = plan.fpdt ? nlohmann::json(plan.fpdt_chunk_tokens) : nlohmann::json(nullptr);
    }
    json["mode"] = row.mode;
    json["seqlen"] = row.seqlen;
    if (row.mode == "max_seqlen" && row.error.empty()) {
      json["seqlen_shortest"] = row.seqlen_shortest;
      json["seqlen_longest"] = row.seqlen_longest;
    }
    json["fits"] = row.fits;
    json["binding_constraint"] = row.binding_constraint;
    if (row.error.empty()) {
      json["gpu_peak_gib"] = row.gpu_peak_gib;
      json["gpu_capacity_gib"] = row.gpu_capacity_gib;
      json["host_per_node_gib"] = row.host_per_node_gib;
      json["host_capacity_gib"] = row.host_capacity_gib;
      for (const auto& category : kCategories) {
        double gib = 0;
        for (const auto& [name, value] : row.gpu_category_gib)
          if (name == category) gib = value;
        json[std::string(category) + "_gib"] = gib;
      }
    }
    if (row.step_s > 0) {
      json["step_s"] = row.step_s;
      json["tflops_hardware"] = row.tflops_hardware;
      json["tflops_megatron"] = row.tflops_megatron;
      json["mfu"] = row.mfu;
      json["tokens_per_s"] = row.tokens_per_s;
      if (row.cost_per_billion_tokens > 0) json["cost_per_billion_tokens"] = row.cost_per_billion_tokens;
    }
    if (row.published) {
      json["published"] = *row.published;
      if (row.published_fail > 0) json["published_fail"] = row.published_fail;
    }
    json["error"] = row.error;
    rows_json.push_back(json);
  }
  // schema_version and its keys: docs/json/sweep.schema.json (a change to either is a new version).
  return {{"schema_version", 1},
          {"command", "sweep"},
          {"kind", "prediction"},
          {"scenario",
           {{"name", scenario.name}, {"path", scenario.path}, {"description", scenario.description},
            {"reproduces", scenario.reproduces}, {"runtime_profile", scenario.runtime_profile_given ? scenario.runtime_profile : "each point's framework's own (deepspeed-hf without one)"},
            {"published_source", scenario.published_source}, {"published_figure", scenario.published_figure},
            {"figures", scenario.output_figures},
            {"gpu_hour_cost", scenario.gpu_hour_cost > 0 ? nlohmann::json(scenario.gpu_hour_cost) : nlohmann::json(nullptr)}}},
          {"columns", sweep_columns()},
          {"rows", rows_json}};
}

std::string sweep_markdown_table(const nlohmann::json& results, const std::string& source) {
  // A priced scenario (gpu_hour_cost) adds the cost of a billion tokens at each point.
  const JsonView scenario = JsonView(results, source)["scenario"];
  const bool priced = scenario.has("gpu_hour_cost") && !scenario["gpu_hour_cost"].raw().is_null();
  std::string out = "| model | gpu | gpus | step | framework | plan | mode | seqlen | band | fits | GPU peak GiB | host GiB/node | step time | "
                    "tokens/s | TFLOPS (ALST formula) |";
  out += priced ? fmt::format(" cost per 1B tokens (at {:g} a GPU-hour) |", scenario["gpu_hour_cost"].number()) : std::string();
  out += " published |\n";
  out += std::string("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|") + (priced ? "---|" : "") + "---|\n";
  const JsonView rows = JsonView(results, source)["rows"];
  for (size_t i = 0; i < rows.size(); ++i) {
    const JsonView row = rows[i];
    auto cell = [&](const char* key) { return row.has(key) ? json_cell_to_text(row[key].raw()) : std::string(); };
    auto number = [&](const char* key, const char* format) {
      return row.has(key) ? fmt::format(fmt::runtime(format), row[key].number()) : std::string();
    };
    const bool max_mode = cell("mode") == "max_seqlen";
    const int64_t tokens = row["seqlen"].integer();
    std::string seqlen = tokens > 0 ? integer_with_commas(tokens) : "";
    if (!cell("error").empty()) seqlen = fmt::format("— ({})", cell("error"));
    std::string published;
    if (row.has("published")) {
      const double value = row["published"].number();
      const std::optional<int64_t> whole = whole_number(std::round(value), INT64_MIN, INT64_MAX);
      published = max_mode && whole ? integer_with_commas(*whole) : fmt::format("{:.1f}", value);
    }
    std::string band;
    if (max_mode && row.has("seqlen_longest") && row["seqlen_longest"].integer() > 0)
      band = seqlen_format(row["seqlen_shortest"].integer()) + " to " + seqlen_format(row["seqlen_longest"].integer());
    // The step as a duration a reader takes in (a 207M-token step of 8.7 days reads as one).
    const std::string step = row.has("step_s") ? duration_text(row["step_s"].number()) : std::string();
    const std::string cost = priced && row.has("cost_per_billion_tokens") ? fmt::format("{:.0f}", row["cost_per_billion_tokens"].number())
                                                                          : std::string();
    out += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |{} {} |\n", cell("model"), cell("gpu"),
                       cell("gpus"), cell("step"), cell("framework"), cell("plan"), max_mode ? "max" : "at", seqlen, band, cell("fits"),
                       number("gpu_peak_gib", "{:.1f}"), number("host_per_node_gib", "{:.0f}"), step, number("tokens_per_s", "{:.0f}"),
                       number("tflops_megatron", "{:.1f}"), priced ? " " + cost + " |" : std::string(), published);
  }
  return out;
}

void sweep_results_write(const Scenario& scenario, const std::vector<SweepRow>& rows, const std::string& out_dir, bool overwrite,
                         const std::string& flag) {
  const nlohmann::json results = sweep_results_to_json(scenario, rows);
  std::string csv;
  for (size_t i = 0; i < sweep_columns().size(); ++i) {
    if (i) csv += ',';
    csv += sweep_columns()[i];
  }
  csv += "\n";
  for (const auto& row : results["rows"]) {
    for (size_t i = 0; i < sweep_columns().size(); ++i) {
      const std::string& column = sweep_columns()[i];
      if (i) csv += ',';
      csv += csv_escape(row.contains(column) ? json_cell_to_text(row[column]) : "");
    }
    csv += "\n";
  }
  std::string markdown = fmt::format("# {}\n\nPREDICTIONS of longseq (runtime profile `{}`), not measurements.\n\n",
                                     scenario.name, scenario.runtime_profile_given ? scenario.runtime_profile : "each point's framework's own (deepspeed-hf without one)");
  if (!scenario.description.empty()) markdown += scenario.description + "\n\n";
  if (!scenario.reproduces.empty()) markdown += "Reproduces: " + scenario.reproduces + "\n\n";
  if (!scenario.published_source.empty()) markdown += "Published values: " + scenario.published_source + "\n\n";
  markdown += sweep_markdown_table(results);

  output_directory_check(out_dir, overwrite, flag, sweep_output_names());
  const std::filesystem::path staging = staging_directory_create(out_dir);
  try {
    file_write_text((staging / "results.csv").string(), csv);
    file_write_text((staging / "results.json").string(), json_text(results) + "\n");
    file_write_text((staging / "results.md").string(), markdown);
    staging_directory_commit(staging, out_dir);
  } catch (...) {
    staging_directory_discard(staging);
    throw;
  }
}

}  // namespace longseq
