// megatron_mla.cpp: Megatron-Core's multi-head latent attention (MLASelfAttention, DeepSeek-V2/V3) up to
// its core attention, as the TE spec builds it without the fused down-projection (gpt_layer_specs.py
// L295-313: a separate TENorm as the input norm, TELinear "duplicated" for the q and kv
// down-projections, TELayerNormColumnParallelLinear for the up-projections with the latents' norms
// fused, qk_layernorm true as Megatron-Bridge's DeepSeek providers set), unfused RoPE
// (apply_rope_fusion false in deepseek_v3_bridge.py L78). Facts and citations:
// docs/reference-megatron-core.md M9.1 (megatron-core 0.19.2 multi_latent_attention.py).
//
// Sizes a rank holds (T = b S/(u r) tokens, T_s = T/t its sequence-parallel shard, n = heads / t,
// d_qk = head_dim, d_v, d_rope, r_q and r_kv the latents' widths):
//   the input norm's output, the down-projections' input    [T_s, h]   (not gathered: they run on the shard)
//   the q latent, the kv latent with the rotary key          [T_s, r_q], [T_s, r_kv + d_rope]
//   an up-projection's gathered input                        [T, r_q], [T, r_kv]
//   q's up-projection, kv's                                  [T, n d_qk], [T, n (d_qk - d_rope + d_v)]
//   query, key, value                                        [T, n d_qk], [T, n d_qk], [T, n d_v]
#include "models/inventory/internal.hpp"

