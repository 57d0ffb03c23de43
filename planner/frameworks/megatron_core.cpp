// megatron_core.cpp: Megatron-Core with Transformer Engine (Megatron-LM's pretrain_gpt, Megatron-Bridge,
// NeMo): tensor parallelism with sequence parallelism, context parallelism, the distributed optimizer.
// One framework's description: its facts, what it runs (read by the rules every framework shares,
// planner/frameworks.cpp) and its own refusals. Listed once in planner/frameworks/registry.cpp. The
// facts are docs/reference-megatron-core.md's (M1-M7).
#include <fmt/format.h>

#include "planner/frameworks.hpp"

namespace longseq {

namespace {

// What longseq's Megatron layer (models/inventory/megatron.cpp) does not build yet, though
// Megatron-Core does: a refusal by name rather than a plan priced for another layer.
std::string model_refused(const char* name, const ModelSpec& model) {
  // Megatron's MoE layer as models/inventory/megatron_moe.cpp builds it: routed SwiGLU experts,
  // shared experts (SharedExpertMLP, without biases: shared_experts.py L124) and their gate.
  if (model.is_moe() && model.shared_expert_intermediate_size > 0 && model.mlp_bias)
    return fmt::format("{}: {}'s shared experts carry biases, which Megatron's SharedExpertMLP refuses", name, model.name);
  if (model.is_moe() && model.mlp_kind != MlpKind::mlp_kind_swiglu)
    return fmt::format("{}: {}'s experts are not SwiGLU, the only experts longseq's Megatron MoE layer builds", name, model.name);
  if (model.norms_per_layer == 4) return fmt::format("{}: {}'s post-norms are not in longseq's Megatron layer yet", name, model.name);
  // Sliding windows as Megatron expresses them (window_size on every layer, every window_attn_skip_freq-th
  // layer full): all layers windowed, or every other one (gpt-oss; Megatron-Bridge's
  // gpt_oss_bridge.py L87-88). A window on layers not known, or in another pattern, is refused.
  if (model.sliding_window > 0 && model.windowed_layers != model.num_layers && 2 * model.windowed_layers != model.num_layers)
    return fmt::format("{}: {}'s sliding-window layers are not in a pattern Megatron's window_size and window_attn_skip_freq express "
                       "(all layers, or every other one, from its layer_types)", name, model.name);
  if (model.final_logit_softcapping > 0) return fmt::format("{}: {}'s logit soft-capping is not modelled under Megatron", name, model.name);
  return "";
}

std::string plan_refused(const char* name, const ModelSpec& model, const PlanOptions& plan, int64_t /*gpus*/) {
  // TE's context parallelism runs sliding windows with cp_comm_type a2a or all_gather, and a
  // learnable softmax (sinks) with a2a alone (TE 2.20.2 context_parallel.py L5688-5701, M7.2).
  if (plan.ring > 1 && (model.sliding_window > 0 || model.attention_sinks))
    return fmt::format("{}: {}'s {} run under TE's context parallelism with cp_comm_type a2a only, not p2p's ring: --sp", name, model.name,
                       model.attention_sinks ? "attention sinks" : "sliding windows");
  if (plan.fpdt) return fmt::format("{}: no FPDT (it exists only in Megatron-DeepSpeed)", name);
  if (plan.tiled_mlp || plan.tiled_loss) return fmt::format("{}: no ALST tiling (TiledMLP and the tiled loss are DeepSpeed's)", name);
  // The distributed optimizer shards the fp32 main parameters and Adam's moments over data x context
  // parallel ranks (ZeRO-1's layout, M2.4, M3.2); gradients stay whole in the DDP buffer (M3.1).
  if (plan.zero_stage > 1)
    return fmt::format("{}: the distributed optimizer is ZeRO-1's layout (zero 1; zero 0 without it); ZeRO-2/3 are DeepSpeed's and FSDP's "
                       "(Megatron-FSDP is not modelled)", name);
  if (plan.offload_optimizer || plan.offload_params)
    return fmt::format("{}: its optimizer CPU offload (optimizer_cpu_offload) is not modelled; no ZeRO offload", name);
  // Offloading each checkpoint is DeepSpeed's and the trainers'; Megatron offloads whole layers'
  // saved activations without recompute (TE's cpu_offloading, M5.3): --offload-activations.
  if (plan.checkpoint_offload)
    return fmt::format("{}: no checkpoint offload (TE's activation offloading moves whole layers' activations without recompute: "
                       "--no-checkpointing --offload-activations N)", name);
  // PyTorch CP's all-to-all rotation is PyTorch's; Megatron's a2a is Ulysses' layout: sp.
  if (plan.cp_all_to_all) return fmt::format("{}: --cp-rotate is PyTorch's; Megatron's cp_comm_type a2a is its Ulysses layout (--sp)", name);
  return "";
}

}  // namespace

extern const FrameworkDescription kMegatronCore = {
    {Framework::framework_megatron_core, "megatron-core", "megatron-core", "megatron-core", 1, nullptr},
    // cp_comm_type p2p: K/V blocks passed in a ring (ring); a2a: Ulysses' layout (sp); a2a+p2p: both (M2.2).
    /*ring_attention=*/true,
    /*pytorch_context_parallelism=*/false,
    /*lora=*/false,
    /*trl_activation_offload=*/false,
    /*adam_8bit=*/false,
    /*tiles_moe_blocks=*/false,
    // recompute_granularity full over every layer (uniform, recompute_num_layers 1), over a stage's
    // first n (block, --recompute-block-layers), or none; its selective recompute is megatron_recompute's (M5.1).
    /*selective_checkpointing=*/false,
    /*model_parallelism=*/true,
    /*attention_sinks=*/true,
    /*te_activation_offload=*/true,
    /*deepseek_v3_layers=*/true,
    /*megatron_recompute=*/true,
    // Transformer Engine's FP8 linears (--fp8-format hybrid, its default delayed recipe: M10).
    /*te_fp8=*/true,
    /*megatron_cp_all_gather=*/true,
    model_refused,
    plan_refused,
};

}  // namespace longseq
