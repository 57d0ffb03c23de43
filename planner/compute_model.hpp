// compute_model.hpp: FLOPs per rank for one training step, component by component.
//
// Conventions: a multiply-add is 2 FLOPs. Attention follows FlashAttention's benchmark
// convention (FA3 paper §4.1, REFERENCE §6): forward = 4 * S^2 * d * heads, halved when causal;
// backward = 2.5 x forward. Backward GEMMs cost 2 x forward (input and weight gradients).
// Activation checkpointing adds one forward (the recompute); DeepSpeed's TiledMLP recomputes
// the MLP once more inside its own backward (its docstring: "if you're using activation
// checkpointing it then occurs trice", REFERENCE §3.2).
#pragma once

#include <cstdint>

#include "models/model_spec.hpp"
#include "planner/plan.hpp"

namespace longseq {

// A sum through a struct: compute is added with +=, never tracked in loose scalars.
struct StepFlops {
  double matmul = 0;     // projections, MLP, LM head (in the compute dtype, bf16)
  // The decoder layers' linears in FP8 (PlanOptions::fp8: Transformer Engine's, forward, both
  // gradients and the recompute), taken out of `matmul`; the LM head stays there (M10.3).
  double matmul_fp8 = 0;
  double attention = 0;  // attention core (QK^T, PV), causal
  StepFlops& operator+=(const StepFlops& other) {
    matmul += other.matmul;
    matmul_fp8 += other.matmul_fp8;
    attention += other.attention;
    return *this;
  }
  double total() const { return matmul + matmul_fp8 + attention; }
};

// One decoder layer's forward on one rank: `tokens` = b * S/sp local tokens; attention runs on
// the full sequence for n_q/sp heads after the Ulysses all-to-all.
struct LayerForwardFlops {
  double projections = 0;  // q, k, v, o
  double mlp = 0;
  double attention = 0;    // causal
};

LayerForwardFlops layer_forward_flops(const ModelSpec& model, int64_t micro_batch, int64_t seqlen, int64_t sp);

// LM head forward on one rank: 2 * tokens * h * V.
double lm_head_forward_flops(const ModelSpec& model, int64_t micro_batch, int64_t seqlen, int64_t sp);

// What the GPU executes: forward, recomputes, backward.
StepFlops step_flops_executed(const ModelSpec& model, const PlanOptions& plan, int64_t seqlen);

// The share of decoder layers whose forward runs again in backward: 1 with checkpointing, 1/N with
// one layer in every N checkpointed (a whole number of them: floor(L / N) / L), 0 without.
double recomputed_layer_share(const ModelSpec& model, const PlanOptions& plan);

// The share of decoder layers whose attention core runs again in backward: as above, but none
// under op-level selective checkpointing (SDPA's outputs are in its save list).
double recomputed_attention_share(const ModelSpec& model, const PlanOptions& plan);

// One layer's matmul FLOPs recomputed under op-level selective checkpointing on one rank: the mms
// its policy does not save (k_proj, o_proj, up_proj; decoder_layer_op_selective_saved_bytes).
double op_selective_recomputed_matmul_flops(const ModelSpec& model, int64_t micro_batch, int64_t seqlen, int64_t sp);

// The linear weights of `dense_layers` dense and `moe_layers` MoE decoder layers that Transformer
// Engine runs in FP8 on one rank (M10.2, M10.4): the attention's, a dense MLP's and the shared experts'
// TP share, a MoE layer's experts' ep share, whole (its router is Megatron's own linear, not TE's).
double te_fp8_linear_parameters(const ModelSpec& model, const PlanOptions& plan, double dense_layers, double moe_layers);

// Model FLOPs for MFU: forward + backward once, no recompute.
StepFlops step_flops_model(const ModelSpec& model, const PlanOptions& plan, int64_t seqlen);

// The formula ALST prints TFLOPS with (ArcticTraining metrics.py @ 9d33fd2, REFERENCE §2.3):
// 8*P*s + 16*L*h*s^2 per sample of s tokens ("activation checkpointing always on", attention
// counted non-causal). Per-GPU TFLOPS = this / (sp * iteration time).
double megatron_flos_per_sample(const ModelSpec& model, int64_t seqlen);

}  // namespace longseq
