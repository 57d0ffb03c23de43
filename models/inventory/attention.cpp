// attention.cpp: the attention block: q/k/v projections, Qwen3's q/k norms, RoPE, Ulysses'
// all-to-all, the kernel with its ring (USP's or PyTorch CP's) and FPDT's chunked variant, forward
// and backward.
#include "models/inventory/internal.hpp"

namespace longseq::inventory {

// Ulysses attention forward: from the layer input to "attention.output_local" ([T, n_q*d]),
// leaving "attention_norm.output" live.
void ulysses_attention_forward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl, bool keep) {
  const Bytes bytes(shape, impl);
  const bool replicated = shape.kv_replication > 1;

  trace.set_moment("q/k/v projections and all-to-all");
  trace.alloc(L, "attention_norm.output", bytes.x);
  eager_norm_saved_alloc(trace, L, kAttentionNormSaved, bytes.x, shape.hidden, shape, impl);
  // Under no_grad, or over an input that needs no gradient with a frozen weight: transient.
  if (!keep || !shape.input_requires_grad) eager_norm_saved_free(trace, kAttentionNormSaved, shape, impl);
  lora_forward(trace, shape, lora_attention_projections(shape, impl), keep);
  projections_alloc(trace, shape, "attention.qkv_proj", {{"attention.q_proj", bytes.q}, {"attention.k_proj", bytes.kv},
                                                          {"attention.v_proj", bytes.kv}});
  if (keep && !base_linears_save_input(shape)) trace.free("attention_norm.output");  // read by frozen linears alone
  const char* q_before_rope = "attention.q_proj";
  const char* k_before_rope = "attention.k_proj";
  if (shape.qk_norm) {
    const double kv_rstd = static_cast<double>(shape.tokens) * static_cast<double>(shape.num_kv_heads) * 4.0;
    trace.alloc(L, "attention.q_norm_rstd", bytes.lse);
    eager_norm_saved_alloc(trace, L, kQNormSaved, bytes.q, shape.head_dim, shape, impl);
    trace.alloc(L, "attention.q_normed", bytes.q);
    trace.alloc(L, "attention.k_norm_rstd", kv_rstd);
    eager_norm_saved_alloc(trace, L, kKNormSaved, bytes.kv, shape.head_dim, shape, impl);
    trace.alloc(L, "attention.k_normed", bytes.kv);
    if (impl.eager_rms_norm) {  // eager saves the upcast, not the projection itself
      trace.free("attention.q_proj");
      trace.free("attention.k_proj");
    }
    q_before_rope = "attention.q_normed";
    k_before_rope = "attention.k_normed";
  }
  // HF apply_rotary_pos_emb builds new q and k (q*cos + rotate_half(q)*sin); the pre-RoPE
  // tensors are not saved by autograd.
  trace.alloc(L, "attention.q_rope", bytes.q);
  trace.free(q_before_rope);
  trace.alloc(L, "attention.k_rope", bytes.kv);
  trace.free(k_before_rope);
  if (!keep) qk_norm_saved_free(trace, shape, impl);
  ulysses_all_to_all(trace, "attention.q_rope", "attention.q", bytes.q, shape, impl);
  // GQA/MQA with sp > n_kv: k and v are repeat_interleave'd before their all-to-all.
  if (replicated) {
    trace.alloc(L, "attention.k_repeated", bytes.kv_replicated);
    ulysses_all_to_all(trace, "attention.k_repeated", "attention.k", bytes.kv_replicated, shape, impl);
    trace.free("attention.k_repeated");
    trace.alloc(L, "attention.v_repeated", bytes.kv_replicated);
    ulysses_all_to_all(trace, "attention.v_repeated", "attention.v", bytes.kv_replicated, shape, impl);
    trace.free("attention.v_repeated");
  } else {
    ulysses_all_to_all(trace, "attention.k_rope", "attention.k", bytes.kv, shape, impl);
    ulysses_all_to_all(trace, "attention.v_proj", "attention.v", bytes.kv, shape, impl);
  }

  trace.set_moment("attention");
  // Ring attention (USP's ring over r Ulysses groups; ring-flash-attention's forward): the key/
  // value block being used and the next one arriving (double buffered: 2 x (k + v)), and the fp32
  // output and softmax-statistics accumulators that each block's partial result merges into.
  const double q_fp32 = bytes.q / static_cast<double>(impl.activation_bytes) * 4.0;
  const double ring = static_cast<double>(shape.ring);
  const bool torch_cp = shape.ring > 1 && impl.context_parallel_allgather;
  if (torch_cp) {
    // PyTorch context parallelism, all-gather rotation (_context_parallel/_attention.py; Reference
    // §11 F2.3-F2.4): next_kv = cat(k, v) copies the local blocks, all_gather_tensor gathers the
    // whole sequence's K and V (kept until the call returns, not saved), and the blocks' outputs
    // merge into a running fp32 output with two fp32 temporaries of its size and fp32 lse.
    // The all-to-all rotation keeps one received block beside the cat copy instead (F2.3).
    trace.alloc(L, "cp.kv_local_copy", 2.0 * bytes.kv_replicated);
    if (impl.context_parallel_all_to_all) trace.alloc(L, "cp.kv_block_received", 2.0 * bytes.kv_replicated);
    else trace.alloc(L, "cp.kv_gathered", 2.0 * ring * bytes.kv_replicated);
    trace.alloc(L, "cp.output_fp32", q_fp32);
    trace.alloc(L, "cp.merge_temporaries", 2.0 * q_fp32);
    trace.alloc(L, "cp.lse_fp32", bytes.lse);
  } else if (shape.ring > 1) {
    trace.alloc(L, "ring.kv_blocks_in_flight", 4.0 * bytes.kv_replicated);
    trace.alloc(L, "ring.output_accumulator", q_fp32);
    trace.alloc(L, "ring.lse_accumulator", bytes.lse);
  }
  // flash_attn forward: output in the activation dtype, softmax statistics (lse) in fp32.
  trace.alloc(L, "attention.output", bytes.q);
  trace.alloc(L, "attention.lse", bytes.lse);
  if (torch_cp)
    for (const char* name : {"cp.lse_fp32", "cp.merge_temporaries", "cp.output_fp32",
                             impl.context_parallel_all_to_all ? "cp.kv_block_received" : "cp.kv_gathered", "cp.kv_local_copy"})
      trace.free(name);
  else if (shape.ring > 1)
    for (const char* name : {"ring.lse_accumulator", "ring.output_accumulator", "ring.kv_blocks_in_flight"}) trace.free(name);
  // Output path back to sequence shards: [S, n_q/sp*d] -> [S_l, n_q*d] (REFERENCE §3.1).
  ulysses_all_to_all(trace, "attention.output", "attention.output_local", bytes.q, shape, impl);
  // The attention inputs are locals of the Ulysses forward, live until it returns; HF
  // LlamaAttention holds query/key/value_states until the attention call returns.
  if (!keep) {
    trace.free("attention.q");
    trace.free("attention.k");
    trace.free("attention.v");
    trace.free("attention.output");
    trace.free("attention.lse");
  }
  trace.free("attention.q_rope");
  trace.free("attention.k_rope");
  trace.free("attention.v_proj");
}

