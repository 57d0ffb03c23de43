// accelerate_fsdp2.cpp: Accelerate / the HF Trainer / TRL on PyTorch FSDP2 with PyTorch's context parallelism (Reference §11).
// One framework's description: its facts, what it runs (read by the rules every framework shares,
// planner/frameworks.cpp) and its own refusals. Listed once in planner/frameworks/registry.cpp.
#include <fmt/format.h>

#include "planner/frameworks.hpp"
#include "planner/frameworks/rules.hpp"

namespace longseq {

namespace {

using namespace framework_rules;

std::string plan_refused(const char* name, const ModelSpec& /*model*/, const PlanOptions& plan, int64_t gpus) {
  // Accelerate's ParallelismConfig: cp runs under FSDP2 only, sp (Ulysses) under DeepSpeed only,
  // never both (parallelism_config.py L328-334; TRL PR #7003; Reference §11 F4.2).
  if (plan.sp > 1) return fmt::format("{}: Ulysses (sp_size) runs only under DeepSpeed, and not beside cp (--framework hf-accelerate)", name);
  // fsdp_offload_params: true is CPUOffloadPolicy (F1.12, F1.19).
  if (std::string refusal = fsdp2_layout_unsupported(name, plan, "fsdp_offload_params, CPUOffloadPolicy"); !refusal.empty()) return refusal;
  if (plan.tiled_mlp) return fmt::format("{}: no switch for TiledMLP", name);
  // CPUOffloadPolicy moves every sharded parameter, frozen or not; with adapters, what stays and
  // what moves is not in the sources (adapters with offload are planned under DeepSpeed).
  // FSDP-QLoRA is planned as its export asks for it: bnb_4bit_quant_storage=bfloat16, the storage
  // Accelerate 1.15 shards (fsdp2_prepare_model leaves uint8 Params4bit out through ignored_params).
  if (plan.lora() && (plan.offload_optimizer || plan.offload_params))
    return fmt::format("{}: adapters beside FSDP2's CPU offload are not modelled (with ZeRO offload: --framework hf-accelerate)", name);
  // "TP/CP cannot be used with pure data parallelism (dp_replicate_size > 1 and dp_shard_size ==
  // 1)" (parallelism_config.py L336-341; Reference §11 F4.2): replicas need a shard group.
  if (gpus > 0 && plan.ring > 1 && plan.dp_replicate > 1 && gpus / (plan.ring * plan.dp_replicate) == 1)
    return fmt::format("{}: context parallelism over replicas of one GPU's shard (dp_replicate {} x cp {} = {} GPUs leaves "
                       "dp_shard 1), which Accelerate refuses (parallelism_config.py; Reference §11 F4.2)",
                       name, plan.dp_replicate, plan.ring, gpus);
  return "";
}

}  // namespace

extern const FrameworkDescription kAccelerateFsdp2 = {
    {Framework::framework_accelerate_fsdp2, "accelerate-fsdp2", "fsdp2-accelerate", "accelerate-fsdp2", 1, nullptr},
    /*ring_attention=*/false,
    /*pytorch_context_parallelism=*/true,
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
