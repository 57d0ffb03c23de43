// attention.hpp: the attention block's kernels and their layouts: Ulysses' all-to-all, FPDT's
// chunks in the host pool, the ring (USP's passing or PyTorch CP's all-gather), the heads'
// attention. Its inventory: models/inventory/attention.cpp.
#pragma once

#include "executor/step/common.hpp"

namespace longseq::llama_step {

// What FPDT keeps of a layer in the host pool, per chunk.
template <typename Act>
struct FpdtSaved {
  std::vector<BufferOf<Act>> q, k, v, output;
  std::vector<Buffer> lse;
};

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

}  // namespace longseq::llama_step