// FPDT attention forward (DS fpdt_layer.py _FPDTGPUOffloadingAttentionImpl_, REFERENCE §3.6):
// per chunk, q/k/v projections of the local chunk, their all-to-alls, flash attention against the
// k/v chunks fetched from the host one ahead (double buffer) into an fp32 accumulator, and the
// output chunk's all-to-all back into the full local output. The chunk's q/k/v/output/lse go to
// pinned host memory; nothing chunk-sized stays on the GPU for backward. Every chunk repeats the
// same allocations, so one chunk stands for all.
void fpdt_attention_forward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl, bool keep) {
  const Bytes bytes(shape, impl);
  const double fraction = static_cast<double>(shape.fpdt_chunk_tokens) / static_cast<double>(shape.tokens);
  const double q_chunk = bytes.q * fraction, kv_chunk = bytes.kv_replicated * fraction, lse_chunk = bytes.lse * fraction;
  trace.set_moment("fpdt attention chunk");
  trace.alloc(L, "attention_norm.output", bytes.x);
  eager_norm_saved_alloc(trace, L, kAttentionNormSaved, bytes.x, shape.hidden, shape, impl);
  if (!keep || !shape.input_requires_grad) eager_norm_saved_free(trace, kAttentionNormSaved, shape, impl);
  trace.alloc(L, "attention.output_local", bytes.q);  // final_output, filled chunk by chunk
  trace.alloc(L, "fpdt.q_proj_chunk", q_chunk);
  trace.alloc(L, "fpdt.k_proj_chunk", kv_chunk);
  trace.alloc(L, "fpdt.v_proj_chunk", kv_chunk);
  ulysses_all_to_all(trace, "fpdt.q_proj_chunk", "fpdt.q_chunk", q_chunk, shape, impl);
  trace.free("fpdt.q_proj_chunk");
  ulysses_all_to_all(trace, "fpdt.k_proj_chunk", "fpdt.k_chunk", kv_chunk, shape, impl);
  trace.free("fpdt.k_proj_chunk");
  ulysses_all_to_all(trace, "fpdt.v_proj_chunk", "fpdt.v_chunk", kv_chunk, shape, impl);
  trace.free("fpdt.v_proj_chunk");
  trace.alloc(L, "fpdt.kv_prefetch", 2.0 * kv_chunk);
  trace.alloc(L, "fpdt.output_accumulator", q_chunk / static_cast<double>(impl.activation_bytes) * 4.0);
  trace.alloc(L, "fpdt.lse_chunk", lse_chunk);
  trace.alloc(L, "fpdt.output_chunk", q_chunk);
  ulysses_all_to_all(trace, "fpdt.output_chunk", "fpdt.output_chunk_local", q_chunk, shape, impl);
  for (const char* name : {"fpdt.output_chunk_local", "fpdt.output_chunk", "fpdt.lse_chunk", "fpdt.output_accumulator",
                           "fpdt.kv_prefetch", "fpdt.v_chunk", "fpdt.k_chunk", "fpdt.q_chunk"})
    trace.free(name);
}


