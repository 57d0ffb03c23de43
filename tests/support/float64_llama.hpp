// float64_llama.hpp: one training step of a Llama-style model in float64, written plainly (every
// kernel of kernels/cpu instantiated for double, nothing kept or tiled cleverly, one rank), with a
// LoRA reference on top of it through merged weights.
//
// It shares the kernels with the executor but none of the step (llama_step.hpp's schedule, its
// arena, its options, its LoRA code): the tests hold it to the PyTorch float64 golden first, then
// use it as the reference for what the golden does not cover.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "executor/llama.hpp"
#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/dense.hpp"
#include "kernels/cpu/loss_optimizer.hpp"
#include "kernels/cpu/norm_rope.hpp"
#include "support/tiny_llama_fixture.hpp"

namespace longseq::testing {

struct Float64Step {
  double loss = 0;
  std::vector<double> gradients;  // every parameter, in llama_layout's order
};

// Loss (mean over counted labels) and every gradient for `weights` (llama_layout's order) on `batch`.
inline Float64Step float64_forward_backward(const ModelSpec& spec, const std::vector<double>& weights, const Batch& batch) {
  using namespace kernels;
  const LlamaLayout layout = llama_layout(spec);
  const TrainingOptions defaults;  // the executor's RoPE theta and RMSNorm epsilon
  const double theta = defaults.rope_theta, eps = defaults.rmsnorm_eps;
  const auto T = static_cast<int64_t>(batch.tokens.size());
  const int64_t C = spec.hidden_size, Q = spec.q_width(), KV = spec.kv_width(), F = spec.intermediate_size, V = spec.vocab_size;
  const int64_t NQ = spec.num_q_heads, NKV = spec.num_kv_heads, HD = spec.head_dim, block = 16;
  const int32_t* positions = batch.positions.data();
  auto zeros = [](int64_t n) { return std::vector<double>(static_cast<size_t>(n), 0.0); };
  const double* w = weights.data();
  Float64Step step;
  step.gradients = zeros(layout.total);
  double* g = step.gradients.data();

  struct Saved {
    std::vector<double> input, h1, rstd1, q, k, v, attention, lse, residual, h2, rstd2, gate, up, product;
  };
  std::vector<Saved> saved(layout.layers.size());
  std::vector<double> x = zeros(T * C);
  embedding_forward(x.data(), batch.tokens.data(), w + layout.embedding, T, C);
  for (size_t i = 0; i < layout.layers.size(); ++i) {
    const LlamaLayout::Layer& l = layout.layers[i];
    Saved& s = saved[i];
    s.input = x;
    s.h1 = zeros(T * C), s.rstd1 = zeros(T);
    rmsnorm_forward(s.h1.data(), s.rstd1.data(), x.data(), w + l.attention_norm, T, C, eps);
    s.q = zeros(T * Q), s.k = zeros(T * KV), s.v = zeros(T * KV);
    linear_forward(s.q.data(), s.h1.data(), w + l.q_proj, static_cast<const double*>(nullptr), T, C, Q);
    linear_forward(s.k.data(), s.h1.data(), w + l.k_proj, static_cast<const double*>(nullptr), T, C, KV);
    linear_forward(s.v.data(), s.h1.data(), w + l.v_proj, static_cast<const double*>(nullptr), T, C, KV);
    rope_forward(s.q.data(), s.q.data(), positions, T, NQ, HD, theta);
    rope_forward(s.k.data(), s.k.data(), positions, T, NKV, HD, theta);
    s.attention = zeros(T * Q), s.lse = zeros(NQ * T);
    attention_forward(s.attention.data(), s.lse.data(), s.q.data(), s.k.data(), s.v.data(), positions, T, NQ, NKV, HD, block);
    s.residual = zeros(T * C);
    linear_forward(s.residual.data(), s.attention.data(), w + l.o_proj, static_cast<const double*>(nullptr), T, Q, C);
    for (int64_t j = 0; j < T * C; ++j) s.residual[static_cast<size_t>(j)] += x[static_cast<size_t>(j)];
    s.h2 = zeros(T * C), s.rstd2 = zeros(T);
    rmsnorm_forward(s.h2.data(), s.rstd2.data(), s.residual.data(), w + l.mlp_norm, T, C, eps);
    s.gate = zeros(T * F), s.up = zeros(T * F), s.product = zeros(T * F);
    linear_forward(s.gate.data(), s.h2.data(), w + l.gate_proj, static_cast<const double*>(nullptr), T, C, F);
    linear_forward(s.up.data(), s.h2.data(), w + l.up_proj, static_cast<const double*>(nullptr), T, C, F);
    swiglu_forward(s.product.data(), s.gate.data(), s.up.data(), T * F);
    linear_forward(x.data(), s.product.data(), w + l.down_proj, static_cast<const double*>(nullptr), T, F, C);
    for (int64_t j = 0; j < T * C; ++j) x[static_cast<size_t>(j)] += s.residual[static_cast<size_t>(j)];
  }
  std::vector<double> final_output = zeros(T * C), final_rstd = zeros(T), logits = zeros(T * V), losses = zeros(T);
  rmsnorm_forward(final_output.data(), final_rstd.data(), x.data(), w + layout.final_norm, T, C, eps);
  linear_forward(logits.data(), final_output.data(), w + layout.lm_head, static_cast<const double*>(nullptr), T, C, V);
  cross_entropy_forward(losses.data(), logits.data(), batch.labels.data(), T, V);
  int64_t counted = 0;
  for (int32_t label : batch.labels) counted += label != kIgnoreIndex;
  for (double loss : losses) step.loss += loss;
  step.loss /= static_cast<double>(counted);

  std::vector<double> logits_grad = zeros(T * V), final_grad = zeros(T * C), dy = zeros(T * C);
  cross_entropy_backward(logits_grad.data(), logits.data(), batch.labels.data(), 1.0 / static_cast<double>(counted), T, V);
  linear_backward(final_grad.data(), g + layout.lm_head, static_cast<double*>(nullptr), logits_grad.data(), final_output.data(),
                  w + layout.lm_head, T, C, V);
  rmsnorm_backward(dy.data(), g + layout.final_norm, final_grad.data(), x.data(), w + layout.final_norm, final_rstd.data(), T, C);
  for (size_t i = layout.layers.size(); i-- > 0;) {
    const LlamaLayout::Layer& l = layout.layers[i];
    Saved& s = saved[i];
    std::vector<double> product_grad = zeros(T * F), gate_grad = zeros(T * F), up_grad = zeros(T * F), h2_grad = zeros(T * C);
    linear_backward(product_grad.data(), g + l.down_proj, static_cast<double*>(nullptr), dy.data(), s.product.data(), w + l.down_proj, T,
                    F, C);
    swiglu_backward(gate_grad.data(), up_grad.data(), product_grad.data(), s.gate.data(), s.up.data(), T * F);
    linear_backward(h2_grad.data(), g + l.gate_proj, static_cast<double*>(nullptr), gate_grad.data(), s.h2.data(), w + l.gate_proj, T, C, F);
    linear_backward(h2_grad.data(), g + l.up_proj, static_cast<double*>(nullptr), up_grad.data(), s.h2.data(), w + l.up_proj, T, C, F);
    std::vector<double> residual_grad = dy;
    rmsnorm_backward(residual_grad.data(), g + l.mlp_norm, h2_grad.data(), s.residual.data(), w + l.mlp_norm, s.rstd2.data(), T, C);
    std::vector<double> attention_grad = zeros(T * Q), q_grad = zeros(T * Q), k_grad = zeros(T * KV), v_grad = zeros(T * KV),
                        delta = zeros(NQ * T);
    linear_backward(attention_grad.data(), g + l.o_proj, static_cast<double*>(nullptr), residual_grad.data(), s.attention.data(),
                    w + l.o_proj, T, Q, C);
    attention_backward(q_grad.data(), k_grad.data(), v_grad.data(), delta.data(), attention_grad.data(), s.q.data(), s.k.data(), s.v.data(),
                       s.attention.data(), s.lse.data(), positions, T, NQ, NKV, HD, block);
    std::vector<double> q_proj_grad = zeros(T * Q), k_proj_grad = zeros(T * KV), h1_grad = zeros(T * C);
    rope_backward(q_proj_grad.data(), q_grad.data(), positions, T, NQ, HD, theta);
    rope_backward(k_proj_grad.data(), k_grad.data(), positions, T, NKV, HD, theta);
    linear_backward(h1_grad.data(), g + l.q_proj, static_cast<double*>(nullptr), q_proj_grad.data(), s.h1.data(), w + l.q_proj, T, C, Q);
    linear_backward(h1_grad.data(), g + l.k_proj, static_cast<double*>(nullptr), k_proj_grad.data(), s.h1.data(), w + l.k_proj, T, C, KV);
    linear_backward(h1_grad.data(), g + l.v_proj, static_cast<double*>(nullptr), v_grad.data(), s.h1.data(), w + l.v_proj, T, C, KV);
    dy = residual_grad;
    rmsnorm_backward(dy.data(), g + l.attention_norm, h1_grad.data(), s.input.data(), w + l.attention_norm, s.rstd1.data(), T, C);
  }
  embedding_backward(g + layout.embedding, dy.data(), batch.tokens.data(), T, C);
  return step;
}

// LoRA's reference: the adapted model is the base with W + s B A in each adapted linear (PEFT's
// merge_and_unload), so its loss is the merged model's and, with G the merged weight's gradient,
// dA = s B^T G and dB = s G A^T. Returns the loss and the adapters' gradients (lora_layout's order).
inline Float64Step float64_lora_step(const ModelSpec& spec, const std::vector<float>& base, const std::vector<float>& adapters,
                                     const LoraLayout& lora, const Batch& batch) {
  const LlamaLayout layout = llama_layout(spec);
  auto base_offset = [&](size_t layer, size_t kind) {
    const LlamaLayout::Layer& l = layout.layers[layer];
    const int64_t offsets[kLayerLinears] = {l.q_proj, l.k_proj, l.v_proj, l.o_proj, l.gate_proj, l.up_proj, l.down_proj};
    return offsets[kind];
  };
  const double s = lora.scale;
  const int64_t r = lora.rank;
  std::vector<double> merged(base.begin(), base.end());
  for (size_t i = 0; i < lora.layers.size(); ++i)
    for (size_t kind = 0; kind < kLayerLinears; ++kind) {
      const LoraLayout::Adapter& adapter = lora.layers[i][kind];
      if (!adapter.present()) continue;
      const int64_t offset = base_offset(i, kind);
      for (int64_t o = 0; o < adapter.out; ++o)
        for (int64_t c = 0; c < adapter.in; ++c) {
          double product = 0;
          for (int64_t j = 0; j < r; ++j)
            product += static_cast<double>(adapters[static_cast<size_t>(adapter.b + o * r + j)]) *
                       static_cast<double>(adapters[static_cast<size_t>(adapter.a + j * adapter.in + c)]);
          merged[static_cast<size_t>(offset + o * adapter.in + c)] += s * product;
        }
    }
  const Float64Step full = float64_forward_backward(spec, merged, batch);
  Float64Step step;
  step.loss = full.loss;
  step.gradients.assign(static_cast<size_t>(lora.total), 0.0);
  for (size_t i = 0; i < lora.layers.size(); ++i)
    for (size_t kind = 0; kind < kLayerLinears; ++kind) {
      const LoraLayout::Adapter& adapter = lora.layers[i][kind];
      if (!adapter.present()) continue;
      const double* G = full.gradients.data() + base_offset(i, kind);  // [out, in]
      for (int64_t o = 0; o < adapter.out; ++o)
        for (int64_t c = 0; c < adapter.in; ++c) {
          const double gradient = s * G[o * adapter.in + c];
          for (int64_t j = 0; j < r; ++j) {
            step.gradients[static_cast<size_t>(adapter.a + j * adapter.in + c)] +=
                static_cast<double>(adapters[static_cast<size_t>(adapter.b + o * r + j)]) * gradient;
            step.gradients[static_cast<size_t>(adapter.b + o * r + j)] +=
                gradient * static_cast<double>(adapters[static_cast<size_t>(adapter.a + j * adapter.in + c)]);
          }
        }
    }
  return step;
}

}  // namespace longseq::testing
