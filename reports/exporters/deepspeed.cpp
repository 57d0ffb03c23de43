// deepspeed.cpp: --emit deepspeed and usp, a DeepSpeed JSON for a plain deepspeed.initialize loop
// (FRAMEWORKS §4).
#include "reports/exporters/common.hpp"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>

#include "io/text_escape.hpp"
#include "models/adapters.hpp"
#include "planner/time_model.hpp"
#include "planner/units.hpp"
#include "io/config_error.hpp"
#include "reports/memory_report.hpp"

namespace longseq {

using namespace exporters;

ExportedConfig deepspeed_config_emit(const ExportRequest& r) {
  const PlanOptions& p = r.plan;
  ExportedConfig exported;
  for (const auto& line : record_lines(r, "a plain deepspeed.initialize loop")) exported.notes.push_back(line);
  if (const RopeExtension rope = rope_extension(r); rope.factor > 0)
    exported.notes.push_back(rope_extension_note(r, rope, "the JSON cannot set it; load the model in the loop with"));
  if (p.sp > 1)
    exported.notes.push_back("Ulysses: call UlyssesSPAttentionHF.register_with_transformers and wrap the DataLoader in "
                             "UlyssesSPDataLoaderAdapter (DeepSpeed >= 0.18.2); sequence_parallel_size alone does not switch it on");
  if (p.activation_checkpointing) exported.notes.push_back("activation checkpointing: model.gradient_checkpointing_enable() in the script");
  if (p.checkpoint_offload)
    exported.notes.push_back("checkpoint offload: ArcticTraining's CheckpointFunction CPU-offload patch (DeepSpeed's cpu_checkpointing "
                             "acts only through deepspeed.checkpointing)");
  if (p.tiled_mlp) exported.notes.push_back("tiled MLP: deepspeed.runtime.sequence_parallel.ulysses_sp.TiledMLP in the script");
  if (p.tiled_loss) exported.notes.push_back("tiled loss: TiledFusedLogitsLoss (DeepSpeed >= 0.17.4) or Liger's fused CE in the script");
  if (p.fpdt) exported.notes.push_back("FPDT: only in Megatron-DeepSpeed (--emit megatron-deepspeed); not expressed here");
  nlohmann::json config = deepspeed_common(r);
  // Nothing fills "auto" in a plain loop (§4.1): dp-based integers; clipping explicit (its
  // default moved from 0 to 1.0 in v0.19.3, §4.4).
  config["train_micro_batch_size_per_gpu"] = p.micro_batch;
  config["gradient_accumulation_steps"] = accumulation_steps(r);
  // DeepSpeed's mesh knows only the Ulysses group (sequence_parallel_size): the world over it is
  // its data-parallel size, so a ring's ranks count as replicas and its batch check wants
  // micro x accumulation x world / sp ("train_batch_size 1 != 1 * 1 * 2" otherwise).
  config["train_batch_size"] = p.micro_batch * accumulation_steps(r) * r.cluster.gpus / p.sp;
  if (p.ring > 1)
    exported.notes.push_back(fmt::format(
        "USP's groups: DeepSpeed sees sequence_parallel_size={} only and counts the {} ring ranks of a sequence as data-parallel "
        "replicas (train_batch_size {} = micro x accumulation x world / sp); build the groups with yunchang's set_seq_parallel_pg({}, {}, rank, "
        "world_size), give the {} ranks of one ring the same sample (each keeps its zigzag chunks), and average the loss over "
        "them as DeepSpeed averages gradients: each rank's mean over its chunk", p.sp, p.ring, p.micro_batch * accumulation_steps(r) * r.cluster.gpus / p.sp,
        p.sp, p.ring, p.ring));
  config["gradient_clipping"] = 1.0;
  // Optimizer offload needs DeepSpeed to build its CPU Adam from this block (no client optimizer, §4.3).
  config["optimizer"] = {{"type", "AdamW"}, {"params", {{"lr", 1e-5}, {"betas", {0.9, 0.95}}, {"eps", 1e-8}, {"weight_decay", 0.0}}}};
  if (p.offload_optimizer) exported.notes.push_back("optimizer offload: pass no optimizer to deepspeed.initialize (the JSON's AdamW becomes CPU Adam)");
  config["longseq_plan"] = json_record(r, "a plain deepspeed.initialize loop");
  exported.files.push_back({"", json_text(config) + "\n"});
  return exported;
}

}  // namespace longseq
