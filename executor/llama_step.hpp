// llama_step.hpp: BasicLlamaModel's training step, written once over a device's Ops (cpu_ops.hpp
// states what an Ops provides). Included by llama.cpp, which instantiates it for the CPU, and by
// llama_cuda.cpp for the GPU: every allocation, its name and its order, every collective and
// every memory option are this one text, so what the CPU tests prove about the schedule (memory
// measured == predicted, loss and gradients unchanged by each option) holds for the GPU's too.
#pragma once

#include <algorithm>
#include <array>
#include <limits>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "executor/llama.hpp"
#include "executor/ulysses.hpp"
#include "kernels/cpu/loss_optimizer.hpp"
#include "models/layer_inventory.hpp"

namespace longseq::llama_step {

inline constexpr const char* kStates = kCategoryModelStates;
inline constexpr const char* L = kCategoryLayer;

struct Dims {
  int64_t T, C, Q, KV, NQ, NKV, HD, F, V;
  // A mixture-of-experts block (E 0: the dense MLP): E experts of width FE, K per token, a shared
  // expert of width FS (0: none), gated by a sigmoid when shared_gate.
  int64_t E = 0, K = 0, FE = 0, FS = 0;
  bool shared_gate = false, normalize_topk = true;
};

// A base weight's gradient, or null where the base is frozen (LoRA).
inline float* gradient_at(float* gradients, int64_t offset) { return gradients ? gradients + offset : nullptr; }

// What a mixture-of-experts block keeps for its backward.
template <typename Act>
struct MoeSaved {
  Buffer probs, weights;                          // fp32 [T, E] and [T, K]
  BufferOf<int32_t> indices, order, position;     // [T, K], [T K], [T K]
  std::vector<int64_t> offsets;                   // host: each expert's first row of the dispatch
  BufferOf<Act> rows, gate, up, product, outputs;  // [T K, C], 3 x [T K, FE], [T K, C]
  BufferOf<Act> shared_gate, shared_up, shared_product, shared_output, shared_gate_logit;
};

// What FPDT keeps of a layer in the host pool, per chunk.
template <typename Act>
struct FpdtSaved {
  std::vector<BufferOf<Act>> q, k, v, output;
  std::vector<Buffer> lse;
};

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

// Calls run(expert's first parameter, first row, rows) for each expert that has rows in the
// dispatch (`offsets`: each expert's first row, then the total), expert e's parameters at
// experts + e x expert_parameters.
template <class Run>
void moe_each_expert(const std::vector<int64_t>& offsets, int64_t experts, int64_t expert_parameters, Run run) {
  for (size_t e = 0; e + 1 < offsets.size(); ++e) {
    const int64_t first = offsets[e], rows = offsets[e + 1] - first;
    if (rows > 0) run(experts + static_cast<int64_t>(e) * expert_parameters, first, rows);
  }
}

// A mixture-of-experts block (HF's MixtralSparseMoeBlock / Qwen2-3MoeSparseMoeBlock, grouped as
// transformers v5 and ArcticMoE run the experts; Reference §12 items 45-55): a linear router,
// fp32 softmax and top-K (renormalized when normalize_topk), the T K (token, choice) pairs sorted
// by expert on the host so each expert's rows are contiguous, every expert's SwiGLU over its rows
// of one [T K, ...] buffer (a fixed size whatever the routing: the schedule does not depend on the
// data), and the rows combined back by their routing weights; then the shared expert, gated by a
// sigmoid (Qwen2-MoE) or added. Adds into `output` (zeroed by the caller); with `saved` keeps what
// the backward reads.
template <class Ops, typename Act = typename Ops::Act>
void moe_forward(Ops& ops, const Act* params, const LlamaLayout::Layer& w, const Act* h, Act* output, const Dims& d, Arena& device,
                 MoeSaved<Act>* saved) {
  MoeSaved<Act> local;
  MoeSaved<Act>& s = saved ? *saved : local;
  const int64_t T = d.T, C = d.C, E = d.E, K = d.K, R = T * K, FE = d.FE, FS = d.FS;
  device.set_moment("forward: moe router");
  BufferOf<Act> logits = device.allocate<Act>(L, "moe.router_logits", T * E);
  ops.linear_forward(logits.data(), h, params + w.router, T, C, E);
  s.probs = device.allocate(L, "moe.router_probs", T * E);
  s.weights = device.allocate(L, "moe.routing_weights", R);
  s.indices = device.allocate<int32_t>(L, "moe.routing_indices", R);
  ops.moe_route(s.weights.data(), s.indices.data(), s.probs.data(), logits.data(), T, E, K, d.normalize_topk);
  logits.release();
  // The dispatch on the host (T K indices there and back): rows sorted by expert.
  std::vector<int32_t> host_indices(static_cast<size_t>(R));
  ops.to_host(host_indices.data(), s.indices.data(), R);
  const kernels::MoeDispatch dispatch = kernels::moe_dispatch(host_indices.data(), T, E, K);
  s.offsets = dispatch.offsets;
  s.order = device.allocate<int32_t>(L, "moe.dispatch_order", R);
  s.position = device.allocate<int32_t>(L, "moe.dispatch_positions", R);
  ops.to_device(s.order.data(), dispatch.order.data(), R);
  ops.to_device(s.position.data(), dispatch.position.data(), R);
  device.set_moment("forward: moe experts");
  s.rows = device.allocate<Act>(L, "moe.expert_inputs", R * C);
  ops.moe_gather(s.rows.data(), h, s.order.data(), R, C);
  s.gate = device.allocate<Act>(L, "moe.expert_gate", R * FE);
  s.up = device.allocate<Act>(L, "moe.expert_up", R * FE);
  auto each_expert = [&](auto run) { moe_each_expert(s.offsets, w.experts, 3 * FE * C, run); };
  each_expert([&](int64_t expert, int64_t first, int64_t rows) {
    ops.linear_forward(s.gate.data() + first * FE, s.rows.data() + first * C, params + expert, rows, C, FE);
    ops.linear_forward(s.up.data() + first * FE, s.rows.data() + first * C, params + expert + FE * C, rows, C, FE);
  });
  s.product = device.allocate<Act>(L, "moe.expert_product", R * FE);
  ops.swiglu_forward(s.product.data(), s.gate.data(), s.up.data(), R * FE);
  s.outputs = device.allocate<Act>(L, "moe.expert_outputs", R * C);
  each_expert([&](int64_t expert, int64_t first, int64_t rows) {
    ops.linear_forward(s.outputs.data() + first * C, s.product.data() + first * FE, params + expert + 2 * FE * C, rows, FE, C);
  });
  ops.moe_combine(output, s.outputs.data(), s.position.data(), s.weights.data(), T, K, C);
  if (!saved) {
    for (BufferOf<Act>* buffer : {&s.outputs, &s.product, &s.up, &s.gate, &s.rows}) buffer->release();
    s.position.release();
    s.order.release();
    s.indices.release();
    s.weights.release();
    s.probs.release();
  }
  if (FS == 0) return;
  device.set_moment("forward: moe shared expert");
  s.shared_gate = device.allocate<Act>(L, "moe.shared_gate", T * FS);
  s.shared_up = device.allocate<Act>(L, "moe.shared_up", T * FS);
  ops.linear_forward(s.shared_gate.data(), h, params + w.gate_proj, T, C, FS);
  ops.linear_forward(s.shared_up.data(), h, params + w.up_proj, T, C, FS);
  s.shared_product = device.allocate<Act>(L, "moe.shared_product", T * FS);
  ops.swiglu_forward(s.shared_product.data(), s.shared_gate.data(), s.shared_up.data(), T * FS);
  if (d.shared_gate) {
    s.shared_output = device.allocate<Act>(L, "moe.shared_output", T * C);
    ops.linear_forward(s.shared_output.data(), s.shared_product.data(), params + w.down_proj, T, FS, C);
    s.shared_gate_logit = device.allocate<Act>(L, "moe.shared_gate_logit", T);
    ops.linear_forward(s.shared_gate_logit.data(), h, params + w.shared_expert_gate, T, C, 1);
    ops.moe_shared_gate_forward(output, s.shared_output.data(), s.shared_gate_logit.data(), T, C);
  } else {
    ops.linear_forward_add(output, s.shared_product.data(), params + w.down_proj, T, FS, C, 1.0f);
  }
  if (!saved)
    for (BufferOf<Act>* buffer : {&s.shared_gate_logit, &s.shared_output, &s.shared_product, &s.shared_up, &s.shared_gate}) buffer->release();
}

// Its backward after moe_forward with `saved`: dy is the block's output gradient; adds the input
// gradient into dh and every weight's gradient into grads (null: frozen).
template <class Ops, typename Act = typename Ops::Act>
void moe_backward(Ops& ops, float* grads, const Act* params, const LlamaLayout::Layer& w, const Act* h, const Act* dy, Act* dh, const Dims& d,
                  Arena& device, MoeSaved<Act>& s) {
  const int64_t T = d.T, C = d.C, E = d.E, K = d.K, R = T * K, FE = d.FE, FS = d.FS;
  if (FS > 0) {
    device.set_moment("backward: moe shared expert");
    BufferOf<Act> product_grad = device.allocate<Act>(L, "moe.shared_product_grad", T * FS, true);
    if (d.shared_gate) {
      BufferOf<Act> output_grad = device.allocate<Act>(L, "moe.shared_output_grad", T * C);
      BufferOf<Act> logit_grad = device.allocate<Act>(L, "moe.shared_gate_logit_grad", T);
      ops.moe_shared_gate_backward(output_grad.data(), logit_grad.data(), dy, s.shared_output.data(), s.shared_gate_logit.data(), T, C);
      ops.linear_backward(dh, gradient_at(grads, w.shared_expert_gate), logit_grad.data(), h, params + w.shared_expert_gate, T, C, 1);
      logit_grad.release();
      s.shared_gate_logit.release();
      s.shared_output.release();
      ops.linear_backward(product_grad.data(), gradient_at(grads, w.down_proj), output_grad.data(), s.shared_product.data(), params + w.down_proj,
                          T, FS, C);
      output_grad.release();
    } else {
      ops.linear_backward(product_grad.data(), gradient_at(grads, w.down_proj), dy, s.shared_product.data(), params + w.down_proj, T, FS, C);
    }
    s.shared_product.release();
    BufferOf<Act> gate_grad = device.allocate<Act>(L, "moe.shared_gate_grad", T * FS, true);
    BufferOf<Act> up_grad = device.allocate<Act>(L, "moe.shared_up_grad", T * FS, true);
    ops.swiglu_backward(gate_grad.data(), up_grad.data(), product_grad.data(), s.shared_gate.data(), s.shared_up.data(), T * FS);
    product_grad.release();
    ops.linear_backward(dh, gradient_at(grads, w.gate_proj), gate_grad.data(), h, params + w.gate_proj, T, C, FS);
    ops.linear_backward(dh, gradient_at(grads, w.up_proj), up_grad.data(), h, params + w.up_proj, T, C, FS);
    for (BufferOf<Act>* buffer : {&up_grad, &gate_grad, &s.shared_up, &s.shared_gate}) buffer->release();
  }
  device.set_moment("backward: moe experts");
  auto each_expert = [&](auto run) { moe_each_expert(s.offsets, w.experts, 3 * FE * C, run); };
  BufferOf<Act> outputs_grad = device.allocate<Act>(L, "moe.expert_outputs_grad", R * C);
  Buffer weights_grad = device.allocate(L, "moe.routing_weights_grad", R, true);
  ops.moe_combine_backward(outputs_grad.data(), weights_grad.data(), dy, s.outputs.data(), s.position.data(), s.weights.data(), T, K, C);
  s.outputs.release();
  BufferOf<Act> product_grad = device.allocate<Act>(L, "moe.expert_product_grad", R * FE, true);
  each_expert([&](int64_t expert, int64_t first, int64_t rows) {
    ops.linear_backward(product_grad.data() + first * FE, gradient_at(grads, expert + 2 * FE * C), outputs_grad.data() + first * C,
                        s.product.data() + first * FE, params + expert + 2 * FE * C, rows, FE, C);
  });
  outputs_grad.release();
  s.product.release();
  BufferOf<Act> gate_grad = device.allocate<Act>(L, "moe.expert_gate_grad", R * FE, true);
  BufferOf<Act> up_grad = device.allocate<Act>(L, "moe.expert_up_grad", R * FE, true);
  ops.swiglu_backward(gate_grad.data(), up_grad.data(), product_grad.data(), s.gate.data(), s.up.data(), R * FE);
  product_grad.release();
  BufferOf<Act> rows_grad = device.allocate<Act>(L, "moe.expert_inputs_grad", R * C, true);
  each_expert([&](int64_t expert, int64_t first, int64_t rows) {
    ops.linear_backward(rows_grad.data() + first * C, gradient_at(grads, expert), gate_grad.data() + first * FE, s.rows.data() + first * C,
                        params + expert, rows, C, FE);
    ops.linear_backward(rows_grad.data() + first * C, gradient_at(grads, expert + FE * C), up_grad.data() + first * FE,
                        s.rows.data() + first * C, params + expert + FE * C, rows, C, FE);
  });
  for (BufferOf<Act>* buffer : {&up_grad, &gate_grad, &s.up, &s.gate}) buffer->release();
  ops.moe_gather_backward(dh, rows_grad.data(), s.position.data(), T, K, C);
  rows_grad.release();
  s.rows.release();
  s.position.release();
  s.order.release();
  device.set_moment("backward: moe router");
  BufferOf<Act> logits_grad = device.allocate<Act>(L, "moe.router_logits_grad", T * E);
  ops.moe_route_backward(logits_grad.data(), weights_grad.data(), s.probs.data(), s.weights.data(), s.indices.data(), T, E, K, d.normalize_topk);
  weights_grad.release();
  s.indices.release();
  s.weights.release();
  s.probs.release();
  ops.linear_backward(dh, gradient_at(grads, w.router), logits_grad.data(), h, params + w.router, T, C, E);
}

// One layer's LoRA adapters (none: full training).
template <typename Act>
struct LayerAdapters {
  const Act* weights = nullptr;  // the adapters' buffer (lora_layout's offsets)
  float* gradients = nullptr;
  const std::array<LoraLayout::Adapter, kLayerLinears>* layer = nullptr;
  int64_t rank = 0;
  float scale = 0;
  const LoraLayout::Adapter* of(LayerLinearKind kind) const {
    if (!layer) return nullptr;
    const LoraLayout::Adapter& adapter = (*layer)[static_cast<size_t>(kind)];
    return adapter.present() ? &adapter : nullptr;
  }
};

// An adapted linear's forward after its base product: y += scale (x A^T) B^T, the r-wide x A^T
// kept in `kept` for the backward (null: released at once).
template <class Ops, typename Act>
void lora_forward(Ops& ops, Act* y, const Act* x, int64_t rows, const LayerAdapters<Act>& lora, LayerLinearKind kind, Arena& device,
                  BufferOf<Act>* kept) {
  const LoraLayout::Adapter* adapter = lora.of(kind);
  if (!adapter) return;
  BufferOf<Act> rank_values = device.allocate<Act>(L, executor_lora_rank_name(kLayerLinearNames[static_cast<size_t>(kind)]), rows * lora.rank);
  ops.linear_forward(rank_values.data(), x, lora.weights + adapter->a, rows, adapter->in, lora.rank);
  ops.linear_forward_add(y, rank_values.data(), lora.weights + adapter->b, rows, lora.rank, adapter->out, lora.scale);
  if (kept) *kept = std::move(rank_values);
}

// Its backward beside the base's: with u = x A^T, dB += s dy^T u and du = s dy B, then dA += du^T x
// and dx += du A. `rank_values` (u) is released.
template <class Ops, typename Act>
void lora_backward(Ops& ops, Act* dx, const Act* dy, const Act* x, int64_t rows, const LayerAdapters<Act>& lora, LayerLinearKind kind,
                   BufferOf<Act>& rank_values, Arena& device) {
  const LoraLayout::Adapter* adapter = lora.of(kind);
  if (!adapter) return;
  BufferOf<Act> rank_grad = device.allocate<Act>(L, "lora.rank_grad", rows * lora.rank, true);
  ops.linear_backward(rank_grad.data(), lora.gradients + adapter->b, dy, rank_values.data(), lora.weights + adapter->b, rows, lora.rank,
                      adapter->out, lora.scale);
  ops.linear_backward(dx, lora.gradients + adapter->a, rank_grad.data(), x, lora.weights + adapter->a, rows, adapter->in, lora.rank);
  rank_grad.release();
  rank_values.release();
}

inline int64_t tile_size(int64_t T, int64_t tiles) { return tiles > 0 ? (T + tiles - 1) / tiles : T; }

// The attention kernel's workspace for T tokens of these heads, from the arena (none when the
// kernel needs none: the CPU's).
template <class Ops>
Buffer attention_workspace(Ops& ops, Arena& device, int64_t T, int64_t NQ, int64_t NKV, int64_t HD, bool backward) {
  const int64_t elements = ops.attention_workspace_elements(T, NQ, NKV, HD, backward);
  return elements > 0 ? device.allocate(L, "attention.workspace", elements) : Buffer();
}

// Ulysses' all-to-all in: `tokens` tokens of this rank for every head become every rank's tokens
// for this rank's heads, in a new buffer `name`, through a staging buffer that lives until the
// exchange is done. `release_after_pack`, when given, is released as soon as it is packed (before
// the result is allocated), which lowers the peak.
template <class Ops, typename Act = typename Ops::Act>
BufferOf<Act> ulysses_to_heads(Ops& ops, Arena& device, const char* name, const Act* rank_tokens, int64_t tokens, int64_t heads_total,
                               HeadBlocks blocks, int64_t HD, const Ulysses& ulysses, BufferOf<Act>* release_after_pack = nullptr) {
  const int64_t count = tokens * blocks.per_rank * HD;
  BufferOf<Act> send = device.allocate<Act>(L, "ulysses.staging", ulysses.sp * count);
  ops.heads_pack(send.data(), rank_tokens, tokens, heads_total, blocks, HD, ulysses.sp);
  if (release_after_pack) release_after_pack->release();
  BufferOf<Act> global = device.allocate<Act>(L, name, ulysses.sp * count);
  ulysses.group->all_to_all(send.data(), global.data(), count);
  return global;
}

// Ulysses' all-to-all out: `heads` (every rank's tokens for this rank's heads) goes back to the
// tokens' ranks through a staging buffer and is added into `rank_tokens` ([tokens, heads_total x
// HD]; replicated kv heads sum). `heads` is released once sent when `release_after_send`.
template <class Ops, typename Act = typename Ops::Act>
void ulysses_to_tokens_add(Ops& ops, Arena& device, Act* rank_tokens, BufferOf<Act>& heads, int64_t tokens, int64_t heads_total,
                           HeadBlocks blocks, int64_t HD, const Ulysses& ulysses, bool release_after_send) {
  const int64_t count = tokens * blocks.per_rank * HD;
  BufferOf<Act> recv = device.allocate<Act>(L, "ulysses.staging", ulysses.sp * count);
  ulysses.group->all_to_all(heads.data(), recv.data(), count);
  if (release_after_send) heads.release();
  ops.heads_unpack_add(rank_tokens, recv.data(), tokens, heads_total, blocks, HD, ulysses.sp);
}

// FPDT (the FPDT paper; DeepSpeed fpdt_layer.py, REFERENCE §3.6): attention over the local sequence
// in chunks of c = options.fpdt_chunk_tokens tokens. The sample is in FPDT's layout
// (fpdt_layout_rank_tokens), so Ulysses' all-to-all of every rank's chunk i is the i-th chunk of
// the whole sequence, Cg = c x sp tokens, global tokens [i Cg, (i+1) Cg), for this rank's heads.
// Key/value chunks (and, kept for backward, q, output and lse) wait in the host pool; query chunk
// i attends to key/value chunks 0..i, each fetched while the one before is used (double
// buffered), its partial output merged into an fp32 accumulator by the online softmax.
struct FpdtChunks {
  int64_t c = 0, count = 0, global = 0, q_heads = 0, kv_heads = 0;
  int64_t q_elements() const { return global * q_heads; }   // x HD
  int64_t kv_elements() const { return global * kv_heads; }  // x HD
};

inline FpdtChunks fpdt_chunks(const Dims& d, const TrainingOptions& options, const Ulysses& ulysses) {
  FpdtChunks chunks;
  chunks.c = options.fpdt_chunk_tokens;
  if (d.T % chunks.c != 0) throw std::invalid_argument("FPDT: the local tokens must be a multiple of the chunk (seqlen_problems reports this)");
  chunks.count = d.T / chunks.c;
  chunks.global = chunks.c * ulysses.sp;
  chunks.q_heads = ulysses.active() ? ulysses.q_heads : d.NQ;
  chunks.kv_heads = ulysses.active() ? ulysses.kv_heads : d.NKV;
  return chunks;
}

// Chunk `i`'s q, k and v for this rank's heads over the whole chunk: projected from the local
// chunk's normed input, rotated, and (with Ulysses) exchanged.
template <class Ops, typename Act = typename Ops::Act>
void fpdt_project_chunk(Ops& ops, const Act* params, const LlamaLayout::Layer& w, const Act* normed, const int32_t* positions, int64_t i,
                        const Dims& d, const FpdtChunks& chunks, const TrainingOptions& options, Arena& device, const Ulysses& ulysses,
                        BufferOf<Act>& q, BufferOf<Act>& k, BufferOf<Act>& v) {
  const int64_t c = chunks.c;
  const Act* x = normed + i * c * d.C;
  const char* q_name = ulysses.active() ? "fpdt.q_proj_chunk" : "fpdt.q_chunk";
  const char* k_name = ulysses.active() ? "fpdt.k_proj_chunk" : "fpdt.k_chunk";
  const char* v_name = ulysses.active() ? "fpdt.v_proj_chunk" : "fpdt.v_chunk";
  BufferOf<Act> q_local = device.allocate<Act>(L, q_name, c * d.Q);
  BufferOf<Act> k_local = device.allocate<Act>(L, k_name, c * d.KV);
  BufferOf<Act> v_local = device.allocate<Act>(L, v_name, c * d.KV);
  ops.linear_forward(q_local.data(), x, params + w.q_proj, c, d.C, d.Q);
  ops.linear_forward(k_local.data(), x, params + w.k_proj, c, d.C, d.KV);
  ops.linear_forward(v_local.data(), x, params + w.v_proj, c, d.C, d.KV);
  ops.rope_forward(q_local.data(), q_local.data(), positions + i * c, c, d.NQ, d.HD, options.rope_theta);
  ops.rope_forward(k_local.data(), k_local.data(), positions + i * c, c, d.NKV, d.HD, options.rope_theta);
  if (!ulysses.active()) {
    q = std::move(q_local);
    k = std::move(k_local);
    v = std::move(v_local);
    return;
  }
  q = ulysses_to_heads(ops, device, "fpdt.q_chunk", q_local.data(), c, d.NQ, ulysses.q_blocks(), d.HD, ulysses, &q_local);
  k = ulysses_to_heads(ops, device, "fpdt.k_chunk", k_local.data(), c, d.NKV, ulysses.kv_blocks(), d.HD, ulysses, &k_local);
  v = ulysses_to_heads(ops, device, "fpdt.v_chunk", v_local.data(), c, d.NKV, ulysses.kv_blocks(), d.HD, ulysses, &v_local);
}

// Chunk rows of this rank's heads (the whole chunk) back to the local tokens they belong to:
// rows [i c, (i+1) c) of `local` (a [T, heads_total x HD] tensor, zero there) receive them.
template <class Ops, typename Act = typename Ops::Act>
void fpdt_return_chunk(Ops& ops, Act* local, BufferOf<Act>& chunk, int64_t i, int64_t heads_total, HeadBlocks blocks, const Dims& d,
                       const FpdtChunks& chunks, Arena& device, const Ulysses& ulysses) {
  Act* rows = local + i * chunks.c * heads_total * d.HD;
  if (!ulysses.active())
    ops.copy(rows, chunk.data(), chunks.c * heads_total * d.HD);
  else
    ulysses_to_tokens_add(ops, device, rows, chunk, chunks.c, heads_total, blocks, d.HD, ulysses, /*release_after_send=*/false);
}

// A chunk between the host pool and the device, in a new buffer `name` (any element type: the
// activations, and the fp32 lse, softmax delta and dq accumulators).
template <class Ops, typename T>
BufferOf<T> fpdt_to_device(Ops& ops, Arena& device, const char* name, const BufferOf<T>& host_copy) {
  BufferOf<T> on_device = device.allocate<T>(L, name, host_copy.size());
  ops.to_device(on_device.data(), host_copy.data(), host_copy.size());
  return on_device;
}

template <class Ops, typename T>
BufferOf<T> fpdt_to_host(Ops& ops, Arena& host, const char* name, const BufferOf<T>& on_device) {
  BufferOf<T> host_copy = host.allocate<T>(kCategoryHost, name, on_device.size());
  ops.to_host(host_copy.data(), on_device.data(), on_device.size());
  return host_copy;
}

// FPDT's attention forward: fills `attention_output` ([T, Q], zeroed) from the normed input.
// With `saved`, q/k/v/output/lse chunks stay in the host pool for the backward.
template <class Ops, typename Act = typename Ops::Act>
void fpdt_attention_forward(Ops& ops, const Act* params, const LlamaLayout::Layer& w, const Act* normed, Act* attention_output,
                            const int32_t* positions, const Dims& d, const TrainingOptions& options, Arena& device, Arena& host,
                            FpdtSaved<Act>* saved, const Ulysses& ulysses) {
  const FpdtChunks chunks = fpdt_chunks(d, options, ulysses);
  const int32_t* global_positions = ulysses.active() ? ulysses.global_positions : positions;
  const int64_t n = chunks.count;
  FpdtSaved<Act> local;
  FpdtSaved<Act>& keep = saved ? *saved : local;
  keep.q.resize(static_cast<size_t>(n));
  keep.k.resize(static_cast<size_t>(n));
  keep.v.resize(static_cast<size_t>(n));
  keep.output.resize(static_cast<size_t>(n));
  keep.lse.resize(static_cast<size_t>(n));
  const int64_t q_elements = chunks.q_elements() * d.HD;
  for (int64_t i = 0; i < n; ++i) {
    const auto chunk = static_cast<size_t>(i);
    BufferOf<Act> q, k, v;
    fpdt_project_chunk(ops, params, w, normed, positions, i, d, chunks, options, device, ulysses, q, k, v);
    keep.k[chunk] = fpdt_to_host(ops, host, "fpdt.k_chunks", k);
    keep.v[chunk] = fpdt_to_host(ops, host, "fpdt.v_chunks", v);
    if (saved) keep.q[chunk] = fpdt_to_host(ops, host, "fpdt.q_chunks", q);
    Buffer accumulator = device.allocate(L, "fpdt.output_accumulator", q_elements, true);
    Buffer accumulator_lse = device.allocate(L, "fpdt.lse_accumulator", chunks.q_elements());
    ops.fill_value(accumulator_lse.data(), accumulator_lse.size(), -std::numeric_limits<float>::infinity());
    BufferOf<Act> part = device.allocate<Act>(L, "fpdt.output_part", q_elements);
    Buffer part_lse = device.allocate(L, "fpdt.lse_part", chunks.q_elements());
    auto attend = [&](const Act* keys, const Act* values, int64_t j) {
      Buffer workspace = attention_workspace(ops, device, chunks.global, chunks.q_heads, chunks.kv_heads, d.HD, false);
      ops.attention_chunk_forward(part.data(), part_lse.data(), q.data(), keys, values, global_positions, i * chunks.global, chunks.global,
                                  j * chunks.global, chunks.global, chunks.q_heads, chunks.kv_heads, d.HD, options.attention_block,
                                  workspace.data());
      workspace.release();
      ops.attention_merge(accumulator.data(), accumulator_lse.data(), part.data(), part_lse.data(), chunks.global, chunks.q_heads, d.HD);
    };
    // Earlier chunks' keys and values from the host pool, the next fetched while this one is used.
    BufferOf<Act> k_current, v_current, k_next, v_next;
    if (i > 0) {
      k_current = fpdt_to_device(ops, device, "fpdt.kv_fetched", keep.k[0]);
      v_current = fpdt_to_device(ops, device, "fpdt.kv_fetched", keep.v[0]);
    }
    for (int64_t j = 0; j < i; ++j) {
      if (j + 1 < i) {
        k_next = fpdt_to_device(ops, device, "fpdt.kv_prefetched", keep.k[static_cast<size_t>(j + 1)]);
        v_next = fpdt_to_device(ops, device, "fpdt.kv_prefetched", keep.v[static_cast<size_t>(j + 1)]);
      }
      attend(k_current.data(), v_current.data(), j);
      k_current.release();
      v_current.release();
      if (j + 1 < i) {
        device.rename(k_next, "fpdt.kv_fetched");
        device.rename(v_next, "fpdt.kv_fetched");
        k_current = std::move(k_next);
        v_current = std::move(v_next);
      }
    }
    attend(k.data(), v.data(), i);  // the chunk's own keys, still on the device
    part.release();
    part_lse.release();
    BufferOf<Act> output = device.allocate<Act>(L, "fpdt.output_chunk", q_elements);
    ops.accumulator_to_act(output.data(), accumulator.data(), q_elements);
    accumulator.release();
    if (saved) {
      keep.output[chunk] = fpdt_to_host(ops, host, "fpdt.output_chunks", output);
      keep.lse[chunk] = fpdt_to_host(ops, host, "fpdt.lse_chunks", accumulator_lse);
    }
    accumulator_lse.release();
    for (BufferOf<Act>* buffer : {&q, &k, &v}) buffer->release();
    fpdt_return_chunk(ops, attention_output, output, i, d.NQ, ulysses.q_blocks(), d, chunks, device, ulysses);
  }
  if (!saved)
    for (int64_t i = n - 1; i >= 0; --i) {  // later chunks were only waiting for the later queries
      keep.v[static_cast<size_t>(i)].release();
      keep.k[static_cast<size_t>(i)].release();
    }
}

// FPDT's attention backward: from the output gradient ([T, Q]) to q_grad, k_grad, v_grad ([T, Q],
// [T, KV], [T, KV], zeroed), with the paper's chunk order: key/value chunk j outermost, its fp32
// dk/dv accumulators on the device, every query chunk i >= j fetched with its output gradient,
// lse, softmax delta and fp32 dq accumulator (the others wait in the host pool).
template <class Ops, typename Act = typename Ops::Act>
void fpdt_attention_backward(Ops& ops, const Act* output_grad, Act* q_grad, Act* k_grad, Act* v_grad, const int32_t* positions,
                             const Dims& d, const TrainingOptions& options, Arena& device, Arena& host, FpdtSaved<Act>& saved,
                             const Ulysses& ulysses) {
  const FpdtChunks chunks = fpdt_chunks(d, options, ulysses);
  const int32_t* global_positions = ulysses.active() ? ulysses.global_positions : positions;
  const int64_t n = chunks.count, c = chunks.c;
  const int64_t q_elements = chunks.q_elements() * d.HD, kv_elements = chunks.kv_elements() * d.HD;
  std::vector<BufferOf<Act>> output_grads(static_cast<size_t>(n));
  std::vector<Buffer> deltas(static_cast<size_t>(n)), q_grad_accumulators(static_cast<size_t>(n));
  // Per chunk: the output gradient to this rank's heads over the whole chunk, and the softmax
  // delta rowsum(dO * O); both wait in the host pool, beside a zero fp32 dq accumulator.
  for (int64_t i = 0; i < n; ++i) {
    const auto chunk = static_cast<size_t>(i);
    BufferOf<Act> output_grad_chunk;
    if (ulysses.active()) {
      output_grad_chunk =
          ulysses_to_heads(ops, device, "fpdt.output_grad_chunk", output_grad + i * c * d.Q, c, d.NQ, ulysses.q_blocks(), d.HD, ulysses);
    } else {
      output_grad_chunk = device.allocate<Act>(L, "fpdt.output_grad_chunk", q_elements);
      ops.copy(output_grad_chunk.data(), output_grad + i * c * d.Q, q_elements);
    }
    BufferOf<Act> output = fpdt_to_device(ops, device, "fpdt.output_chunk", saved.output[chunk]);
    Buffer delta = device.allocate(L, "fpdt.delta_chunk", chunks.q_elements());
    ops.attention_softmax_delta(delta.data(), output_grad_chunk.data(), output.data(), chunks.global, chunks.q_heads, d.HD);
    output.release();
    saved.output[chunk].release();
    output_grads[chunk] = fpdt_to_host(ops, host, "fpdt.output_grad_chunks", output_grad_chunk);
    deltas[chunk] = fpdt_to_host(ops, host, "fpdt.delta_chunks", delta);
    q_grad_accumulators[chunk] = host.allocate(kCategoryHost, "fpdt.q_grad_accumulators", q_elements, true);
  }
  for (int64_t j = 0; j < n; ++j) {
    const auto key_chunk = static_cast<size_t>(j);
    BufferOf<Act> k = fpdt_to_device(ops, device, "fpdt.k_chunk", saved.k[key_chunk]);
    BufferOf<Act> v = fpdt_to_device(ops, device, "fpdt.v_chunk", saved.v[key_chunk]);
    Buffer k_grad_accumulator = device.allocate(L, "fpdt.kv_grad_accumulators", kv_elements, true);
    Buffer v_grad_accumulator = device.allocate(L, "fpdt.kv_grad_accumulators", kv_elements, true);
    for (int64_t i = j; i < n; ++i) {
      const auto chunk = static_cast<size_t>(i);
      BufferOf<Act> q = fpdt_to_device(ops, device, "fpdt.q_chunk", saved.q[chunk]);
      BufferOf<Act> output_grad_chunk = fpdt_to_device(ops, device, "fpdt.output_grad_chunk", output_grads[chunk]);
      Buffer lse = fpdt_to_device(ops, device, "fpdt.lse_chunk", saved.lse[chunk]);
      Buffer delta = fpdt_to_device(ops, device, "fpdt.delta_chunk", deltas[chunk]);
      Buffer q_grad_accumulator = fpdt_to_device(ops, device, "fpdt.q_grad_accumulator", q_grad_accumulators[chunk]);
      BufferOf<Act> q_grad_part = device.allocate<Act>(L, "fpdt.q_grad_part", q_elements, true);
      BufferOf<Act> k_grad_part = device.allocate<Act>(L, "fpdt.kv_grad_parts", kv_elements, true);
      BufferOf<Act> v_grad_part = device.allocate<Act>(L, "fpdt.kv_grad_parts", kv_elements, true);
      Buffer workspace = attention_workspace(ops, device, chunks.global, chunks.q_heads, chunks.kv_heads, d.HD, true);
      ops.attention_chunk_backward(q_grad_part.data(), k_grad_part.data(), v_grad_part.data(), delta.data(), output_grad_chunk.data(),
                                   q.data(), k.data(), v.data(), lse.data(), global_positions, i * chunks.global, chunks.global,
                                   j * chunks.global, chunks.global, chunks.q_heads, chunks.kv_heads, d.HD, options.attention_block,
                                   workspace.data());
      workspace.release();
      ops.accumulate(q_grad_accumulator.data(), q_grad_part.data(), q_elements);
      ops.accumulate(k_grad_accumulator.data(), k_grad_part.data(), kv_elements);
      ops.accumulate(v_grad_accumulator.data(), v_grad_part.data(), kv_elements);
      for (BufferOf<Act>* buffer : {&v_grad_part, &k_grad_part, &q_grad_part}) buffer->release();
      ops.to_host(q_grad_accumulators[chunk].data(), q_grad_accumulator.data(), q_elements);
      for (Buffer* buffer : {&q_grad_accumulator, &delta, &lse}) buffer->release();
      output_grad_chunk.release();
      q.release();
    }
    k.release();
    v.release();
    saved.v[key_chunk].release();
    saved.k[key_chunk].release();
    // This key chunk is done: its gradients go back to the tokens' ranks (replicas summed).
    for (auto [accumulator, target] : {std::pair{&k_grad_accumulator, k_grad}, std::pair{&v_grad_accumulator, v_grad}}) {
      BufferOf<Act> gradient = device.allocate<Act>(L, "fpdt.kv_grad_chunk", kv_elements);
      ops.accumulator_to_act(gradient.data(), accumulator->data(), kv_elements);
      accumulator->release();
      fpdt_return_chunk(ops, target, gradient, j, d.NKV, ulysses.kv_blocks(), d, chunks, device, ulysses);
    }
    // Query chunk j has now seen every key chunk it attends to: its dq is complete.
    const auto chunk = static_cast<size_t>(j);
    Buffer q_grad_accumulator = fpdt_to_device(ops, device, "fpdt.q_grad_accumulator", q_grad_accumulators[chunk]);
    q_grad_accumulators[chunk].release();
    BufferOf<Act> gradient = device.allocate<Act>(L, "fpdt.q_grad_chunk", q_elements);
    ops.accumulator_to_act(gradient.data(), q_grad_accumulator.data(), q_elements);
    q_grad_accumulator.release();
    fpdt_return_chunk(ops, q_grad, gradient, j, d.NQ, ulysses.q_blocks(), d, chunks, device, ulysses);
    output_grads[chunk].release();
    deltas[chunk].release();
    saved.lse[chunk].release();
    saved.q[chunk].release();
  }
}

// Ring attention (ring-flash-attention's zigzag, as USP runs it over r Ulysses groups): the
// sequence in 2r chunks of c = S / 2r tokens, ring rank i holding chunks i and 2r-1-i (so every
// rank has the same causal work: one early and one late chunk, the split Megatron-Core's context
// parallelism uses too), its Ulysses group sharing them by heads. This rank's queries stay; key/
// value blocks (both chunks of a ring rank, for this rank's heads) pass around the ring, the next
// one arriving into its own buffer beside the one in use (double buffered: the memory of an
// overlapped schedule, though the communicators here finish each pass before the compute
// starts), and every chunk pair with any visible key is computed with the range kernels (global
// token indices: causal and packed-document masks hold across blocks) and merged into an fp32
// accumulator by the online softmax. The lse is laid out per half, [2][heads][c], so each half's
// statistics are contiguous for the range kernels.
struct RingGeometry {
  int64_t r = 1, rank = 0, c = 0, q_heads = 0, kv_heads = 0;
  // The global chunk that ring rank `holder` keeps in half `half` (0: its early chunk).
  int64_t chunk(int64_t holder, int64_t half) const { return half == 0 ? holder : 2 * r - 1 - holder; }
  int next() const { return static_cast<int>((rank + 1) % r); }
  int previous() const { return static_cast<int>((rank + r - 1) % r); }
  // Calls visit(q_half, k_half, q_chunk, k_chunk) for each pair of this rank's query halves and
  // ring rank `source`'s key halves in which some key is visible (none after every query).
  template <class Visit>
  void visible_pairs(int64_t source, Visit visit) const {
    for (int64_t q_half = 0; q_half < 2; ++q_half)
      for (int64_t k_half = 0; k_half < 2; ++k_half)
        if (chunk(source, k_half) <= chunk(rank, q_half)) visit(q_half, k_half, chunk(rank, q_half), chunk(source, k_half));
  }
};

inline RingGeometry ring_geometry(const Dims& d, const Ulysses& ulysses) {
  RingGeometry g;
  g.r = ulysses.ring;
  g.rank = ulysses.ring_rank;
  const int64_t tokens = d.T * ulysses.sp;  // this rank's two chunks
  if (tokens % 2 != 0) throw std::invalid_argument("ring attention: a rank's tokens must be two whole chunks (seqlen_problems reports this)");
  g.c = tokens / 2;
  g.q_heads = ulysses.active() ? ulysses.q_heads : d.NQ;
  g.kv_heads = ulysses.active() ? ulysses.kv_heads : d.NKV;
  return g;
}

// A block to the ring's next rank while the previous rank's arrives in `arriving`.
template <typename T>
void ring_pass(const Ulysses& ulysses, const RingGeometry& g, const T* block, T* arriving, int64_t count) {
  ulysses.ring_group->send_receive(block, g.next(), arriving, g.previous(), count);
}

// PyTorch CP's all-gather rotation: every ring rank's K and V block at once, rank-major, into
// buffers of r blocks each (Reference §11 F2.3).
template <typename Act>
void ring_kv_all_gather(BufferOf<Act>& k_gathered, BufferOf<Act>& v_gathered, const Act* k, const Act* v, int64_t block,
                        const RingGeometry& g, Arena& device, const Ulysses& ulysses) {
  k_gathered = device.allocate<Act>(L, "cp.kv_gathered", g.r * block);
  v_gathered = device.allocate<Act>(L, "cp.kv_gathered", g.r * block);
  ulysses.ring_group->all_gather(k, k_gathered.data(), block);
  ulysses.ring_group->all_gather(v, v_gathered.data(), block);
}

// Ring attention's forward: `output` ([2c, q heads, HD]) and `lse` ([2][q heads][c]) of this
// rank's queries `q` over the whole sequence's keys, from this rank's own block `k`, `v`.
template <class Ops, typename Act = typename Ops::Act>
void ring_attention_forward(Ops& ops, Act* output, float* lse, const Act* q, const Act* k, const Act* v, const Dims& d,
                            const TrainingOptions& options, Arena& device, const Ulysses& ulysses) {
  const RingGeometry g = ring_geometry(d, ulysses);
  const int64_t q_row = g.q_heads * d.HD, kv_row = g.kv_heads * d.HD, block = 2 * g.c * kv_row;
  Buffer accumulator = device.allocate(L, "ring.output_accumulator", 2 * g.c * q_row, true);
  ops.fill_value(lse, 2 * g.c * g.q_heads, -std::numeric_limits<float>::infinity());
  BufferOf<Act> part = device.allocate<Act>(L, "ring.output_part", g.c * q_row);
  Buffer part_lse = device.allocate(L, "ring.lse_part", g.c * g.q_heads);
  BufferOf<Act> k_block, v_block;  // a received block, once there is one
  const Act* keys = k;
  const Act* values = v;
  const bool gathered = options.context_parallel_all_gather;
  BufferOf<Act> k_gathered, v_gathered;
  if (gathered) ring_kv_all_gather(k_gathered, v_gathered, k, v, block, g, device, ulysses);
  for (int64_t step = 0; step < g.r; ++step) {
    BufferOf<Act> k_arriving, v_arriving;
    const int64_t source = (g.rank + g.r - step) % g.r;  // whose block this is
    if (gathered) {
      keys = k_gathered.data() + source * block;
      values = v_gathered.data() + source * block;
    } else if (step + 1 < g.r) {
      k_arriving = device.allocate<Act>(L, "ring.kv_arriving", block);
      v_arriving = device.allocate<Act>(L, "ring.kv_arriving", block);
      ring_pass(ulysses, g, keys, k_arriving.data(), block);
      ring_pass(ulysses, g, values, v_arriving.data(), block);
    }
    g.visible_pairs(source, [&](int64_t q_half, int64_t k_half, int64_t q_chunk, int64_t k_chunk) {
      Buffer workspace = attention_workspace(ops, device, g.c, g.q_heads, g.kv_heads, d.HD, false);
      ops.attention_chunk_forward(part.data(), part_lse.data(), q + q_half * g.c * q_row, keys + k_half * g.c * kv_row,
                                  values + k_half * g.c * kv_row, ulysses.global_positions, q_chunk * g.c, g.c, k_chunk * g.c, g.c,
                                  g.q_heads, g.kv_heads, d.HD, options.attention_block, workspace.data());
      workspace.release();
      ops.attention_merge(accumulator.data() + q_half * g.c * q_row, lse + q_half * g.c * g.q_heads, part.data(), part_lse.data(), g.c,
                          g.q_heads, d.HD);
    });
    if (gathered) continue;
    k_block.release();
    v_block.release();
    if (step + 1 < g.r) {
      device.rename(k_arriving, "ring.kv_block");
      device.rename(v_arriving, "ring.kv_block");
      k_block = std::move(k_arriving);
      v_block = std::move(v_arriving);
      keys = k_block.data();
      values = v_block.data();
    }
  }
  k_gathered.release();
  v_gathered.release();
  part.release();
  part_lse.release();
  ops.accumulator_to_act(output, accumulator.data(), 2 * g.c * q_row);
  accumulator.release();
}

// Ring attention's backward: q_grad, k_grad, v_grad (this rank's queries and own block, written)
// from the output gradient, with `delta` ([2][q heads][c]) the caller's scratch for the softmax
// delta. The key/value blocks travel the ring again, each with its fp32 dk/dv accumulators, to
// which every rank adds its queries' share; after the last step one more pass brings each block's
// accumulators home.
template <class Ops, typename Act = typename Ops::Act>
void ring_attention_backward(Ops& ops, Act* q_grad, Act* k_grad, Act* v_grad, float* delta, const Act* output_grad, const Act* q,
                             const Act* k, const Act* v, const Act* output, const float* lse, const Dims& d, const TrainingOptions& options,
                             Arena& device, const Ulysses& ulysses) {
  const RingGeometry g = ring_geometry(d, ulysses);
  const int64_t q_row = g.q_heads * d.HD, kv_row = g.kv_heads * d.HD, block = 2 * g.c * kv_row, queries = 2 * g.c * q_row;
  for (int64_t half = 0; half < 2; ++half)
    ops.attention_softmax_delta(delta + half * g.c * g.q_heads, output_grad + half * g.c * q_row, output + half * g.c * q_row, g.c,
                                g.q_heads, d.HD);
  // PyTorch CP gathers the whole sequence's K/V again for backward (its kv rotater; F2.5).
  const bool gathered = options.context_parallel_all_gather;
  BufferOf<Act> k_gathered, v_gathered;
  if (gathered) ring_kv_all_gather(k_gathered, v_gathered, k, v, block, g, device, ulysses);
  Buffer q_grad_accumulator = device.allocate(L, "ring.q_grad_accumulator", queries, true);
  Buffer k_grad_accumulator = device.allocate(L, "ring.kv_grad_accumulators", block, true);
  Buffer v_grad_accumulator = device.allocate(L, "ring.kv_grad_accumulators", block, true);
  BufferOf<Act> k_block, v_block;
  const Act* keys = k;
  const Act* values = v;
  for (int64_t step = 0; step < g.r; ++step) {
    const int64_t source = (g.rank + g.r - step) % g.r;
    if (gathered) {
      keys = k_gathered.data() + source * block;
      values = v_gathered.data() + source * block;
    }
    BufferOf<Act> q_grad_part = device.allocate<Act>(L, "ring.q_grad_part", queries, true);
    BufferOf<Act> k_grad_part = device.allocate<Act>(L, "ring.kv_grad_parts", block, true);
    BufferOf<Act> v_grad_part = device.allocate<Act>(L, "ring.kv_grad_parts", block, true);
    g.visible_pairs(source, [&](int64_t q_half, int64_t k_half, int64_t q_chunk, int64_t k_chunk) {
      const int64_t q_rows = q_half * g.c * q_row, k_rows = k_half * g.c * kv_row, stats = q_half * g.c * g.q_heads;
      Buffer workspace = attention_workspace(ops, device, g.c, g.q_heads, g.kv_heads, d.HD, true);
      ops.attention_chunk_backward(q_grad_part.data() + q_rows, k_grad_part.data() + k_rows, v_grad_part.data() + k_rows, delta + stats,
                                   output_grad + q_rows, q + q_rows, keys + k_rows, values + k_rows, lse + stats, ulysses.global_positions,
                                   q_chunk * g.c, g.c, k_chunk * g.c, g.c, g.q_heads, g.kv_heads, d.HD, options.attention_block,
                                   workspace.data());
      workspace.release();
    });
    ops.accumulate(q_grad_accumulator.data(), q_grad_part.data(), queries);
    ops.accumulate(k_grad_accumulator.data(), k_grad_part.data(), block);
    ops.accumulate(v_grad_accumulator.data(), v_grad_part.data(), block);
    for (BufferOf<Act>* buffer : {&v_grad_part, &k_grad_part, &q_grad_part}) buffer->release();
    if (step + 1 == g.r) break;
    if (gathered) {
      // Only the accumulators move on: the next block is already here.
      Buffer k_grad_arriving = device.allocate(L, "ring.kv_grad_arriving", block);
      Buffer v_grad_arriving = device.allocate(L, "ring.kv_grad_arriving", block);
      ring_pass(ulysses, g, k_grad_accumulator.data(), k_grad_arriving.data(), block);
      ring_pass(ulysses, g, v_grad_accumulator.data(), v_grad_arriving.data(), block);
      for (Buffer* buffer : {&k_grad_accumulator, &v_grad_accumulator}) buffer->release();
      for (Buffer* buffer : {&k_grad_arriving, &v_grad_arriving}) device.rename(*buffer, "ring.kv_grad_accumulators");
      k_grad_accumulator = std::move(k_grad_arriving);
      v_grad_accumulator = std::move(v_grad_arriving);
      continue;
    }
    // The block and its accumulators move on together.
    BufferOf<Act> k_arriving = device.allocate<Act>(L, "ring.kv_arriving", block);
    BufferOf<Act> v_arriving = device.allocate<Act>(L, "ring.kv_arriving", block);
    Buffer k_grad_arriving = device.allocate(L, "ring.kv_grad_arriving", block);
    Buffer v_grad_arriving = device.allocate(L, "ring.kv_grad_arriving", block);
    ring_pass(ulysses, g, keys, k_arriving.data(), block);
    ring_pass(ulysses, g, values, v_arriving.data(), block);
    ring_pass(ulysses, g, k_grad_accumulator.data(), k_grad_arriving.data(), block);
    ring_pass(ulysses, g, v_grad_accumulator.data(), v_grad_arriving.data(), block);
    for (BufferOf<Act>* buffer : {&k_block, &v_block}) buffer->release();
    for (Buffer* buffer : {&k_grad_accumulator, &v_grad_accumulator}) buffer->release();
    for (BufferOf<Act>* buffer : {&k_arriving, &v_arriving}) device.rename(*buffer, "ring.kv_block");
    for (Buffer* buffer : {&k_grad_arriving, &v_grad_arriving}) device.rename(*buffer, "ring.kv_grad_accumulators");
    k_block = std::move(k_arriving);
    v_block = std::move(v_arriving);
    k_grad_accumulator = std::move(k_grad_arriving);
    v_grad_accumulator = std::move(v_grad_arriving);
    keys = k_block.data();
    values = v_block.data();
  }
  for (BufferOf<Act>* buffer : {&k_block, &v_block, &k_gathered, &v_gathered}) buffer->release();
  ops.accumulator_to_act(q_grad, q_grad_accumulator.data(), queries);
  q_grad_accumulator.release();
  // The last block held is the next rank's: its accumulators go home, this rank's arrive.
  for (auto [accumulator, target] : {std::pair{&k_grad_accumulator, k_grad}, std::pair{&v_grad_accumulator, v_grad}}) {
    Buffer home = device.allocate(L, "ring.kv_grad_arriving", block);
    ring_pass(ulysses, g, accumulator->data(), home.data(), block);
    accumulator->release();
    ops.accumulator_to_act(target, home.data(), block);
    home.release();
  }
}

// Which attention serves a rank's tokens for its heads: FlashAttention-2's over all of them (one
// rank, or after Ulysses' all-to-all), or the ring's over its two chunks.
struct AttentionShape {
  int64_t tokens = 0, q_heads = 0, kv_heads = 0;
  const int32_t* positions = nullptr;
};

inline AttentionShape attention_shape(const Dims& d, const Ulysses& ulysses, const int32_t* positions) {
  if (!ulysses.active()) return {d.T, d.NQ, d.NKV, ulysses.ring_active() ? ulysses.global_positions : positions};
  return {d.T * ulysses.sp, ulysses.q_heads, ulysses.kv_heads, ulysses.global_positions};
}

template <class Ops, typename Act = typename Ops::Act>
void heads_attention_forward(Ops& ops, Act* output, float* lse, const Act* q, const Act* k, const Act* v, const AttentionShape& shape,
                             const Dims& d, const TrainingOptions& options, Arena& device, const Ulysses& ulysses) {
  if (ulysses.ring_active()) return ring_attention_forward(ops, output, lse, q, k, v, d, options, device, ulysses);
  Buffer workspace = attention_workspace(ops, device, shape.tokens, shape.q_heads, shape.kv_heads, d.HD, false);
  ops.attention_forward(output, lse, q, k, v, shape.positions, shape.tokens, shape.q_heads, shape.kv_heads, d.HD, options.attention_block,
                        workspace.data());
  workspace.release();
}

template <class Ops, typename Act = typename Ops::Act>
void heads_attention_backward(Ops& ops, Act* q_grad, Act* k_grad, Act* v_grad, float* delta, const Act* output_grad, const Act* q,
                              const Act* k, const Act* v, const Act* output, const float* lse, const AttentionShape& shape, const Dims& d,
                              const TrainingOptions& options, Arena& device, const Ulysses& ulysses) {
  if (ulysses.ring_active())
    return ring_attention_backward(ops, q_grad, k_grad, v_grad, delta, output_grad, q, k, v, output, lse, d, options, device, ulysses);
  Buffer workspace = attention_workspace(ops, device, shape.tokens, shape.q_heads, shape.kv_heads, d.HD, true);
  ops.attention_backward(q_grad, k_grad, v_grad, delta, output_grad, q, k, v, output, lse, shape.positions, shape.tokens, shape.q_heads,
                         shape.kv_heads, d.HD, options.attention_block, workspace.data());
  workspace.release();
}

// One decoder layer's forward. Returns the layer output; fills `saved` when given.
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

namespace longseq {

template <class Ops>
BasicLlamaModel<Ops>::BasicLlamaModel(const ModelSpec& model, Arena& device) : BasicLlamaModel(model, device, nullptr, {}, nullptr) {}

template <class Ops>
BasicLlamaModel<Ops>::BasicLlamaModel(const ModelSpec& model, Arena& device, Communicator& zero_group)
    : BasicLlamaModel(model, device, &zero_group, ModelStates{3, false, false, {}}, nullptr) {}

template <class Ops>
BasicLlamaModel<Ops>::BasicLlamaModel(const ModelSpec& model, Arena& device, Communicator& zero_group, Arena& optimizer_host)
    : BasicLlamaModel(model, device, &zero_group, ModelStates{3, true, false, {}}, &optimizer_host) {}

template <class Ops>
BasicLlamaModel<Ops>::BasicLlamaModel(const ModelSpec& model, Arena& device, Communicator* zero_group, const ModelStates& states,
                                      Arena* host)
    : spec_(model), layout_(llama_layout(model)), lora_layout_(longseq::lora_layout(model, states.lora)), states_(states) {
  executor_model_check(model);
  if (lora()) {
    if (states.zero_stage != 0 || states.offload_optimizer || states.offload_params)
      throw std::invalid_argument("BasicLlamaModel: LoRA trains without ZeRO or offload here (executor_plan_problems reports this)");
    if (model.is_moe()) throw std::invalid_argument("BasicLlamaModel: LoRA on a mixture-of-experts model is not run here (plan_problems reports this)");
    // The frozen base in the kernels' dtype, alone; the adapters with what training needs: their
    // fp32 master (the adapters themselves on the CPU), gradients and AdamW moments (the planner's
    // names for them, planner/memory_model.cpp).
    plan_modules(1);
    const int64_t adapters = lora_layout_.total;
    weights_copy_ = device.template allocate<Act>(llama_step::kStates, "base_weights", padded_total(), true);
    adapters_ = device.template allocate<Act>(llama_step::kStates, Ops::kSeparateMasterWeights ? "lora_adapters" : "lora_adapters_fp32",
                                             adapters, true);
    if (Ops::kSeparateMasterWeights) master_ = device.allocate(llama_step::kStates, "lora_master_weights", adapters, true);
    gradients_ = device.allocate(llama_step::kStates, "lora_gradients_fp32", adapters, true);
    adam_m_ = device.allocate(llama_step::kStates, "lora_optimizer_states", adapters, true);
    adam_v_ = device.allocate(llama_step::kStates, "lora_optimizer_states", adapters, true);
    load_adapters(lora_initial_adapters(lora_layout_).data());
    return;
  }
  if (states.zero_stage < 0 || states.zero_stage > 3) throw std::invalid_argument("BasicLlamaModel: ZeRO stage must be 0..3");
  if (states.offload_optimizer && states.zero_stage < 1)
    throw std::invalid_argument("BasicLlamaModel: optimizer offload needs a ZeRO stage (plan_problems reports this)");
  if (states.offload_params && states.zero_stage != 3)
    throw std::invalid_argument("BasicLlamaModel: parameter offload needs ZeRO-3 (plan_problems reports this)");
  if ((states.offload_optimizer || states.offload_params) && !host) throw std::invalid_argument("BasicLlamaModel: offload needs a host pool");
  if (states.precision == PrecisionRegime::fsdp2 &&
      (states.zero_stage != 3 || states.offload_optimizer || states.offload_params || lora()))
    throw std::invalid_argument("BasicLlamaModel: FSDP2's regime shards fully (ZeRO stage 3) without offload or adapters here");
  cast_at_gather_ = states.precision == PrecisionRegime::fsdp2 && Ops::kSeparateMasterWeights;
  if (states.precision == PrecisionRegime::pure_bf16) {
    if (states.zero_stage != 0 || states.offload_optimizer || states.offload_params || lora())
      throw std::invalid_argument("BasicLlamaModel: the pure-bf16 regime runs without ZeRO, offload or adapters here");
    act_states_ = Ops::kSeparateMasterWeights;  // in fp32 it is the plain step
  }
  if (act_states_) {
    // bf16 weights, gradients and moments (the planner's names: weights, gradients_bf16,
    // optimizer_states), no master.
    plan_modules(1);
    weights_copy_ = device.template allocate<Act>(llama_step::kStates, "weights", layout_.total, true);
    gradients_act_ = device.template allocate<Act>(llama_step::kStates, "gradients_bf16", layout_.total, true);
    adam_m_act_ = device.template allocate<Act>(llama_step::kStates, "optimizer_states", layout_.total, true);
    adam_v_act_ = device.template allocate<Act>(llama_step::kStates, "optimizer_states", layout_.total, true);
    return;
  }
  if (states.zero_stage >= 1 && !zero_group) zero_group = &own_group_;  // ZeRO over one rank
  zero_group_ = states.zero_stage >= 1 ? zero_group : nullptr;
  const int64_t shard = plan_modules(zero_ranks());
  const int64_t whole = padded_total();
  // The kernels' weights (Act): this rank's shards under ZeRO-3, else the whole (padded) model;
  // on the device, or in the host pool with offload_param.
  Arena& weight_arena = states.offload_params ? *host : device;
  Arena& optimizer_arena = states.offload_optimizer ? *host : device;
  const int64_t optimizer_elements = states.zero_stage >= 1 ? shard : whole;
  if (cast_at_gather_) {
    // The fp32 shards are the parameters (the planner's "weights" at 4 bytes), and the optimizer's.
    master_ = device.allocate(llama_step::kStates, "weights", shard, true);
    gradients_ = device.allocate(llama_step::kStates, "gradients_fp32", shard, true);
    adam_m_ = device.allocate(llama_step::kStates, "optimizer_states", shard, true);
    adam_v_ = device.allocate(llama_step::kStates, "optimizer_states", shard, true);
    return;
  }
  weights_copy_ = weight_arena.template allocate<Act>(llama_step::kStates, "weights", weights_partitioned() ? shard : whole, true);
  // Mixed precision (DeepSpeed's bf16 mode), or an optimizer on the host: AdamW updates separate
  // fp32 master weights (sharded with the optimizer states) and the weights are written back.
  if (!master_is_weights()) {
    master_ = optimizer_arena.allocate(llama_step::kStates, "master_weights", optimizer_elements, true);
    master_on_host_ = states.offload_optimizer;
  } else {
    master_on_host_ = states.offload_params;
  }
  gradients_on_host_ = states.offload_optimizer;
  gradients_ = (gradients_on_host_ ? *host : device).allocate(llama_step::kStates, "gradients_fp32", gradients_partitioned() ? shard : whole, true);
  adam_m_ = optimizer_arena.allocate(llama_step::kStates, "optimizer_states", optimizer_elements, true);
  adam_v_ = optimizer_arena.allocate(llama_step::kStates, "optimizer_states", optimizer_elements, true);
}

template <class Ops>
bool BasicLlamaModel<Ops>::master_is_weights() const {
  return !Ops::kSeparateMasterWeights && !states_.offload_optimizer;
}

template <class Ops>
float* BasicLlamaModel<Ops>::master_data() {
  if constexpr (std::is_same_v<Act, float>) {
    if (lora() && !Ops::kSeparateMasterWeights) return adapters_.data();
    if (master_is_weights()) return weights_copy_.data();
  }
  return master_.data();
}

template <class Ops>
typename BasicLlamaModel<Ops>::Act* BasicLlamaModel<Ops>::weights() {
  return weights_copy_.data();
}

template <class Ops>
float* BasicLlamaModel<Ops>::module_master(const Module& module) {
  // The master weights are sharded with the optimizer (stage >= 1) unless they are the kernels'
  // whole weights, where this rank's chunk sits at its place in the padded module.
  if (master_is_weights() && !weights_partitioned()) return master_data() + own_chunk_start(module);
  return master_data() + module.shard_offset;
}

template <class Ops>
float* BasicLlamaModel<Ops>::module_gradient(const Module& module) {
  if (gradients_partitioned()) return gradients_.data() + module.shard_offset;
  return gradients_.data() + own_chunk_start(module);
}

template <class Ops>
void BasicLlamaModel<Ops>::weights_store(Act* destination, const Act* host_values, int64_t n) {
  if (states_.offload_params)
    std::copy_n(host_values, n, destination);
  else
    ops_.to_device(destination, host_values, n);
}

template <class Ops>
void BasicLlamaModel<Ops>::gradients_scale(float factor) {
  if (gradients_on_host_)
    for (int64_t i = 0; i < gradients_.size(); ++i) gradients_.data()[i] *= factor;
  else
    ops_.scale(gradients_.data(), gradients_.size(), factor);
}

template <class Ops>
int64_t BasicLlamaModel<Ops>::plan_modules(int64_t ranks) {
  modules_.clear();
  auto add = [&](int64_t start, int64_t end) {
    Module module;
    module.start = start;
    module.size = end - start;
    module.chunk = (module.size + ranks - 1) / ranks;
    if (!modules_.empty()) {
      module.shard_offset = modules_.back().shard_offset + modules_.back().chunk;
      module.padded_start = modules_.back().padded_start + modules_.back().chunk * ranks;
    }
    modules_.push_back(module);
  };
  add(layout_.embedding, layout_.embedding + spec_.vocab_size * spec_.hidden_size);
  for (size_t i = 0; i < layout_.layers.size(); ++i)
    add(layout_.layers[i].attention_norm, i + 1 < layout_.layers.size() ? layout_.layers[i + 1].attention_norm : layout_.final_norm);
  add(layout_.final_norm, layout_.total);
  return modules_.back().shard_offset + modules_.back().chunk;
}

template <class Ops>
void BasicLlamaModel<Ops>::load_parameters(const float* full) {
  // Built in host memory as a checkpoint is read: the whole model padded module by module, and
  // this rank's chunk of every module.
  const int64_t rank = zero_group_ ? zero_group_->rank() : 0;
  std::vector<float> padded(static_cast<size_t>(padded_total()), 0.0f);
  std::vector<float> shard(static_cast<size_t>(modules_.back().shard_offset + modules_.back().chunk), 0.0f);
  for (const Module& module : modules_) {
    std::copy_n(full + module.start, module.size, padded.data() + module.padded_start);
    for (int64_t i = 0; i < module.chunk; ++i) {
      const int64_t source = rank * module.chunk + i;
      shard[static_cast<size_t>(module.shard_offset + i)] = source < module.size ? full[module.start + source] : 0.0f;
    }
  }
  const std::vector<float>& own_weights = weights_partitioned() ? shard : padded;
  if (!master_is_weights() && !lora() && !act_states_) {  // (LoRA's master is the adapters'; pure bf16 has none)
    const std::vector<float>& own_master = states_.zero_stage >= 1 ? shard : padded;
    if (master_on_host_)
      std::copy(own_master.begin(), own_master.end(), master_.data());
    else
      ops_.to_device(master_.data(), own_master.data(), master_.size());
  }
  if (cast_at_gather_) return;  // no bf16 copy to keep
  if constexpr (std::is_same_v<Act, float>) {
    weights_store(weights(), own_weights.data(), weights_copy_.size());
  } else {
    // The weights in Act, converted on the device from the fp32 values (as the GPU rounds them).
    ops_.weights_from_host_master(weights(), own_weights.data(), weights_copy_.size());
  }
}

template <class Ops>
void BasicLlamaModel<Ops>::load_adapters(const float* full) {
  if (!lora()) throw std::invalid_argument("load_adapters: this model has no LoRA adapters");
  const int64_t n = lora_layout_.total;
  if constexpr (std::is_same_v<Act, float>) {
    ops_.to_device(adapters_.data(), full, n);
    if (Ops::kSeparateMasterWeights) ops_.to_device(master_.data(), full, n);
  } else {
    ops_.to_device(master_.data(), full, n);
    ops_.weights_from_host_master(adapters_.data(), full, n);
  }
}

template <class Ops>
std::vector<float> BasicLlamaModel<Ops>::gather_full(const float* shard) {
  std::vector<float> full(static_cast<size_t>(layout_.total));
  const bool on_host = (shard == master_.data() && master_on_host_) || (shard == gradients_.data() && gradients_on_host_) ||
                       (master_is_weights() && shard == master_data() && master_on_host_);
  if (!zero_group_) {
    if (on_host) std::copy_n(shard, layout_.total, full.data());
    else ops_.to_host(full.data(), shard, layout_.total);
    return full;
  }
  // Offloaded states are in host memory; the collectives (NCCL on a GPU) take device memory.
  const int64_t shard_size = modules_.back().shard_offset + modules_.back().chunk;
  auto staged = ops_.template scratch<float>(on_host ? shard_size : 0);
  if (on_host) {
    ops_.to_device(staged.data(), shard, shard_size);
    shard = staged.data();
  }
  for (const Module& module : modules_) {
    auto gathered = ops_.template scratch<float>(module.chunk * zero_group_->size());
    zero_group_->all_gather(shard + module.shard_offset, gathered.data(), module.chunk);
    ops_.to_host(full.data() + module.start, gathered.data(), module.size);
  }
  return full;
}

template <class Ops>
std::vector<float> BasicLlamaModel<Ops>::fp32_to_host(const float* values, int64_t n) {
  std::vector<float> host(static_cast<size_t>(n));
  ops_.to_host(host.data(), values, n);
  return host;
}

template <class Ops>
std::vector<float> BasicLlamaModel<Ops>::act_to_host(const Act* values, int64_t n) {
  auto wide = ops_.template scratch<float>(n);
  ops_.fill_zero(wide.data(), n);
  ops_.accumulate(wide.data(), values, n);
  return fp32_to_host(wide.data(), n);
}

template <class Ops>
std::vector<float> BasicLlamaModel<Ops>::parameters_full() {
  if (act_states_) return act_to_host(weights(), layout_.total);
  if (lora()) return fp32_to_host(master_data(), lora_layout_.total);
  if (!master_is_weights() && states_.zero_stage >= 1) return gather_full(master_.data());
  if (weights_partitioned()) return gather_full(master_data());
  // The whole (padded) vector is here: the master weights of stage 0, or the kernels' weights.
  std::vector<float> full(static_cast<size_t>(layout_.total));
  const float* whole = master_data();
  for (const Module& module : modules_) {
    if (master_on_host_) std::copy_n(whole + module.padded_start, module.size, full.data() + module.start);
    else ops_.to_host(full.data() + module.start, whole + module.padded_start, module.size);
  }
  return full;
}

template <class Ops>
std::vector<float> BasicLlamaModel<Ops>::gradients_full() {
  if (act_states_) return act_to_host(gradients_act_.data(), layout_.total);
  if (lora()) return fp32_to_host(gradients_.data(), lora_layout_.total);
  if (gradients_partitioned()) return gather_full(gradients_.data());
  std::vector<float> full(static_cast<size_t>(layout_.total));
  for (const Module& module : modules_) ops_.to_host(full.data() + module.start, gradients_.data() + module.padded_start, module.size);
  return full;
}

template <class Ops>
StepResult BasicLlamaModel<Ops>::forward_backward(const int32_t* host_tokens, const int32_t* host_labels,
                                                  const int32_t* host_positions, int64_t T, const TrainingOptions& options,
                                                  Arena& device, Arena& host, const SequenceParallel& parallel) {
  using namespace llama_step;
  const ModelSpec& m = spec_;
  Dims d{T, m.hidden_size, m.q_width(), m.kv_width(), m.num_q_heads, m.num_kv_heads, m.head_dim, m.intermediate_size, m.vocab_size};
  if (m.is_moe()) {
    d.E = m.experts;
    d.K = m.experts_per_token;
    d.FE = m.expert_intermediate_size;
    d.FS = m.shared_expert_intermediate_size;
    d.shared_gate = m.shared_expert_gate;
    d.normalize_topk = m.moe_normalize_topk;
    if (options.mlp_tiles > 0 || options.fpdt_chunk_tokens > 0)
      throw std::invalid_argument("forward_backward: a mixture-of-experts block runs untiled, without FPDT (plan_problems reports this)");
  }
  Ops& ops = ops_;
  // The step's int32 inputs where its kernels read them (beside the arena: they are not part of
  // the executor's predicted schedule, REFERENCE counts them under "inputs").
  auto upload = [&](const int32_t* values, int64_t n) {
    auto copy = ops.template scratch<int32_t>(n);
    ops.to_device(copy.data(), values, n);
    return copy;
  };
  const auto tokens_on_device = upload(host_tokens, T), labels_on_device = upload(host_labels, T),
             positions_on_device = upload(host_positions, T);
  const int32_t* tokens = tokens_on_device.data();
  const int32_t* labels = labels_on_device.data();
  const int32_t* positions = positions_on_device.data();
  // Where a module's weights and gradients are for this step. Under ZeRO-3 a module is
  // all-gathered into "gathered_layer_weights" when it runs (its shard first brought from the host
  // pool with offload_param) and released after; otherwise it is read in place from the whole
  // (padded) weights. With partitioned gradients (ZeRO-2/3, or an offloaded optimizer) a module's
  // gradient is produced whole in "weight_gradient" and reduce-scattered into this rank's shard
  // (summing every rank's part); otherwise it accumulates in place in the whole gradients.
  // A module's kernels read its tensors at offsets relative to the module (rebased).
  if (gradients_on_host_)
    std::fill_n(gradients_.data(), gradients_.size(), 0.0f);  // host memory
  else
    ops.fill_zero(gradients_.data(), gradients_.size());
  if (act_states_) ops.fill_zero(gradients_act_.data(), gradients_act_.size());
  // The base's gradients (null with LoRA: the base is frozen, gradients_ holds the adapters'; and
  // in the pure-bf16 regime, where each module's is produced in fp32 and added in: module_gradients).
  float* grads = lora() || act_states_ ? nullptr : gradients_.data();
  if (lora() && (options.mlp_tiles > 0 || options.fpdt_chunk_tokens > 0))
    throw std::invalid_argument("forward_backward: LoRA runs untiled MLPs without FPDT here (executor_plan_problems reports this)");
  auto layer_adapters = [&](int64_t layer) {
    LayerAdapters<Act> adapters;
    if (!lora()) return adapters;
    adapters.weights = adapters_.data();
    adapters.gradients = gradients_.data();
    adapters.layer = &lora_layout_.layers[static_cast<size_t>(layer)];
    adapters.rank = lora_layout_.rank;
    adapters.scale = lora_layout_.scale;
    return adapters;
  };
  const int64_t layers = m.num_layers;
  const bool gather_weights = weights_partitioned();
  const bool scatter_gradients = gradients_partitioned();
  auto gather = [&](size_t index, const char* name = "gathered_layer_weights") {
    const Module& module = modules_[index];
    BufferOf<Act> gathered = device.allocate<Act>(kCategoryZero, name, module.chunk * zero_group_->size());
    // (FSDP2's regime keeps no bf16 shard: weights() is empty there.)
    const Act* shard = cast_at_gather_ ? nullptr : weights() + module.shard_offset;
    BufferOf<Act> staged;
    if (cast_at_gather_) {  // FSDP2: the fp32 shard cast to bf16 for its all-gather
      staged = device.allocate<Act>(kCategoryZero, "fsdp.cast_shard", module.chunk);
      ops.weights_from_master(staged.data(), master_.data() + module.shard_offset, module.chunk);
      shard = staged.data();
    } else if (states_.offload_params) {
      staged = device.allocate<Act>(kCategoryZero, "offloaded_weights_in_flight", module.chunk);
      ops.to_device(staged.data(), shard, module.chunk);
      shard = staged.data();
    }
    zero_group_->all_gather(shard, gathered.data(), module.chunk);
    return gathered;
  };
  // The module's weights for its kernels: gathered into `holder`, or in place.
  auto module_weights = [&](size_t index, BufferOf<Act>& holder, const char* name = "gathered_layer_weights") -> const Act* {
    if (!gather_weights) return weights() + modules_[index].padded_start;
    holder = gather(index, name);
    return holder.data();
  };
  auto gradient_buffer = [&](size_t index, const char* name = "weight_gradient") {
    return device.allocate(kCategoryZero, name, modules_[index].chunk * zero_group_->size(), true);
  };
  auto module_gradients = [&](size_t index, Buffer& holder, const char* name = "weight_gradient") -> float* {
    if (act_states_) {
      holder = device.allocate(L, "module_gradient_fp32", modules_[index].size, true);
      return holder.data();
    }
    if (!scatter_gradients) return gradient_at(grads, modules_[index].padded_start);
    holder = gradient_buffer(index, name);
    return holder.data();
  };
  auto scatter = [&](size_t index, Buffer& gradient) {
    if (act_states_) {  // the pure-bf16 regime: into the bf16 gradients, rounded once
      ops.gradient_add_to_act(gradients_act_.data() + modules_[index].start, gradient.data(), modules_[index].size);
      gradient.release();
      return;
    }
    if (!scatter_gradients) return;
    const Module& module = modules_[index];
    Buffer part = device.allocate(kCategoryZero, "gradient_shard_in_flight", module.chunk);
    zero_group_->reduce_scatter(gradient.data(), part.data(), module.chunk);
    if (gradients_on_host_) {  // to the host shard, as ZeRO-Offload moves each reduced partition
      std::vector<float> arrived(static_cast<size_t>(module.chunk));
      ops.to_host(arrived.data(), part.data(), module.chunk);
      for (int64_t i = 0; i < module.chunk; ++i) gradients_.data()[module.shard_offset + i] += arrived[static_cast<size_t>(i)];
    } else {
      ops.add(gradients_.data() + module.shard_offset, part.data(), module.chunk);
    }
    gradient.release();
  };
  // A layer's offsets relative to its module, for running it on the module's weights.
  auto rebased = [&](size_t layer) {
    LlamaLayout::Layer w = layout_.layers[layer];
    const int64_t start = modules_[1 + layer].start;
    for (int64_t* offset : {&w.attention_norm, &w.q_proj, &w.k_proj, &w.v_proj, &w.o_proj, &w.mlp_norm, &w.gate_proj, &w.up_proj,
                            &w.down_proj})
      *offset -= start;
    for (int64_t* offset : {&w.router, &w.experts, &w.shared_expert_gate})
      if (*offset >= 0) *offset -= start;
    return w;
  };
  const size_t final_module = static_cast<size_t>(layers) + 1;
  Ulysses ulysses;
  auto global_positions_on_device = ops.template scratch<int32_t>(0);
  if (parallel.group && parallel.group->size() > 1) {
    ulysses.group = parallel.group;
    ulysses.sp = parallel.group->size();
    if (m.num_q_heads % ulysses.sp != 0 || (m.num_kv_heads % ulysses.sp != 0 && ulysses.sp % m.num_kv_heads != 0))
      throw std::invalid_argument("forward_backward: sp breaks Ulysses' head rules (plan_problems reports this)");
    ulysses.q_heads = m.num_q_heads / ulysses.sp;
    ulysses.replication = ulysses.sp > m.num_kv_heads ? ulysses.sp / m.num_kv_heads : 1;
    ulysses.kv_heads = ulysses.replication > 1 ? 1 : m.num_kv_heads / ulysses.sp;
  }
  if (parallel.ring_group && parallel.ring_group->size() > 1) {
    ulysses.ring_group = parallel.ring_group;
    ulysses.ring = parallel.ring_group->size();
    ulysses.ring_rank = parallel.ring_group->rank();
    if (options.fpdt_chunk_tokens > 0) throw std::invalid_argument("forward_backward: FPDT with ring attention is not in the executor");
  }
  if (act_states_ && (ulysses.active() || ulysses.ring_active()))
    throw std::invalid_argument("forward_backward: the pure-bf16 regime runs on one rank here (its bf16 gradients are not summed across ranks)");
  if (ulysses.active() || ulysses.ring_active()) {
    if (!parallel.global_positions) throw std::invalid_argument("forward_backward: sequence parallelism needs the global position ids");
    global_positions_on_device = upload(parallel.global_positions, T * ulysses.sp * ulysses.ring);
    ulysses.global_positions = global_positions_on_device.data();
  }
  // Sums over every rank of the sequence: the Ulysses group, then the ring of such groups.
  auto sequence_sum = [&](auto* values, int64_t count) {
    if (ulysses.active()) ulysses.group->all_reduce(values, count);
    if (ulysses.ring_active()) ulysses.ring_group->all_reduce(values, count);
  };

  // Forward. With checkpointing only each layer's input survives (on the device, or copied to
  // the host pool); without it every layer keeps what its backward reads.
  BufferOf<Act> x = device.allocate<Act>(L, "layer.input", T * d.C);
  {
    BufferOf<Act> table;
    ops.embedding_forward(x.data(), tokens, module_weights(0, table), T, d.C);
  }
  std::vector<BufferOf<Act>> inputs(static_cast<size_t>(layers));
  std::vector<LayerSaved<Act>> saved(options.activation_checkpointing ? 0 : static_cast<size_t>(layers));
  // Checkpoint offload is asynchronous: a layer's input is copied to the host while the next
  // layer computes, and its device buffer is released only once that layer is done (one extra
  // checkpoint on the device: the price of the overlap ALST's blocking copy does without).
  BufferOf<Act> offload_in_flight;
  typename Ops::PendingCopy offload_copy{};
  for (int64_t i = 0; i < layers; ++i) {
    BufferOf<Act> gathered;
    const Act* layer_params = module_weights(1 + static_cast<size_t>(i), gathered);
    const LlamaLayout::Layer w = rebased(static_cast<size_t>(i));
    BufferOf<Act> y = layer_forward(ops, layer_params, w, x.data(), positions, d, options, device, host,
                                    options.activation_checkpointing ? nullptr : &saved[static_cast<size_t>(i)], ulysses, layer_adapters(i));
    gathered.release();
    if (options.progress) options.progress("forward", i + 1, layers);
    if (options.checkpoint_offload) {
      if (!offload_in_flight.empty()) {
        ops.copy_wait(offload_copy);
        offload_in_flight.release();
      }
      BufferOf<Act> copy = host.allocate<Act>(kCategoryCheckpoints, "hidden_states_checkpoints", T * d.C);
      offload_copy = ops.copy_to_host_begin(copy.data(), x.data(), T * d.C);
      device.rename(x, "checkpoint.offload_in_flight");
      offload_in_flight = std::move(x);
      inputs[static_cast<size_t>(i)] = std::move(copy);
    } else {
      inputs[static_cast<size_t>(i)] = std::move(x);
    }
    x = std::move(y);
  }
  if (!offload_in_flight.empty()) {
    ops.copy_wait(offload_copy);
    offload_in_flight.release();
  }

  // Final norm, logits and loss; the gradient comes back into the last layer's output.
  device.set_moment("loss: logits and cross entropy");
  // The loss is the mean over every counted token of the sample: with Ulysses the count is summed
  // over the ranks first (ranks whose tokens are all ignored included), so each rank's gradient is
  // its share of the same mean.
  StepResult result;
  for (int64_t t = 0; t < T; ++t) result.counted_tokens += host_labels[t] != kernels::kIgnoreIndex;
  {
    double count = static_cast<double>(result.counted_tokens);
    sequence_sum(&count, 1);
    result.counted_tokens = static_cast<int64_t>(count);
  }
  const float loss_scale = result.counted_tokens > 0 ? 1.0f / static_cast<float>(result.counted_tokens) : 0.0f;
  // Where the final norm and the LM head (and their gradients) are for this step.
  BufferOf<Act> final_weights, tied_weights;
  Buffer final_gradient, tied_gradient;
  // The final module holds the norm and (untied) the LM head; a tied head is the embedding's.
  const Act* final_norm_weight = module_weights(final_module, final_weights);
  float* final_norm_grad = module_gradients(final_module, final_gradient);
  const Act* lm_head_weight = final_norm_weight + (layout_.lm_head - layout_.final_norm);
  float* lm_head_grad = gradient_at(final_norm_grad, layout_.lm_head - layout_.final_norm);
  if (m.tied_embeddings) {
    lm_head_weight = module_weights(0, tied_weights, "gathered_embedding_weights");
    lm_head_grad = module_gradients(0, tied_gradient, "embedding_weight_gradient");
  }
  BufferOf<Act> final_output = device.allocate<Act>(kCategoryLoss, "final_norm.output", T * d.C);
  Buffer final_rstd = device.allocate(kCategoryLoss, "final_norm.rstd", T);
  ops.rmsnorm_forward(final_output.data(), final_rstd.data(), x.data(), final_norm_weight, T, d.C, options.rmsnorm_eps);
  BufferOf<Act> final_grad = device.allocate<Act>(kCategoryLoss, "final_norm.output_grad", T * d.C, true);
  const int64_t loss_tile = options.loss_tile_tokens > 0 ? std::min(options.loss_tile_tokens, T)
                            : options.loss_tiles > 0     ? tile_size(T, options.loss_tiles)
                                                         : T;
  double loss_sum = 0;
  for (int64_t t0 = 0; t0 < T; t0 += loss_tile) {
    const int64_t rows = std::min(loss_tile, T - t0);
    BufferOf<Act> logits = device.allocate<Act>(kCategoryLoss, "loss.logits", rows * d.V);
    ops.linear_forward(logits.data(), final_output.data() + t0 * d.C, lm_head_weight, rows, d.C, d.V);
    Buffer losses = device.allocate(kCategoryLoss, "loss.per_token", rows);
    ops.cross_entropy_forward(losses.data(), logits.data(), labels + t0, rows, d.V);
    loss_sum += ops.sum(losses.data(), rows);
    BufferOf<Act> logits_grad = device.allocate<Act>(kCategoryLoss, "loss.logits_grad", rows * d.V, true);
    ops.cross_entropy_backward(logits_grad.data(), logits.data(), labels + t0, loss_scale, rows, d.V);
    logits.release();
    ops.linear_backward(final_grad.data() + t0 * d.C, lm_head_grad, logits_grad.data(), final_output.data() + t0 * d.C, lm_head_weight,
                        rows, d.C, d.V);
  }
  sequence_sum(&loss_sum, 1);
  result.loss = result.counted_tokens > 0 ? loss_sum / static_cast<double>(result.counted_tokens) : 0.0;
  final_output.release();
  BufferOf<Act> dy = device.allocate<Act>(L, "layer.output_grad", T * d.C, true);
  ops.rmsnorm_backward(dy.data(), final_norm_grad, final_grad.data(), x.data(), final_norm_weight, final_rstd.data(), T, d.C);
  scatter(final_module, final_gradient);
  if (m.tied_embeddings) scatter(0, tied_gradient);
  final_weights.release();
  tied_weights.release();
  final_grad.release();
  final_rstd.release();
  x.release();

  // Backward, last layer first; with checkpointing each layer is recomputed from its input. An
  // offloaded input is prefetched one layer ahead, its copy overlapping this layer's backward.
  BufferOf<Act> prefetched;
  typename Ops::PendingCopy prefetch_copy{};
  auto prefetch = [&](int64_t layer) {
    prefetched = device.allocate<Act>(L, "checkpoint.prefetched", T * d.C);
    prefetch_copy = ops.copy_to_device_begin(prefetched.data(), inputs[static_cast<size_t>(layer)].data(), T * d.C);
  };
  if (options.checkpoint_offload && layers > 0) prefetch(layers - 1);
  for (int64_t i = layers - 1; i >= 0; --i) {
    BufferOf<Act> gathered;
    Buffer layer_gradient;
    const Act* layer_params = module_weights(1 + static_cast<size_t>(i), gathered);
    float* layer_grads = module_gradients(1 + static_cast<size_t>(i), layer_gradient);
    const LlamaLayout::Layer w = rebased(static_cast<size_t>(i));
    BufferOf<Act> input = std::move(inputs[static_cast<size_t>(i)]);
    if (options.checkpoint_offload) {
      ops.copy_wait(prefetch_copy);
      ops.copy_finish(prefetch_copy);  // the host copy may be reused once the device has it
      input.release();
      device.rename(prefetched, "layer.input");
      input = std::move(prefetched);
      if (i > 0) prefetch(i - 1);
    }
    LayerSaved<Act> recomputed;
    LayerSaved<Act>& layer_saved = options.activation_checkpointing ? recomputed : saved[static_cast<size_t>(i)];
    if (options.activation_checkpointing) {
      BufferOf<Act> output =
          layer_forward(ops, layer_params, w, input.data(), positions, d, options, device, host, &recomputed, ulysses, layer_adapters(i));
      output.release();
    }
    BufferOf<Act> dx =
        layer_backward(ops, layer_grads, layer_params, w, input.data(), dy.data(), positions, d, options, device, host, layer_saved, ulysses,
                       layer_adapters(i));
    dy = std::move(dx);
    scatter(1 + static_cast<size_t>(i), layer_gradient);
    if (options.progress) options.progress("backward", layers - i, layers);
  }
  {
    Buffer table_gradient;
    if (float* table_grad = module_gradients(0, table_gradient)) ops.embedding_backward(table_grad, dy.data(), tokens, T, d.C);
    scatter(0, table_gradient);
  }
  // Every rank saw different tokens with the same weights: whole gradients are summed over the
  // sequence's ranks here (partitioned ones were summed by their reduce-scatter).
  if (!scatter_gradients) sequence_sum(gradients_.data(), gradients_.size());
  return result;
}

template <class Ops>
void BasicLlamaModel<Ops>::adamw_step(float lr, float beta1, float beta2, float eps, float weight_decay) {
  ++step_;
  if (act_states_) {  // bf16 parameters, gradients and moments
    ops_.adamw_update_act(weights(), gradients_act_.data(), adam_m_act_.data(), adam_v_act_.data(), layout_.total, lr, beta1, beta2, eps,
                          weight_decay, step_);
    return;
  }
  if (lora()) {  // the adapters alone
    ops_.adamw_update(master_data(), adapters_.data(), gradients_.data(), adam_m_.data(), adam_v_.data(), lora_layout_.total, lr, beta1,
                      beta2, eps, weight_decay, step_);
    return;
  }
  if (states_.offload_optimizer) {  // on the host (DeepSpeed's cpu_adam), then the weights go back
    kernels::adamw_update(master_.data(), gradients_.data(), adam_m_.data(), adam_v_.data(), master_.size(), lr, beta1, beta2, eps,
                          weight_decay, step_);
    // (With offload_param the weights are in the host pool too; the same call writes them there.)
    if (weights_partitioned()) {
      ops_.weights_from_host_master(weights(), master_.data(), master_.size());
      return;
    }
    for (const Module& module : modules_)
      ops_.weights_from_host_master(weights() + own_chunk_start(module), master_.data() + module.shard_offset, module.chunk);
  } else if (weights_partitioned() || !zero_group_) {
    // Every value this rank updates is contiguous: its ZeRO-3 shard, or the whole model.
    ops_.adamw_update(master_data(), weights(), gradients_.data(), adam_m_.data(), adam_v_.data(), adam_m_.size(), lr, beta1, beta2, eps,
                      weight_decay, step_);
    return;
  } else {
    // ZeRO-1/2: this rank's chunk of every module, where its master and gradient chunks are.
    for (const Module& module : modules_)
      ops_.adamw_update(module_master(module), weights() + own_chunk_start(module), module_gradient(module),
                        adam_m_.data() + module.shard_offset, adam_v_.data() + module.shard_offset, module.chunk, lr, beta1, beta2, eps,
                        weight_decay, step_);
  }
  // ZeRO-1/2: every rank's updated chunks make the whole weights again (DeepSpeed's all-gather of
  // the updated partitions). The send chunk is copied out first: it lies inside the receive buffer.
  for (const Module& module : modules_) {
    auto own = ops_.template scratch<Act>(module.chunk);
    ops_.copy(own.data(), weights() + own_chunk_start(module), module.chunk);
    zero_group_->all_gather(own.data(), weights() + module.padded_start, module.chunk);
  }
}

}  // namespace longseq
