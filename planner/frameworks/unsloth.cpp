// unsloth.cpp: Unsloth on one GPU: its offloaded checkpointing, fused chunked loss, LoRA/QLoRA (a Python script).
// One framework's description: its facts, what it runs (read by the rules every framework shares,
// planner/frameworks.cpp) and its own refusals. Listed once in planner/frameworks/registry.cpp.
#include <fmt/format.h>

#include "planner/frameworks.hpp"

namespace longseq {

namespace {

std::string plan_refused(const char* name, const ModelSpec& /*model*/, const PlanOptions& plan, int64_t gpus) {
  // One GPU (its open-source trainer), its own kernels: no DeepSpeed, FSDP or sequence
  // parallelism; its fused cross entropy runs whenever labels are given (item 31), its
  // checkpoint offload is use_gradient_checkpointing="unsloth" (items 25-29).
  if (plan.sequence_ranks() > 1) return fmt::format("{}: no sequence parallelism (one GPU)", name);
  if (gpus > 1) return fmt::format("{}: trains on one GPU (its open-source trainer; no data-parallel launch is planned)", name);
  if (plan.fpdt) return fmt::format("{}: no FPDT (it exists only in Megatron-DeepSpeed)", name);
  if (plan.zero_stage > 0 || plan.offload_optimizer || plan.offload_params)
    return fmt::format("{}: no ZeRO or optimizer/parameter offload (DeepSpeed's)", name);
  if (!plan.tiled_loss) return fmt::format("{}: its fused, chunked cross entropy always runs (Reference §12 item 31)", name);
  if (plan.checkpoint_offload && !plan.activation_checkpointing)
    return fmt::format("{}: its offload is of checkpoints (use_gradient_checkpointing=\"unsloth\")", name);
  return "";
}

}  // namespace

extern const FrameworkDescription kUnsloth = {
    {Framework::framework_unsloth, "unsloth", "unsloth", "unsloth", 1, nullptr},
    /*ring_attention=*/false,
    /*pytorch_context_parallelism=*/false,
    /*lora=*/true,
    /*trl_activation_offload=*/false,
    /*adam_8bit=*/true,
    /*tiles_moe_blocks=*/true,
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
