#include "planner/scenario.hpp"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fmt/format.h>
#include <map>

#include "io/checked_input.hpp"
#include "io/config_error.hpp"
#include "io/nearest_names.hpp"
#include "models/model_loader.hpp"
#include "io/yaml_reader.hpp"
#include "planner/framework_choice.hpp"
#include "planner/frameworks.hpp"
#include "planner/max_seqlen.hpp"
#include "planner/search.hpp"
#include "planner/time_model.hpp"
#include "planner/units.hpp"

namespace longseq {

bool PlanSettings::fixes_a_plan() const {
  return preset || sp || ring || tp || pp || ep || offload_activation_layers || recompute_block_layers || recompute_modules || zero_stage || offload_optimizer || offload_params || activation_checkpointing || checkpoint_offload ||
         tiled_mlp || tiled_loss || fpdt || mlp_tiles || loss_tiles || fpdt_chunk_tokens || checkpoint_every || checkpoint_ops;
}

void PlanSettings::override_with(const PlanSettings& later) {
  auto take = [](auto& mine, const auto& theirs) {
    if (theirs) mine = theirs;
  };
  if (search_by_default && !later.search && later.fixes_a_plan()) {
    search.reset();
    search_by_default = false;
  }
  take(framework, later.framework);
  take(preset, later.preset);
  take(search, later.search);
  take(sp, later.sp);
  take(ring, later.ring);
  take(tp, later.tp);
  take(pp, later.pp);
  take(ep, later.ep);
  take(offload_activation_layers, later.offload_activation_layers);
  take(recompute_block_layers, later.recompute_block_layers);
  take(recompute_modules, later.recompute_modules);
  take(zero_stage, later.zero_stage);
  take(offload_optimizer, later.offload_optimizer);
  take(offload_params, later.offload_params);
  take(activation_checkpointing, later.activation_checkpointing);
  take(checkpoint_offload, later.checkpoint_offload);
  take(tiled_mlp, later.tiled_mlp);
  take(tiled_loss, later.tiled_loss);
  take(fpdt, later.fpdt);
  take(mlp_tiles, later.mlp_tiles);
  take(loss_tiles, later.loss_tiles);
  take(fpdt_chunk_tokens, later.fpdt_chunk_tokens);
  take(lora_rank, later.lora_rank);
  take(lora_all_linear, later.lora_all_linear);
  take(qlora, later.qlora);
  take(fp8, later.fp8);
  take(cp_all_gather, later.cp_all_gather);
  take(micro_batch, later.micro_batch);
  take(global_batch, later.global_batch);
  take(checkpoint_every, later.checkpoint_every);
  take(checkpoint_ops, later.checkpoint_ops);
}

namespace {

constexpr int64_t kMaxGpus = 1 << 20;

// A published memory (GiB) or time (s): a positive decimal number.
double published_number(const std::string& text, const std::string& path, const std::string& element) {
  const std::optional<double> value = decimal_parse(text);
  if (!value || *value <= 0) throw ConfigError(path, element, fmt::format("expected a positive number, got '{}'", text));
  return *value;
}

int64_t seqlen_from_node(const YamlReader& reader, const YAML::Node& node, const std::string& name) {
  return seqlen_parse(reader.node_to_string(node, name), reader.source_name() + ": key '" + name + "'");
}

// Reads the plan keys of `reader` (a plan section or a ladder step) into settings.
PlanSettings plan_settings_read(YamlReader& reader) {
  PlanSettings settings;
  auto optional_bool = [&](const char* key, std::optional<bool>& field) {
    if (reader.has(key)) field = reader.get_bool(key);
  };
  if (reader.has("preset")) {
    settings.preset = reader.get_string("preset");
    if (*settings.preset != "alst" && *settings.preset != "baseline")
      throw ConfigError(reader.source_name(), reader.key_name("preset"), fmt::format("expected alst or baseline, got '{}'", *settings.preset));
  }
  if (reader.has("search")) {
    settings.search = reader.get_string("search");
    if (*settings.search != "max-seqlen" && *settings.search != "throughput")
      throw ConfigError(reader.source_name(), reader.key_name("search"),
                        fmt::format("expected max-seqlen or throughput, got '{}'", *settings.search));
  }
  if (reader.has("framework")) {
    settings.framework = reader.get_string("framework");
    framework_parse(*settings.framework, reader.source_name() + ": key '" + reader.key_name("framework") + "'");
  }
  if (reader.has("sp") && reader.get_string("sp") != "auto") settings.sp = reader.get_int("sp", 1, kMaxGpus);
  if (reader.has("ring")) settings.ring = reader.get_int("ring", 1, kMaxGpus);
  if (reader.has("tp")) settings.tp = reader.get_int("tp", 1, kMaxGpus);
  if (reader.has("pp")) settings.pp = reader.get_int("pp", 1, kMaxGpus);
  if (reader.has("ep")) settings.ep = reader.get_int("ep", 1, kMaxGpus);
  if (reader.has("offload_activation_layers")) settings.offload_activation_layers = reader.get_int("offload_activation_layers", 1, kMaxGpus);
  if (reader.has("recompute_block_layers")) settings.recompute_block_layers = reader.get_int("recompute_block_layers", 1, kMaxGpus);
  if (reader.has("recompute_modules"))
    settings.recompute_modules =
        megatron_recompute_modules_parse(reader.get_string("recompute_modules"), reader.source_name(), reader.key_name("recompute_modules"));
  if (reader.has("zero_stage")) settings.zero_stage = static_cast<int>(reader.get_int("zero_stage", 0, 3));
  optional_bool("offload_optimizer", settings.offload_optimizer);
  optional_bool("offload_params", settings.offload_params);
  optional_bool("activation_checkpointing", settings.activation_checkpointing);
  optional_bool("checkpoint_offload", settings.checkpoint_offload);
  optional_bool("tiled_mlp", settings.tiled_mlp);
  optional_bool("tiled_loss", settings.tiled_loss);
  optional_bool("fpdt", settings.fpdt);
  if (reader.has("mlp_tiles")) settings.mlp_tiles = reader.get_int("mlp_tiles", 1, kTileCountLimit);
  if (reader.has("loss_tiles")) settings.loss_tiles = reader.get_int("loss_tiles", 1, kTileCountLimit);
  if (reader.has("fpdt_chunk_tokens"))
    settings.fpdt_chunk_tokens = seqlen_parse(reader.get_string("fpdt_chunk_tokens"),
                                              reader.source_name() + ": key '" + reader.key_name("fpdt_chunk_tokens") + "'");
  if (reader.has("lora_rank")) settings.lora_rank = reader.get_int("lora_rank", 1, 4096);
  if (reader.has("lora_targets"))
    settings.lora_all_linear =
        PlanOptions::lora_targets_parse(reader.get_string("lora_targets"), reader.source_name(), reader.key_name("lora_targets"));
  optional_bool("qlora", settings.qlora);
  optional_bool("fp8", settings.fp8);
  optional_bool("cp_all_gather", settings.cp_all_gather);
  if (reader.has("micro_batch")) settings.micro_batch = reader.get_int("micro_batch", 1, 1'000'000);
  if (reader.has("global_batch")) settings.global_batch = reader.get_int("global_batch", 1, 1'000'000'000);
  if (reader.has("checkpoint_every")) settings.checkpoint_every = reader.get_int("checkpoint_every", 1, int64_t{1} << 20);
  optional_bool("checkpoint_ops", settings.checkpoint_ops);
  if (settings.qlora.value_or(false) && !settings.lora_rank)
    throw ConfigError(reader.source_name(), reader.key_name("qlora"), "QLoRA trains LoRA adapters on its 4-bit base: give lora_rank too");
  return settings;
}

std::string resolve_relative(const std::string& value, const std::string& scenario_path) {
  if (value.empty() || std::filesystem::path(value).is_absolute()) return value;
  const auto candidate = std::filesystem::path(scenario_path).parent_path() / value;
  std::error_code error;
  return std::filesystem::exists(candidate, error) ? candidate.string() : value;  // else a built-in name
}

}  // namespace

Scenario scenario_from_text(const std::string& yaml_text, const std::string& path) {
  YamlReader reader(yaml_text, path);
  Scenario scenario;
  scenario.path = path;
  scenario.name = reader.get_string("name");
  // The name becomes a directory (out/NAME), a Slurm job name and a word of a batch script: a
  // portable file name only, never "." or ".." (which would name the directory above).
  if (scenario.name.empty() || scenario.name == "." || scenario.name == ".." || scenario.name.front() == '-' ||
      scenario.name.size() > 200 ||
      !std::all_of(scenario.name.begin(), scenario.name.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' || c == '+';
      }))
    throw ConfigError(path, "name",
                      "must be a file name of letters, digits, '-', '_', '.' and '+' (at most 200, not '.' or '..', not starting "
                      "with '-'): it names the output directory and the Slurm job");
  scenario.description = reader.get_string("description", "");
  scenario.reproduces = reader.get_string("reproduces", "");
  scenario.model = resolve_relative(reader.get_string("model"), path);
  scenario.runtime_profile_given = reader.has("runtime_profile");
  scenario.runtime_profile = reader.get_string("runtime_profile", "deepspeed-hf");
  scenario.attention_kernel = reader.get_string("attention", "");
  // A price below 1e6 an hour, as plan --gpu-hour-cost takes it.
  if (reader.has("gpu_hour_cost")) scenario.gpu_hour_cost = reader.get_double("gpu_hour_cost", 1e-9, 999999.0);
  if (!scenario.attention_kernel.empty() && !attention_kernel_known(scenario.attention_kernel, true))
    throw ConfigError(path, "attention", fmt::format("expected {}, got '{}'", attention_kernel_choices(true), scenario.attention_kernel));

