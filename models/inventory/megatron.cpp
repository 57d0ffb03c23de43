// megatron.cpp: Megatron-Core's GPT decoder layer as its default Transformer Engine spec builds it
// (models/gpt/gpt_layer_specs.py: TELayerNormColumnParallelLinear for the input norm with QKV and
// for the pre-MLP norm with fc1, TE's DotProductAttention, TERowParallelLinear for the output
// projection and fc2; get_mlp_module_spec_for_backend L489-505), and its vocabulary-parallel loss,
// under tensor parallelism with sequence parallelism and context parallelism. The facts and their
// line citations are docs/reference-megatron-core.md (M1-M3); each step below names the one it uses.
//
// Sizes a rank holds (T = b S/(u r) tokens, t = tp; the widths in LayerShape are one TP rank's):
//   residual stream, norm outputs          [T/t, h]   (sequence-parallel shards, M1.2)
//   a column-parallel linear's gathered input [T, h]  (Megatron's global "mpu" buffer / TE's gather, M1.1)
//   q, k, v, attention output, lse         [T, n d / t], fp32 [T, n_q / t]
//   fc1 output, activation output          [T, 2f/t] (gated) or [T, f/t], [T, f/t]
// In FP8 (LayerImplementation::te_fp8, M10) the linears' inputs are saved and gathered quantized, one
// byte an element, and each backward quantizes its output gradient; the residual stream, attention and
// the loss stay bf16.
// Not modelled: dropout (the Llama-shaped recipes set hidden_dropout 0, Megatron-Bridge
// llama_bridge.py L66; TE's fused attention draws its dropout in-kernel), and what TE's
// userbuffers overlap would add.
#include "models/inventory/internal.hpp"

#include <string_view>

