// ulysses.hpp: the data layout of Ulysses sequence parallelism (DeepSpeed ulysses_sp.py,
// REFERENCE §3.1). Each rank holds T consecutive tokens with every head; around attention an
// all-to-all regroups them so each rank holds all S = sp x T tokens for its own heads: q heads
// NQ/sp, kv heads NKV/sp, or one kv head replicated when sp > NKV. A send buffer is laid out
// [destination rank][token][head of that rank][d]; a receive buffer [source rank][token][head][d],
// which for the sequence dimension is simply [global token][head][d].
#pragma once

#include <algorithm>
#include <cstdint>

#include "executor/communicator.hpp"

namespace longseq {

// Which global head block j of rank r's heads is: q heads r * per_rank + j; kv heads the same,
// or, replicated when sp > NKV, head r / replication (DeepSpeed's rule, REFERENCE §3.1). A plain
// struct, so the GPU's pack kernels take it by value.
struct HeadBlocks {
  int64_t per_rank = 1, replication = 1;
  int64_t head(int64_t r, int64_t j) const { return replication > 1 ? r / replication : r * per_rank + j; }
};

// Ulysses geometry of one rank: q heads NQ/sp; kv heads NKV/sp, or one head replicated. With ring
// attention (USP's 2D sequence parallelism) the sequence is also split over `ring` Ulysses groups:
// the ranks with this rank's heads in every group form `ring_group`, around which key/value
// blocks travel (llama_step.hpp ring_attention_forward).
struct Ulysses {
  Communicator* group = nullptr;
  Communicator* ring_group = nullptr;
  // The whole sample's position ids, where the step's kernels read them (device memory on a GPU):
  // attention masks with global token indices.
  const int32_t* global_positions = nullptr;
  int64_t sp = 1, q_heads = 0, kv_heads = 0, replication = 1;
  int64_t ring = 1, ring_rank = 0;
  bool active() const { return sp > 1; }
  bool ring_active() const { return ring > 1; }
  HeadBlocks q_blocks() const { return {q_heads, 1}; }
  HeadBlocks kv_blocks() const { return {kv_heads, replication}; }
};

// send[r][t][j][d] = source[t][blocks.head(r, j)][d]: this rank's tokens, regrouped by destination rank.
template <typename T>
void heads_pack(T* send, const T* source, int64_t tokens, int64_t heads_total, HeadBlocks blocks, int64_t HD, int64_t sp) {
  for (int64_t r = 0; r < sp; ++r)
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t j = 0; j < blocks.per_rank; ++j)
        std::copy_n(source + (t * heads_total + blocks.head(r, j)) * HD, HD, send + ((r * tokens + t) * blocks.per_rank + j) * HD);
}

// The inverse regrouping, adding into target[t][blocks.head(r, j)][d] (replicated kv heads sum their gradients).
template <typename T>
void heads_unpack_add(T* target, const T* recv, int64_t tokens, int64_t heads_total, HeadBlocks blocks, int64_t HD, int64_t sp) {
  for (int64_t r = 0; r < sp; ++r)
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t j = 0; j < blocks.per_rank; ++j) {
        T* out = target + (t * heads_total + blocks.head(r, j)) * HD;
        const T* in = recv + ((r * tokens + t) * blocks.per_rank + j) * HD;
        for (int64_t d = 0; d < HD; ++d) out[d] += in[d];
      }
}

}  // namespace longseq