// Ulysses attention backward: from "attention.output_local" (o_proj's input) to
// "attention_norm.output_grad", freeing what the forward kept.
void ulysses_attention_backward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl) {
  const Bytes bytes(shape, impl);
  const bool replicated = shape.kv_replication > 1;
  trace.set_moment("o_proj and all-to-all");
  trace.alloc(L, "attention.output_local_grad", bytes.q);
  if (shape.post_norms) trace.free("attention.post_norm_input_grad");  // o_proj's output gradient, read by its backward
  trace.free("attention.output_local");  // after o_proj's weight gradient
  ulysses_all_to_all(trace, "attention.output_local_grad", "attention.output_grad", bytes.q, shape, impl);
  trace.free("attention.output_local_grad");

  trace.set_moment("attention");
  // flash_attn backward (csrc mha_bwd): dq, dk, dv; dk/dv at q-head width when the rank has
  // fewer kv heads than q heads (then summed per group); dq accumulated in fp32; softmax_d fp32.
  const bool grouped = shape.q_width > shape.kv_width * shape.kv_replication;
  // The kernel's padded rows, each [n_q/sp, d] of fp32 dq and [n_q/sp] of fp32 statistics.
  const double pad_rows = attention_backward_pad_rows(shape, impl);
  const double q_pad_bytes = pad_rows * static_cast<double>(shape.q_width / shape.sp) * 4.0;
  const double lse_pad_bytes = pad_rows * static_cast<double>(shape.num_q_heads / shape.sp) * 4.0;
  trace.alloc(L, "attention.q_grad", bytes.q);
  trace.alloc(L, "attention.k_grad", bytes.kv_replicated);
  trace.alloc(L, "attention.v_grad", bytes.kv_replicated);
  // Ring attention backward: the key/value block in use and the next (2 x (k + v)), and the fp32
  // dk/dv accumulators that travel the ring with them (the pair being added to and the pair in
  // flight: 2 x (dk + dv)).
  const double fp32_per_element = 4.0 / static_cast<double>(impl.activation_bytes);
  const bool torch_cp = shape.ring > 1 && impl.context_parallel_allgather;
  if (torch_cp) {
    // PyTorch CP backward (F2.5): the whole sequence's K/V gathered again (all-to-all rotation:
    // a block in flight beside the cat copy), fp32 accumulators for dq, dk, dv, and dk/dv passed by
    // all-to-all in fp32 (send and receive).
    if (impl.context_parallel_all_to_all) trace.alloc(L, "cp.kv_blocks_in_flight", 4.0 * bytes.kv_replicated);
    else trace.alloc(L, "cp.kv_gathered", 2.0 * static_cast<double>(shape.ring) * bytes.kv_replicated);
    trace.alloc(L, "cp.grad_accumulators_fp32", (bytes.q + 2.0 * bytes.kv_replicated) * fp32_per_element);
    trace.alloc(L, "cp.kv_grad_all_to_all_fp32", 2.0 * 2.0 * bytes.kv_replicated * fp32_per_element);
  } else if (shape.ring > 1) {
    trace.alloc(L, "ring.kv_blocks_in_flight", 4.0 * bytes.kv_replicated);
    trace.alloc(L, "ring.kv_grad_accumulators_in_flight", 4.0 * bytes.kv_replicated * fp32_per_element);
  }
  if (impl.flash_attention_3) {
    // FA3 (hopper/flash_api.cpp L1475-1546): fp32 dk/dv accumulators at kv width under GQA, the
    // fp32 dq accumulator, softmax_d and softmax_lse_log2.
    const double fp32 = 4.0 / static_cast<double>(impl.activation_bytes);
    if (grouped) {
      trace.alloc(L, "attention.k_grad_accumulator", bytes.kv_replicated * fp32);
      trace.alloc(L, "attention.v_grad_accumulator", bytes.kv_replicated * fp32);
    }
    trace.alloc(L, "attention.q_grad_accumulator", bytes.q * fp32 + q_pad_bytes);
    trace.alloc(L, "attention.softmax_d", bytes.lse + lse_pad_bytes);
    trace.alloc(L, "attention.softmax_lse_log2", bytes.lse + lse_pad_bytes);
    for (const char* name : {"attention.softmax_lse_log2", "attention.softmax_d", "attention.q_grad_accumulator"}) trace.free(name);
    if (grouped)
      for (const char* name : {"attention.v_grad_accumulator", "attention.k_grad_accumulator"}) trace.free(name);
  } else {
    if (impl.flash_attention_expands_gqa_grads && grouped) {
      trace.alloc(L, "attention.k_grad_expanded", bytes.q);
      trace.alloc(L, "attention.v_grad_expanded", bytes.q);
    }
    if (impl.flash_attention_dq_accumulator) {
      trace.alloc(L, "attention.q_grad_accumulator", bytes.q / static_cast<double>(impl.activation_bytes) * 4.0 + q_pad_bytes);
      trace.alloc(L, "attention.softmax_d", bytes.lse + lse_pad_bytes);
      trace.free("attention.q_grad_accumulator");
      trace.free("attention.softmax_d");
    }
    if (impl.flash_attention_expands_gqa_grads && grouped) {
      trace.free("attention.k_grad_expanded");
      trace.free("attention.v_grad_expanded");
    }
  }
  if (torch_cp)
    for (const char* name : {"cp.kv_grad_all_to_all_fp32", "cp.grad_accumulators_fp32",
                             impl.context_parallel_all_to_all ? "cp.kv_blocks_in_flight" : "cp.kv_gathered"})
      trace.free(name);
  else if (shape.ring > 1)
    for (const char* name : {"ring.kv_grad_accumulators_in_flight", "ring.kv_blocks_in_flight"}) trace.free(name);
  trace.free("attention.output_grad");
  trace.free("attention.q");
  trace.free("attention.k");
  trace.free("attention.v");
  trace.free("attention.output");
  trace.free("attention.lse");

  trace.set_moment("all-to-all and q/k/v projections");
  ulysses_all_to_all(trace, "attention.q_grad", "attention.q_rope_grad", bytes.q, shape, impl);
  trace.free("attention.q_grad");
  if (replicated) {
    // The gradient of repeat_interleave sums the copies back to n_kv heads.
    ulysses_all_to_all(trace, "attention.k_grad", "attention.k_repeated_grad", bytes.kv_replicated, shape, impl);
    trace.free("attention.k_grad");
    trace.alloc(L, "attention.k_rope_grad", bytes.kv);
    trace.free("attention.k_repeated_grad");
    ulysses_all_to_all(trace, "attention.v_grad", "attention.v_repeated_grad", bytes.kv_replicated, shape, impl);
    trace.free("attention.v_grad");
    trace.alloc(L, "attention.v_proj_grad", bytes.kv);
    trace.free("attention.v_repeated_grad");
  } else {
    ulysses_all_to_all(trace, "attention.k_grad", "attention.k_rope_grad", bytes.kv, shape, impl);
    trace.free("attention.k_grad");
    ulysses_all_to_all(trace, "attention.v_grad", "attention.v_proj_grad", bytes.kv, shape, impl);
    trace.free("attention.v_grad");
  }
  // RoPE backward makes new tensors, as its forward did.
  // (With q/k norms their backward maps these to the projections' gradients, same sizes.)
  if (shape.qk_norm) eager_norm_backward_transients(trace, L, kQNormSaved, bytes.q / static_cast<double>(impl.activation_bytes) * 4.0, impl);
  trace.alloc(L, "attention.q_proj_grad", bytes.q);
  trace.free("attention.q_rope_grad");
  if (shape.qk_norm) eager_norm_backward_transients(trace, L, kKNormSaved, bytes.kv / static_cast<double>(impl.activation_bytes) * 4.0, impl);
  trace.alloc(L, "attention.k_proj_grad", bytes.kv);
  trace.free("attention.k_rope_grad");
  qk_norm_saved_free(trace, shape, impl);
  // The three projections' input gradients are summed into one (none where the layer's input
  // needs no gradient: a frozen norm over a frozen embedding's output).
  if (shape.input_requires_grad) {
    trace.alloc(L, "attention_norm.output_grad", bytes.x);
    trace.alloc(L, "attention_norm.output_grad_partial", bytes.x);
    trace.free("attention_norm.output_grad_partial");
  }
  trace.free("attention.q_proj_grad");
  trace.free("attention.k_proj_grad");
  trace.free("attention.v_proj_grad");
  if (base_linears_save_input(shape)) trace.free("attention_norm.output");
}