namespace longseq::inventory {

// A column-parallel linear under sequence parallelism multiplies on its input gathered over the TP
// ranks, in one transient buffer freed after the GEMM (M1.1; TE layernorm_linear.py L282-317,
// L430-435). Without TP it multiplies on its input as it is.
void column_parallel_gather(TensorTrace& trace, const LayerShape& shape, double gathered_bytes, std::string_view category) {
  if (shape.tp > 1) trace.alloc(category, "tp.gathered_input", gathered_bytes);
}
void column_parallel_gather_free(TensorTrace& trace, const LayerShape& shape) {
  if (shape.tp > 1) trace.free("tp.gathered_input");
}

// A row-parallel linear's output: [T, h] partial sums reduce-scattered into this rank's [T/t, h]
// (M1.2: RowParallelLinear.forward L1289-1290); without TP the GEMM writes the shard itself.
int64_t row_parallel_reduce_scatter(TensorTrace& trace, const LayerShape& shape, double gathered_bytes, double shard_bytes, const char* output) {
  if (shape.tp > 1) trace.alloc(L, "tp.row_parallel_partial", gathered_bytes);
  const int64_t id = trace.alloc(L, output, shard_bytes);
  if (shape.tp > 1) trace.free("tp.row_parallel_partial");
  return id;
}

// A column-parallel linear's input gradient, produced whole ([T, h], `partial`), reduce-scattered to
// this rank's shard (M1.1: L548-560); without TP the whole gradient is the shard, renamed.
void input_gradient_to_shard(TensorTrace& trace, const LayerShape& shape, double shard_bytes, std::string_view category, const char* partial,
                             const char* shard) {
  if (shape.tp > 1) trace.alloc(category, shard, shard_bytes);
  else trace.alias(partial, category, shard);
  trace.free(partial);
}

// A column-parallel linear's backward (M1.1: L515-527, L548-560): its input gathered again for the
// weight gradient while the input gradient is produced whole from `output_grad` (freed), then
// reduce-scattered into `shard`.
void column_parallel_backward(TensorTrace& trace, const LayerShape& shape, double gathered_bytes, double shard_bytes, const char* output_grad,
                              const char* partial, const char* shard) {
  column_parallel_gather(trace, shape, gathered_bytes);
  trace.alloc(L, partial, gathered_bytes);
  trace.free(output_grad);
  column_parallel_gather_free(trace, shape);
  input_gradient_to_shard(trace, shape, shard_bytes, L, partial, shard);
}

void TeFp8::rowwise_copy_alloc(TensorTrace& trace, double input_bytes, bool gathered) const {
  if (on && copies > 1 && !gathered) trace.alloc(L, "fp8.rowwise_copy", one(input_bytes));
}
void TeFp8::rowwise_copy_free(TensorTrace& trace, bool gathered) const {
  if (on && copies > 1 && !gathered) trace.free("fp8.rowwise_copy");
}
void TeFp8::input_quantize(TensorTrace& trace, const char* saved, double input_bytes, bool gathered) const {
  if (!on) return;
  trace.alloc(L, saved, one(input_bytes));
  rowwise_copy_alloc(trace, input_bytes, gathered);
}
void TeFp8::output_grad_quantize(TensorTrace& trace, double grad_bytes) const {
  if (on) trace.alloc(L, "fp8.output_grad", both(grad_bytes));
}
void TeFp8::output_grad_free(TensorTrace& trace) const {
  if (on) trace.free("fp8.output_grad");
}

void row_parallel_output_grad(TensorTrace& trace, const LayerShape& shape, const TeFp8& fp8, double gathered_bytes) {
  if (fp8.on) fp8.output_grad_quantize(trace, gathered_bytes);
  else column_parallel_gather(trace, shape, gathered_bytes);
}
void row_parallel_output_grad_free(TensorTrace& trace, const LayerShape& shape, const TeFp8& fp8) {
  if (fp8.on) fp8.output_grad_free(trace);
  else column_parallel_gather_free(trace, shape);
}

namespace {

struct MegatronBytes {
  double shard;        // [T/t, h]: the residual stream and the norms' outputs
  double gathered;     // [T, h]: a column-parallel linear's input gathered over the TP ranks
  double rsigma;       // fp32 [T/t]: a TE norm's saved statistic (RMSNorm: rsigma; LayerNorm adds the mean)
  double qkv, q, kv, v, out, lse;  // kv: the keys' (and, but under MLA, the values'); v, out: the values' and the attention output's
  double k_heads;               // [T, n_kv d / t]: the key heads as the QKV output holds them (no Ulysses replication)
  double q_rsigma, k_rsigma;    // fp32 [T, n_q / t], [T, n_kv / t]: a q/k norm's statistics, one per head
  double fc1, activation;
  // FP8 (M10): the linears' saved and gathered inputs at one byte an element (norm_saved, gathered_input;
  // else the activation dtype's).
  TeFp8 fp8;
  double norm_saved;      // [T/t, h]: a fused norm's output as its linear saves it
  double gathered_input;  // [T, h]: that output gathered for a column-parallel GEMM
  MegatronBytes(const LayerShape& shape, const LayerImplementation& impl) : fp8(impl) {
    const double a = static_cast<double>(impl.activation_bytes);
    const double tokens = static_cast<double>(shape.tokens), shard_tokens = static_cast<double>(shape.hidden_state_tokens());
    const double h = static_cast<double>(shape.hidden);
    shard = shard_tokens * h * a;
    gathered = tokens * h * a;
    rsigma = shard_tokens * 4.0 * 2.0;  // TE saves mean and rsigma alike (LayerNorm); RMSNorm's mean slot is empty: an upper bound
    q = tokens * static_cast<double>(shape.q_width) * a;
    kv = tokens * static_cast<double>(shape.kv_width * shape.kv_replication) * a;
    v = tokens * static_cast<double>(shape.value_width() * shape.kv_replication) * a;
    out = shape.latent_attention() ? tokens * static_cast<double>(shape.value_width()) * a : q;
    qkv = tokens * static_cast<double>(shape.q_width + 2 * shape.kv_width) * a;
    lse = tokens * static_cast<double>(shape.num_q_heads) * 4.0;
    k_heads = tokens * static_cast<double>(shape.kv_width) * a;
    q_rsigma = tokens * static_cast<double>(shape.num_q_heads) * 4.0;
    k_rsigma = tokens * static_cast<double>(shape.num_kv_heads) * 4.0;
    const double f = static_cast<double>(shape.intermediate);
    fc1 = tokens * (shape.mlp_kind == MlpKind::mlp_kind_swiglu ? 2.0 * f : f) * a;
    activation = tokens * f * a;
    norm_saved = fp8.on ? fp8.one(shard) : shard;
    gathered_input = fp8.on ? fp8.one(gathered) : gathered;
  }
};

bool context_parallel(const LayerShape& shape) { return shape.sp > 1 || shape.ring > 1; }
// The ring degree's two cp_comm_types (M2.2): p2p passes K/V blocks in a ring; all_gather gathers them whole.
bool p2p_ring(const LayerShape& shape, const LayerImplementation& impl) { return shape.ring > 1 && !impl.megatron_cp_all_gather; }
bool kv_all_gather(const LayerShape& shape, const LayerImplementation& impl) { return shape.ring > 1 && impl.megatron_cp_all_gather; }

// A norm and the column-parallel linear after it, forward (TELayerNormColumnParallelLinear, M1.1; the
// final TENorm and the vocabulary-parallel output layer, M1.3, alike): the norm's output as this
// rank's shard and its statistics are saved, the linear's `output` made on the gathered input.
//
// In FP8 the norm writes its output quantized (TE layernorm_linear.py L244-266, with_quantized_norm),
// all-gathered in FP8 under TP (L282-307); without TP it writes both copies for a card that keeps a
// transposed one, and the row-wise copy goes once the GEMM has run (the saved output keeps only its
// column-wise usage, L476-486).
void layernorm_linear_forward(TensorTrace& trace, const LayerShape& shape, const MegatronBytes& bytes, std::string_view category,
                              const char* norm_output, const char* norm_rsigma, const char* output, double output_bytes, bool keep) {
  trace.alloc(category, norm_output, bytes.norm_saved);
  trace.alloc(category, norm_rsigma, bytes.rsigma);
  bytes.fp8.rowwise_copy_alloc(trace, bytes.shard, /*gathered=*/shape.tp > 1);
  column_parallel_gather(trace, shape, bytes.gathered_input, category);
  trace.alloc(category, output, output_bytes);
  column_parallel_gather_free(trace, shape);
  bytes.fp8.rowwise_copy_free(trace, /*gathered=*/shape.tp > 1);
  if (!keep) {
    trace.free(norm_output);
    trace.free(norm_rsigma);
  }
}

// A row-parallel linear's output reduce-scattered (row_parallel_reduce_scatter); the bias-add into
// the residual makes a new shard. In FP8 it first quantizes its input (`input_bytes` at the activation
// dtype) and saves that instead (TE linear.py L514-533, L696-717: the row-wise copy, where there is a
// transposed one beside it, dropped after the GEMM), as `fp8_saved_input`.
void row_parallel_output(TensorTrace& trace, const LayerShape& shape, const MegatronBytes& bytes, const char* residual, double input_bytes,
                         const char* fp8_saved_input) {
  bytes.fp8.input_quantize(trace, fp8_saved_input, input_bytes, /*gathered=*/false);
  row_parallel_reduce_scatter(trace, shape, bytes.gathered, bytes.shard, "tp.row_parallel_output");
  bytes.fp8.rowwise_copy_free(trace, /*gathered=*/false);
  trace.alloc(L, residual, bytes.shard);
  trace.free("tp.row_parallel_output");
}

// A TE norm fused with a column-parallel linear, backward: the input gradient produced whole
// ([T, h]) and reduce-scattered to the shard, while the norm's output is gathered again for the
// weight gradient (M1.1: L515-527, L548-560).
//
// In FP8 the output gradient (`output_grad_bytes`) is quantized for both GEMMs first (TE linear.py
// L1240-1262), and under TP the saved FP8 shard gathered again is transposed for the weight gradient
// where the card keeps transposed copies (L1300-1311, L1515-1520).
void layernorm_linear_backward(TensorTrace& trace, const LayerShape& shape, const MegatronBytes& bytes, const char* output_grad,
                               double output_grad_bytes, const char* norm_output, const char* norm_rsigma, const char* input_grad) {
  bytes.fp8.output_grad_quantize(trace, output_grad_bytes);
  column_parallel_backward(trace, shape, bytes.fp8.on ? bytes.fp8.both(bytes.gathered) : bytes.gathered, bytes.shard, output_grad,
                           "tp.input_grad_partial", "tp.input_grad_shard");
  bytes.fp8.output_grad_free(trace);
  trace.free(norm_output);
  // The norm's backward writes its input's gradient; the residual branch's is added into it.
  trace.alloc(L, input_grad, bytes.shard);
  trace.free("tp.input_grad_shard");
  trace.free(norm_rsigma);
}

// The input norm fused with QKV and RoPE (GPT's attention; MLA's is megatron_mla.cpp), forward:
// leaves "attention.q", "attention.k" and either "attention.v" (under context parallelism) or the QKV
// output v is a view of.
void qkv_forward(TensorTrace& trace, const LayerShape& shape, const MegatronBytes& bytes, bool keep) {
  const bool cp = context_parallel(shape);
  // TELayerNormColumnParallelLinear (M1.1): saves the layer's input, the norm's output as this
  // rank's shard and the norm's statistics; multiplies on the gathered norm output.
  trace.set_moment("input norm and QKV");
  layernorm_linear_forward(trace, shape, bytes, L, "attention_norm.output", "attention_norm.rsigma_fp32", "attention.qkv", bytes.qkv, keep);

  // q, k and v are views of the QKV output (attention.py get_query_key_value_tensors: torch.split /
  // SplitAlongDim along the head dim); RoPE writes new q and k (apply_rotary_pos_emb, fused or not),
  // while v stays a view, keeping the whole QKV output alive as long as attention saves v.
  trace.set_moment("RoPE");
  if (shape.qk_norm) {
    // qk_layernorm (Qwen3): TENorms on the q and k views (attention.py get_query_key_value_tensors
    // L1918-1922). TE's RMSNorm makes its input contiguous and saves that copy with one statistic a
    // row (TE ops/basic/rmsnorm.py L189, L209); RoPE then writes new q and k from the norms' outputs.
    trace.alloc(L, "attention.q_norm_input", bytes.q);
    trace.alloc(L, "attention.q_norm_rsigma_fp32", bytes.q_rsigma);
    trace.alloc(L, "attention.q_norm_output", bytes.q);
    trace.alloc(L, "attention.k_norm_input", bytes.k_heads);
    trace.alloc(L, "attention.k_norm_rsigma_fp32", bytes.k_rsigma);
    trace.alloc(L, "attention.k_norm_output", bytes.k_heads);
  }
  trace.alloc(L, "attention.q", bytes.q);
  trace.alloc(L, "attention.k", bytes.kv);
  if (shape.qk_norm) {
    trace.free("attention.q_norm_output");
    trace.free("attention.k_norm_output");
  }
  if (cp) {
    // Under context parallelism TE makes q, k and v contiguous (dot_product_attention.py L2529-2532):
    // v becomes its own tensor and the QKV output is released.
    trace.alloc(L, "attention.v", bytes.kv);
    trace.free("attention.qkv");
  }
}

// Its backward, from "attention.dqkv" to the layer input's gradient.
void qkv_backward(TensorTrace& trace, const LayerShape& shape, const MegatronBytes& bytes) {
  // RoPE's backward rotates dq and dk back (through the q/k norms' backward, each writing its
  // input's gradient) into the QKV output's gradient.
  trace.set_moment("RoPE backward");
  if (shape.qk_norm) {
    trace.alloc(L, "attention.qk_norm_input_grad", bytes.q + bytes.k_heads);
    for (const char* name : {"attention.q_norm_input", "attention.q_norm_rsigma_fp32", "attention.k_norm_input", "attention.k_norm_rsigma_fp32"})
      trace.free(name);
  }
  trace.alloc(L, "attention.qkv_grad", bytes.qkv);
  trace.free("attention.dqkv");
  if (shape.qk_norm) trace.free("attention.qk_norm_input_grad");

  trace.set_moment("QKV and input norm backward");
  layernorm_linear_backward(trace, shape, bytes, "attention.qkv_grad", bytes.qkv, "attention_norm.output", "attention_norm.rsigma_fp32",
                            "layer.input_grad");
}

// The dense MLP's forward from the residual ("residual.attention") to `output` (the layer's), keeping
// what its backward needs with `keep`.
void dense_mlp_forward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl, const MegatronBytes& bytes, bool keep,
                       const char* output) {
  // The pre-MLP norm fused with fc1 (M1.1 again): saves its input (the residual), its output shard
  // and statistics.
  trace.set_moment("pre-MLP norm and fc1");
  layernorm_linear_forward(trace, shape, bytes, L, "mlp_norm.output", "mlp_norm.rsigma_fp32", "mlp.fc1_output", bytes.fc1, keep);

  // The activation (mlp.py MLP.forward): the fused bias_swiglu_impl / bias_gelu_impl saves its
  // input (fc1's output) only; the unfused glu's silu saves its output beside it.
  trace.set_moment("activation");
  if (!impl.megatron_fused_swiglu && shape.mlp_kind == MlpKind::mlp_kind_swiglu) trace.alloc(L, "mlp.silu_output", bytes.activation);
  trace.alloc(L, "mlp.activation_output", bytes.activation);
  if (!keep) {
    trace.free("mlp.fc1_output");
    if (trace.is_live("mlp.silu_output")) trace.free("mlp.silu_output");
  }

  // fc2, row-parallel, saves the activation output; its reduce-scattered output plus the residual
  // is the layer's output.
  trace.set_moment("fc2 and residual");
  row_parallel_output(trace, shape, bytes, output, bytes.activation, "mlp.activation_output_fp8");
  // In FP8 fc2 saved its quantized input, and the activation's bf16 output goes with the MLP's forward.
  if (!keep || bytes.fp8.on) trace.free("mlp.activation_output");
  if (!keep && bytes.fp8.on) trace.free("mlp.activation_output_fp8");
}

}  // namespace