  if (reader.has("run")) {
    YamlReader run = reader.get_section("run");
    Scenario::Run settings;
    if (run.has("seqlen"))
      settings.seqlen = seqlen_parse(run.get_string("seqlen"), path + ": key '" + run.key_name("seqlen") + "'");
    settings.steps = run.get_int("steps", 1, 100000, 5);
    if (run.has("budget_mib")) settings.budget_mib = run.get_double("budget_mib", 0.001, 1e9);
    settings.auto_plan = run.get_bool("auto", false);
    settings.data = resolve_relative(run.get_string("data", ""), path);
    run.reject_unknown_keys();
    if (settings.auto_plan && !settings.budget_mib) throw ConfigError(path, "run.auto", "needs run.budget_mib (the device memory to plan for)");
    if (!settings.auto_plan && !settings.seqlen) throw ConfigError(path, "run.seqlen", "required unless run.auto is true");
    scenario.run = settings;
  }
  // A run-only scenario needs no cluster or sweep: it runs on this machine.
  if (!scenario.run || reader.has("cluster")) {
    YamlReader cluster = reader.get_section("cluster");
    scenario.gpu = resolve_relative(cluster.get_string("gpu"), path);
    if (cluster.has("gpus")) scenario.gpus = cluster.get_int("gpus", 1, kMaxGpus);
    if (cluster.has("nodes")) scenario.nodes = cluster.get_int("nodes", 1, kMaxGpus);
    if (cluster.has("gpus_per_node")) scenario.gpus_per_node = cluster.get_int("gpus_per_node", 1, 1024);
    if (cluster.has("host_memory_gib")) scenario.host_memory_gib = cluster.get_double("host_memory_gib", 0.001, 1e9);
    cluster.reject_unknown_keys();
  }