namespace longseq::inventory {

namespace {

struct MlaBytes {
  double shard, rsigma;
  double q_latent, kv_combined, kv_latent;  // [T_s, r_q], [T_s, r_kv + d_rope], [T_s, r_kv]
  double q_latent_gathered, kv_latent_gathered, gathered;  // [T, r_q], [T, r_kv], [T, h]
  double rope_key;  // [T, d_rope]: the rotary key gathered from the sequence shards
  double q, k, v, kv_up;
  MlaBytes(const LayerShape& shape, const LayerImplementation& impl) {
    const double a = static_cast<double>(impl.activation_bytes);
    const double tokens = static_cast<double>(shape.tokens), shard_tokens = static_cast<double>(shape.hidden_state_tokens());
    const double q_rank = static_cast<double>(shape.mla_q_rank), kv_rank = static_cast<double>(shape.mla_kv_rank);
    const double rope = static_cast<double>(shape.mla_rope_dim), heads = static_cast<double>(shape.num_q_heads);
    shard = shard_tokens * static_cast<double>(shape.hidden) * a;
    rsigma = shard_tokens * 4.0 * 2.0;  // as megatron.cpp's TE norms: mean and rsigma slots, an upper bound for RMSNorm
    q_latent = shard_tokens * q_rank * a;
    kv_combined = shard_tokens * (kv_rank + rope) * a;
    kv_latent = shard_tokens * kv_rank * a;
    q_latent_gathered = tokens * q_rank * a;
    kv_latent_gathered = tokens * kv_rank * a;
    gathered = tokens * static_cast<double>(shape.hidden) * a;
    rope_key = tokens * rope * a;
    q = tokens * static_cast<double>(shape.q_width) * a;
    k = tokens * static_cast<double>(shape.kv_width) * a;
    v = tokens * static_cast<double>(shape.value_width()) * a;
    kv_up = tokens * heads * (static_cast<double>(shape.head_dim) - rope) * a + v;  // k's non-rotary part and v, per head
  }
};

bool projects_q_latent(const LayerShape& shape) { return shape.mla_q_rank > 0; }

// An up-projection: TELayerNormColumnParallelLinear on a latent shard (M1.1's pattern): the norm saves
// its input and statistics and its output shard, the GEMM multiplies on the output gathered over the
// TP ranks.
void up_projection_forward(TensorTrace& trace, const LayerShape& shape, const char* norm_output, const char* norm_rsigma, double latent_bytes,
                           double rsigma_bytes, double gathered_bytes, const char* output, double output_bytes) {
  trace.alloc(L, norm_output, latent_bytes);
  trace.alloc(L, norm_rsigma, rsigma_bytes);
  column_parallel_gather(trace, shape, gathered_bytes);
  trace.alloc(L, output, output_bytes);
  column_parallel_gather_free(trace, shape);
}

// Its backward: the norm's output gathered again for the weight gradient, the input gradient produced
// whole and reduce-scattered to the shard (M1.1), then the norm's backward writes the latent's.
void up_projection_backward(TensorTrace& trace, const LayerShape& shape, const char* output_grad, const char* norm_output, const char* norm_rsigma,
                            const char* latent, double latent_bytes, double gathered_bytes, const char* latent_grad, double latent_grad_bytes) {
  column_parallel_backward(trace, shape, gathered_bytes, latent_bytes, output_grad, "mla.up_input_grad_partial", "mla.up_input_grad");
  trace.alloc(L, latent_grad, latent_grad_bytes);
  trace.free("mla.up_input_grad");
  trace.free(norm_output);
  trace.free(norm_rsigma);
  trace.free(latent);
}

// RoPE and the concatenations (qkv_up_proj_and_rope_apply L846-970): query, key and value made from
// the up-projections' outputs and the gathered rotary key, which then have no reader.
void query_key_value_from_up_projections(TensorTrace& trace, const LayerShape& shape, const MlaBytes& bytes) {
  trace.alloc(L, "attention.q", bytes.q);
  trace.alloc(L, "attention.k", bytes.k);
  trace.alloc(L, "attention.v", bytes.v);
  trace.free("mla.q_up_output");
  trace.free("mla.kv_up_output");
  if (shape.tp > 1) trace.free("mla.rope_key_gathered");
}

}  // namespace

void megatron_mla_forward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl, bool keep) {
  const MlaBytes bytes(shape, impl);
  // The input norm (a TENorm of its own: the down-projections are not fused with it) saves its input
  // (the layer's) and statistics; both down-projections save its output, one tensor.
  trace.set_moment("input norm and MLA down-projections");
  trace.alloc(L, "attention_norm.output", bytes.shard);
  trace.alloc(L, "attention_norm.rsigma_fp32", bytes.rsigma);
  // linear_q_down_proj and linear_kv_down_proj: TELinear with parallel_mode "duplicated", the whole
  // weight on every TP rank multiplying the rank's sequence shard (_qkv_down_projection L637-663).
  if (projects_q_latent(shape)) trace.alloc(L, "mla.q_latent", bytes.q_latent);
  trace.alloc(L, "mla.kv_down_output", bytes.kv_combined);
  // Split into the kv latent and the rotary key (views); under sequence parallelism the rotary key is
  // gathered whole for the up-projected heads (get_query_key_value_tensors L752-754).
  if (shape.tp > 1) trace.alloc(L, "mla.rope_key_gathered", bytes.rope_key);

  trace.set_moment("MLA up-projections");
  if (projects_q_latent(shape)) {
    up_projection_forward(trace, shape, "mla.q_norm_output", "mla.q_norm_rsigma_fp32", bytes.q_latent, bytes.rsigma, bytes.q_latent_gathered,
                          "mla.q_up_output", bytes.q);
  } else {
    // linear_q_proj, column-parallel on the input norm's output gathered.
    column_parallel_gather(trace, shape, bytes.gathered);
    trace.alloc(L, "mla.q_up_output", bytes.q);
    column_parallel_gather_free(trace, shape);
  }
  // The kv latent is a view of the down-projection's output; TE makes a module's input contiguous
  // (module/base.py prepare_forward L1639-1640), and that copy is what its norm saves.
  trace.alloc(L, "mla.kv_latent", bytes.kv_latent);
  up_projection_forward(trace, shape, "mla.kv_norm_output", "mla.kv_norm_rsigma_fp32", bytes.kv_latent, bytes.rsigma,
                        bytes.kv_latent_gathered, "mla.kv_up_output", bytes.kv_up);

  // qkv_up_proj_and_rope_apply (L846-970): RoPE on q's and the key's rotary parts (new tensors; it
  // saves its cos and sin only), query and key concatenated anew, value made contiguous; the
  // up-projections' outputs and the down-projection's then have no reader.
  trace.set_moment("MLA RoPE and q/k/v");
  query_key_value_from_up_projections(trace, shape, bytes);
  trace.free("mla.kv_down_output");
  if (!keep)
    for (const char* name : {"attention_norm.output", "attention_norm.rsigma_fp32", "mla.q_latent", "mla.q_norm_output", "mla.q_norm_rsigma_fp32",
                             "mla.kv_latent", "mla.kv_norm_output", "mla.kv_norm_rsigma_fp32"})
      if (trace.is_live(name)) trace.free(name);
}