void megatron_layer_forward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl, bool keep) {
  const MegatronBytes bytes(shape, impl);
  const bool cp = context_parallel(shape);
  const bool mla = shape.latent_attention();
  // v its own tensor (not a view of the QKV output): under context parallelism and MLA.
  const bool separate_v = cp || mla;

  if (mla) megatron_mla_forward(trace, shape, impl, keep);  // leaves q, k and v (megatron_mla.cpp)
  else qkv_forward(trace, shape, bytes, keep);

  trace.set_moment("attention");
  if (shape.sp > 1) {
    // cp_comm_type a2a (M2.2: AttnFuncWithCPAndQKVOA2A): q, k and v exchanged to the whole sequence
    // at n/u heads through staging copies (TE's buffers unread: priced as DeepSpeed's Ulysses, two
    // copies of what is exchanged, REFERENCE §3.1).
    trace.alloc(L, "attention.a2a_staging", static_cast<double>(impl.ulysses_staging_copies) * (bytes.q + bytes.kv + bytes.v));
  }
  if (p2p_ring(shape, impl)) {
    // cp_comm_type p2p (M2.3): the local K and V concatenated into one block and a second block for
    // the one in flight; the block last received is what attention saves, the local k and v go.
    trace.alloc(L, "ring.kv_blocks", 2.0 * (bytes.kv + bytes.v));
  }
  // cp_comm_type all_gather (M2.2: AttnFuncWithCPAndKVAllGather): every ring rank's K and V gathered,
  // and reordered by index_select into a second copy; the attention saves the local q, k, v.
  if (kv_all_gather(shape, impl)) trace.alloc(L, "cp.kv_all_gathered", 2.0 * static_cast<double>(shape.ring) * (bytes.kv + bytes.v));
  if (shape.sp > 1) trace.free("attention.a2a_staging");
  trace.alloc(L, "attention.output", bytes.out);
  trace.alloc(L, "attention.lse_fp32", bytes.lse);
  if (p2p_ring(shape, impl)) {
    trace.free("ring.kv_blocks");
    trace.free("attention.k");
    trace.free("attention.v");
    trace.alloc(L, "attention.kv_block_saved", bytes.kv + bytes.v);
  }
  if (kv_all_gather(shape, impl)) trace.free("cp.kv_all_gathered");
  if (!keep) {
    trace.free("attention.q");
    if (p2p_ring(shape, impl)) trace.free("attention.kv_block_saved");
    else {
      trace.free("attention.k");
      trace.free(separate_v ? "attention.v" : "attention.qkv");
    }
    trace.free("attention.lse_fp32");
    if (shape.qk_norm)
      for (const char* name : {"attention.q_norm_input", "attention.q_norm_rsigma_fp32", "attention.k_norm_input", "attention.k_norm_rsigma_fp32"})
        trace.free(name);
  }

  // Selective recompute of MLA's up-projections (M5.1): q, k and v, which the core attention saved,
  // discarded once it has run (multi_latent_attention.py L454-457: their storage released), and
  // recomputed as backward reaches the attention (below).
  if (keep && mla && shape.recompute.mla_up_proj)
    for (const char* name : {"attention.q", "attention.k", "attention.v"}) trace.free(name);

  // TERowParallelLinear saves its input, the attention output (M1.2); the residual add makes the
  // next shard (bias_dropout_add with hidden_dropout 0).
  trace.set_moment("output projection and residual");
  row_parallel_output(trace, shape, bytes, "residual.attention", bytes.out, "attention.output_fp8");
  if (!keep) {
    trace.free("attention.output");
    if (bytes.fp8.on) trace.free("attention.output_fp8");
  }
  // Selective recompute of a separate input norm ("layernorm", transformer_layer.py L681-686): its
  // output discarded after the attention block, recomputed when backward reaches the block.
  if (keep && mla && shape.recompute.layernorm) trace.free("attention_norm.output");

  // A MoE model's layer runs Megatron's MoE layer in place of the MLP (megatron_moe.cpp).
  if (shape.experts > 0) return megatron_moe_forward(trace, shape, impl, keep);

  // The dense MLP; under selective recompute of "mlp" (tensor_parallel.checkpoint over the MLP,
  // transformer_layer.py L882-899) it keeps nothing but its input, the residual, which the
  // checkpoint holds; backward reruns it (megatron_layer_backward).
  dense_mlp_forward(trace, shape, impl, bytes, keep && !shape.recompute.mlp, "layer.output");
  if (!keep) trace.free("residual.attention");
}

