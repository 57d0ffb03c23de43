#include "planner/compute_model.hpp"

#include <algorithm>
#include <string_view>
#include <utility>

#include "models/adapters.hpp"
#include "planner/pipeline.hpp"

namespace longseq {

namespace {
double as_double(int64_t value) { return static_cast<double>(value); }
}  // namespace

LayerForwardFlops layer_forward_flops(const ModelSpec& model, int64_t micro_batch, int64_t seqlen, int64_t sp) {
  const double tokens = as_double(micro_batch) * as_double(seqlen / sp);
  const double h = as_double(model.hidden_size);
  const double qkv_width = as_double(model.q_width() + 2 * model.kv_width());
  LayerForwardFlops flops;
  flops.projections = 2.0 * tokens * h * qkv_width + 2.0 * tokens * as_double(model.q_width()) * h;
  if (model.is_latent_attention()) {
    // MLA's projections, each a matrix of parameter_count's: q's down and up (or q_proj), kv's down
    // and up, the output's.
    const ModelSpec::LatentAttention& mla = model.latent_attention;
    const double q_rank = as_double(mla.q_lora_rank), kv_rank = as_double(mla.kv_lora_rank);
    const double d_nope = as_double(model.head_dim - mla.qk_rope_head_dim);
    const double q_matrices = mla.q_lora_rank > 0 ? h * q_rank + q_rank * as_double(model.q_width()) : h * as_double(model.q_width());
    flops.projections = 2.0 * tokens * (q_matrices + h * (kv_rank + as_double(mla.qk_rope_head_dim)) +
                                        kv_rank * as_double(model.num_q_heads) * (d_nope + as_double(mla.v_head_dim)) +
                                        as_double(model.v_width()) * h);
  }
  const double mlp_matrices = model.mlp_kind == MlpKind::mlp_kind_swiglu ? 3.0 : 2.0;
  flops.mlp = mlp_matrices * 2.0 * tokens * h * as_double(model.intermediate_size);
  if (model.is_moe()) {
    // Active FLOPs (Reference §12 item 4.11): each token through the router (h x E), its k experts
    // and the shared experts (gated, three matrices each), and the shared expert's gate (h x 1).
    const double per_token_width = 3.0 * (as_double(model.experts_per_token) * as_double(model.expert_intermediate_size) +
                                          as_double(model.shared_expert_intermediate_size)) +
                                   as_double(model.experts) + (model.shared_expert_gate ? 1.0 : 0.0);
    flops.mlp = 2.0 * tokens * h * per_token_width;
    // Dense first layers (DeepSeek-V3's): the average layer's share of their dense MLPs.
    if (model.dense_layers > 0)
      flops.mlp = (flops.mlp * as_double(model.moe_layers()) + mlp_matrices * 2.0 * tokens * h * as_double(model.intermediate_size) *
                                                                  as_double(model.dense_layers)) / as_double(model.num_layers);
  }
  // 2 S^2 per head for each of QK^T (over the q/k head_dim) and PV (over the value heads' width),
  // halved by the causal mask, over this rank's n_q/sp heads.
  const double s = as_double(seqlen);
  const double v_head_dim = as_double(model.v_width()) / as_double(model.num_kv_heads);
  flops.attention = as_double(micro_batch) * s * s * (as_double(model.head_dim) + v_head_dim) * as_double(model.num_q_heads) / as_double(sp);
  // Layers that attend within a sliding window of W tokens (layer_types' sliding_attention) score
  // about S W pairs where a causal layer scores S^2 / 2: the average layer's share. Where which layers
  // are windowed is not known (windowed_layers 0), every layer is priced as full attention.
  if (model.windowed_layers > 0 && model.sliding_window > 0) {
    const double windowed_share = std::min(1.0, 2.0 * as_double(model.sliding_window) / s);
    flops.attention *= (as_double(model.num_layers - model.windowed_layers) + as_double(model.windowed_layers) * windowed_share) /
                       as_double(model.num_layers);
  }
  return flops;
}

double lm_head_forward_flops(const ModelSpec& model, int64_t micro_batch, int64_t seqlen, int64_t sp) {
  return 2.0 * as_double(micro_batch) * as_double(seqlen / sp) * as_double(model.hidden_size) * as_double(model.vocab_size);
}

double recomputed_layer_share(const ModelSpec& model, const PlanOptions& plan) {
  // Block recompute: the first n of each model chunk's layers (a stage's, or under interleaving a
  // vpp-th of it), on the largest stage the step waits on.
  if (plan.activation_checkpointing && plan.recompute_block_layers > 0) {
    const double chunk_layers = as_double(pipeline_split(model, plan).largest()) / as_double(std::max<int64_t>(1, plan.vpp));
    return chunk_layers > 0 ? std::min(1.0, as_double(plan.recompute_block_layers) / chunk_layers) : 0.0;
  }
  return model.num_layers > 0 ? as_double(plan.checkpointed_layers(model.num_layers)) / as_double(model.num_layers) : 0.0;
}

double recomputed_attention_share(const ModelSpec& model, const PlanOptions& plan) {
  return plan.checkpoint_ops ? 0.0 : recomputed_layer_share(model, plan);
}

double op_selective_recomputed_matmul_flops(const ModelSpec& model, int64_t micro_batch, int64_t seqlen, int64_t sp) {
  // The even-numbered mms of decoder_layer_op_selective_saved_bytes' count: wk, wo and w3.
  const double tokens = as_double(micro_batch) * as_double(seqlen / sp);
  const double h = as_double(model.hidden_size);
  return 2.0 * tokens * h * (as_double(model.kv_width()) + as_double(model.q_width()) + as_double(model.intermediate_size));
}

double te_fp8_linear_parameters(const ModelSpec& model, const PlanOptions& plan, double dense_layers, double moe_layers) {
  // The weight matrices alone (TE's FP8 copies hold no bias or norm): a layer's linears as LoRA and
  // QLoRA count them, the attention's (q, k, v, o) and the dense MLP's.
  double attention = 0, dense_mlp = 0;
  for (const LayerLinear& linear : decoder_layer_linears(model)) {
    const std::string_view name = linear.name;
    (name == "q_proj" || name == "k_proj" || name == "v_proj" || name == "o_proj" ? attention : dense_mlp) += as_double(linear.in * linear.out);
  }
  // A MoE layer's routed experts as parameter_count splits them out, and its shared experts (gated,
  // three matrices, as parameter_count counts them), TE's linears over tp.
  const double rank_experts = as_double(parameter_count(model).per_layer_routed_experts) / as_double(std::max<int64_t>(1, plan.ep));
  const double shared_experts = 3.0 * as_double(model.hidden_size) * as_double(model.shared_expert_intermediate_size);
  const double tp = as_double(std::max<int64_t>(1, plan.tp));
  return dense_layers * (attention + dense_mlp) / tp + moe_layers * ((attention + shared_experts) / tp + rank_experts);
}

namespace {

StepFlops step_flops(const ModelSpec& model, const PlanOptions& plan, int64_t seqlen, bool with_recompute) {
  // Ring attention's zigzag split balances the causal work: per rank 1/(u r) of the whole.
  const LayerForwardFlops layer = layer_forward_flops(model, plan.micro_batch, seqlen, plan.sequence_ranks());
  // The share of layers recomputed in backward: all with checkpointing, one in every N with torchtitan's layer SAC.
  const double recompute = with_recompute ? recomputed_layer_share(model, plan) : 0.0;
  const double tiled_mlp_recompute = with_recompute && plan.tiled_mlp ? 1.0 : 0.0;
  StepFlops flops;
  // forward + backward (2x) + recompute. A frozen base (LoRA) computes no weight gradient: its
  // backward is the input gradient alone (1x); the adapters add 2 T r (in + out) a linear, trained.
  const double backward = plan.lora() ? 1.0 : 2.0;
  flops.matmul = as_double(model.num_layers) * ((layer.projections + layer.mlp) * (1.0 + backward) + layer.mlp * tiled_mlp_recompute);
  // Selective recompute of MLA's up-projections (M5.1) runs their two GEMMs again in backward.
  if (with_recompute && plan.recompute_modules.mla_up_proj && model.is_latent_attention()) {
    const ModelSpec::LatentAttention& mla = model.latent_attention;
    const double tokens = as_double(plan.micro_batch) * as_double(seqlen / plan.sequence_ranks()), heads = as_double(model.num_q_heads);
    const double q_up = mla.q_lora_rank > 0 ? as_double(mla.q_lora_rank) : as_double(model.hidden_size);
    flops.matmul += as_double(model.num_layers) * 2.0 * tokens * heads *
                    (q_up * as_double(model.head_dim) + as_double(mla.kv_lora_rank) * as_double(model.head_dim - mla.qk_rope_head_dim + mla.v_head_dim));
  }
  // Selective recompute of the dense MLP ("mlp") runs its three (or two) GEMMs' forward again in backward.
  if (with_recompute && plan.recompute_modules.mlp) flops.matmul += as_double(model.num_layers) * layer.mlp;
  if (with_recompute && plan.activation_checkpointing && plan.checkpoint_ops)
    flops.matmul += as_double(model.num_layers) * op_selective_recomputed_matmul_flops(model, plan.micro_batch, seqlen, plan.sequence_ranks());
  else flops.matmul += as_double(model.num_layers) * (layer.projections + layer.mlp) * recompute;
  if (plan.lora()) {
    const double tokens = as_double(plan.micro_batch) * as_double(seqlen / plan.sequence_ranks());
    flops.matmul += 2.0 * tokens * as_double(lora_parameter_count(model, plan.lora_rank, plan.lora_all_linear)) * (3.0 + recompute);
  }
  flops.attention = as_double(model.num_layers) * layer.attention * (1.0 + 2.5 + (with_recompute ? recomputed_attention_share(model, plan) : 0.0));
  // In FP8 every GEMM of the decoder layers' linears is TE's FP8 GEMM (forward, input and weight
  // gradients: Megatron's fp8_wgrad defaults to True, transformer_config.py L610); the LM head's are not.
  if (plan.fp8) std::swap(flops.matmul, flops.matmul_fp8);
  // LM head: forward and both gradients, never recomputed (fused losses compute the gradient in forward).
  flops.matmul += 3.0 * lm_head_forward_flops(model, plan.micro_batch, seqlen, plan.sequence_ranks());
  // Tensor parallelism splits every linear's weight, the LM head's vocabulary and the attention's
  // heads over its t ranks (reference-megatron-core M1): each computes 1/t of its group's work.
  // Pipeline parallelism gives each stage its layers; the schedule waits on the largest stage, whose
  // share is priced (the LM head's share rides with the last stage; spread evenly here).
  const double stage_share = plan.pp > 1 ? as_double(pipeline_split(model, plan).largest()) / as_double(model.num_layers) : 1.0;
  const double split = as_double(std::max<int64_t>(1, plan.tp)) / stage_share;
  flops.matmul /= split;
  flops.matmul_fp8 /= split;
  flops.attention /= split;
  return flops;
}

}  // namespace

StepFlops step_flops_executed(const ModelSpec& model, const PlanOptions& plan, int64_t seqlen) {
  return step_flops(model, plan, seqlen, true);
}

StepFlops step_flops_model(const ModelSpec& model, const PlanOptions& plan, int64_t seqlen) {
  return step_flops(model, plan, seqlen, false);
}

double megatron_flos_per_sample(const ModelSpec& model, int64_t seqlen) {
  const double s = as_double(seqlen);
  // Megatron's 24 L h^2 + 4 L h V terms as 8 P s; for a MoE model the parameters a token uses.
  return 8.0 * as_double(parameter_count(model).active) * s +
         16.0 * as_double(model.num_layers) * as_double(model.hidden_size) * s * s;
}

}  // namespace longseq
