#include "planner/validation.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <fmt/format.h>
#include <map>
#include <sstream>

#include "io/checked_input.hpp"
#include "io/config_error.hpp"
#include "io/embedded_files.hpp"
#include "models/model_loader.hpp"
#include "planner/frameworks.hpp"
#include "planner/max_seqlen.hpp"
#include "planner/memory_model.hpp"
#include "planner/time_model.hpp"
#include "planner/units.hpp"

namespace longseq {

namespace {

// One CSV record: fields split on commas, double quotes protect commas and "" is a quote.
std::vector<std::string> csv_fields_split(const std::string& line, const std::string& where) {
  std::vector<std::string> fields(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        fields.back() += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        fields.back() += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      fields.emplace_back();
    } else if (c != '\r') {
      fields.back() += c;
    }
  }
  if (quoted) throw ConfigError(where, "", "unterminated quoted field");
  return fields;
}

}  // namespace

std::vector<PublishedPoint> published_points_parse(const std::string& csv_text, const std::string& source_name) {
  std::istringstream stream(csv_text);
  std::string line;
  int64_t line_number = 0;
  std::map<std::string, size_t> columns;
  std::vector<PublishedPoint> points;
  const std::vector<std::string> required = {"source", "model", "gpus", "gpu_type", "gpu_mem_gib", "nodes",
                                             "gpus_per_node", "host_mem_gb", "features", "sp", "seqlen", "seqlen_fail",
                                             "peak_mem_gib", "iter_time_s", "tflops", "mfu", "notes"};
  while (std::getline(stream, line)) {
    ++line_number;
    const std::string where = fmt::format("{}:{}", source_name, line_number);
    if (line.empty() || line[0] == '#' || line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::vector<std::string> fields = csv_fields_split(line, where);
    if (columns.empty()) {
      for (size_t i = 0; i < fields.size(); ++i)
        if (!columns.emplace(fields[i], i).second) throw ConfigError(where, fields[i], "the header names this column twice");
      for (const auto& name : required)
        if (!columns.count(name)) throw ConfigError(where, name, "header lacks this column");
      continue;
    }
    if (fields.size() != columns.size())
      throw ConfigError(where, "", fmt::format("{} fields, but the header has {} columns", fields.size(), columns.size()));
    auto text = [&](const char* name) { return fields[columns.at(name)]; };
    auto number = [&](const char* name) -> std::optional<double> {
      const std::string value = text(name);
      if (value.empty()) return std::nullopt;
      const std::optional<double> parsed = decimal_parse(value);
      if (!parsed || *parsed < 0) throw ConfigError(where, name, fmt::format("expected a non-negative number, got '{}'", value));
      return *parsed;
    };
    auto integer = [&](const char* name) -> std::optional<int64_t> {
      const std::optional<double> value = number(name);
      if (!value) return std::nullopt;
      const std::optional<int64_t> whole = whole_number(*value, 0, int64_t{1'000'000'000'000'000});
      if (!whole) throw ConfigError(where, name, fmt::format("expected an integer up to 10^15, got '{}'", text(name)));
      return *whole;
    };
    PublishedPoint point;
    // A required column left empty (sources that do not state it) keeps the row, to be reported as
    // skipped for that reason; a value that is there must be valid.
    auto unstated = [&](const char* name) {
      if (point.unstated.empty()) point.unstated = name;
    };
    auto required_integer = [&](const char* name) -> int64_t {
      const std::optional<int64_t> value = integer(name);
      if (!value) {
        unstated(name);
        return 0;
      }
      if (*value < 1) throw ConfigError(where, name, "at least 1 when given");
      return *value;
    };
    point.line = line_number;
    point.source = text("source");
    point.model = text("model");
    point.gpu_type = text("gpu_type");
    point.features = text("features");
    point.notes = text("notes");
    if (point.model.empty()) throw ConfigError(where, "model", "required");
    point.gpus = required_integer("gpus");
    point.nodes = required_integer("nodes");
    point.sp = required_integer("sp");
    // micro_batch (added to the data in 2026-11): per_device_train_batch_size; empty or absent = 1.
    if (columns.count("micro_batch")) {
      point.micro_batch = integer("micro_batch").value_or(1);
      if (point.micro_batch < 1) throw ConfigError(where, "micro_batch", "at least 1 when given");
    }
    const std::optional<double> gpu_mem = number("gpu_mem_gib");
    if (gpu_mem && *gpu_mem <= 0) throw ConfigError(where, "gpu_mem_gib", "positive when given");
    if (!gpu_mem) unstated("gpu_mem_gib");
    point.gpu_mem_gib = gpu_mem.value_or(0);
    point.gpus_per_node = integer("gpus_per_node");
    point.host_mem_gb = number("host_mem_gb");
    point.seqlen = integer("seqlen");
    point.seqlen_fail = integer("seqlen_fail");
    point.peak_mem_gib = number("peak_mem_gib");
    point.iter_time_s = number("iter_time_s");
    point.tflops = number("tflops");
    point.mfu = number("mfu");
    points.push_back(std::move(point));
  }
  if (columns.empty()) throw ConfigError(source_name, "", "no header line (expected the published_points.csv columns)");
  return points;
}

const char* figure_kind_name(FigureKind kind) {
  switch (kind) {
    case FigureKind::figure_max_seqlen: return "max_seqlen";
    case FigureKind::figure_peak_memory: return "peak_memory_gib";
    case FigureKind::figure_iteration_time: return "iteration_time_s";
    case FigureKind::figure_tflops: return "tflops";
    case FigureKind::figure_mfu: return "mfu";
    case FigureKind::figure_attention_time: return "attention_time_s";
  }
  return "?";
}

namespace {

// The hardware card for "H100-SXM" with 80 GiB: "h100-sxm-80gb"; otherwise a built-in card whose
// name starts with the type (or its first word: "H800 80GB NVLink" is an H800) and whose memory is
// within 5%.
std::optional<HardwareCard> hardware_for_point(const PublishedPoint& point) {
  const std::string exact = text_to_lower(fmt::format("{}-{:g}gb", point.gpu_type, point.gpu_mem_gib));
  for (const auto& name : builtin_hardware_names()) {
    if (name == exact) return hardware_card_load(name);
  }
  // A card that lists the source's spelling among its names (A800-SXM4-80GB, L20-48GB PCIe), at its memory.
  const std::string spelled = hardware_name_normalized(point.gpu_type);
  for (const auto& name : builtin_hardware_names()) {
    HardwareCard card = hardware_card_load(name);
    if (std::find(card.names.begin(), card.names.end(), spelled) != card.names.end() &&
        std::fabs(card.gpu_memory_gib - point.gpu_mem_gib) <= 0.05 * point.gpu_mem_gib)
      return card;
  }
  const std::string type = text_to_lower(point.gpu_type);
  for (const std::string& prefix : {type, type.substr(0, type.find(' '))}) {
    for (const auto& name : builtin_hardware_names()) {
      if (prefix.empty() || name.rfind(prefix, 0) != 0) continue;
      HardwareCard card = hardware_card_load(name);
      if (std::fabs(card.gpu_memory_gib - point.gpu_mem_gib) <= 0.05 * point.gpu_mem_gib) return card;
    }
  }
  return std::nullopt;
}

// The number written right before `suffix` ("32 q", "8 kv") or right after `prefix` ("d=128",
// "u=2"); nullopt when the text has none.
std::optional<int64_t> number_before(const std::string& text, const std::string& suffix) {
  for (size_t at = text.find(suffix); at != std::string::npos; at = text.find(suffix, at + 1)) {
    size_t begin = at;
    while (begin > 0 && text[begin - 1] == ' ') --begin;
    size_t digits = begin;
    while (digits > 0 && std::isdigit(static_cast<unsigned char>(text[digits - 1]))) --digits;
    if (digits < begin) return std::stoll(text.substr(digits, begin - digits));
  }
  return std::nullopt;
}

std::optional<int64_t> number_after(const std::string& text, const std::string& prefix) {
  for (size_t at = text.find(prefix); at != std::string::npos; at = text.find(prefix, at + 1)) {
    if (at > 0 && std::isalnum(static_cast<unsigned char>(text[at - 1]))) continue;  // "bs=1" is not "s=1"
    const size_t begin = at + prefix.size();
    size_t end = begin;
    while (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end]))) ++end;
    if (end > begin) return std::stoll(text.substr(begin, end - begin));
  }
  return std::nullopt;
}

bool contains(const std::string& text, const char* word) { return text.find(word) != std::string::npos; }

double relative_error(double predicted, double reference) { return (predicted - reference) / reference; }

// A published figure beside its prediction, where the row publishes it.
void figure_add(PointValidation& validation, FigureKind kind, std::optional<double> published, double predicted) {
  if (!published) return;
  FigureComparison figure;
  figure.kind = kind;
  figure.published = *published;
  figure.predicted = predicted;
  figure.relative_error = relative_error(predicted, *published);
  validation.figures.push_back(figure);
}

// An attention kernel benchmark row (ring_published.csv): its heads from the model column, its
// degrees, passes and split from the features, predicted by attention_benchmark_seconds.
PointValidation attention_point_validate(const PublishedPoint& point) {
  PointValidation validation;
  validation.point = point;
  auto skip = [&](const std::string& reason) {
    validation.skipped_reason = reason;
    return validation;
  };
  const std::string features = text_to_lower(point.features);
  AttentionBenchmark benchmark;
  const auto q_heads = number_before(point.model, " q"), kv_heads = number_before(point.model, " kv"),
             head_dim = number_after(point.model, "d="), batch = number_after(point.model, "bs=");
  if (!q_heads || !kv_heads || !head_dim) return skip("attention benchmark: the model column names no 'N q', 'N kv' and 'd=N'");
  benchmark.q_heads = *q_heads;
  benchmark.kv_heads = *kv_heads;
  benchmark.head_dim = *head_dim;
  benchmark.batch = batch.value_or(1);
  if (!point.seqlen) return skip("attention benchmark without a sequence length");
  benchmark.seqlen = *point.seqlen;
  if (!contains(features, "causal")) return skip("attention benchmark: only causal attention is modelled");
  if (contains(features, "fwd+bwd")) benchmark.backward = true;
  else if (!contains(features, "fwd")) return skip("attention benchmark: neither 'fwd' nor 'fwd+bwd'");
  const auto u = number_after(features, "u="), r = number_after(features, "r=");
  if (u && r) {
    benchmark.sp = *u;
    benchmark.ring = *r;
  } else if (contains(features, "ring") || contains(features, "stripe")) {
    benchmark.ring = point.sp;  // a ring over every rank of the row
  } else {
    return skip("attention benchmark: no 'u=N; r=M' and no ring named");
  }
  if (benchmark.sp * benchmark.ring != point.gpus) return skip(fmt::format("u x r = {} is not the row's {} GPUs", benchmark.sp * benchmark.ring, point.gpus));
  // zigzag / lb-ring (load-balanced) and stripe give every rank the same causal work; "basic ring"
  // is the plain split.
  benchmark.balanced = !contains(features, "basic ring");
  const std::optional<HardwareCard> hardware = hardware_for_point(point);
  if (!hardware) return skip(fmt::format("no hardware card for {} with {:g} GiB", point.gpu_type, point.gpu_mem_gib));
  if (!point.iter_time_s) return skip("attention benchmark without a time");
  ClusterSpec cluster;
  try {
    cluster = cluster_make(*hardware, point.gpus, point.nodes, point.gpus_per_node.value_or(0), 0);
  } catch (const ConfigError& error) {
    return skip(fmt::format("cluster: {}", error.what()));
  }
  validation.plan = fmt::format("attention only: sp={} ring={}{}, {}", benchmark.sp, benchmark.ring, benchmark.balanced ? "" : " (unbalanced)",
                                benchmark.backward ? "fwd+bwd" : "fwd");
  validation.profile = "FlashAttention-2 rate of the card";
  FigureComparison figure;
  figure.kind = FigureKind::figure_attention_time;
  figure.published = *point.iter_time_s;
  figure.predicted = attention_benchmark_seconds(benchmark, cluster);
  figure.relative_error = relative_error(figure.predicted, figure.published);
  validation.figures.push_back(figure);
  return validation;
}

// A card name from a free-text model column: "Llama3-8B (32L h4096 32q/8kv heads)" is llama-3-8b,
// "Llama2-7B (...)" llama-2-7b (the parenthesis restates the card's shape).
std::optional<ModelSpec> model_for_free_text(const std::string& text) {
  std::string name = text_to_lower(text.substr(0, text.find(" (")));
  if (name.rfind("llama", 0) == 0 && name.size() > 5 && std::isdigit(static_cast<unsigned char>(name[5]))) name.insert(5, "-");
  try {
    return model_load(name);
  } catch (const ConfigError&) {
    return std::nullopt;
  }
}

// A Megatron run in free text: ring_published.csv's USP rows ("Megatron-LM@... + yunchang USP; ...; tp=4;
// u=2; r=2; dp=1; pp=1; gbs=1") and NeMo's Megatron-Core rows ("NeMo 24.03.01; Megatron-Core CP (ring
// P2P; TE); FP8; tp=4; pp=1; dp=8; cp=2; gbs=64"). Priced as Megatron-Core's TE layer under tensor
// parallelism with sequence parallelism, the distributed optimizer, and context parallelism: USP's u x r
// as Megatron's a2a+p2p layout (u heads-wise inside, r ring-wise across, as yunchang's), NeMo's cp as
// its p2p ring; with FP8 where the row says so (M10). Meta's Llama 3 rows ("Meta 4D: tp=8; cp=1 ...;
// pp=16 (interleaved); dp=64 (FSDP); batch/DP=32") are priced in the same layout: Meta's own stack, which
// the row says; its FSDP as the distributed optimizer and its interleaved schedule, whose virtual stages
// it does not state (and which Megatron plans on an even split only: 126 layers on 16 stages are not),
// as 1F1B. Figures: the step's MFU, and TFLOPS as the model's causal FLOPs a second ("MFU counts only
// causal-effective FLOPs", the USP rows say; NeMo's tables do not state their FLOP count, which the
// report says).
PointValidation megatron_point_validate(const PublishedPoint& point, const std::string& features, const std::string& profile_name,
                                        std::optional<double> reserve_gib) {
  PointValidation validation;
  validation.point = point;
  auto skip = [&](const std::string& reason) {
    validation.skipped_reason = reason;
    return validation;
  };
  const auto tp = number_after(features, "tp="), u = number_after(features, "u="), r = number_after(features, "r="),
             cp = number_after(features, "cp="), pp = number_after(features, "pp="), gbs = number_after(features, "gbs="),
             batch_per_dp = number_after(features, "batch/dp="), dp_stated = number_after(features, "dp=");
  const bool meta = contains(features, "meta 4d");
  const bool usp_layout = u && r;
  if (!tp || !(usp_layout || cp)) return skip("Megatron row: no 'tp=N' with 'u=N; r=N' or 'cp=N'");
  const std::optional<ModelSpec> model = model_for_free_text(point.model);
  if (!model) return skip(fmt::format("no model card matches '{}'", point.model));
  const std::optional<HardwareCard> hardware = hardware_for_point(point);
  if (!hardware) return skip(fmt::format("no hardware card for {} with {:g} GiB", point.gpu_type, point.gpu_mem_gib));
  PlanOptions plan;
  plan.tp = *tp;
  plan.sp = usp_layout ? *u : 1;
  plan.ring = usp_layout ? *r : *cp;
  plan.pp = pp.value_or(1);
  // NeMo's global batch of samples (its rows' gbs: "gbs=1024 (4M tokens/step)" at 4,096 tokens) in micro
  // batches of one sample. USP's rows are priced one sample a data-parallel rank, as their "no
  // grad-accum" says (their gbs of 16 on one data-parallel rank is not a batch of sixteen 30K samples
  // that would fit without recompute).
  if (!usp_layout) plan.global_batch = gbs.value_or(0);
  if (meta && batch_per_dp && dp_stated) plan.global_batch = *batch_per_dp * *dp_stated;
  // The distributed optimizer: USP's rows say "ZeRO-1"; NeMo's recipes run Megatron's distributed
  // optimizer (Megatron-Bridge's and NeMo's default optimizer config, use_distributed_optimizer True).
  plan.zero_stage = usp_layout && !contains(features, "zero-1") ? 0 : 1;
  plan.fp8 = contains(features, "fp8");
  // Context parallelism that gathers K/V whole (Llama 3's: "all-gather KV CP") is Megatron's all_gather.
  plan.cp_all_gather = plan.ring > 1 && plan.sp == 1 && contains(features, "all-gather");
  std::vector<std::string> assumptions;
  const bool recompute_stated = contains(features, "recompute") && !contains(features, "recompute not stated");
  plan.activation_checkpointing = recompute_stated && !contains(features, "no act-recompute");
  ClusterSpec cluster;
  try {
    cluster = cluster_make(*hardware, point.gpus, point.nodes, point.gpus_per_node.value_or(0), 0);
  } catch (const ConfigError& error) {
    return skip(fmt::format("cluster: {}", error.what()));
  }
  if (dp_stated && *dp_stated != data_parallel_ranks(cluster, plan))
    return skip(fmt::format("dp={} is not the {} GPUs' share left by tp x cp x pp", *dp_stated, point.gpus));
  if (const std::vector<std::string> problems = plan_problems(*model, cluster, plan); !problems.empty())
    return skip(fmt::format("plan: {}", problems.front()));
  if (const std::string refusal = framework_unsupported(Framework::framework_megatron_core, *model, plan, cluster.gpus); !refusal.empty())
    return skip(refusal);
  RuntimeProfile profile = runtime_profile_load(!profile_name.empty() ? profile_name : "megatron-core");
  if (reserve_gib) profile.calibrated_reserve_gib = *reserve_gib;
  if (!point.seqlen) return skip("Megatron row without a sequence length");
  const int64_t seqlen = *point.seqlen;
  if (const std::vector<std::string> problems = seqlen_problems(plan, seqlen); !problems.empty()) return skip(problems.front());
  // The run ran at this length: a prediction that it does not fit is an error of the memory model.
  // Recompute unstated (NeMo's tables): none where the step fits without it, else every layer's,
  // what a run at that length needs; said so.
  MemoryPrediction memory = memory_predict(*model, cluster, plan, profile, seqlen, /*with_breakdown=*/false);
  if (!recompute_stated) {
    if (!memory.fits()) {
      plan.activation_checkpointing = true;
      memory = memory_predict(*model, cluster, plan, profile, seqlen, /*with_breakdown=*/false);
    }
    assumptions.push_back(plan.activation_checkpointing ? "recompute unstated: full (it does not fit without)" : "recompute unstated: none (it fits)");
  }
  if (meta) assumptions.push_back("Meta's 4D stack priced as Megatron-Core's layout: FSDP as the distributed optimizer, its interleaved "
                                  "schedule as 1F1B");
  if (!usp_layout && !plan.global_batch) assumptions.push_back("one sample a step a data-parallel rank (no gbs)");
  else if (!usp_layout && !contains(features, "mbs=")) assumptions.push_back("micro batch 1 (unstated)");
  validation.plan = plan_describe(plan);
  validation.profile_name = profile.name;
  validation.profile = profile.name + (usp_layout ? " (Megatron's TE layer; the row's USP attention priced as Megatron-Core's a2a+p2p layout)"
                                                  : plan.cp_all_gather ? " (Megatron-Core's TE layer, its all_gather context parallelism)"
                                                  : plan.ring > 1      ? " (Megatron-Core's TE layer, its p2p context parallelism)"
                                                                       : " (Megatron-Core's TE layer)");
  if (plan.fp8) validation.profile += "; FP8 GEMMs at an approximate rate (M10.3)";
  for (const std::string& assumption : assumptions) validation.profile += "; " + assumption;
  const TimePrediction timing = time_predict(*model, cluster, plan, profile, seqlen);
  figure_add(validation, FigureKind::figure_iteration_time, point.iter_time_s, timing.time.total_s());
  figure_add(validation, FigureKind::figure_tflops, point.tflops, timing.mfu * hardware->peak_bf16_tflops);
  figure_add(validation, FigureKind::figure_mfu, point.mfu, timing.mfu);
  if (!memory.fits())
    validation.profile += fmt::format("; predicted NOT to fit ({:.1f} of {:.1f} GiB) at a length the row ran", bytes_to_gib(memory.gpu_peak_bytes),
                                      bytes_to_gib(memory.gpu_capacity_bytes));
  return validation;
}

}  // namespace