void megatron_layer_backward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl) {
  const MegatronBytes bytes(shape, impl);
  const bool cp = context_parallel(shape);
  const bool mla = shape.latent_attention();
  const bool separate_v = cp || mla;

  if (shape.experts > 0) {
    megatron_moe_backward(trace, shape, impl);
  } else {
    // A checkpointed MLP ("mlp" recompute) runs its forward again first, its output held through its
    // backward (the checkpoint's backward is torch.autograd.backward on the rerun's outputs).
    if (shape.recompute.mlp) dense_mlp_forward(trace, shape, impl, bytes, /*keep=*/true, "mlp.rerun_output");
    // fc2 (row-parallel) backward: the output gradient gathered over the TP ranks, the activation's
    // gradient produced; the weight gradient goes into the DDP's gradient buffer (model states, M3.1).
    trace.set_moment("fc2 backward");
    row_parallel_output_grad(trace, shape, bytes.fp8, bytes.gathered);
    trace.alloc(L, "mlp.activation_output_grad", bytes.activation);
    row_parallel_output_grad_free(trace, shape, bytes.fp8);
    trace.free(bytes.fp8.on ? "mlp.activation_output_fp8" : "mlp.activation_output");
    if (trace.is_live("layer.output")) trace.free("layer.output");
    if (shape.recompute.mlp) trace.free("mlp.rerun_output");

    trace.set_moment("activation backward");
    trace.alloc(L, "mlp.fc1_output_grad", bytes.fc1);
    trace.free("mlp.activation_output_grad");
    if (trace.is_live("mlp.silu_output")) trace.free("mlp.silu_output");
    trace.free("mlp.fc1_output");

    trace.set_moment("fc1 and pre-MLP norm backward");
    layernorm_linear_backward(trace, shape, bytes, "mlp.fc1_output_grad", bytes.fc1, "mlp_norm.output", "mlp_norm.rsigma_fp32",
                              "residual.attention_grad");
    trace.free("residual.attention");
  }

  // The output projection (row-parallel) backward: its output gradient gathered, the attention
  // output's gradient produced. A recomputed input norm's output comes back first (its hook is on
  // the attention block's output gradient).
  trace.set_moment("output projection backward");
  if (mla && shape.recompute.layernorm) trace.alloc(L, "attention_norm.output", bytes.shard);
  row_parallel_output_grad(trace, shape, bytes.fp8, bytes.gathered);
  trace.alloc(L, "attention.output_grad", bytes.out);
  row_parallel_output_grad_free(trace, shape, bytes.fp8);
  if (bytes.fp8.on) trace.free("attention.output_fp8");
  // MLA's up-projections recomputed (their hook is on the attention output's gradient): the
  // up-projections' outputs beside the rebuilt q, k and v (megatron_mla.cpp's forward again).
  if (mla && shape.recompute.mla_up_proj) megatron_mla_up_projection_recompute(trace, shape, impl);

  // The attention's backward: dq, dk, dv at their dtype with an fp32 dq accumulator where the
  // kernel keeps one (the profile's); under p2p two K/V blocks and their gradients travel the ring
  // with a dq buffer (M2.3: L2622-2628); under all_gather K and V gathered again and reordered, and
  // dK, dV of the whole sequence (L840-857, L868-890) with the two steps' partial gradients, about as
  // much again, before they are reduce-scattered (L1259-1275); under a2a the exchange's staging copies again.
  trace.set_moment("attention backward");
  if (impl.flash_attention_dq_accumulator) trace.alloc(L, "attention.dq_accumulator_fp32", bytes.q / static_cast<double>(impl.activation_bytes) * 4.0);
  if (p2p_ring(shape, impl)) trace.alloc(L, "ring.backward_blocks", 4.0 * (bytes.kv + bytes.v) + bytes.q);
  if (kv_all_gather(shape, impl)) trace.alloc(L, "cp.all_gather_backward", 4.0 * static_cast<double>(shape.ring) * (bytes.kv + bytes.v));
  if (shape.sp > 1) trace.alloc(L, "attention.a2a_staging", static_cast<double>(impl.ulysses_staging_copies) * (bytes.q + bytes.kv + bytes.v));
  trace.alloc(L, "attention.dqkv", bytes.q + bytes.kv + bytes.v);
  if (shape.sp > 1) trace.free("attention.a2a_staging");
  if (p2p_ring(shape, impl)) trace.free("ring.backward_blocks");
  if (kv_all_gather(shape, impl)) trace.free("cp.all_gather_backward");
  if (impl.flash_attention_dq_accumulator) trace.free("attention.dq_accumulator_fp32");
  trace.free("attention.output_grad");
  trace.free("attention.output");
  trace.free("attention.lse_fp32");
  trace.free("attention.q");
  if (p2p_ring(shape, impl)) trace.free("attention.kv_block_saved");
  else {
    trace.free("attention.k");
    trace.free(separate_v ? "attention.v" : "attention.qkv");
  }
  if (mla) megatron_mla_backward(trace, shape, impl);  // to the layer input's gradient (megatron_mla.cpp)
  else qkv_backward(trace, shape, bytes);
  trace.free("residual.attention_grad");
  trace.free("layer.output_grad");
  if (trace.is_live("layer.input")) trace.free("layer.input");
}

