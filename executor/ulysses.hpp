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

// Ulysses geometry of one rank: q heads NQ/sp; kv heads NKV/sp, or one head replicated when
// sp > NKV (DeepSpeed's rule, REFERENCE §3.1).
struct Ulysses {
  Communicator* group = nullptr;
  const int32_t* global_positions = nullptr;
  int64_t sp = 1, q_heads = 0, kv_heads = 0, replication = 1;
  bool active() const { return sp > 1; }
  // The global kv head that block `j` of rank `r`'s kv heads is.
  int64_t kv_head_of(int64_t r, int64_t j) const { return replication > 1 ? r / replication : r * kv_heads + j; }
};

// send[r][t][j][d] = source[t][head(r, j)][d]: this rank's tokens, regrouped by destination rank.
template <typename HeadOf>
void heads_pack(float* send, const float* source, int64_t T, int64_t heads_total, int64_t heads_per_rank, int64_t HD, int64_t sp,
                HeadOf head_of) {
  for (int64_t r = 0; r < sp; ++r)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < heads_per_rank; ++j)
        std::copy_n(source + (t * heads_total + head_of(r, j)) * HD, HD, send + ((r * T + t) * heads_per_rank + j) * HD);
}

// The inverse regrouping, adding into target[t][head(r, j)][d] (replicated kv heads sum their gradients).
template <typename HeadOf>
void heads_unpack_add(float* target, const float* recv, int64_t T, int64_t heads_total, int64_t heads_per_rank, int64_t HD,
                      int64_t sp, HeadOf head_of) {
  for (int64_t r = 0; r < sp; ++r)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < heads_per_rank; ++j) {
        float* out = target + (t * heads_total + head_of(r, j)) * HD;
        const float* in = recv + ((r * T + t) * heads_per_rank + j) * HD;
        for (int64_t d = 0; d < HD; ++d) out[d] += in[d];
      }
}

}  // namespace longseq