PointValidation point_validate(const PublishedPoint& point, const std::string& profile_name, std::optional<double> reserve_gib) {
  PointValidation validation;
  validation.point = point;
  auto skip = [&](const std::string& reason) {
    validation.skipped_reason = reason;
    return validation;
  };

  if (!point.unstated.empty()) return skip(fmt::format("the row does not state {}", point.unstated));
  if (text_to_lower(point.model).rfind("attention only", 0) == 0) return attention_point_validate(point);
  // Features in free text (ring_published.csv's): what the model leaves out, named first.
  if (point.features.find_first_of(" ;") != std::string::npos) {
    const std::string features = text_to_lower(point.features);
    // Megatron's runs (USP's on Megatron-LM, NeMo's on Megatron-Core), FP8 among them (TE's, M10).
    if ((contains(features, "megatron-lm") && contains(features, "u=") && contains(features, "r=")) || contains(features, "megatron-core") ||
        contains(features, "meta 4d"))
      return megatron_point_validate(point, features, profile_name, reserve_gib);
    if (contains(features, "float8") || contains(features, "fp8"))
      return skip("FP8 outside Megatron-Core (torchtitan's Float8 linears: torchao's) is not modelled");
    const std::optional<int64_t> tp = number_after(features, "tp=");
    if (tp && *tp > 1) return skip(fmt::format("tensor parallelism (tp={}) outside Megatron is not modelled", *tp));
    if (contains(features, "lora")) return skip("LoRA in free text: adapter rows are read from the + features (lora, qlora) with their rank in the notes");
    return skip("features in free text: longseq reads them for attention kernel benchmarks only");
  }
  ModelSpec model;
  try {
    model = model_load(point.model);
  } catch (const ConfigError&) {
    return skip(fmt::format("no model card matches '{}'", point.model));
  }
  const std::optional<HardwareCard> hardware = hardware_for_point(point);
  if (!hardware) return skip(fmt::format("no hardware card for {} with {:g} GiB", point.gpu_type, point.gpu_mem_gib));

  PlanOptions plan;
  plan.zero_stage = 0;
  plan.activation_checkpointing = false;
  plan.sp = point.sp;
  plan.micro_batch = point.micro_batch;
  bool ulysses = false, context_parallel = false, ring = false, fsdp2 = false, hf_bf16 = false, sdpa = false, zero_unstated = false;
  bool lora = false;
  std::string attention_kernel = "fa2";
  std::stringstream features(point.features);
  std::string feature;
  while (std::getline(features, feature, '+')) {
    if (feature == "zero1") plan.zero_stage = 1;
    else if (feature == "zero2") plan.zero_stage = 2;
    else if (feature == "zero3") plan.zero_stage = 3;
    else if (feature == "ac") plan.activation_checkpointing = true;
    else if (feature == "fa2" || feature == "fa3") attention_kernel = feature;
    else if (feature == "opt_offload") plan.offload_optimizer = true;
    else if (feature == "param_offload") plan.offload_params = true;
    else if (feature == "tiled_loss") plan.tiled_loss = true;
    else if (feature == "tiled_mlp") plan.tiled_mlp = true;
    else if (feature == "ckpt_offload") plan.checkpoint_offload = true;
    else if (feature == "ulysses") ulysses = true;
    else if (feature == "tp") return skip("Megatron tensor parallelism (tp) is not modelled");
    else if (feature == "fpdt") plan.fpdt = true;
    // SDPA: whichever backend PyTorch picks on the row's GPU (the card's sdpa_default_backend).
    else if (feature == "sdpa") sdpa = true;
    else if (feature == "fsdp2") fsdp2 = true;
    else if (feature == "cp") context_parallel = true;
    else if (feature == "ring") ring = true;
    else if (feature == "hf_bf16") hf_bf16 = true;
    else if (feature == "moe") continue;  // the model card says it
    else if (feature == "lora") lora = true;
    else if (feature == "qlora") lora = plan.qlora = true;
    else if (feature == "adam8bit") plan.adam_8bit = true;
    // DeepSpeed's long-sequence recipes (ALST's, the Trainer's ZeRO configs for long context) run
    // stage 3; the row is priced so, and says it assumed it.
    else if (feature == "zero_unstated") zero_unstated = true;
    else return skip(fmt::format("unknown feature '{}'", feature));
  }
  // The sp column is the degree of whichever sequence parallelism the row names: Ulysses, or a ring
  // (PyTorch's context parallelism under FSDP2, USP's otherwise).
  if (context_parallel || ring) {
    if (ulysses) return skip("Ulysses beside a ring: the row gives one degree for both");
    plan.ring = plan.sp;
    plan.sp = 1;
  }
  if (context_parallel && !fsdp2) return skip("PyTorch context parallelism runs under FSDP2 (Accelerate, torchtitan): the row names no fsdp2");
  // FSDP2 shards every parameter over the mesh (the ZeRO-3 layout).
  if (fsdp2) plan.zero_stage = 3;
  if (zero_unstated) plan.zero_stage = 3;
  std::vector<std::string> assumptions;
  if (zero_unstated) assumptions.push_back("ZeRO stage 3 assumed (the row states none)");
  if (lora) {
    // The adapters' rank and targets as the notes give them ("r=16", "rank 64", "q_proj,v_proj");
    // otherwise rank 16 on every linear (Unsloth's and TRL's long-context examples), said so. The
    // adapters are a small share of memory either way (Reference §12 item 6).
    const std::string notes = text_to_lower(point.notes);
    std::optional<int64_t> rank;
    for (const char* prefix : {"lora_rank=", "lora_r=", "rank=", "rank: ", "rank ", "r="})
      if (!rank) rank = number_after(notes, prefix);
    plan.lora_rank = rank && *rank >= 1 && *rank <= 4096 ? *rank : 16;
    if (!rank) assumptions.push_back("LoRA rank 16 assumed (the row states none)");
    plan.lora_all_linear = !(contains(notes, "q_proj,v_proj") || contains(notes, "q_proj, v_proj") || contains(notes, "q,v"));
    if (plan.lora_all_linear && !contains(notes, "all-linear") && !contains(notes, "all_linear"))
      assumptions.push_back("adapters on every linear assumed");
  }
  if (!ulysses && plan.sp != 1) return skip(fmt::format("sp={} without the ulysses feature", plan.sp));
  // FPDT chunks the MLP and the loss itself; a listed tiled_mlp/tiled_loss adds nothing to it.
  if (plan.fpdt) plan.tiled_mlp = plan.tiled_loss = false;

  const double host_gib = point.host_mem_gb ? *point.host_mem_gb * 1e9 / kBytesPerGib : 0;
  ClusterSpec cluster;
  try {
    cluster = cluster_make(*hardware, point.gpus, point.nodes, point.gpus_per_node.value_or(0), host_gib);
  } catch (const ConfigError& error) {
    return skip(fmt::format("cluster: {}", error.what()));
  }
  const std::vector<std::string> problems = plan_problems(model, cluster, plan);
  if (!problems.empty()) return skip(fmt::format("plan: {}", problems.front()));
  validation.plan = plan_describe(plan);
  // The stack the row ran: FSDP2 under Accelerate/TRL, the plain HF Trainer in bf16, Megatron for
  // FPDT, DeepSpeed with HF otherwise.
  // 8-bit AdamW is planned through the HF Trainer / TRL (bitsandbytes), one replica a GPU.
  if (plan.adam_8bit && (fsdp2 || plan.zero_stage > 0 || plan.sequence_ranks() > 1))
    return skip(fmt::format("8-bit AdamW beside {} is not modelled yet (planned on the HF Trainer / TRL path, one replica a GPU)",
                            fsdp2 ? "FSDP2" : plan.zero_stage > 0 ? "ZeRO" : "sequence parallelism"));
  // A row from Unsloth (its source or notes say so) ran Unsloth's stack: its offloaded checkpointing
  // and fused, chunked loss (Reference §12 items 25-32).
  const bool unsloth = contains(text_to_lower(point.source), "unsloth") || contains(text_to_lower(point.notes), "unsloth");
  const char* stack = fsdp2                                            ? "fsdp2-accelerate"
                      : unsloth && !plan.fpdt && plan.zero_stage == 0  ? "unsloth"
                      : hf_bf16 || ((plan.lora() || plan.adam_8bit) && plan.zero_stage == 0 && plan.sequence_ranks() == 1) ? "hf-trainer"
                      : plan.fpdt                                      ? "megatron-deepspeed"
                                                                       : "deepspeed-hf";
  RuntimeProfile profile = runtime_profile_load(!profile_name.empty() ? profile_name : stack);
  profile.attention_kernel = sdpa ? "sdpa" : attention_kernel;
  if (reserve_gib) profile.calibrated_reserve_gib = *reserve_gib;
  if (const std::string problem = attention_kernel_problem(profile, *hardware); !problem.empty()) return skip(problem);
  validation.profile_name = profile.name;
  const std::string kernel = attention_kernel_for(profile, *hardware, plan);
  validation.profile = profile.name + (kernel != "fa2" || sdpa ? " with " + std::string(attention_kernel_facts(kernel).label) : "") +
                       (sdpa ? " (SDPA's default on this GPU)" : "");
  for (const std::string& assumption : assumptions) validation.profile += "; " + assumption;

  const bool measured_at = point.notes.find("measured_at") != std::string::npos;
  // The maximum, against a published one or a [fits, fails) bracket; a row with only a failing
  // length (its run ran out of memory there) is the bracket [0, seqlen_fail).
  if ((point.seqlen && !measured_at) || (!point.seqlen && point.seqlen_fail)) {
    // FPDT needs S to be a multiple of its chunk (which is a multiple of sp).
    const MaxSeqlenResult result = max_seqlen_find(model, cluster, plan, profile);
    FigureComparison figure;
    figure.kind = FigureKind::figure_max_seqlen;
    figure.published = static_cast<double>(point.seqlen.value_or(0));
    figure.predicted = static_cast<double>(result.max_seqlen);
    figure.binding_constraint = result.binding_constraint;
    if (point.seqlen_fail) {
      figure.published_fail = static_cast<double>(*point.seqlen_fail);
      // The true maximum lies in [seqlen, seqlen_fail): inside is exact, outside is measured
      // against the nearer bound.
      if (figure.predicted < figure.published) figure.relative_error = relative_error(figure.predicted, figure.published);
      else if (figure.predicted >= figure.published_fail) figure.relative_error = relative_error(figure.predicted, figure.published_fail);
    } else {
      figure.relative_error = relative_error(figure.predicted, figure.published);
    }
    validation.figures.push_back(figure);
  }
  if (!point.seqlen) return validation;
  const int64_t seqlen = *point.seqlen;
  if (!seqlen_problems(plan, seqlen).empty()) {
    if (validation.figures.empty()) return skip(seqlen_problems(plan, seqlen).front());
    return validation;
  }
  if (point.peak_mem_gib) {
    const MemoryPrediction memory = memory_predict(model, cluster, plan, profile, seqlen);
    FigureComparison figure;
    figure.kind = FigureKind::figure_peak_memory;
    figure.published = *point.peak_mem_gib;
    figure.predicted = bytes_to_gib(memory.gpu_peak_bytes);
    figure.relative_error = relative_error(figure.predicted, figure.published);
    validation.figures.push_back(figure);
  }
  if (point.iter_time_s || point.tflops || point.mfu) {
    const TimePrediction timing = time_predict(model, cluster, plan, profile, seqlen);
    figure_add(validation, FigureKind::figure_iteration_time, point.iter_time_s, timing.time.total_s());
    figure_add(validation, FigureKind::figure_tflops, point.tflops, timing.megatron_tflops_per_gpu);
    figure_add(validation, FigureKind::figure_mfu, point.mfu, timing.mfu);
  }
  return validation;
}