double megatron_layer_saved_bytes(const LayerShape& shape, const LayerImplementation& impl) {
  TensorTrace trace;
  const double input = MegatronBytes(shape, impl).shard;
  trace.alloc(L, "layer.input", input);
  megatron_layer_forward(trace, shape, impl, /*keep=*/true);
  // Everything but layer.output, with the input (the input norm's saved input, M1.1).
  return trace.current_bytes() - input;
}

void megatron_loss_forward_backward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl) {
  // The final norm and the output layer run in bf16 under FP8 too (Megatron's output layer is its own
  // ColumnParallelLinear, not TE's; transformer_config.py fp8_output_proj is MXFP8's alone).
  LayerImplementation bf16 = impl;
  bf16.te_fp8 = false;
  const MegatronBytes bytes(shape, bf16);
  const double a = static_cast<double>(impl.activation_bytes);
  const double logits = static_cast<double>(shape.tokens) * static_cast<double>(shape.vocab) * a;  // [T, V/t]
  trace.set_moment("logits and cross entropy");
  // The final norm (TENorm) saves its input and statistics; the output layer, column-parallel over
  // the vocabulary, saves its input's shard and multiplies on it gathered (M1.3).
  layernorm_linear_forward(trace, shape, bytes, kCategoryLoss, "final_norm.output", "final_norm.rsigma_fp32", "logits", logits,
                           /*keep=*/true);
  if (impl.megatron_te_cross_entropy) {
    // TE's fused kernel (M1.4): a copy of the logits' shard at their dtype, which it turns into
    // their gradient in forward, and two fp32 statistics a row; the logits themselves go.
    trace.alloc(kCategoryLoss, "cross_entropy.logits_grad", logits);
    trace.alloc(kCategoryLoss, "cross_entropy.row_stats_fp32", static_cast<double>(shape.tokens) * 8.0);
    trace.free("logits");
  } else {
    // Megatron's native loss (M1.4): the shard upcast to fp32, exponentiated in place and kept; the
    // bf16 logits are not saved.
    trace.alloc(kCategoryLoss, "cross_entropy.exp_logits_fp32", logits / a * 4.0);
    trace.free("logits");
    // Backward: the gradient written into the saved fp32 tensor in place, then cast to the
    // activation dtype for the output layer.
    trace.set_moment("cross entropy backward");
    trace.alloc(kCategoryLoss, "cross_entropy.logits_grad", logits);
    trace.free("cross_entropy.exp_logits_fp32");
  }
  trace.set_moment("output layer backward");
  trace.alloc(kCategoryLoss, "output_layer.input_grad_partial", bytes.gathered);
  trace.free("cross_entropy.logits_grad");
  if (trace.is_live("cross_entropy.row_stats_fp32")) trace.free("cross_entropy.row_stats_fp32");
  input_gradient_to_shard(trace, shape, bytes.shard, kCategoryLoss, "output_layer.input_grad_partial", "output_layer.input_grad_shard");
  trace.set_moment("final norm backward");
  trace.alloc(L, "layer.output_grad", bytes.shard);
  trace.free("output_layer.input_grad_shard");
  trace.free("final_norm.output");
  trace.free("final_norm.rsigma_fp32");
  if (trace.is_live("final_norm.input")) trace.free("final_norm.input");
}

}  // namespace longseq::inventory
