#include "executor/llama.hpp"

#include "executor/ulysses.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <stdexcept>

#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/dense.hpp"
#include "kernels/cpu/loss_optimizer.hpp"
#include "kernels/cpu/norm_rope.hpp"
#include "models/config_error.hpp"
#include "models/layer_inventory.hpp"

namespace longseq {

namespace k = kernels;

LlamaLayout llama_layout(const ModelSpec& model) {
  LlamaLayout layout;
  const int64_t C = model.hidden_size, Q = model.q_width(), KV = model.kv_width(), F = model.intermediate_size;
  int64_t offset = 0;
  auto take = [&](int64_t elements) {
    const int64_t start = offset;
    offset += elements;
    return start;
  };
  layout.embedding = take(model.vocab_size * C);
  for (int64_t i = 0; i < model.num_layers; ++i) {
    LlamaLayout::Layer layer{};
    layer.attention_norm = take(C);
    layer.q_proj = take(Q * C);
    layer.k_proj = take(KV * C);
    layer.v_proj = take(KV * C);
    layer.o_proj = take(C * Q);
    layer.mlp_norm = take(C);
    layer.gate_proj = take(F * C);
    layer.up_proj = take(F * C);
    layer.down_proj = take(C * F);
    layout.layers.push_back(layer);
  }
  layout.final_norm = take(C);
  layout.lm_head = model.tied_embeddings ? layout.embedding : take(model.vocab_size * C);
  layout.total = offset;
  return layout;
}

namespace {

constexpr const char* kStates = kCategoryModelStates;
constexpr const char* L = kCategoryLayer;

struct Dims {
  int64_t T, C, Q, KV, NQ, NKV, HD, F, V;
};

// What a layer keeps for its backward when its forward runs with keep_for_backward.
struct LayerSaved {
  Buffer attention_norm_output, attention_norm_rstd, q, k, v, attention_output, lse, residual, mlp_norm_output,
      mlp_norm_rstd, gate, up, product;
  // With Ulysses: attention's own inputs and output over the whole sequence for this rank's heads.
  Buffer q_global, k_global, v_global, output_global;
};

int64_t tile_size(int64_t T, int64_t tiles) { return tiles > 0 ? (T + tiles - 1) / tiles : T; }

// One decoder layer's forward. Returns the layer output; fills `saved` when given.
Buffer layer_forward(const float* params, const LlamaLayout::Layer& w, const float* x, const int32_t* positions, const Dims& d,
                     const TrainingOptions& options, Arena& device, LayerSaved* saved, const Ulysses& ulysses) {
  LayerSaved local;
  LayerSaved& s = saved ? *saved : local;
  device.set_moment("forward: attention");
  s.attention_norm_output = device.allocate(L, "attention_norm.output", d.T * d.C);
  s.attention_norm_rstd = device.allocate(L, "attention_norm.rstd", d.T);
  k::rmsnorm_forward(s.attention_norm_output.data(), s.attention_norm_rstd.data(), x, params + w.attention_norm, d.T, d.C,
                     options.rmsnorm_eps);
  s.q = device.allocate(L, "attention.q", d.T * d.Q);
  s.k = device.allocate(L, "attention.k", d.T * d.KV);
  s.v = device.allocate(L, "attention.v", d.T * d.KV);
  k::linear_forward(s.q.data(), s.attention_norm_output.data(), params + w.q_proj, static_cast<const float*>(nullptr), d.T, d.C, d.Q);
  k::linear_forward(s.k.data(), s.attention_norm_output.data(), params + w.k_proj, static_cast<const float*>(nullptr), d.T, d.C, d.KV);
  k::linear_forward(s.v.data(), s.attention_norm_output.data(), params + w.v_proj, static_cast<const float*>(nullptr), d.T, d.C, d.KV);
  k::rope_forward(s.q.data(), s.q.data(), positions, d.T, d.NQ, d.HD, options.rope_theta);
  k::rope_forward(s.k.data(), s.k.data(), positions, d.T, d.NKV, d.HD, options.rope_theta);
  if (!saved) s.attention_norm_output.release();
  if (!ulysses.active()) {
    s.attention_output = device.allocate(L, "attention.output", d.T * d.Q);
    s.lse = device.allocate(L, "attention.lse", d.NQ * d.T);
    k::attention_forward(s.attention_output.data(), s.lse.data(), s.q.data(), s.k.data(), s.v.data(), positions, d.T, d.NQ,
                         d.NKV, d.HD, options.attention_block);
    if (!saved) {
      s.q.release();
      s.k.release();
      s.v.release();
      s.lse.release();
    }
  } else {
    // All-to-all in: every token of the sample for this rank's heads.
    const int64_t S = d.T * ulysses.sp, q_count = d.T * ulysses.q_heads * d.HD;
    auto q_head = [&](int64_t r, int64_t j) { return r * ulysses.q_heads + j; };
    auto kv_head = [&](int64_t r, int64_t j) { return ulysses.kv_head_of(r, j); };
    auto exchange = [&](const char* name, const float* rank_tokens, int64_t heads_total, int64_t heads_per_rank, auto head_of) {
      const int64_t count = d.T * heads_per_rank * d.HD;
      Buffer send = device.allocate(L, "ulysses.staging", ulysses.sp * count);
      heads_pack(send.data(), rank_tokens, d.T, heads_total, heads_per_rank, d.HD, ulysses.sp, head_of);
      Buffer global = device.allocate(L, name, ulysses.sp * count);
      ulysses.group->all_to_all(send.data(), global.data(), count);
      return global;
    };
    s.q_global = exchange("attention.q_global", s.q.data(), d.NQ, ulysses.q_heads, q_head);
    s.k_global = exchange("attention.k_global", s.k.data(), d.NKV, ulysses.kv_heads, kv_head);
    s.v_global = exchange("attention.v_global", s.v.data(), d.NKV, ulysses.kv_heads, kv_head);
    s.q.release();
    s.k.release();
    s.v.release();
    s.output_global = device.allocate(L, "attention.output_global", ulysses.sp * q_count);
    s.lse = device.allocate(L, "attention.lse", ulysses.q_heads * S);
    k::attention_forward(s.output_global.data(), s.lse.data(), s.q_global.data(), s.k_global.data(), s.v_global.data(),
                         ulysses.global_positions, S, ulysses.q_heads, ulysses.kv_heads, d.HD, options.attention_block);
    // All-to-all out: the output's token blocks go back to the ranks that own them.
    Buffer recv = device.allocate(L, "ulysses.staging", ulysses.sp * q_count);
    ulysses.group->all_to_all(s.output_global.data(), recv.data(), q_count);
    s.attention_output = device.allocate(L, "attention.output", d.T * d.Q, true);
    heads_unpack_add(s.attention_output.data(), recv.data(), d.T, d.NQ, ulysses.q_heads, d.HD, ulysses.sp, q_head);
    if (!saved) {
      for (Buffer* buffer : {&s.q_global, &s.k_global, &s.v_global, &s.output_global, &s.lse}) buffer->release();
    }
  }
  device.set_moment("forward: o_proj and residual");
  s.residual = device.allocate(L, "residual.attention", d.T * d.C);
  k::linear_forward(s.residual.data(), s.attention_output.data(), params + w.o_proj, static_cast<const float*>(nullptr), d.T, d.Q, d.C);
  for (int64_t i = 0; i < d.T * d.C; ++i) s.residual.data()[i] += x[i];
  if (!saved) s.attention_output.release();

  device.set_moment("forward: mlp");
  s.mlp_norm_output = device.allocate(L, "mlp_norm.output", d.T * d.C);
  s.mlp_norm_rstd = device.allocate(L, "mlp_norm.rstd", d.T);
  k::rmsnorm_forward(s.mlp_norm_output.data(), s.mlp_norm_rstd.data(), s.residual.data(), params + w.mlp_norm, d.T, d.C,
                     options.rmsnorm_eps);
  Buffer output = device.allocate(L, "layer.output", d.T * d.C);
  const int64_t tile = options.mlp_tiles > 0 ? tile_size(d.T, options.mlp_tiles) : d.T;
  const bool keep_intermediates = saved && options.mlp_tiles == 0;
  for (int64_t t0 = 0; t0 < d.T; t0 += tile) {
    const int64_t rows = std::min(tile, d.T - t0);
    Buffer gate = device.allocate(L, "mlp.gate", rows * d.F);
    Buffer up = device.allocate(L, "mlp.up", rows * d.F);
    const float* h = s.mlp_norm_output.data() + t0 * d.C;
    k::linear_forward(gate.data(), h, params + w.gate_proj, static_cast<const float*>(nullptr), rows, d.C, d.F);
    k::linear_forward(up.data(), h, params + w.up_proj, static_cast<const float*>(nullptr), rows, d.C, d.F);
    Buffer product = device.allocate(L, "mlp.product", rows * d.F);
    k::swiglu_forward(product.data(), gate.data(), up.data(), rows * d.F);
    k::linear_forward(output.data() + t0 * d.C, product.data(), params + w.down_proj, static_cast<const float*>(nullptr), rows,
                      d.F, d.C);
    if (keep_intermediates) {
      s.gate = std::move(gate);
      s.up = std::move(up);
      s.product = std::move(product);
    }
  }
  for (int64_t i = 0; i < d.T * d.C; ++i) output.data()[i] += s.residual.data()[i];
  if (!saved) {
    s.mlp_norm_output.release();
    s.mlp_norm_rstd.release();
    s.residual.release();
  }
  return output;
}

// One decoder layer's backward after layer_forward with `saved`. dy is the gradient of the
// layer output; returns the gradient of its input.
Buffer layer_backward(float* grads, const float* params, const LlamaLayout::Layer& w, const float* x, const float* dy,
                      const int32_t* positions, const Dims& d, const TrainingOptions& options, Arena& device, LayerSaved& s,
                      const Ulysses& ulysses) {
  device.set_moment("backward: mlp");
  // The residual branch passes dy through; the MLP adds its input gradient through the norm.
  Buffer mlp_input_grad = device.allocate(L, "mlp.input_grad", d.T * d.C, true);
  const int64_t tile = options.mlp_tiles > 0 ? tile_size(d.T, options.mlp_tiles) : d.T;
  for (int64_t t0 = 0; t0 < d.T; t0 += tile) {
    const int64_t rows = std::min(tile, d.T - t0);
    const float* h = s.mlp_norm_output.data() + t0 * d.C;
    Buffer gate, up, product;
    if (options.mlp_tiles == 0) {
      gate = std::move(s.gate);
      up = std::move(s.up);
      product = std::move(s.product);
    } else {  // TiledMLP: recompute this tile
      gate = device.allocate(L, "mlp.gate", rows * d.F);
      up = device.allocate(L, "mlp.up", rows * d.F);
      k::linear_forward(gate.data(), h, params + w.gate_proj, static_cast<const float*>(nullptr), rows, d.C, d.F);
      k::linear_forward(up.data(), h, params + w.up_proj, static_cast<const float*>(nullptr), rows, d.C, d.F);
      product = device.allocate(L, "mlp.product", rows * d.F);
      k::swiglu_forward(product.data(), gate.data(), up.data(), rows * d.F);
    }
    Buffer product_grad = device.allocate(L, "mlp.product_grad", rows * d.F, true);
    k::linear_backward(product_grad.data(), grads + w.down_proj, static_cast<float*>(nullptr), dy + t0 * d.C, product.data(),
                       params + w.down_proj, rows, d.F, d.C);
    product.release();
    Buffer gate_grad = device.allocate(L, "mlp.gate_grad", rows * d.F, true);
    Buffer up_grad = device.allocate(L, "mlp.up_grad", rows * d.F, true);
    k::swiglu_backward(gate_grad.data(), up_grad.data(), product_grad.data(), gate.data(), up.data(), rows * d.F);
    product_grad.release();
    float* dh = mlp_input_grad.data() + t0 * d.C;
    k::linear_backward(dh, grads + w.gate_proj, static_cast<float*>(nullptr), gate_grad.data(), h, params + w.gate_proj, rows, d.C, d.F);
    k::linear_backward(dh, grads + w.up_proj, static_cast<float*>(nullptr), up_grad.data(), h, params + w.up_proj, rows, d.C, d.F);
  }
  s.mlp_norm_output.release();
  device.set_moment("backward: mlp norm");
  Buffer residual_grad = device.allocate(L, "residual.attention_grad", d.T * d.C);
  std::copy_n(dy, d.T * d.C, residual_grad.data());
  k::rmsnorm_backward(residual_grad.data(), grads + w.mlp_norm, mlp_input_grad.data(), s.residual.data(), params + w.mlp_norm,
                      s.mlp_norm_rstd.data(), d.T, d.C);
  mlp_input_grad.release();
  s.residual.release();
  s.mlp_norm_rstd.release();

  device.set_moment("backward: attention");
  Buffer output_grad = device.allocate(L, "attention.output_grad", d.T * d.Q, true);
  k::linear_backward(output_grad.data(), grads + w.o_proj, static_cast<float*>(nullptr), residual_grad.data(),
                     s.attention_output.data(), params + w.o_proj, d.T, d.Q, d.C);
  Buffer q_grad = device.allocate(L, "attention.q_grad", d.T * d.Q, true);
  Buffer k_grad = device.allocate(L, "attention.k_grad", d.T * d.KV, true);
  Buffer v_grad = device.allocate(L, "attention.v_grad", d.T * d.KV, true);
  if (!ulysses.active()) {
    k::attention_backward(q_grad.data(), k_grad.data(), v_grad.data(), output_grad.data(), s.q.data(), s.k.data(), s.v.data(),
                          s.attention_output.data(), s.lse.data(), positions, d.T, d.NQ, d.NKV, d.HD, options.attention_block);
    output_grad.release();
    s.attention_output.release();
    s.lse.release();
    s.q.release();
    s.k.release();
    s.v.release();
  } else {
    // The mirror of the forward: the output gradient goes to the heads' ranks, q/k/v gradients
    // come back to the tokens' ranks (replicated kv heads summed).
    const int64_t S = d.T * ulysses.sp, q_count = d.T * ulysses.q_heads * d.HD, kv_count = d.T * ulysses.kv_heads * d.HD;
    auto q_head = [&](int64_t r, int64_t j) { return r * ulysses.q_heads + j; };
    auto kv_head = [&](int64_t r, int64_t j) { return ulysses.kv_head_of(r, j); };
    Buffer send = device.allocate(L, "ulysses.staging", ulysses.sp * q_count);
    heads_pack(send.data(), output_grad.data(), d.T, d.NQ, ulysses.q_heads, d.HD, ulysses.sp, q_head);
    output_grad.release();
    Buffer output_grad_global = device.allocate(L, "attention.output_grad_global", ulysses.sp * q_count);
    ulysses.group->all_to_all(send.data(), output_grad_global.data(), q_count);
    send.release();
    Buffer q_grad_global = device.allocate(L, "attention.q_grad_global", ulysses.sp * q_count, true);
    Buffer k_grad_global = device.allocate(L, "attention.k_grad_global", ulysses.sp * kv_count, true);
    Buffer v_grad_global = device.allocate(L, "attention.v_grad_global", ulysses.sp * kv_count, true);
    k::attention_backward(q_grad_global.data(), k_grad_global.data(), v_grad_global.data(), output_grad_global.data(),
                          s.q_global.data(), s.k_global.data(), s.v_global.data(), s.output_global.data(), s.lse.data(),
                          ulysses.global_positions, S, ulysses.q_heads, ulysses.kv_heads, d.HD, options.attention_block);
    for (Buffer* buffer : {&output_grad_global, &s.output_global, &s.lse, &s.q_global, &s.k_global, &s.v_global}) buffer->release();
    s.attention_output.release();
    auto gather_back = [&](Buffer& global, float* rank_tokens, int64_t count, int64_t heads_total, int64_t heads_per_rank, auto head_of) {
      Buffer recv = device.allocate(L, "ulysses.staging", ulysses.sp * count);
      ulysses.group->all_to_all(global.data(), recv.data(), count);
      global.release();
      heads_unpack_add(rank_tokens, recv.data(), d.T, heads_total, heads_per_rank, d.HD, ulysses.sp, head_of);
    };
    gather_back(q_grad_global, q_grad.data(), q_count, d.NQ, ulysses.q_heads, q_head);
    gather_back(k_grad_global, k_grad.data(), kv_count, d.NKV, ulysses.kv_heads, kv_head);
    gather_back(v_grad_global, v_grad.data(), kv_count, d.NKV, ulysses.kv_heads, kv_head);
  }
  // RoPE's backward is the inverse rotation, done in place on the gradients.
  Buffer q_proj_grad = device.allocate(L, "attention.q_proj_grad", d.T * d.Q, true);
  k::rope_backward(q_proj_grad.data(), q_grad.data(), positions, d.T, d.NQ, d.HD, options.rope_theta);
  q_grad.release();
  Buffer k_proj_grad = device.allocate(L, "attention.k_proj_grad", d.T * d.KV, true);
  k::rope_backward(k_proj_grad.data(), k_grad.data(), positions, d.T, d.NKV, d.HD, options.rope_theta);
  k_grad.release();
  Buffer norm_grad = device.allocate(L, "attention_norm.output_grad", d.T * d.C, true);
  const float* h1 = s.attention_norm_output.data();
  k::linear_backward(norm_grad.data(), grads + w.q_proj, static_cast<float*>(nullptr), q_proj_grad.data(), h1, params + w.q_proj, d.T, d.C, d.Q);
  k::linear_backward(norm_grad.data(), grads + w.k_proj, static_cast<float*>(nullptr), k_proj_grad.data(), h1, params + w.k_proj, d.T, d.C, d.KV);
  k::linear_backward(norm_grad.data(), grads + w.v_proj, static_cast<float*>(nullptr), v_grad.data(), h1, params + w.v_proj, d.T, d.C, d.KV);
  q_proj_grad.release();
  k_proj_grad.release();
  v_grad.release();
  s.attention_norm_output.release();

  device.set_moment("backward: attention norm");
  Buffer input_grad = std::move(residual_grad);  // dx = residual gradient + the attention branch
  k::rmsnorm_backward(input_grad.data(), grads + w.attention_norm, norm_grad.data(), x, params + w.attention_norm,
                      s.attention_norm_rstd.data(), d.T, d.C);
  s.attention_norm_rstd.release();
  return input_grad;
}

}  // namespace

void executor_model_check(const ModelSpec& model) {
  // The executor implements Llama-style blocks; anything else would train a different model.
  std::string unsupported;
  if (model.mlp_kind != MlpKind::mlp_kind_swiglu) unsupported += " a GELU MLP";
  if (model.norm_kind != NormKind::norm_kind_rmsnorm) unsupported += " LayerNorm";
  if (model.qkv_bias || model.o_proj_bias || model.mlp_bias) unsupported += " biases";
  if (model.qk_norm) unsupported += " q/k norms";
  if (!unsupported.empty())
    throw ConfigError(model.name, "", "the executor trains Llama-style models (SwiGLU, RMSNorm, no biases, no q/k norms); this one has" +
                                          unsupported);
}

LlamaModel::LlamaModel(const ModelSpec& model, Arena& device) : spec_(model), layout_(llama_layout(model)) {
  executor_model_check(model);
  states_allocate(device, layout_.total);
}

LlamaModel::LlamaModel(const ModelSpec& model, Arena& device, Communicator& zero_group) : spec_(model), layout_(llama_layout(model)) {
  executor_model_check(model);
  states_allocate(device, plan_modules(zero_group.size()));
  zero_group_ = &zero_group;
}

void LlamaModel::states_allocate(Arena& device, int64_t elements) {
  parameters_ = device.allocate(kStates, "weights", elements, true);
  gradients_ = device.allocate(kStates, "gradients_fp32", elements, true);
  adam_m_ = device.allocate(kStates, "optimizer_states", elements, true);
  adam_v_ = device.allocate(kStates, "optimizer_states", elements, true);
}

int64_t LlamaModel::plan_modules(int64_t ranks) {
  modules_.clear();
  auto add = [&](int64_t start, int64_t end) {
    Module module;
    module.start = start;
    module.size = end - start;
    module.chunk = (module.size + ranks - 1) / ranks;
    module.shard_offset = modules_.empty() ? 0 : modules_.back().shard_offset + modules_.back().chunk;
    modules_.push_back(module);
  };
  add(layout_.embedding, layout_.embedding + spec_.vocab_size * spec_.hidden_size);
  for (size_t i = 0; i < layout_.layers.size(); ++i)
    add(layout_.layers[i].attention_norm, i + 1 < layout_.layers.size() ? layout_.layers[i + 1].attention_norm : layout_.final_norm);
  add(layout_.final_norm, layout_.total);
  return modules_.back().shard_offset + modules_.back().chunk;
}

void LlamaModel::load_parameters(const float* full) {
  if (!zero_group_) {
    std::copy_n(full, layout_.total, parameters_.data());
    return;
  }
  // This rank's padded chunk of every module (the padding is zero).
  const int64_t rank = zero_group_->rank();
  for (const Module& module : modules_)
    for (int64_t i = 0; i < module.chunk; ++i) {
      const int64_t source = rank * module.chunk + i;
      parameters_.data()[module.shard_offset + i] = source < module.size ? full[module.start + source] : 0.0f;
    }
}

std::vector<float> LlamaModel::gather_full(const float* shard) const {
  if (!zero_group_) return std::vector<float>(shard, shard + layout_.total);
  std::vector<float> full(static_cast<size_t>(layout_.total));
  for (const Module& module : modules_) {
    std::vector<float> gathered(static_cast<size_t>(module.chunk * zero_group_->size()));
    zero_group_->all_gather(shard + module.shard_offset, gathered.data(), module.chunk);
    std::copy_n(gathered.data(), module.size, full.data() + module.start);
  }
  return full;
}

StepResult LlamaModel::forward_backward(const int32_t* tokens, const int32_t* labels, const int32_t* positions, int64_t T,
                                        const TrainingOptions& options, Arena& device, Arena& host, const SequenceParallel& parallel) {
  const ModelSpec& m = spec_;
  const Dims d{T, m.hidden_size, m.q_width(), m.kv_width(), m.num_q_heads, m.num_kv_heads, m.head_dim, m.intermediate_size, m.vocab_size};
  // Without ZeRO the weights and gradients are the full flat buffers. With ZeRO-3 a module is
  // all-gathered into "gathered_layer_weights" when it runs, and its gradient, produced whole in
  // "weight_gradient", is reduce-scattered into this rank's shard (summing every rank's part).
  const float* params = parameters_.data();
  float* grads = gradients_.data();
  std::fill_n(grads, parameters_.size(), 0.0f);
  const int64_t layers = m.num_layers;
  const bool zero = zero_group_ != nullptr;
  auto gather = [&](size_t index, const char* name = "gathered_layer_weights") {
    const Module& module = modules_[index];
    Buffer gathered = device.allocate(kCategoryZero, name, module.chunk * zero_group_->size());
    zero_group_->all_gather(parameters_.data() + module.shard_offset, gathered.data(), module.chunk);
    return gathered;
  };
  auto gradient_buffer = [&](size_t index, const char* name = "weight_gradient") {
    return device.allocate(kCategoryZero, name, modules_[index].chunk * zero_group_->size(), true);
  };
  auto scatter = [&](size_t index, Buffer& gradient) {
    const Module& module = modules_[index];
    Buffer part = device.allocate(kCategoryZero, "gradient_shard_in_flight", module.chunk);
    zero_group_->reduce_scatter(gradient.data(), part.data(), module.chunk);
    for (int64_t i = 0; i < module.chunk; ++i) gradients_.data()[module.shard_offset + i] += part.data()[i];
    gradient.release();
  };
  // A layer's offsets relative to its module, for running it on the gathered buffer.
  auto rebased = [&](size_t layer) {
    LlamaLayout::Layer w = layout_.layers[layer];
    const int64_t start = modules_[1 + layer].start;
    for (int64_t* offset : {&w.attention_norm, &w.q_proj, &w.k_proj, &w.v_proj, &w.o_proj, &w.mlp_norm, &w.gate_proj, &w.up_proj,
                            &w.down_proj})
      *offset -= start;
    return w;
  };
  const size_t final_module = static_cast<size_t>(layers) + 1;
  Ulysses ulysses;
  if (parallel.group && parallel.group->size() > 1) {
    ulysses.group = parallel.group;
    ulysses.global_positions = parallel.global_positions;
    ulysses.sp = parallel.group->size();
    if (!parallel.global_positions) throw std::invalid_argument("forward_backward: Ulysses needs the global position ids");
    if (m.num_q_heads % ulysses.sp != 0 || (m.num_kv_heads % ulysses.sp != 0 && ulysses.sp % m.num_kv_heads != 0))
      throw std::invalid_argument("forward_backward: sp breaks Ulysses' head rules (plan_problems reports this)");
    ulysses.q_heads = m.num_q_heads / ulysses.sp;
    ulysses.replication = ulysses.sp > m.num_kv_heads ? ulysses.sp / m.num_kv_heads : 1;
    ulysses.kv_heads = ulysses.replication > 1 ? 1 : m.num_kv_heads / ulysses.sp;
  }

  // Forward. With checkpointing only each layer's input survives (on the device, or copied to
  // the host pool); without it every layer keeps what its backward reads.
  Buffer x = device.allocate(L, "layer.input", T * d.C);
  if (zero) {
    Buffer table = gather(0);
    k::embedding_forward(x.data(), tokens, table.data(), T, d.C);
  } else {
    k::embedding_forward(x.data(), tokens, params + layout_.embedding, T, d.C);
  }
  std::vector<Buffer> inputs(static_cast<size_t>(layers));
  std::vector<LayerSaved> saved(options.activation_checkpointing ? 0 : static_cast<size_t>(layers));
  for (int64_t i = 0; i < layers; ++i) {
    Buffer gathered = zero ? gather(1 + static_cast<size_t>(i)) : Buffer();
    const LlamaLayout::Layer w = zero ? rebased(static_cast<size_t>(i)) : layout_.layers[static_cast<size_t>(i)];
    Buffer y = layer_forward(zero ? gathered.data() : params, w, x.data(), positions, d, options, device,
                             options.activation_checkpointing ? nullptr : &saved[static_cast<size_t>(i)], ulysses);
    gathered.release();
    if (options.checkpoint_offload) {
      Buffer copy = host.allocate(kCategoryCheckpoints, "hidden_states_checkpoints", T * d.C);
      std::copy_n(x.data(), T * d.C, copy.data());
      x.release();
      inputs[static_cast<size_t>(i)] = std::move(copy);
    } else {
      inputs[static_cast<size_t>(i)] = std::move(x);
    }
    x = std::move(y);
  }

  // Final norm, logits and loss; the gradient comes back into the last layer's output.
  device.set_moment("loss: logits and cross entropy");
  // The loss is the mean over every counted token of the sample: with Ulysses the count is summed
  // over the ranks first (ranks whose tokens are all ignored included), so each rank's gradient is
  // its share of the same mean.
  StepResult result;
  for (int64_t t = 0; t < T; ++t) result.counted_tokens += labels[t] != k::kIgnoreIndex;
  if (ulysses.active()) {
    double count = static_cast<double>(result.counted_tokens);
    ulysses.group->all_reduce(&count, 1);
    result.counted_tokens = static_cast<int64_t>(count);
  }
  const float loss_scale = result.counted_tokens > 0 ? 1.0f / static_cast<float>(result.counted_tokens) : 0.0f;
  // Where the final norm and the LM head (and their gradients) are for this step.
  Buffer final_weights, tied_weights, final_gradient, tied_gradient;
  const float* final_norm_weight = params + layout_.final_norm;
  const float* lm_head_weight = params + layout_.lm_head;
  float* final_norm_grad = grads + layout_.final_norm;
  float* lm_head_grad = grads + layout_.lm_head;
  if (zero) {
    final_weights = gather(final_module);
    final_gradient = gradient_buffer(final_module);
    final_norm_weight = final_weights.data();
    final_norm_grad = final_gradient.data();
    if (m.tied_embeddings) {
      tied_weights = gather(0, "gathered_embedding_weights");
      tied_gradient = gradient_buffer(0, "embedding_weight_gradient");
      lm_head_weight = tied_weights.data();
      lm_head_grad = tied_gradient.data();
    } else {
      lm_head_weight = final_weights.data() + (layout_.lm_head - layout_.final_norm);
      lm_head_grad = final_gradient.data() + (layout_.lm_head - layout_.final_norm);
    }
  }
  Buffer final_output = device.allocate(kCategoryLoss, "final_norm.output", T * d.C);
  Buffer final_rstd = device.allocate(kCategoryLoss, "final_norm.rstd", T);
  k::rmsnorm_forward(final_output.data(), final_rstd.data(), x.data(), final_norm_weight, T, d.C, options.rmsnorm_eps);
  Buffer final_grad = device.allocate(kCategoryLoss, "final_norm.output_grad", T * d.C, true);
  const int64_t loss_tile = options.loss_tiles > 0 ? tile_size(T, options.loss_tiles) : T;
  double loss_sum = 0;
  for (int64_t t0 = 0; t0 < T; t0 += loss_tile) {
    const int64_t rows = std::min(loss_tile, T - t0);
    Buffer logits = device.allocate(kCategoryLoss, "loss.logits", rows * d.V);
    k::linear_forward(logits.data(), final_output.data() + t0 * d.C, lm_head_weight, static_cast<const float*>(nullptr),
                      rows, d.C, d.V);
    Buffer losses = device.allocate(kCategoryLoss, "loss.per_token", rows);
    k::cross_entropy_forward(losses.data(), logits.data(), labels + t0, rows, d.V);
    for (int64_t r = 0; r < rows; ++r) loss_sum += losses.data()[r];
    Buffer logits_grad = device.allocate(kCategoryLoss, "loss.logits_grad", rows * d.V, true);
    k::cross_entropy_backward(logits_grad.data(), logits.data(), labels + t0, loss_scale, rows, d.V);
    logits.release();
    k::linear_backward(final_grad.data() + t0 * d.C, lm_head_grad, static_cast<float*>(nullptr), logits_grad.data(),
                       final_output.data() + t0 * d.C, lm_head_weight, rows, d.C, d.V);
  }
  if (ulysses.active()) ulysses.group->all_reduce(&loss_sum, 1);
  result.loss = result.counted_tokens > 0 ? loss_sum / static_cast<double>(result.counted_tokens) : 0.0;
  final_output.release();
  Buffer dy = device.allocate(L, "layer.output_grad", T * d.C, true);
  k::rmsnorm_backward(dy.data(), final_norm_grad, final_grad.data(), x.data(), final_norm_weight, final_rstd.data(), T, d.C);
  if (zero) {
    scatter(final_module, final_gradient);
    if (m.tied_embeddings) scatter(0, tied_gradient);
    final_weights.release();
    tied_weights.release();
  }
  final_grad.release();
  final_rstd.release();
  x.release();

  // Backward, last layer first; with checkpointing each layer is recomputed from its input.
  for (int64_t i = layers - 1; i >= 0; --i) {
    Buffer gathered = zero ? gather(1 + static_cast<size_t>(i)) : Buffer();
    Buffer layer_gradient = zero ? gradient_buffer(1 + static_cast<size_t>(i)) : Buffer();
    const float* layer_params = zero ? gathered.data() : params;
    float* layer_grads = zero ? layer_gradient.data() : grads;
    const LlamaLayout::Layer w = zero ? rebased(static_cast<size_t>(i)) : layout_.layers[static_cast<size_t>(i)];
    Buffer input = std::move(inputs[static_cast<size_t>(i)]);
    if (options.checkpoint_offload) {
      Buffer fetched = device.allocate(L, "layer.input", T * d.C);
      std::copy_n(input.data(), T * d.C, fetched.data());
      input = std::move(fetched);
    }
    LayerSaved recomputed;
    LayerSaved& layer_saved = options.activation_checkpointing ? recomputed : saved[static_cast<size_t>(i)];
    if (options.activation_checkpointing) {
      Buffer output = layer_forward(layer_params, w, input.data(), positions, d, options, device, &recomputed, ulysses);
      output.release();
    }
    Buffer dx = layer_backward(layer_grads, layer_params, w, input.data(), dy.data(), positions, d, options, device, layer_saved,
                               ulysses);
    dy = std::move(dx);
    if (zero) scatter(1 + static_cast<size_t>(i), layer_gradient);
  }
  if (zero) {
    Buffer table_gradient = gradient_buffer(0);
    k::embedding_backward(table_gradient.data(), dy.data(), tokens, T, d.C);
    scatter(0, table_gradient);
  } else {
    k::embedding_backward(grads + layout_.embedding, dy.data(), tokens, T, d.C);
    // Every rank saw different tokens with the same weights: the gradient is the sum.
    if (ulysses.active()) ulysses.group->all_reduce(grads, layout_.total);
  }
  return result;
}

void LlamaModel::adamw_step(float lr, float beta1, float beta2, float eps, float weight_decay) {
  ++step_;
  k::adamw_update(parameters_.data(), gradients_.data(), adam_m_.data(), adam_v_.data(), parameters_.size(), lr, beta1, beta2, eps,
                  weight_decay, step_);
}

}  // namespace longseq