  if (reader.has("plan")) {
    YamlReader plan = reader.get_section("plan");
    scenario.plan = plan_settings_read(plan);
    plan.reject_unknown_keys();
  } else {
    scenario.plan.search = "max-seqlen";
    scenario.plan.search_by_default = true;
  }

  if (scenario.run && !reader.has("sweep")) {
    reader.reject_unknown_keys();
    return scenario;
  }
  YamlReader sweep = reader.get_section("sweep");
  for (auto& [node, name] : sweep.get_sequence("model")) scenario.sweep_model.push_back(resolve_relative(sweep.node_to_string(node, name), path));
  for (auto& [node, name] : sweep.get_sequence("gpu")) scenario.sweep_gpu.push_back(resolve_relative(sweep.node_to_string(node, name), path));
  for (auto& [node, name] : sweep.get_sequence("gpus")) scenario.sweep_gpus.push_back(sweep.node_to_int(node, name, 1, kMaxGpus));
  for (auto& [node, name] : sweep.get_sequence("seqlen")) scenario.sweep_seqlen.push_back(seqlen_from_node(sweep, node, name));
  for (auto& [node, name] : sweep.get_sequence("sp")) scenario.sweep_sp.push_back(sweep.node_to_int(node, name, 1, kMaxGpus));
  for (auto& [node, name] : sweep.get_sequence("mlp_tiles")) scenario.sweep_mlp_tiles.push_back(sweep.node_to_int(node, name, 1, kTileCountLimit));
  for (auto& [node, name] : sweep.get_sequence("loss_tiles")) scenario.sweep_loss_tiles.push_back(sweep.node_to_int(node, name, 1, kTileCountLimit));
  for (auto& [node, name] : sweep.get_sequence("fpdt_chunk_tokens")) scenario.sweep_fpdt_chunk_tokens.push_back(seqlen_from_node(sweep, node, name));
  for (auto& [node, name] : sweep.get_sequence("ladder")) {
    if (!node.IsMap()) throw ConfigError(path, name, "expected a mapping with a name and plan settings");
    YamlReader step(node, path, name);
    LadderStep ladder_step;
    ladder_step.name = step.get_string("name");
    ladder_step.settings = plan_settings_read(step);
    step.reject_unknown_keys();
    scenario.sweep_ladder.push_back(ladder_step);
  }
  sweep.reject_unknown_keys();
  const size_t axes = scenario.sweep_model.size() + scenario.sweep_gpu.size() + scenario.sweep_gpus.size() +
                      scenario.sweep_seqlen.size() + scenario.sweep_sp.size() + scenario.sweep_mlp_tiles.size() +
                      scenario.sweep_loss_tiles.size() + scenario.sweep_fpdt_chunk_tokens.size() + scenario.sweep_ladder.size();
  if (axes == 0) throw ConfigError(path, "sweep", "is empty: give at least one axis with at least one value");