// FPDT attention backward (REFERENCE §3.6): grad_layernorm_output is a full local buffer of zero
// chunks; per inner step the q, output, lse and output-gradient chunks are prefetched (current and
// next), with the k/v chunk, fp32 dk/dv accumulators and the current fp32 dq accumulator (the
// others wait in host memory), plus flash attention's own per-chunk backward buffers; the q/k/v
// weight gradient is accumulated in fp32 at full size.
void fpdt_attention_backward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl) {
  const Bytes bytes(shape, impl);
  const double a = static_cast<double>(impl.activation_bytes);
  const double fraction = static_cast<double>(shape.fpdt_chunk_tokens) / static_cast<double>(shape.tokens);
  const double q_chunk = bytes.q * fraction, kv_chunk = bytes.kv_replicated * fraction, lse_chunk = bytes.lse * fraction;
  trace.set_moment("fpdt attention backward chunk");
  trace.alloc(L, "attention.output_local_grad", bytes.q);
  if (shape.post_norms) trace.free("attention.post_norm_input_grad");  // o_proj's output gradient, read by its backward
  trace.free("attention.output_local");
  trace.alloc(L, "attention_norm.output_grad", bytes.x);  // grad_layernorm_output
  const double qkv_weights = static_cast<double>(shape.hidden) * static_cast<double>(shape.q_width + 2 * shape.kv_width);
  trace.alloc(L, "fpdt.qkv_weight_grad_fp32", qkv_weights * 4.0);
  trace.alloc(L, "fpdt.q_output_grad_chunks", 2.0 * (3.0 * q_chunk + lse_chunk));
  trace.alloc(L, "fpdt.kv_chunk", 2.0 * kv_chunk);
  trace.alloc(L, "fpdt.kv_grad_accumulators", 2.0 * kv_chunk / a * 4.0);
  trace.alloc(L, "fpdt.q_grad_accumulator", q_chunk / a * 4.0);
  trace.alloc(L, "fpdt.flash_backward_chunk", q_chunk + 2.0 * kv_chunk + q_chunk / a * 4.0 + lse_chunk);
  for (const char* name : {"fpdt.flash_backward_chunk", "fpdt.q_grad_accumulator", "fpdt.kv_grad_accumulators",
                           "fpdt.kv_chunk", "fpdt.q_output_grad_chunks", "fpdt.qkv_weight_grad_fp32"})
    trace.free(name);
  trace.free("attention.output_local_grad");
  trace.free("attention_norm.output");
}

}  // namespace longseq::inventory
