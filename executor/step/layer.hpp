// layer.hpp: one decoder layer from the blocks (attention.hpp, moe.hpp, lora.hpp; the dense MLP and its
// tiles here), forward and backward, and what it keeps between them. Its inventory:
// models/inventory/layer.cpp and mlp.cpp.
#pragma once

#include "executor/step/attention.hpp"
#include "executor/step/lora.hpp"
#include "executor/step/moe.hpp"

namespace longseq::llama_step {

// What a layer keeps for its backward when its forward runs with keep_for_backward.
template <typename Act>
struct LayerSaved {
  BufferOf<Act> attention_norm_output, q, k, v, attention_output, residual, mlp_norm_output, gate, up, product;
  Buffer attention_norm_rstd, lse, mlp_norm_rstd;
  // With Ulysses: attention's own inputs and output over the whole sequence for this rank's heads.
  BufferOf<Act> q_global, k_global, v_global, output_global;
  FpdtSaved<Act> fpdt;  // with FPDT: the chunks in the host pool
  // With LoRA: each adapted linear's r-wide x A^T, which lora_B's gradient reads.
  std::array<BufferOf<Act>, kLayerLinears> lora_rank;
  MoeSaved<Act> moe;  // a mixture-of-experts block's
};


template <class Ops, typename Act = typename Ops::Act>
BufferOf<Act> layer_forward(Ops& ops, const Act* params, const LlamaLayout::Layer& w, const Act* x, const int32_t* positions,
                            const Dims& d, const TrainingOptions& options, Arena& device, Arena& host, LayerSaved<Act>* saved,
                            const Ulysses& ulysses, const LayerAdapters<Act>& lora = {}) {
  LayerSaved<Act> local;
  LayerSaved<Act>& s = saved ? *saved : local;
  auto keep_rank = [&](LayerLinearKind kind) { return saved ? &s.lora_rank[static_cast<size_t>(kind)] : nullptr; };
  device.set_moment("forward: attention");
  s.attention_norm_output = device.allocate<Act>(L, "attention_norm.output", d.T * d.C);
  s.attention_norm_rstd = device.allocate(L, "attention_norm.rstd", d.T);
  ops.rmsnorm_forward(s.attention_norm_output.data(), s.attention_norm_rstd.data(), x, params + w.attention_norm, d.T, d.C,
                      options.rmsnorm_eps);
  if (options.fpdt_chunk_tokens > 0) {
    device.set_moment("forward: fpdt attention");
    s.attention_output = device.allocate<Act>(L, "attention.output", d.T * d.Q, true);
    fpdt_attention_forward(ops, params, w, s.attention_norm_output.data(), s.attention_output.data(), positions, d, options, device, host,
                           saved ? &s.fpdt : nullptr, ulysses);
    if (!saved) s.attention_norm_output.release();
  } else {
    s.q = device.allocate<Act>(L, "attention.q", d.T * d.Q);
    s.k = device.allocate<Act>(L, "attention.k", d.T * d.KV);
    s.v = device.allocate<Act>(L, "attention.v", d.T * d.KV);
    const Act* h1 = s.attention_norm_output.data();
    ops.linear_forward(s.q.data(), h1, params + w.q_proj, d.T, d.C, d.Q);
    lora_forward(ops, s.q.data(), h1, d.T, lora, LayerLinearKind::q_proj, device, keep_rank(LayerLinearKind::q_proj));
    ops.linear_forward(s.k.data(), h1, params + w.k_proj, d.T, d.C, d.KV);
    lora_forward(ops, s.k.data(), h1, d.T, lora, LayerLinearKind::k_proj, device, keep_rank(LayerLinearKind::k_proj));
    ops.linear_forward(s.v.data(), h1, params + w.v_proj, d.T, d.C, d.KV);
    lora_forward(ops, s.v.data(), h1, d.T, lora, LayerLinearKind::v_proj, device, keep_rank(LayerLinearKind::v_proj));
    ops.rope_forward(s.q.data(), s.q.data(), positions, d.T, d.NQ, d.HD, options.rope_theta);
    ops.rope_forward(s.k.data(), s.k.data(), positions, d.T, d.NKV, d.HD, options.rope_theta);
    if (!saved) s.attention_norm_output.release();
    const AttentionShape heads = attention_shape(d, ulysses, positions);
    if (!ulysses.active()) {
      s.attention_output = device.allocate<Act>(L, "attention.output", d.T * d.Q);
      s.lse = device.allocate(L, "attention.lse", d.NQ * d.T);
      heads_attention_forward(ops, s.attention_output.data(), s.lse.data(), s.q.data(), s.k.data(), s.v.data(), heads, d, options, device,
                              ulysses);
      if (!saved) {
        s.q.release();
        s.k.release();
        s.v.release();
        s.lse.release();
      }
    } else {
      // All-to-all in: every token of the sample for this rank's heads.
      const int64_t q_count = d.T * ulysses.q_heads * d.HD;
      s.q_global = ulysses_to_heads(ops, device, "attention.q_global", s.q.data(), d.T, d.NQ, ulysses.q_blocks(), d.HD, ulysses);
      s.k_global = ulysses_to_heads(ops, device, "attention.k_global", s.k.data(), d.T, d.NKV, ulysses.kv_blocks(), d.HD, ulysses);
      s.v_global = ulysses_to_heads(ops, device, "attention.v_global", s.v.data(), d.T, d.NKV, ulysses.kv_blocks(), d.HD, ulysses);
      s.q.release();
      s.k.release();
      s.v.release();
      s.output_global = device.allocate<Act>(L, "attention.output_global", ulysses.sp * q_count);
      s.lse = device.allocate(L, "attention.lse", ulysses.q_heads * heads.tokens);
      heads_attention_forward(ops, s.output_global.data(), s.lse.data(), s.q_global.data(), s.k_global.data(), s.v_global.data(), heads, d,
                              options, device, ulysses);
      // All-to-all out: the output's token blocks go back to the ranks that own them.
      BufferOf<Act> recv = device.allocate<Act>(L, "ulysses.staging", ulysses.sp * q_count);
      ulysses.group->all_to_all(s.output_global.data(), recv.data(), q_count);
      s.attention_output = device.allocate<Act>(L, "attention.output", d.T * d.Q, true);
      ops.heads_unpack_add(s.attention_output.data(), recv.data(), d.T, d.NQ, ulysses.q_blocks(), d.HD, ulysses.sp);
      if (!saved) {
        for (BufferOf<Act>* buffer : {&s.q_global, &s.k_global, &s.v_global, &s.output_global}) buffer->release();
        s.lse.release();
      }
    }
  }
  device.set_moment("forward: o_proj and residual");
  s.residual = device.allocate<Act>(L, "residual.attention", d.T * d.C);
  ops.linear_forward(s.residual.data(), s.attention_output.data(), params + w.o_proj, d.T, d.Q, d.C);
  lora_forward(ops, s.residual.data(), s.attention_output.data(), d.T, lora, LayerLinearKind::o_proj, device,
               keep_rank(LayerLinearKind::o_proj));
  ops.add(s.residual.data(), x, d.T * d.C);
  if (!saved) s.attention_output.release();

  device.set_moment("forward: mlp");
  s.mlp_norm_output = device.allocate<Act>(L, "mlp_norm.output", d.T * d.C);
  s.mlp_norm_rstd = device.allocate(L, "mlp_norm.rstd", d.T);
  ops.rmsnorm_forward(s.mlp_norm_output.data(), s.mlp_norm_rstd.data(), s.residual.data(), params + w.mlp_norm, d.T, d.C,
                      options.rmsnorm_eps);
  BufferOf<Act> output = device.allocate<Act>(L, "layer.output", d.T * d.C, /*zeroed=*/d.E > 0);
  // (A mixture-of-experts block runs untiled: forward_backward refuses tiles with experts.)
  if (d.E > 0) {
    moe_forward(ops, params, w, s.mlp_norm_output.data(), output.data(), d, device, saved ? &s.moe : nullptr);
  } else {
    const int64_t tile = options.mlp_tiles > 0 ? tile_size(d.T, options.mlp_tiles) : d.T;
    const bool keep_intermediates = saved && options.mlp_tiles == 0;
    // (LoRA runs untiled MLPs: forward_backward refuses tiles with adapters.)
    auto keep_mlp_rank = [&](LayerLinearKind kind) { return keep_intermediates ? &s.lora_rank[static_cast<size_t>(kind)] : nullptr; };
    for (int64_t t0 = 0; t0 < d.T; t0 += tile) {
      const int64_t rows = std::min(tile, d.T - t0);
      BufferOf<Act> gate = device.allocate<Act>(L, "mlp.gate", rows * d.F);
      BufferOf<Act> up = device.allocate<Act>(L, "mlp.up", rows * d.F);
      const Act* h = s.mlp_norm_output.data() + t0 * d.C;
      ops.linear_forward(gate.data(), h, params + w.gate_proj, rows, d.C, d.F);
      lora_forward(ops, gate.data(), h, rows, lora, LayerLinearKind::gate_proj, device, keep_mlp_rank(LayerLinearKind::gate_proj));
      ops.linear_forward(up.data(), h, params + w.up_proj, rows, d.C, d.F);
      lora_forward(ops, up.data(), h, rows, lora, LayerLinearKind::up_proj, device, keep_mlp_rank(LayerLinearKind::up_proj));
      BufferOf<Act> product = device.allocate<Act>(L, "mlp.product", rows * d.F);
      ops.swiglu_forward(product.data(), gate.data(), up.data(), rows * d.F);
      ops.linear_forward(output.data() + t0 * d.C, product.data(), params + w.down_proj, rows, d.F, d.C);
      lora_forward(ops, output.data() + t0 * d.C, product.data(), rows, lora, LayerLinearKind::down_proj, device,
                   keep_mlp_rank(LayerLinearKind::down_proj));
      if (keep_intermediates) {
        s.gate = std::move(gate);
        s.up = std::move(up);
        s.product = std::move(product);
      }
    }
  }
  ops.add(output.data(), s.residual.data(), d.T * d.C);
  if (!saved) {
    s.mlp_norm_output.release();
    s.mlp_norm_rstd.release();
    s.residual.release();
  }
  return output;
}

// One decoder layer's backward after layer_forward with `saved`. dy is the gradient of the
// layer output; returns the gradient of its input.
template <class Ops, typename Act = typename Ops::Act>
BufferOf<Act> layer_backward(Ops& ops, float* grads, const Act* params, const LlamaLayout::Layer& w, const Act* x, const Act* dy,
                             const int32_t* positions, const Dims& d, const TrainingOptions& options, Arena& device, Arena& host,
                             LayerSaved<Act>& s, const Ulysses& ulysses, const LayerAdapters<Act>& lora = {}) {
  auto rank_values = [&](LayerLinearKind kind) -> BufferOf<Act>& { return s.lora_rank[static_cast<size_t>(kind)]; };
  device.set_moment("backward: mlp");
  // The residual branch passes dy through; the MLP adds its input gradient through the norm.
  BufferOf<Act> mlp_input_grad = device.allocate<Act>(L, "mlp.input_grad", d.T * d.C, true);
  if (d.E > 0) {
    moe_backward(ops, grads, params, w, s.mlp_norm_output.data(), dy, mlp_input_grad.data(), d, device, s.moe);
  } else {
    const int64_t tile = options.mlp_tiles > 0 ? tile_size(d.T, options.mlp_tiles) : d.T;
    for (int64_t t0 = 0; t0 < d.T; t0 += tile) {
      const int64_t rows = std::min(tile, d.T - t0);
      const Act* h = s.mlp_norm_output.data() + t0 * d.C;
      BufferOf<Act> gate, up, product;
      if (options.mlp_tiles == 0) {
        gate = std::move(s.gate);
        up = std::move(s.up);
        product = std::move(s.product);
      } else {  // TiledMLP: recompute this tile
        gate = device.allocate<Act>(L, "mlp.gate", rows * d.F);
        up = device.allocate<Act>(L, "mlp.up", rows * d.F);
        ops.linear_forward(gate.data(), h, params + w.gate_proj, rows, d.C, d.F);
        ops.linear_forward(up.data(), h, params + w.up_proj, rows, d.C, d.F);
        product = device.allocate<Act>(L, "mlp.product", rows * d.F);
        ops.swiglu_forward(product.data(), gate.data(), up.data(), rows * d.F);
      }
      BufferOf<Act> product_grad = device.allocate<Act>(L, "mlp.product_grad", rows * d.F, true);
      ops.linear_backward(product_grad.data(), gradient_at(grads, w.down_proj), dy + t0 * d.C, product.data(), params + w.down_proj, rows,
                          d.F, d.C);
      lora_backward(ops, product_grad.data(), dy + t0 * d.C, product.data(), rows, lora, LayerLinearKind::down_proj,
                    rank_values(LayerLinearKind::down_proj), device);
      product.release();
      BufferOf<Act> gate_grad = device.allocate<Act>(L, "mlp.gate_grad", rows * d.F, true);
      BufferOf<Act> up_grad = device.allocate<Act>(L, "mlp.up_grad", rows * d.F, true);
      ops.swiglu_backward(gate_grad.data(), up_grad.data(), product_grad.data(), gate.data(), up.data(), rows * d.F);
      product_grad.release();
      Act* dh = mlp_input_grad.data() + t0 * d.C;
      ops.linear_backward(dh, gradient_at(grads, w.gate_proj), gate_grad.data(), h, params + w.gate_proj, rows, d.C, d.F);
      lora_backward(ops, dh, gate_grad.data(), h, rows, lora, LayerLinearKind::gate_proj, rank_values(LayerLinearKind::gate_proj), device);
      ops.linear_backward(dh, gradient_at(grads, w.up_proj), up_grad.data(), h, params + w.up_proj, rows, d.C, d.F);
      lora_backward(ops, dh, up_grad.data(), h, rows, lora, LayerLinearKind::up_proj, rank_values(LayerLinearKind::up_proj), device);
    }
  }
  s.mlp_norm_output.release();
  device.set_moment("backward: mlp norm");
  BufferOf<Act> residual_grad = device.allocate<Act>(L, "residual.attention_grad", d.T * d.C);
  ops.copy(residual_grad.data(), dy, d.T * d.C);
  ops.rmsnorm_backward(residual_grad.data(), gradient_at(grads, w.mlp_norm), mlp_input_grad.data(), s.residual.data(), params + w.mlp_norm,
                       s.mlp_norm_rstd.data(), d.T, d.C);
  mlp_input_grad.release();
  s.residual.release();
  s.mlp_norm_rstd.release();

  device.set_moment("backward: attention");
  BufferOf<Act> output_grad = device.allocate<Act>(L, "attention.output_grad", d.T * d.Q, true);
  ops.linear_backward(output_grad.data(), gradient_at(grads, w.o_proj), residual_grad.data(), s.attention_output.data(), params + w.o_proj,
                      d.T, d.Q, d.C);
  lora_backward(ops, output_grad.data(), residual_grad.data(), s.attention_output.data(), d.T, lora, LayerLinearKind::o_proj,
                rank_values(LayerLinearKind::o_proj), device);
  BufferOf<Act> q_grad = device.allocate<Act>(L, "attention.q_grad", d.T * d.Q, true);
  BufferOf<Act> k_grad = device.allocate<Act>(L, "attention.k_grad", d.T * d.KV, true);
  BufferOf<Act> v_grad = device.allocate<Act>(L, "attention.v_grad", d.T * d.KV, true);
  if (options.fpdt_chunk_tokens > 0) {
    device.set_moment("backward: fpdt attention");
    fpdt_attention_backward(ops, output_grad.data(), q_grad.data(), k_grad.data(), v_grad.data(), positions, d, options, device, host, s.fpdt,
                            ulysses);
    output_grad.release();
    s.attention_output.release();
  } else if (!ulysses.active()) {
    Buffer delta = device.allocate(L, "attention.softmax_delta", d.NQ * d.T);
    heads_attention_backward(ops, q_grad.data(), k_grad.data(), v_grad.data(), delta.data(), output_grad.data(), s.q.data(), s.k.data(),
                             s.v.data(), s.attention_output.data(), s.lse.data(), attention_shape(d, ulysses, positions), d, options, device,
                             ulysses);
    delta.release();
    output_grad.release();
    s.attention_output.release();
    s.lse.release();
    s.q.release();
    s.k.release();
    s.v.release();
  } else {
    // The mirror of the forward: the output gradient goes to the heads' ranks, q/k/v gradients
    // come back to the tokens' ranks (replicated kv heads summed).
    const AttentionShape heads = attention_shape(d, ulysses, positions);
    const int64_t q_count = d.T * ulysses.q_heads * d.HD, kv_count = d.T * ulysses.kv_heads * d.HD;
    BufferOf<Act> output_grad_global = ulysses_to_heads(ops, device, "attention.output_grad_global", output_grad.data(), d.T, d.NQ,
                                                        ulysses.q_blocks(), d.HD, ulysses, &output_grad);
    BufferOf<Act> q_grad_global = device.allocate<Act>(L, "attention.q_grad_global", ulysses.sp * q_count, true);
    BufferOf<Act> k_grad_global = device.allocate<Act>(L, "attention.k_grad_global", ulysses.sp * kv_count, true);
    BufferOf<Act> v_grad_global = device.allocate<Act>(L, "attention.v_grad_global", ulysses.sp * kv_count, true);
    Buffer delta = device.allocate(L, "attention.softmax_delta", ulysses.q_heads * heads.tokens);
    heads_attention_backward(ops, q_grad_global.data(), k_grad_global.data(), v_grad_global.data(), delta.data(), output_grad_global.data(),
                             s.q_global.data(), s.k_global.data(), s.v_global.data(), s.output_global.data(), s.lse.data(), heads, d,
                             options, device, ulysses);
    delta.release();
    for (BufferOf<Act>* buffer : {&output_grad_global, &s.output_global}) buffer->release();
    s.lse.release();
    for (BufferOf<Act>* buffer : {&s.q_global, &s.k_global, &s.v_global}) buffer->release();
    s.attention_output.release();
    ulysses_to_tokens_add(ops, device, q_grad.data(), q_grad_global, d.T, d.NQ, ulysses.q_blocks(), d.HD, ulysses, true);
    ulysses_to_tokens_add(ops, device, k_grad.data(), k_grad_global, d.T, d.NKV, ulysses.kv_blocks(), d.HD, ulysses, true);
    ulysses_to_tokens_add(ops, device, v_grad.data(), v_grad_global, d.T, d.NKV, ulysses.kv_blocks(), d.HD, ulysses, true);
  }
  // RoPE's backward is the inverse rotation.
  BufferOf<Act> q_proj_grad = device.allocate<Act>(L, "attention.q_proj_grad", d.T * d.Q, true);
  ops.rope_backward(q_proj_grad.data(), q_grad.data(), positions, d.T, d.NQ, d.HD, options.rope_theta);
  q_grad.release();
  BufferOf<Act> k_proj_grad = device.allocate<Act>(L, "attention.k_proj_grad", d.T * d.KV, true);
  ops.rope_backward(k_proj_grad.data(), k_grad.data(), positions, d.T, d.NKV, d.HD, options.rope_theta);
  k_grad.release();
  BufferOf<Act> norm_grad = device.allocate<Act>(L, "attention_norm.output_grad", d.T * d.C, true);
  const Act* h1 = s.attention_norm_output.data();
  ops.linear_backward(norm_grad.data(), gradient_at(grads, w.q_proj), q_proj_grad.data(), h1, params + w.q_proj, d.T, d.C, d.Q);
  lora_backward(ops, norm_grad.data(), q_proj_grad.data(), h1, d.T, lora, LayerLinearKind::q_proj, rank_values(LayerLinearKind::q_proj), device);
  ops.linear_backward(norm_grad.data(), gradient_at(grads, w.k_proj), k_proj_grad.data(), h1, params + w.k_proj, d.T, d.C, d.KV);
  lora_backward(ops, norm_grad.data(), k_proj_grad.data(), h1, d.T, lora, LayerLinearKind::k_proj, rank_values(LayerLinearKind::k_proj), device);
  ops.linear_backward(norm_grad.data(), gradient_at(grads, w.v_proj), v_grad.data(), h1, params + w.v_proj, d.T, d.C, d.KV);
  lora_backward(ops, norm_grad.data(), v_grad.data(), h1, d.T, lora, LayerLinearKind::v_proj, rank_values(LayerLinearKind::v_proj), device);
  q_proj_grad.release();
  k_proj_grad.release();
  v_grad.release();
  s.attention_norm_output.release();

  device.set_moment("backward: attention norm");
  BufferOf<Act> input_grad = std::move(residual_grad);  // dx = residual gradient + the attention branch
  ops.rmsnorm_backward(input_grad.data(), gradient_at(grads, w.attention_norm), norm_grad.data(), x, params + w.attention_norm,
                       s.attention_norm_rstd.data(), d.T, d.C);
  s.attention_norm_rstd.release();
  return input_grad;
}

}  // namespace longseq::llama_step