  if (reader.has("published")) {
    YamlReader published = reader.get_section("published");
    scenario.published_source = published.get_string("source");
    scenario.published_figure = published.get_string("figure", "max_seqlen");
    if (scenario.published_figure != "max_seqlen" && scenario.published_figure != "peak_memory_gib" &&
        scenario.published_figure != "iteration_time_s")
      throw ConfigError(path, published.key_name("figure"),
                        fmt::format("expected max_seqlen, peak_memory_gib or iteration_time_s, got '{}'", scenario.published_figure));
    for (auto& [node, name] : published.get_sequence("points")) {
      if (!node.IsMap()) throw ConfigError(path, name, "expected a mapping of axis values and a value");
      ScenarioPublishedPoint point;
      bool has_value = false;
      for (const auto& entry : node) {
        const std::string key = published.node_key(entry.first);
        const std::string element = name + "." + key;
        const std::string text = published.node_to_string(entry.second, element);
        if (key == "value" || key == "value_fail") {
          const double value = scenario.published_figure == "max_seqlen"
                                   ? static_cast<double>(seqlen_parse(text, path + ": key '" + element + "'"))
                                   : published_number(text, path, element);
          (key == "value" ? point.value : point.value_fail) = value;
          has_value |= key == "value";
        } else if (key == "gpus" || key == "model" || key == "gpu" || key == "seqlen" || key == "sp" || key == "step" ||
                   key == "mlp_tiles" || key == "loss_tiles" || key == "fpdt_chunk_tokens") {
          point.where.emplace_back(key, key == "seqlen" ? std::to_string(seqlen_parse(text, path + ": key '" + element + "'")) : text);
        } else {
          throw ConfigError(path, element, "unknown key (an axis name, value or value_fail)");
        }
      }
      if (!has_value) throw ConfigError(path, name, "has no value");
      scenario.published_points.push_back(point);
    }
    published.reject_unknown_keys();
  }
  if (reader.has("output")) {
    YamlReader output = reader.get_section("output");
    scenario.output_directory = output.get_string("directory", "");
    for (auto& [node, name] : output.get_sequence("figures")) {
      const std::string figure = output.node_to_string(node, name);
      const auto& known = report_figure_names();
      if (std::find(known.begin(), known.end(), figure) == known.end())
        throw ConfigError(path, name, fmt::format("unknown figure '{}' (known: {})", figure, names_listed(known)));
      scenario.output_figures.push_back(figure);
    }
    output.reject_unknown_keys();
  }
  reader.reject_unknown_keys();
  bool throughput = scenario.plan.search == "throughput";
  for (const auto& step : scenario.sweep_ladder) throughput |= step.settings.search == "throughput";
  if (throughput && scenario.sweep_seqlen.empty())
    throw ConfigError(path, "plan.search", "throughput is measured at given lengths: add a sweep.seqlen axis");
  return scenario;
}

Scenario scenario_load(const std::string& path) { return scenario_from_text(file_read_text(path), path); }

const std::vector<std::string>& report_figure_names() {
  static const std::vector<std::string> names = {"max_seqlen_vs_gpus", "throughput_vs_gpus", "throughput_vs_card", "ablation",
                                                 "memory_breakdown", "host_memory", "predicted_vs_published"};
  return names;
}

namespace {

PlanOptions plan_from_settings(const PlanSettings& settings, const ModelSpec& model, const ClusterSpec& cluster) {
  const int64_t ring = settings.ring.value_or(1);
  // Under Megatron's model parallelism Ulysses (its a2a) is only where asked, as `plan --tp` has it.
  const bool megatron = settings.tp || settings.pp || settings.ep || settings.offload_activation_layers || settings.recompute_block_layers ||
                        settings.recompute_modules;
  const int64_t sp = settings.sp.value_or(megatron ? 1 : sp_largest_valid(model, std::max<int64_t>(1, cluster.gpus / ring)));
  PlanOptions plan;
  plan.sp = sp;
  if (settings.preset) {
    plan = PlanOptions::alst(sp, cluster.gpus);
    if (*settings.preset == "baseline") {
      plan.sp = settings.sp.value_or(1);
      plan.tiled_mlp = plan.tiled_loss = plan.checkpoint_offload = false;
    }
  }
  plan.ring = ring;
  plan.tp = settings.tp.value_or(1);
  plan.pp = settings.pp.value_or(1);
  plan.ep = settings.ep.value_or(1);
  plan.offload_activation_layers = settings.offload_activation_layers.value_or(0);
  plan.recompute_block_layers = settings.recompute_block_layers.value_or(0);
  plan.recompute_modules = settings.recompute_modules.value_or(MegatronRecomputeModules{});
  // Megatron's plan, not ALST's set (as `plan --tp`): its distributed optimizer (with PlanOptions'
  // recompute and no offload or tiling) unless a key asks otherwise.
  if (megatron && !settings.preset) plan.zero_stage = 1;
  if (settings.zero_stage) plan.zero_stage = *settings.zero_stage;
  if (settings.offload_optimizer) plan.offload_optimizer = *settings.offload_optimizer;
  if (settings.offload_params) plan.offload_params = *settings.offload_params;
  if (settings.activation_checkpointing) plan.activation_checkpointing = *settings.activation_checkpointing;
  if (settings.checkpoint_offload) plan.checkpoint_offload = *settings.checkpoint_offload;
  if (settings.tiled_mlp) plan.tiled_mlp = *settings.tiled_mlp;
  if (settings.tiled_loss) plan.tiled_loss = *settings.tiled_loss;
  if (settings.fpdt) plan.fpdt = *settings.fpdt;
  if (settings.mlp_tiles) plan.mlp_tiles = *settings.mlp_tiles;
  if (settings.loss_tiles) plan.loss_tiles = *settings.loss_tiles;
  if (settings.fpdt_chunk_tokens) plan.fpdt_chunk_tokens = *settings.fpdt_chunk_tokens;
  plan.lora_rank = settings.lora_rank.value_or(0);
  plan.lora_all_linear = settings.lora_all_linear.value_or(true);
  plan.qlora = settings.qlora.value_or(false);
  plan.fp8 = settings.fp8.value_or(false);
  plan.cp_all_gather = settings.cp_all_gather.value_or(false);
  plan.micro_batch = settings.micro_batch.value_or(1);
  plan.global_batch = settings.global_batch.value_or(0);
  if (settings.checkpoint_every) plan.checkpoint_every = *settings.checkpoint_every;
  if (settings.checkpoint_ops) plan.checkpoint_ops = *settings.checkpoint_ops;
  return plan;
}

template <typename T>
std::vector<std::optional<T>> axis_values(const std::vector<T>& values) {
  if (values.empty()) return {std::nullopt};
  return {values.begin(), values.end()};
}

bool point_matches(const ScenarioPublishedPoint& point, const std::vector<std::pair<std::string, std::string>>& axes) {
  for (const auto& [key, value] : point.where) {
    bool found = false;
    for (const auto& [axis, axis_value] : axes) found |= axis == key && axis_value == value;
    if (!found) return false;
  }
  return true;
}

void row_fill_prediction(SweepRow& row, const MemoryPrediction& memory) {
  row.fits = memory.fits();
  row.gpu_peak_gib = bytes_to_gib(memory.gpu_peak_bytes);
  row.gpu_capacity_gib = bytes_to_gib(memory.gpu_capacity_bytes);
  row.host_per_node_gib = bytes_to_gib(memory.host_bytes_per_node);
  row.host_capacity_gib = bytes_to_gib(memory.host_capacity_bytes);
  for (const auto& item : memory.gpu_items) {
    auto found = std::find_if(row.gpu_category_gib.begin(), row.gpu_category_gib.end(),
                              [&](const auto& entry) { return entry.first == item.category; });
    if (found == row.gpu_category_gib.end()) row.gpu_category_gib.emplace_back(item.category, bytes_to_gib(item.bytes));
    else found->second += bytes_to_gib(item.bytes);
  }
}

}  // namespace

std::vector<SweepRow> scenario_run(const Scenario& scenario, const std::function<void(size_t, size_t)>& progress) {
  RuntimeProfile profile = runtime_profile_load(scenario.runtime_profile);
  if (!scenario.attention_kernel.empty()) profile.attention_kernel = scenario.attention_kernel;
  std::map<std::string, ModelSpec> models;
  std::map<std::string, HardwareCard> cards;
  auto model_of = [&](const std::string& name) -> const ModelSpec& {
    auto found = models.find(name);
    if (found == models.end()) found = models.emplace(name, model_load(name)).first;
    return found->second;
  };
  auto card_of = [&](const std::string& name) -> const HardwareCard& {
    auto found = cards.find(name);
    if (found == cards.end()) found = cards.emplace(name, hardware_card_load(name)).first;
    return found->second;
  };
  // Load every named model and card up front, so a bad name fails before any work.
  for (const auto& name : scenario.sweep_model.empty() ? std::vector<std::string>{scenario.model} : scenario.sweep_model) model_of(name);
  for (const auto& name : scenario.sweep_gpu.empty() ? std::vector<std::string>{scenario.gpu} : scenario.sweep_gpu)
    if (const std::string problem = attention_kernel_problem(profile, card_of(name)); !problem.empty())
      throw ConfigError(scenario.path, "attention", problem);

  std::vector<std::optional<LadderStep>> steps;
  if (scenario.sweep_ladder.empty()) steps.push_back(std::nullopt);
  for (const auto& step : scenario.sweep_ladder) steps.push_back(step);
  const auto models_axis = axis_values(scenario.sweep_model);
  const auto gpu_axis = axis_values(scenario.sweep_gpu);
  const auto gpus_axis = axis_values(scenario.sweep_gpus);
  const auto sp_axis = axis_values(scenario.sweep_sp);
  const auto seqlen_axis = axis_values(scenario.sweep_seqlen);
  const auto mlp_axis = axis_values(scenario.sweep_mlp_tiles);
  const auto loss_axis = axis_values(scenario.sweep_loss_tiles);
  const auto chunk_axis = axis_values(scenario.sweep_fpdt_chunk_tokens);
  const size_t total = models_axis.size() * gpu_axis.size() * gpus_axis.size() * sp_axis.size() * seqlen_axis.size() *
                       mlp_axis.size() * loss_axis.size() * chunk_axis.size() * steps.size();

  std::vector<SweepRow> rows;
  for (const auto& model_name : models_axis)
    for (const auto& gpu_name : gpu_axis)
      for (const auto& gpus : gpus_axis)
        for (const auto& sp : sp_axis)
          for (const auto& seqlen : seqlen_axis)
            for (const auto& mlp_tiles : mlp_axis)
              for (const auto& loss_tiles : loss_axis)
                for (const auto& chunk : chunk_axis)
                  for (const auto& step : steps) {
                    SweepRow row;
                    const std::string model_key = model_name.value_or(scenario.model);
                    const std::string gpu_key = gpu_name.value_or(scenario.gpu);
                    const ModelSpec& model = model_of(model_key);
                    const HardwareCard& card = card_of(gpu_key);
                    row.model = model.name;
                    row.gpu = card.name;
                    if (model_name) row.axes.emplace_back("model", *model_name);
                    if (gpu_name) row.axes.emplace_back("gpu", *gpu_name);
                    if (gpus) row.axes.emplace_back("gpus", std::to_string(*gpus));
                    if (sp) row.axes.emplace_back("sp", std::to_string(*sp));
                    if (seqlen) row.axes.emplace_back("seqlen", std::to_string(*seqlen));
                    if (mlp_tiles) row.axes.emplace_back("mlp_tiles", std::to_string(*mlp_tiles));
                    if (loss_tiles) row.axes.emplace_back("loss_tiles", std::to_string(*loss_tiles));
                    if (chunk) row.axes.emplace_back("fpdt_chunk_tokens", std::to_string(*chunk));
                    if (step) {
                      row.step = step->name;
                      row.axes.emplace_back("step", step->name);
                    }
                    row.mode = seqlen ? "at_seqlen" : "max_seqlen";
                    row.seqlen = seqlen.value_or(0);
                    try {
                      const ClusterSpec cluster =
                          cluster_make(card, gpus.value_or(scenario.gpus.value_or(0)), gpus ? 0 : scenario.nodes.value_or(0),
                                       scenario.gpus_per_node.value_or(0), scenario.host_memory_gib.value_or(0));
                      row.gpus = cluster.gpus;
                      row.nodes = cluster.nodes;
                      PlanSettings settings = scenario.plan;
                      if (step) settings.override_with(step->settings);
                      if (sp) settings.sp = *sp;
                      if (mlp_tiles) settings.mlp_tiles = *mlp_tiles;
                      if (loss_tiles) settings.loss_tiles = *loss_tiles;
                      if (chunk) settings.fpdt_chunk_tokens = *chunk;
                      PlanOptions plan;
                      // The search's options but the framework's own (its lengths, what it runs).
                      auto search_options = [&] {
                        SearchOptions options;
                        options.objective = seqlen ? SearchObjective::objective_throughput : SearchObjective::objective_max_seqlen;
                        options.seqlen = seqlen.value_or(0);
                        options.explore_ring = settings.ring.value_or(0) != 1;
                        options.held.lora_rank = settings.lora_rank.value_or(0);
                        options.held.lora_all_linear = settings.lora_all_linear.value_or(true);
                        options.held.qlora = settings.qlora.value_or(false);
                        options.held.fp8 = settings.fp8.value_or(false);
                        options.held.cp_all_gather = settings.cp_all_gather.value_or(false);
                        options.held.micro_batch = settings.micro_batch.value_or(1);
                        options.held.global_batch = settings.global_batch.value_or(0);
                        // Held as --search --checkpoint-every and --checkpoint-ops hold them: every plan searched
                        // checkpoints one layer in N, or under the op-level policy (or not, given false).
                        const int64_t every = settings.checkpoint_every.value_or(0);
                        if (every > 0) options.checkpoint_every = {every};
                        if (every > 0 || settings.checkpoint_ops)
                          options.admits = [every, ops = settings.checkpoint_ops](const PlanOptions& candidate) {
                            return (every == 0 || candidate.checkpoint_every == every) && (!ops || candidate.checkpoint_ops == *ops);
                          };
                        // A TP degree, pipeline stages or expert ranks given are held, as `plan --search --tp T` holds them.
                        // So are Megatron's offloading and recompute choices.
                        if (settings.tp || settings.pp || settings.ep || settings.offload_activation_layers || settings.recompute_block_layers ||
                            settings.recompute_modules)
                          options.admits = [previous = options.admits, tp = settings.tp, pp = settings.pp, ep = settings.ep,
                                            offloaded = settings.offload_activation_layers, block = settings.recompute_block_layers,
                                            modules = settings.recompute_modules](const PlanOptions& candidate) {
                            return (!previous || previous(candidate)) && (!tp || candidate.tp == *tp) && (!pp || candidate.pp == *pp) &&
                                   (!ep || candidate.ep == *ep) && (!offloaded || candidate.offload_activation_layers == *offloaded) &&
                                   (!block || candidate.recompute_block_layers == *block) &&
                                   (!modules || candidate.recompute_modules == *modules);
                          };
                        return options;
                      };
                      // The framework, as `longseq plan` takes it: given; for a search with adapters the HF
                      // Trainer / TRL (PEFT's path); for any other search the framework whose own search
                      // serves the model best here, the default kept unless another is ahead by more than
                      // the search resolves (framework_best); a fixed plan without one is unchecked (and on
                      // the plain granule).
                      std::optional<Framework> framework =
                          settings.framework                    ? std::optional<Framework>(framework_parse(*settings.framework))
                          : settings.search && settings.lora_rank.value_or(0) > 0 ? std::optional<Framework>(Framework::framework_hf_trainer)
                                                                  : std::nullopt;
                      if (settings.search && !framework) {
                        FrameworkSearches searches;
                        framework_searches_add(searches, model, cluster, search_options(),
                                               scenario.runtime_profile_given ? scenario.runtime_profile : "", !scenario.attention_kernel.empty(),
                                               std::nullopt);
                        const FrameworkWinner* best = framework_best(searches.winners, kDefaultFramework, !seqlen);
                        framework = best ? best->framework : kDefaultFramework;
                      }
                      const int64_t length_multiple = framework ? framework_facts(*framework).length_multiple : 1;
                      if (framework) row.framework = framework_name(*framework);
                      // The framework's own profile unless the scenario names one (its precision, its buffers).
                      RuntimeProfile row_profile = profile;
                      if (framework && !scenario.runtime_profile_given) {
                        row_profile = runtime_profile_load(framework_facts(*framework).runtime_profile);
                        if (!scenario.attention_kernel.empty()) row_profile.attention_kernel = scenario.attention_kernel;
                      }
                      if (framework) row_profile = framework_profile(*framework, row_profile);
                      // A swept length off the framework's granule keeps its reason in the row (a
                      // search would say only "no plan fits"), with the lengths on either side.
                      if (seqlen && *seqlen % length_multiple != 0) {
                        const int64_t below = *seqlen / length_multiple * length_multiple;
                        throw ConfigError("", "", fmt::format("sequence length {} is not a multiple of {}: {} pads every batch to one "
                                                              "(the nearest: {} or {})", *seqlen, length_multiple, row.framework, below,
                                                              below + length_multiple));
                      }
                      if (settings.search) {
                        SearchOptions options = search_options();
                        const std::vector<int64_t> held_every = options.checkpoint_every;
                        search_options_for_framework(options, *framework, model, cluster);
                        if (settings.checkpoint_every.value_or(0) > 0) options.checkpoint_every = held_every;
                        const SearchResult result = plan_search(model, cluster, row_profile, options);
                        if (!result.winner()) throw ConfigError("", "", "no plan fits");
                        plan = result.winner()->plan;
                      } else {
                        plan = plan_from_settings(settings, model, cluster);
                      }
                      std::vector<std::string> problems = plan_problems(model, cluster, plan);
                      if (framework && !settings.search)
                        if (const std::string unsupported = framework_unsupported(*framework, model, plan, cluster.gpus); !unsupported.empty())
                          problems.push_back(unsupported);
                      if (seqlen)
                        for (auto& problem : seqlen_problems(plan, *seqlen)) problems.push_back(problem);
                      if (!problems.empty()) throw ConfigError("", "", problems.front());
                      row.plan = plan;
                      MemoryPrediction memory;
                      if (seqlen) {
                        memory = memory_predict(model, cluster, plan, row_profile, *seqlen);
                        row.binding_constraint = !memory.fits_gpu() ? "GPU memory" : !memory.fits_host() ? "host memory" : "";
                      } else {
                        const int64_t grid = seqlen_grid(plan, length_multiple);
                        const MaxSeqlenResult found = max_seqlen_find(model, cluster, plan, row_profile, grid);
                        memory = found.at_max;
                        row.seqlen = found.max_seqlen;
                        const SeqlenBand band = max_seqlen_band(model, cluster, plan, row_profile, grid);
                        row.seqlen_shortest = band.shortest;
                        row.seqlen_longest = band.longest;
                        row.binding_constraint = found.binding_constraint;
                      }
                      row_fill_prediction(row, memory);
                      if (row.seqlen > 0 && memory.fits()) {
                        const TimePrediction time = time_predict(model, cluster, plan, row_profile, row.seqlen);
                        row.step_s = time.time.total_s();
                        row.tflops_hardware = time.hardware_tflops_per_gpu;
                        row.tflops_megatron = time.megatron_tflops_per_gpu;
                        row.mfu = time.mfu;
                        row.tokens_per_s = time.tokens_per_s;
                        row.cost_per_billion_tokens = cost_per_billion_tokens(time.tokens_per_s, cluster.gpus, scenario.gpu_hour_cost);
                      }
                      if (!seqlen && row.seqlen == 0) row.fits = false;
                    } catch (const ConfigError& error) {
                      row.error = error.what();  // this point cannot run; the others still do
                    }
                    for (const auto& point : scenario.published_points) {
                      if (!point_matches(point, row.axes)) continue;
                      row.published = point.value;
                      row.published_fail = point.value_fail;
                      break;
                    }
                    rows.push_back(std::move(row));
                    if (progress) progress(rows.size(), total);
                  }
  return rows;
}

ScenarioRunOptions scenario_run_options(const Scenario& scenario) {
  const PlanSettings& plan = scenario.plan;
  auto refuse = [&](const char* key, const std::string& why) { throw ConfigError(scenario.path, key, why); };
  if (plan.preset) refuse("plan.preset", "a run trains the options its plan: section gives one by one (run has no presets; sweep reads them)");
  if (plan.search) refuse("plan.search", "a run trains one fixed plan (run.auto: true lets the planner choose it for this machine)");
  if (plan.framework) refuse("plan.framework", "a run trains with longseq's executor, not a framework's stack");
  if (plan.qlora.value_or(false)) refuse("plan.qlora", "the executor has no 4-bit base (LoRA on the kernels' dtype: lora_rank alone)");
  if (plan.fp8.value_or(false)) refuse("plan.fp8", "Transformer Engine's FP8 is Megatron-Core's; the executor's GEMMs are fp32 or bf16");
  if (plan.cp_all_gather.value_or(false)) refuse("plan.cp_all_gather", "all_gather context parallelism is Megatron-Core's; the executor runs a ring");
  if (plan.tiled_mlp == false && plan.mlp_tiles) refuse("plan.mlp_tiles", "given with tiled_mlp: false");
  if (plan.tiled_loss == false && plan.loss_tiles) refuse("plan.loss_tiles", "given with tiled_loss: false");
  if (plan.fpdt_chunk_tokens && !plan.fpdt.value_or(false)) refuse("plan.fpdt_chunk_tokens", "given without fpdt: true");
  if (plan.lora_all_linear && !plan.lora_rank) refuse("plan.lora_targets", "given without lora_rank");
  if (plan.micro_batch.value_or(1) != 1) refuse("plan.micro_batch", "the executor trains one sample per rank per step");
  if (plan.global_batch) refuse("plan.global_batch", "the executor runs one micro batch a step");
  if (plan.checkpoint_every.value_or(1) != 1) refuse("plan.checkpoint_every", "the executor checkpoints every layer or none");
  if (plan.checkpoint_ops.value_or(false)) refuse("plan.checkpoint_ops", "the executor checkpoints whole layers");
  if (plan.offload_activation_layers) refuse("plan.offload_activation_layers", "TE's activation offloading is Megatron-Core's, not the executor's");
  if (plan.recompute_block_layers) refuse("plan.recompute_block_layers", "the executor checkpoints every layer or none");
  if (plan.recompute_modules) refuse("plan.recompute_modules", "the executor checkpoints every layer or none");
  if (scenario.runtime_profile_given && scenario.runtime_profile != "native" && scenario.runtime_profile != "native-cuda")
    refuse("runtime_profile", fmt::format("a run's prediction is priced for longseq's executor (native, or native-cuda on a GPU), not '{}'",
                                          scenario.runtime_profile));
  if (!scenario.attention_kernel.empty()) refuse("attention", "the executor runs its own attention kernel");
  if (!scenario.gpu.empty()) refuse("cluster", "a run trains on this machine, its ranks from mpirun (cluster: is for longseq sweep)");
  const bool swept = !scenario.sweep_model.empty() || !scenario.sweep_gpu.empty() || !scenario.sweep_gpus.empty() ||
                     !scenario.sweep_seqlen.empty() || !scenario.sweep_sp.empty() || !scenario.sweep_mlp_tiles.empty() ||
                     !scenario.sweep_loss_tiles.empty() || !scenario.sweep_fpdt_chunk_tokens.empty() || !scenario.sweep_ladder.empty();
  if (swept) refuse("sweep", "a run trains one plan; a sweep is for longseq sweep (one scenario file each)");
  ScenarioRunOptions options;
  options.checkpointing = plan.activation_checkpointing;
  options.checkpoint_offload = plan.checkpoint_offload;
  options.offload_optimizer = plan.offload_optimizer;
  options.offload_params = plan.offload_params;
  if (plan.tiled_mlp == false) options.mlp_tiles = 0;
  else if (plan.tiled_mlp.value_or(false) || plan.mlp_tiles) options.mlp_tiles = plan.mlp_tiles.value_or(16);
  if (plan.tiled_loss == false) options.loss_tiles = 0;
  else if (plan.tiled_loss.value_or(false) || plan.loss_tiles) options.loss_tiles = plan.loss_tiles.value_or(16);
  options.sp = plan.sp;
  options.ring = plan.ring;
  if (plan.zero_stage) options.zero_stage = *plan.zero_stage;
  if (plan.fpdt.value_or(false)) options.fpdt_chunk_tokens = plan.fpdt_chunk_tokens.value_or(65536);
  options.lora_rank = plan.lora_rank;
  options.lora_all_linear = plan.lora_all_linear;
  return options;
}

}  // namespace longseq
