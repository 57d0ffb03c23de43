#include "planner/plan_file.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <set>

#include "io/text_escape.hpp"
#include "io/checked_input.hpp"
#include "models/model_loader.hpp"

namespace longseq {

namespace {

constexpr double kBytesPerMib = 1024.0 * 1024.0;

// Refuses any key of `view` outside `known`.
void keys_check(const JsonView& view, const std::set<std::string>& known) {
  if (!view.is_object()) view.fail("expected an object");
  for (const auto& [key, value] : view.raw().items()) {
    (void)value;
    if (!known.count(key)) {
      std::string list;
      for (const auto& name : known) list += (list.empty() ? "" : ", ") + name;
      JsonView(value, view.source(), view.path().empty() ? key : view.path() + "." + key).fail("unknown key (known: " + list + ")");
    }
  }
}

bool boolean_or(const JsonView& view, const std::string& key, bool default_value) {
  return view.has(key) ? view[key].boolean() : default_value;
}

}  // namespace

std::string plan_file_to_json(const PlanFile& file) {
  const PlanOptions& p = file.plan;
  nlohmann::json plan = {{"sp", p.sp},
                         {"ring", p.ring},
                         {"zero_stage", p.zero_stage},
                         {"offload_optimizer", p.offload_optimizer},
                         {"offload_params", p.offload_params},
                         {"activation_checkpointing", p.activation_checkpointing},
                         {"checkpoint_offload", p.checkpoint_offload},
                         {"tiled_mlp", p.tiled_mlp},
                         {"mlp_tiles", p.mlp_tiles},
                         {"tiled_loss", p.tiled_loss},
                         {"loss_tiles", p.loss_tiles},
                         {"fpdt", p.fpdt},
                         {"fpdt_chunk_tokens", p.fpdt_chunk_tokens},
                         {"micro_batch", p.micro_batch}};
  if (p.tp > 1) plan["tp"] = p.tp;  // (written only under Megatron's model parallelism, which longseq's executor refuses)
  if (p.pp > 1) plan["pp"] = p.pp;
  if (p.ep > 1) plan["ep"] = p.ep;
  if (p.offload_activation_layers > 0) plan["offload_activation_layers"] = p.offload_activation_layers;
  if (p.recompute_block_layers > 0) plan["recompute_block_layers"] = p.recompute_block_layers;
  if (p.recompute_modules.any()) plan["recompute_modules"] = megatron_recompute_modules_describe(p.recompute_modules);
  if (p.vpp > 1) plan["vpp"] = p.vpp;
  if (p.fp8) plan["fp8"] = true;
  if (p.cp_all_gather) plan["cp_all_gather"] = true;
  if (p.lora()) {  // (written only for adapters: a full-training plan's file is as before)
    plan["lora_rank"] = p.lora_rank;
    plan["lora_targets"] = p.lora_all_linear ? "all-linear" : "q,v";
  }
  nlohmann::json json = {
      {"longseq_plan", kPlanFileVersion},
      {"summary", plan_describe(p)},
      {"model", {{"source", file.model}, {"name", file.model_name}, {"layers", file.layers}, {"parameters", file.parameters}}},
      {"seqlen", file.seqlen},
      {"ranks", file.ranks},
      {"device", file.device},
      {"device_budget_mib", file.device_budget_bytes / kBytesPerMib},
      {"hardware", file.hardware},
      {"profile", file.profile},
      {"plan", plan},
      {"prediction",
       {{"note", "PREDICTION of the cost model for this plan; not read back"},
        {"device_peak_mib", file.predicted_peak_bytes / kBytesPerMib},
        {"host_mib_per_node", file.predicted_host_bytes / kBytesPerMib}}}};
  return json_text(json) + "\n";
}

PlanFile plan_file_parse(const std::string& text, const std::string& source) {
  const nlohmann::json document = json_parse(text, source);
  const JsonView root(document, source);
  keys_check(root, {"longseq_plan", "summary", "model", "seqlen", "ranks", "device", "device_budget_mib", "hardware", "profile", "plan",
                    "prediction"});
  if (!root.has("longseq_plan")) root.fail("not a longseq plan file (no 'longseq_plan' version key; write one with longseq plan --plan-out)");
  const int64_t version = root["longseq_plan"].integer();
  if (version != kPlanFileVersion)
    root["longseq_plan"].fail(fmt::format("version {} is not the {} this longseq reads", version, kPlanFileVersion));
  PlanFile file;
  const JsonView model = root["model"];
  keys_check(model, {"source", "name", "layers", "parameters"});
  file.model = model["source"].string();
  file.model_name = model["name"].string();
  file.layers = model.has("layers") ? model["layers"].integer(0, 1 << 20) : 0;
  file.parameters = model["parameters"].integer(1, static_cast<int64_t>(kModelParameterLimit));
  file.seqlen = root["seqlen"].integer(1, int64_t{1} << 40);
  file.ranks = root["ranks"].integer(1, 1 << 20);
  file.device = root["device"].string();
  if (file.device != "cpu" && file.device != "cuda") root["device"].fail("expected cpu or cuda, got '" + file.device + "'");
  const double budget_mib = root["device_budget_mib"].number();
  if (!(budget_mib > 0)) root["device_budget_mib"].fail("must be positive");
  file.device_budget_bytes = budget_mib * kBytesPerMib;
  file.hardware = root.string_or("hardware", "");
  file.profile = root["profile"].string();

  const JsonView plan = root["plan"];
  keys_check(plan, {"sp", "ring", "zero_stage", "offload_optimizer", "offload_params", "activation_checkpointing", "checkpoint_offload",
                    "tiled_mlp", "mlp_tiles", "tiled_loss", "loss_tiles", "fpdt", "fpdt_chunk_tokens", "micro_batch", "lora_rank",
                    "lora_targets", "tp", "pp", "vpp", "ep", "offload_activation_layers", "recompute_block_layers", "recompute_modules", "fp8", "cp_all_gather"});
  PlanOptions& p = file.plan;
  p.sp = plan["sp"].integer(1, 1 << 20);
  p.ring = plan.has("ring") ? plan["ring"].integer(1, 1 << 20) : 1;
  p.zero_stage = static_cast<int>(plan["zero_stage"].integer(0, 3));
  p.offload_optimizer = boolean_or(plan, "offload_optimizer", false);
  p.offload_params = boolean_or(plan, "offload_params", false);
  p.activation_checkpointing = boolean_or(plan, "activation_checkpointing", false);
  p.checkpoint_offload = boolean_or(plan, "checkpoint_offload", false);
  p.tiled_mlp = boolean_or(plan, "tiled_mlp", false);
  p.mlp_tiles = plan.has("mlp_tiles") ? plan["mlp_tiles"].integer(0, int64_t{1} << 40) : 0;
  p.tiled_loss = boolean_or(plan, "tiled_loss", false);
  p.loss_tiles = plan.has("loss_tiles") ? plan["loss_tiles"].integer(0, int64_t{1} << 40) : 0;
  p.fpdt = boolean_or(plan, "fpdt", false);
  if (plan.has("fpdt_chunk_tokens")) p.fpdt_chunk_tokens = plan["fpdt_chunk_tokens"].integer(1, int64_t{1} << 40);
  p.micro_batch = plan.has("micro_batch") ? plan["micro_batch"].integer(1, 1'000'000) : 1;
  p.tp = plan.has("tp") ? plan["tp"].integer(1, 1 << 20) : 1;
  p.pp = plan.has("pp") ? plan["pp"].integer(1, 1 << 20) : 1;
  p.ep = plan.has("ep") ? plan["ep"].integer(1, 1 << 20) : 1;
  p.offload_activation_layers = plan.has("offload_activation_layers") ? plan["offload_activation_layers"].integer(0, 1 << 20) : 0;
  p.vpp = plan.has("vpp") ? plan["vpp"].integer(1, 1 << 20) : 1;
  p.recompute_block_layers = plan.has("recompute_block_layers") ? plan["recompute_block_layers"].integer(1, 1 << 20) : 0;
  if (plan.has("recompute_modules")) p.recompute_modules = megatron_recompute_modules_parse(plan["recompute_modules"].string(), source, "plan.recompute_modules");
  p.fp8 = boolean_or(plan, "fp8", false);
  p.cp_all_gather = boolean_or(plan, "cp_all_gather", false);
  if (plan.has("lora_rank")) p.lora_rank = plan["lora_rank"].integer(1, 4096);
  if (plan.has("lora_targets")) {
    if (!p.lora()) plan["lora_targets"].fail("given without lora_rank");
    p.lora_all_linear = HeldChoices::lora_targets_parse(plan["lora_targets"].string(), source, "plan.lora_targets");
  }
  if (file.ranks % p.model_parallel_ranks() != 0)
    plan["sp"].fail(fmt::format("tp={} x sp={} x ring={} x pp={} does not divide the plan's {} ranks", p.tp, p.sp, p.ring, p.pp, file.ranks));
  return file;
}

PlanFile plan_file_read(const std::string& path) { return plan_file_parse(file_read_text(path), path); }

}  // namespace longseq
