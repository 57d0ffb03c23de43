// float64_llama.hpp: one training step of a Llama-style model in float64, written plainly (every
// kernel of kernels/cpu instantiated for double, nothing kept or tiled cleverly, one rank), with a
// LoRA reference on top of it through merged weights.
//
// It shares the kernels with the executor but none of the step (llama_step.hpp's schedule, its
// arena, its options, its LoRA code): the tests hold it to the PyTorch float64 golden first, then
// use it as the reference for what the golden does not cover.
#pragma once

#include <algorithm>
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

// A mixture-of-experts block token by token, as HF's loop reads (Reference §12 items 50-55): the
// router's softmax and top-k (renormalized or not), each chosen expert's SwiGLU weighted, the
// shared expert (gated by a sigmoid or added). Nothing of the executor's dispatch, sorting or
// combine is used. The backward recomputes each token's forward.
struct Float64Moe {
  const ModelSpec& spec;
  const LlamaLayout::Layer& l;
  const double* w;
  int64_t C() const { return spec.hidden_size; }
  // The token's experts (descending probability, ties to the lower) and their routing weights.
  void route(const double* h, std::vector<double>& probs, std::vector<int32_t>& chosen, std::vector<double>& weights) const {
    const int64_t E = spec.experts, k = spec.experts_per_token;
    probs.assign(static_cast<size_t>(E), 0.0);
    double largest = -1e300, sum = 0;
    for (int64_t e = 0; e < E; ++e) {
      double z = 0;
      for (int64_t c = 0; c < C(); ++c) z += w[l.router + e * C() + c] * h[c];
      probs[static_cast<size_t>(e)] = z;
      largest = std::max(largest, z);
    }
    for (double& p : probs) sum += (p = std::exp(p - largest));
    for (double& p : probs) p /= sum;
    chosen.resize(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) chosen[static_cast<size_t>(e)] = static_cast<int32_t>(e);
    std::stable_sort(chosen.begin(), chosen.end(), [&](int32_t a, int32_t b) { return probs[static_cast<size_t>(a)] > probs[static_cast<size_t>(b)]; });
    chosen.resize(static_cast<size_t>(k));
    double total = 0;
    for (int32_t e : chosen) total += probs[static_cast<size_t>(e)];
    weights.clear();
    for (int32_t e : chosen) weights.push_back(probs[static_cast<size_t>(e)] / (spec.moe_normalize_topk ? total : 1.0));
  }
  // A SwiGLU of width F at gate/up/down offsets on one token: out += scale x down(silu(gate h) up h)
  // (its unscaled output in `unscaled` when given).
  void swiglu(const double* h, int64_t gate, int64_t up, int64_t down, int64_t F, double scale, double* out, std::vector<double>* unscaled = nullptr) const {
    std::vector<double> g(static_cast<size_t>(F)), u(static_cast<size_t>(F)), p(static_cast<size_t>(F)), y(static_cast<size_t>(C()));
    kernels::linear_forward(g.data(), h, w + gate, static_cast<const double*>(nullptr), 1, C(), F);
    kernels::linear_forward(u.data(), h, w + up, static_cast<const double*>(nullptr), 1, C(), F);
    kernels::swiglu_forward(p.data(), g.data(), u.data(), F);
    kernels::linear_forward(y.data(), p.data(), w + down, static_cast<const double*>(nullptr), 1, F, C());
    for (int64_t c = 0; c < C(); ++c) out[c] += scale * y[static_cast<size_t>(c)];
    if (unscaled) *unscaled = y;
  }
  void swiglu_backward(const double* h, int64_t gate, int64_t up, int64_t down, int64_t F, const double* dy, double* dh, double* g_) const {
    std::vector<double> g(static_cast<size_t>(F)), u(static_cast<size_t>(F)), p(static_cast<size_t>(F));
    kernels::linear_forward(g.data(), h, w + gate, static_cast<const double*>(nullptr), 1, C(), F);
    kernels::linear_forward(u.data(), h, w + up, static_cast<const double*>(nullptr), 1, C(), F);
    kernels::swiglu_forward(p.data(), g.data(), u.data(), F);
    std::vector<double> dp(static_cast<size_t>(F), 0.0), dg(static_cast<size_t>(F), 0.0), du(static_cast<size_t>(F), 0.0);
    kernels::linear_backward(dp.data(), g_ + down, static_cast<double*>(nullptr), dy, p.data(), w + down, 1, F, C());
    kernels::swiglu_backward(dg.data(), du.data(), dp.data(), g.data(), u.data(), F);
    kernels::linear_backward(dh, g_ + gate, static_cast<double*>(nullptr), dg.data(), h, w + gate, 1, C(), F);
    kernels::linear_backward(dh, g_ + up, static_cast<double*>(nullptr), du.data(), h, w + up, 1, C(), F);
  }
  int64_t expert(int64_t e) const { return l.experts + e * 3 * spec.expert_intermediate_size * C(); }
  double shared_gate(const double* h) const {
    double z = 0;
    for (int64_t c = 0; c < C(); ++c) z += w[l.shared_expert_gate + c] * h[c];
    return 1.0 / (1.0 + std::exp(-z));
  }
  void forward(const double* h, double* out) const {
    std::vector<double> probs, weights;
    std::vector<int32_t> chosen;
    route(h, probs, chosen, weights);
    const int64_t FE = spec.expert_intermediate_size, FS = spec.shared_expert_intermediate_size;
    for (size_t j = 0; j < chosen.size(); ++j) {
      const int64_t e = expert(chosen[j]);
      swiglu(h, e, e + FE * C(), e + 2 * FE * C(), FE, weights[j], out);
    }
    if (FS > 0) swiglu(h, l.gate_proj, l.up_proj, l.down_proj, FS, spec.shared_expert_gate ? shared_gate(h) : 1.0, out);
  }
  void backward(const double* h, const double* dy, double* dh, double* g_) const {
    std::vector<double> probs, weights;
    std::vector<int32_t> chosen;
    route(h, probs, chosen, weights);
    const int64_t FE = spec.expert_intermediate_size, FS = spec.shared_expert_intermediate_size, E = spec.experts;
    std::vector<double> scaled(static_cast<size_t>(C())), y;
    if (FS > 0) {
      double gate = 1.0;
      if (spec.shared_expert_gate) {
        gate = shared_gate(h);
        std::vector<double> zero(static_cast<size_t>(C()), 0.0);
        swiglu(h, l.gate_proj, l.up_proj, l.down_proj, FS, 1.0, zero.data(), &y);
        double dot = 0;
        for (int64_t c = 0; c < C(); ++c) dot += dy[c] * y[static_cast<size_t>(c)];
        const double dz = dot * gate * (1 - gate);
        for (int64_t c = 0; c < C(); ++c) {
          g_[l.shared_expert_gate + c] += dz * h[c];
          dh[c] += dz * w[l.shared_expert_gate + c];
        }
      }
      for (int64_t c = 0; c < C(); ++c) scaled[static_cast<size_t>(c)] = gate * dy[c];
      swiglu_backward(h, l.gate_proj, l.up_proj, l.down_proj, FS, scaled.data(), dh, g_);
    }
    // Each chosen expert: its output's gradient is w_j dy; the weight's is dy . y_j.
    std::vector<double> dweights(chosen.size());
    for (size_t j = 0; j < chosen.size(); ++j) {
      const int64_t e = expert(chosen[j]);
      std::vector<double> zero(static_cast<size_t>(C()), 0.0);
      swiglu(h, e, e + FE * C(), e + 2 * FE * C(), FE, 1.0, zero.data(), &y);
      double dot = 0;
      for (int64_t c = 0; c < C(); ++c) {
        dot += dy[c] * y[static_cast<size_t>(c)];
        scaled[static_cast<size_t>(c)] = weights[j] * dy[c];
      }
      dweights[j] = dot;
      swiglu_backward(h, e, e + FE * C(), e + 2 * FE * C(), FE, scaled.data(), dh, g_);
    }
    // The router: through the renormalization (w_j = p_j / S) and the softmax.
    std::vector<double> dp(static_cast<size_t>(E), 0.0);
    double total = 0, inner_w = 0;
    for (size_t j = 0; j < chosen.size(); ++j) {
      total += probs[static_cast<size_t>(chosen[j])];
      inner_w += dweights[j] * weights[j];
    }
    for (size_t j = 0; j < chosen.size(); ++j)
      dp[static_cast<size_t>(chosen[j])] = spec.moe_normalize_topk ? (dweights[j] - inner_w) / total : dweights[j];
    double inner = 0;
    for (int64_t e = 0; e < E; ++e) inner += dp[static_cast<size_t>(e)] * probs[static_cast<size_t>(e)];
    for (int64_t e = 0; e < E; ++e) {
      const double dz = probs[static_cast<size_t>(e)] * (dp[static_cast<size_t>(e)] - inner);
      for (int64_t c = 0; c < C(); ++c) {
        g_[l.router + e * C() + c] += dz * h[c];
        dh[c] += dz * w[l.router + e * C() + c];
      }
    }
  }
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
    if (spec.is_moe()) {
      std::fill(x.begin(), x.end(), 0.0);
      const Float64Moe moe{spec, l, w};
      for (int64_t t = 0; t < T; ++t) moe.forward(s.h2.data() + t * C, x.data() + t * C);
    } else {
      s.gate = zeros(T * F), s.up = zeros(T * F), s.product = zeros(T * F);
      linear_forward(s.gate.data(), s.h2.data(), w + l.gate_proj, static_cast<const double*>(nullptr), T, C, F);
      linear_forward(s.up.data(), s.h2.data(), w + l.up_proj, static_cast<const double*>(nullptr), T, C, F);
      swiglu_forward(s.product.data(), s.gate.data(), s.up.data(), T * F);
      linear_forward(x.data(), s.product.data(), w + l.down_proj, static_cast<const double*>(nullptr), T, F, C);
    }
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
    std::vector<double> h2_grad = zeros(T * C);
    if (spec.is_moe()) {
      const Float64Moe moe{spec, l, w};
      for (int64_t t = 0; t < T; ++t) moe.backward(s.h2.data() + t * C, dy.data() + t * C, h2_grad.data() + t * C, g);
    } else {
      std::vector<double> product_grad = zeros(T * F), gate_grad = zeros(T * F), up_grad = zeros(T * F);
      linear_backward(product_grad.data(), g + l.down_proj, static_cast<double*>(nullptr), dy.data(), s.product.data(), w + l.down_proj, T,
                      F, C);
      swiglu_backward(gate_grad.data(), up_grad.data(), product_grad.data(), s.gate.data(), s.up.data(), T * F);
      linear_backward(h2_grad.data(), g + l.gate_proj, static_cast<double*>(nullptr), gate_grad.data(), s.h2.data(), w + l.gate_proj, T, C, F);
      linear_backward(h2_grad.data(), g + l.up_proj, static_cast<double*>(nullptr), up_grad.data(), s.h2.data(), w + l.up_proj, T, C, F);
    }
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

// Each adapted linear's base weight offset (llama_layout's), by LayerLinearKind.
inline int64_t base_linear_offset(const LlamaLayout& layout, size_t layer, size_t kind) {
  const LlamaLayout::Layer& l = layout.layers[layer];
  const int64_t offsets[kLayerLinears] = {l.q_proj, l.k_proj, l.v_proj, l.o_proj, l.gate_proj, l.up_proj, l.down_proj};
  return offsets[kind];
}

// The adapted model as one set of weights: W + s B A in each adapted linear (PEFT's
// merge_and_unload), in float64.
inline std::vector<double> float64_lora_merge(const ModelSpec& spec, const std::vector<double>& base, const std::vector<double>& adapters,
                                              const LoraLayout& lora) {
  const LlamaLayout layout = llama_layout(spec);
  const int64_t r = lora.rank;
  std::vector<double> merged = base;
  for (size_t i = 0; i < lora.layers.size(); ++i)
    for (size_t kind = 0; kind < kLayerLinears; ++kind) {
      const LoraLayout::Adapter& adapter = lora.layers[i][kind];
      if (!adapter.present()) continue;
      const int64_t offset = base_linear_offset(layout, i, kind);
      for (int64_t o = 0; o < adapter.out; ++o)
        for (int64_t c = 0; c < adapter.in; ++c) {
          double product = 0;
          for (int64_t j = 0; j < r; ++j)
            product += adapters[static_cast<size_t>(adapter.b + o * r + j)] * adapters[static_cast<size_t>(adapter.a + j * adapter.in + c)];
          merged[static_cast<size_t>(offset + o * adapter.in + c)] += static_cast<double>(lora.scale) * product;
        }
    }
  return merged;
}

// LoRA's reference: the adapted model's loss is the merged model's and, with G the merged
// weight's gradient, dA = s B^T G and dB = s G A^T. Returns the loss and the adapters' gradients
// (lora_layout's order).
inline Float64Step float64_lora_step(const ModelSpec& spec, const std::vector<float>& base, const std::vector<float>& adapters,
                                     const LoraLayout& lora, const Batch& batch) {
  const LlamaLayout layout = llama_layout(spec);
  const double s = lora.scale;
  const int64_t r = lora.rank;
  const Float64Step full = float64_forward_backward(
      spec, float64_lora_merge(spec, {base.begin(), base.end()}, {adapters.begin(), adapters.end()}, lora), batch);
  Float64Step step;
  step.loss = full.loss;
  step.gradients.assign(static_cast<size_t>(lora.total), 0.0);
  for (size_t i = 0; i < lora.layers.size(); ++i)
    for (size_t kind = 0; kind < kLayerLinears; ++kind) {
      const LoraLayout::Adapter& adapter = lora.layers[i][kind];
      if (!adapter.present()) continue;
      const double* G = full.gradients.data() + base_linear_offset(layout, i, kind);  // [out, in]
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
