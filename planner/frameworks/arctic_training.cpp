// arctic_training.cpp: ArcticTraining: ALST's own trainer (recipe YAML), a switch for each ALST technique. Its SFT collator pads each
// batch to a multiple of data.div_length, 256 by default (FRAMEWORKS §1.5, AT-main data/sft_factory.py L163-174);
// it swaps a MoE block for ArcticMoE's grouped GEMM (Reference §12 items 79-80).
// One framework's description: its facts, what it runs (read by the rules every framework shares,
// planner/frameworks.cpp) and its own refusals. Listed once in planner/frameworks/registry.cpp.
#include <fmt/format.h>

#include "planner/frameworks.hpp"
#include "planner/frameworks/rules.hpp"

namespace longseq {

namespace {

using namespace framework_rules;

constexpr MoeExperts kArcticMoe = MoeExperts::moe_grouped_gemm;

std::string model_refused(const char* name, const ModelSpec& model) {
  if (model.is_moe() && !qwen3_moe_shaped(model))
    return fmt::format("{}: its MoE path (ArcticMoE, turned on for any model with experts) remaps Qwen3-MoE only; {} is not one "
                       "(Reference §12 item 79)", name, model.name);
  return "";
}

std::string plan_refused(const char* name, const ModelSpec& model, const PlanOptions& plan, int64_t /*gpus*/) {
  // FPDT exists only in Megatron-DeepSpeed; the UlyssesSPAttentionHF path has none (REFERENCE §8).
  if (plan.fpdt) return fmt::format("{}: no FPDT (it exists only in Megatron-DeepSpeed)", name);
  // With sp > 1 ArcticTraining always tiles the logits+loss (Liger's fused CE, or DeepSpeed's
  // TiledFusedLogitsLoss) (AT trainer/sft_trainer.py L79-156; FRAMEWORKS §1.9).
  if (plan.sp > 1 && !plan.tiled_loss) return fmt::format("{}: with sp > 1 the logits+loss are always tiled", name);
  // DeepSpeed's MoE under ArcticMoE: "Deepspeed supports only ZeRO stage 2 with MoE" (AT
  // trainer/trainer.py L259-264).
  if (model.is_moe() && plan.zero_stage > 2) return fmt::format("{}: MoE trains with ZeRO stage 2 at most (trainer.py L259-264)", name);
  if (plan.moe_aux_loss || model.output_router_logits) return fmt::format("{}: ArcticMoE's auxiliary loss is not in Reference §12; planned for transformers' own MoE "
                                            "blocks (--framework deepspeed, hf-accelerate, accelerate-fsdp2, hf-trainer)", name);
  return "";
}

}  // namespace

extern const FrameworkDescription kArcticTraining = {
    {Framework::framework_arctic_training, "arctic-training", "deepspeed-hf", "arctic-training", 256, &kArcticMoe},
    /*ring_attention=*/false,
    /*pytorch_context_parallelism=*/false,
    /*lora=*/false,
    /*trl_activation_offload=*/false,
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
    model_refused,
    plan_refused,
};

}  // namespace longseq