namespace {

// Median of |value| (0 for none).
double median_abs(std::vector<double> values) {
  if (values.empty()) return 0;
  for (double& value : values) value = std::fabs(value);
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

}  // namespace

std::vector<ReserveFit> reserve_fit(const std::vector<PublishedPoint>& points, double max_gib, double step_gib) {
  const int steps = static_cast<int>(std::floor(max_gib / step_gib + 1e-9));
  std::vector<ReserveFit> fits;
  for (const auto& point : points) {
    const PointValidation base = point_validate(point, "", 0.0);
    if (!base.skipped_reason.empty()) continue;
    auto fit = std::find_if(fits.begin(), fits.end(), [&](const ReserveFit& f) { return f.profile == base.profile_name; });
    if (fit == fits.end()) fit = fits.insert(fits.end(), ReserveFit{base.profile_name, 0, step_gib, {}});
    // errors[figure][step]: the figure's relative error with the reserve at step * step_gib.
    std::vector<std::vector<double>> errors(base.figures.size());
    for (int step = 0; step <= steps; ++step) {
      const PointValidation at = step == 0 ? base : point_validate(point, "", step * step_gib);
      for (size_t f = 0; f < at.figures.size(); ++f) errors[f].push_back(at.figures[f].relative_error);
    }
    for (size_t f = 0; f < base.figures.size(); ++f) {
      const FigureComparison& figure = base.figures[f];
      if (figure.kind != FigureKind::figure_max_seqlen && figure.kind != FigureKind::figure_peak_memory) continue;
      ReserveEvidence evidence{point, figure.kind, false, 0, 0, 0, errors[f]};
      const std::vector<double>& e = evidence.relative_errors;
      for (int step = 0; step <= steps; ++step) {
        const double reserve = step * step_gib;
        if (e[step] == 0) {  // inside a bracket (or exact)
          if (!evidence.informative) evidence.low_gib = reserve;
          evidence.high_gib = reserve;
          evidence.informative = true;
        } else if (step > 0 && !evidence.informative && e[step - 1] * e[step] < 0) {
          // The error changes sign between two grid points: interpolate the crossing.
          const double crossing = reserve - step_gib + step_gib * e[step - 1] / (e[step - 1] - e[step]);
          evidence.informative = true;
          evidence.low_gib = evidence.high_gib = crossing;
          break;
        }
      }
      // Too long without a reserve, and host memory the reason: the interval's low end is no evidence.
      if (evidence.informative && evidence.low_gib > 0 && e[0] > 0 && figure.binding_constraint == "host memory") {
        evidence.host_bound_below_gib = evidence.low_gib;
        evidence.low_gib = 0;
      }
      fit->evidence.push_back(evidence);
    }
  }
  for (auto& fit : fits) {
    double best_cost = std::numeric_limits<double>::infinity();
    for (int step = 0; step <= steps; ++step) {
      const double reserve = step * step_gib;
      double cost = 0;
      for (const auto& evidence : fit.evidence)
        if (evidence.informative) cost += std::max({0.0, evidence.low_gib - reserve, reserve - evidence.high_gib});
      if (cost < best_cost - 1e-9) {
        best_cost = cost;
        fit.reserve_gib = reserve;
      }
    }
  }
  return fits;
}

ReserveSensitivity reserve_fit_sensitivity(const ReserveFit& fit, double reserve_gib) {
  const auto step = static_cast<size_t>(std::lround(reserve_gib / fit.step_gib));
  std::vector<double> max_errors, peak_errors;
  for (const auto& evidence : fit.evidence) {
    if (step >= evidence.relative_errors.size()) throw std::invalid_argument("reserve_fit_sensitivity: reserve outside the fit's grid");
    (evidence.kind == FigureKind::figure_max_seqlen ? max_errors : peak_errors).push_back(evidence.relative_errors[step]);
  }
  return {median_abs(max_errors), median_abs(peak_errors)};
}

std::vector<FigureSummary> validation_summarize(const std::vector<PointValidation>& validations) {
  std::vector<FigureSummary> summaries;
  for (FigureKind kind : {FigureKind::figure_max_seqlen, FigureKind::figure_peak_memory, FigureKind::figure_iteration_time,
                          FigureKind::figure_tflops, FigureKind::figure_mfu, FigureKind::figure_attention_time}) {
    std::vector<double> errors;
    FigureSummary summary;
    summary.kind = kind;
    for (const auto& validation : validations) {
      for (const auto& figure : validation.figures) {
        if (figure.kind != kind) continue;
        const double error = std::fabs(figure.relative_error);
        errors.push_back(error);
        if (error >= summary.worst_abs_error) {
          summary.worst_abs_error = error;
          summary.worst_line = validation.point.line;
        }
      }
    }
    if (errors.empty()) continue;
    summary.count = static_cast<int64_t>(errors.size());
    summary.median_abs_error = median_abs(std::move(errors));
    summaries.push_back(summary);
  }
  return summaries;
}

}  // namespace longseq
