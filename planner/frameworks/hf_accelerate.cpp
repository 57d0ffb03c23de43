// hf_accelerate.cpp: Accelerate / the HF Trainer / TRL on DeepSpeed (an Accelerate YAML and the DeepSpeed JSON it names).
// One framework's description: its facts, what it runs (read by the rules every framework shares,
// planner/frameworks.cpp) and its own refusals. Listed once in planner/frameworks/registry.cpp.
#include <fmt/format.h>

#include "planner/frameworks.hpp"

namespace longseq {

namespace {

std::string plan_refused(const char* name, const ModelSpec& /*model*/, const PlanOptions& plan, int64_t /*gpus*/) {
  if (plan.fpdt) return fmt::format("{}: no FPDT (it exists only in Megatron-DeepSpeed)", name);
  // No Trainer flag for TiledMLP or activation-checkpoint CPU offload (FRAMEWORKS §2.8).
  if (plan.tiled_mlp) return fmt::format("{}: no switch for TiledMLP (HF Trainer/TRL; a script change)", name);
  if (plan.checkpoint_offload) return fmt::format("{}: no switch for checkpoint offload to the host (HF Trainer/TRL)", name);
  return "";
}

}  // namespace

extern const FrameworkDescription kHfAccelerate = {
    {Framework::framework_hf_accelerate, "hf-accelerate", "deepspeed-hf", "accelerate", 1, nullptr},
    /*ring_attention=*/false,
    /*pytorch_context_parallelism=*/false,
    /*lora=*/true,
    /*trl_activation_offload=*/true,
    /*adam_8bit=*/false,
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
