// megatron_deepspeed.cpp: Megatron-DeepSpeed: Ulysses and FPDT in its own GPT model code (launch arguments and a DeepSpeed JSON).
// One framework's description: its facts, what it runs (read by the rules every framework shares,
// planner/frameworks.cpp) and its own refusals. Listed once in planner/frameworks/registry.cpp.
#include <fmt/format.h>

#include "planner/frameworks.hpp"
#include "planner/frameworks/rules.hpp"

namespace longseq {

namespace {

using namespace framework_rules;

std::string model_refused(const char* name, const ModelSpec& model) {
  // Megatron's MoE is its own model code (deepspeed.moe layers), not a Hugging Face checkpoint's block.
  if (model.is_moe()) return fmt::format("{}: trains its own MoE model code, not {}'s Hugging Face experts", name, model.name);
  // Megatron's ParallelAttention has no per-head q/k RMSNorm: a Qwen3 model would train without it.
  if (model.qk_norm) return fmt::format("{}: no q/k norm (Qwen3's per-head RMSNorm); {} would train without it", name, model.name);
  return "";
}

std::string plan_refused(const char* name, const ModelSpec& model, const PlanOptions& plan, int64_t /*gpus*/) {
  // TiledMLP and the tiled loss are ALST's (ArcticTraining/DeepSpeed HF path); Megatron chunks
  // the FFN and the loss only inside FPDT (FRAMEWORKS §3.1-3.2).
  if (plan.tiled_mlp) return fmt::format("{}: no TiledMLP (its FFN is chunked only by FPDT)", name);
  if (plan.tiled_loss) return fmt::format("{}: no tiled logits+loss (chunked only by FPDT)", name);
  // Its non-FPDT attention asserts projection_size == kv_projection_size whenever DeepSpeed
  // sequence parallelism is on (megatron/model/transformer.py L728-729 since the FPDT commit
  // 676a482c; FRAMEWORKS §3.2's correction, reproduced with 4 query / 2 kv heads at sp=2).
  if (plan.sp > 1 && !plan.fpdt && model.num_kv_heads != model.num_q_heads)
    return fmt::format("{}: its Ulysses attention asserts as many kv heads as query heads (transformer.py L728-729); {} has "
                       "{}/{} (grouped-query): sp=1 only, or FPDT for a GPT-shaped model",
                       name, model.name, model.num_q_heads, model.num_kv_heads);
  if (plan.fpdt && !gpt_shaped(model))
    return fmt::format("{}: FPDT's layer is GPT-shaped (GeLU MLP with bias, biased q/k/v); {} is not (FRAMEWORKS §3.2)", name,
                       model.name);
  return "";
}

}  // namespace

extern const FrameworkDescription kMegatronDeepSpeed = {
    {Framework::framework_megatron_deepspeed, "megatron-deepspeed", "megatron-deepspeed", "megatron-deepspeed", 1, nullptr},
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
