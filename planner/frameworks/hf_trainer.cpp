// hf_trainer.cpp: The plain HF Trainer / TRL SFTTrainer: no DeepSpeed, no FSDP (DDP across GPUs); where adapters are planned.
// One framework's description: its facts, what it runs (read by the rules every framework shares,
// planner/frameworks.cpp) and its own refusals. Listed once in planner/frameworks/registry.cpp.
#include <fmt/format.h>

#include "planner/frameworks.hpp"

namespace longseq {

namespace {

std::string plan_refused(const char* name, const ModelSpec& /*model*/, const PlanOptions& plan, int64_t /*gpus*/) {
  // A model on every GPU, trained by PyTorch alone: none of DeepSpeed's partitioning, offload,
  // sequence parallelism or tiling; Liger's kernels (use_liger_kernel=True) give the tiled loss.
  if (plan.sp > 1) return fmt::format("{}: no sequence parallelism (DeepSpeed's Ulysses: --framework hf-accelerate)", name);
  if (plan.fpdt) return fmt::format("{}: no FPDT (it exists only in Megatron-DeepSpeed)", name);
  if (plan.zero_stage > 0) return fmt::format("{}: no ZeRO (DeepSpeed: --framework hf-accelerate)", name);
  if (plan.offload_optimizer || plan.offload_params) return fmt::format("{}: no optimizer or parameter offload (DeepSpeed's)", name);
  if (plan.tiled_mlp) return fmt::format("{}: no switch for TiledMLP", name);
  // Checkpoint offload: transformers' gradient_checkpointing_kwargs={"offload": True} (>= 5.17;
  // Reference §11 F5.7), or Unsloth's offloaded checkpointing for adapters (§12 items 25-29).
  return "";
}

}  // namespace

extern const FrameworkDescription kHfTrainer = {
    {Framework::framework_hf_trainer, "hf-trainer", "hf-trainer", "hf-trainer", 1, nullptr},
    /*ring_attention=*/false,
    /*pytorch_context_parallelism=*/false,
    /*lora=*/true,
    /*trl_activation_offload=*/true,
    /*adam_8bit=*/true,
    /*tiles_moe_blocks=*/false,
    /*selective_checkpointing=*/false,
    /*model_parallelism=*/false,
    /*attention_sinks=*/false,
    /*te_activation_offload=*/false,
    /*deepseek_v3_layers=*/false,
    /*megatron_recompute=*/false,
    /*te_fp8=*/false,
    /*megatron_cp_all_gather=*/false,
    nullptr,
    plan_refused,
};

}  // namespace longseq