void megatron_mla_up_projection_recompute(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl) {
  const MlaBytes bytes(shape, impl);
  trace.set_moment("MLA up-projections recomputed");
  // q's up-projection (or q_proj on the input norm's output), then kv's, each on its input gathered.
  column_parallel_gather(trace, shape, projects_q_latent(shape) ? bytes.q_latent_gathered : bytes.gathered);
  trace.alloc(L, "mla.q_up_output", bytes.q);
  column_parallel_gather_free(trace, shape);
  column_parallel_gather(trace, shape, bytes.kv_latent_gathered);
  trace.alloc(L, "mla.kv_up_output", bytes.kv_up);
  column_parallel_gather_free(trace, shape);
  if (shape.tp > 1) trace.alloc(L, "mla.rope_key_gathered", bytes.rope_key);
  query_key_value_from_up_projections(trace, shape, bytes);
}

void megatron_mla_backward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl) {
  const MlaBytes bytes(shape, impl);
  // The concatenations and splits undone: the up-projections' output gradients, RoPE's backward
  // rotating the rotary parts back, the rotary key's summed over the heads it was expanded to.
  trace.set_moment("MLA RoPE backward");
  trace.alloc(L, "mla.q_up_output_grad", bytes.q);
  trace.alloc(L, "mla.kv_up_output_grad", bytes.kv_up);
  trace.alloc(L, "mla.rope_key_grad", bytes.rope_key);
  trace.free("attention.dqkv");

  trace.set_moment("MLA kv up-projection backward");
  // The kv latent's gradient and the rotary key's (reduce-scattered to the shard under TP) make the
  // down-projection's output gradient.
  up_projection_backward(trace, shape, "mla.kv_up_output_grad", "mla.kv_norm_output", "mla.kv_norm_rsigma_fp32", "mla.kv_latent",
                         bytes.kv_latent, bytes.kv_latent_gathered, "mla.kv_down_output_grad", bytes.kv_combined);
  trace.free("mla.rope_key_grad");

  trace.set_moment("MLA q up-projection backward");
  if (projects_q_latent(shape))
    up_projection_backward(trace, shape, "mla.q_up_output_grad", "mla.q_norm_output", "mla.q_norm_rsigma_fp32", "mla.q_latent",
                           bytes.q_latent, bytes.q_latent_gathered, "mla.q_latent_grad", bytes.q_latent);

  // The down-projections' input gradients, on the shard (no reduce-scatter: duplicated linears),
  // summed into the norm output's; q_proj's (no q latent) reduce-scattered from the whole.
  trace.set_moment("MLA down-projections and input norm backward");
  trace.alloc(L, "mla.norm_output_grad", bytes.shard);
  trace.free("mla.kv_down_output_grad");
  if (projects_q_latent(shape)) {
    trace.alloc(L, "mla.q_down_input_grad", bytes.shard);
    trace.free("mla.q_latent_grad");
  } else {
    column_parallel_backward(trace, shape, bytes.gathered, bytes.shard, "mla.q_up_output_grad", "mla.q_proj_input_grad_partial",
                             "mla.q_down_input_grad");
  }
  trace.free("mla.q_down_input_grad");
  // The input norm's backward writes its input's gradient; the residual branch's is added into it.
  trace.alloc(L, "layer.input_grad", bytes.shard);
  trace.free("mla.norm_output_grad");
  trace.free("attention_norm.output");
  trace.free("attention_norm.rsigma_fp32");
}

}  // namespace longseq::inventory
