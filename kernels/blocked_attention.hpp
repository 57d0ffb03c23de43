// blocked_attention.hpp: causal attention as FlashAttention-2 computes it, written once over a
// small set of primitives: three batched matrix products per block pair (cuBLAS on the GPU) and
// row-wise kernels for the online softmax, its gradient and the masks. Memory is bounded by the
// block size (B x B scores per head), except the fp32 dq accumulator over the whole sequence that
// FlashAttention-2's backward also keeps (dq_accum, [S, heads, d] fp32).
//
// The algorithm here is the part that can be wrong in ways a CPU test can see (loop order, masks,
// rescaling, accumulation, the split of work between blocks); kernels/cpu/blocked_attention_cpu.hpp
// runs it with plain loops and tests hold it equal to kernels/cpu/attention.hpp, so what is left
// to the GPU is each primitive's mapping onto cuBLAS and a kernel.
//
// Shapes as kernels/cpu/attention.hpp: q[T, NQ, HD], k and v[T, NKV, HD], out[T, NQ, HD],
// lse[NQ, T]; masking by position_ids (a query at position p sees the p keys before it in its
// document and itself). `Act` is the storage type (float, or bf16 on the GPU); accumulators fp32.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace longseq {

// The block geometry and the workspace's parts, in elements; every buffer is the caller's.
struct BlockedAttentionLayout {
  int64_t T = 0, NQ = 0, NKV = 0, HD = 0, block = 0;
  BlockedAttentionLayout(int64_t tokens, int64_t q_heads, int64_t kv_heads, int64_t head_dim, int64_t block_tokens)
      : T(tokens), NQ(q_heads), NKV(kv_heads), HD(head_dim), block(std::max<int64_t>(1, std::min(block_tokens, tokens))) {}
  int64_t group() const { return NQ / NKV; }
  int64_t scores() const { return NQ * block * block; }       // fp32 S (dP in backward) and Act P, dS
  int64_t row_accumulator() const { return NQ * block * HD; }  // fp32 O of one query block
  int64_t row_statistics() const { return NQ * block; }        // fp32 running max and sum
  int64_t kv_accumulator() const { return NKV * block * HD; }  // fp32 dK or dV of one key block
  int64_t dq_accumulator() const { return T * NQ * HD; }       // fp32 dq of the whole sequence
  // The workspaces in fp32 elements for an Act of act_bytes (fp32 parts first, so every part is
  // aligned, then the Act parts; rounded up to whole fp32 elements).
  int64_t forward_elements(int64_t act_bytes) const {
    return scores() + row_accumulator() + 2 * row_statistics() + (scores() * act_bytes + 3) / 4;
  }
  int64_t backward_elements(int64_t act_bytes) const {
    return scores() + 2 * kv_accumulator() + dq_accumulator() + (2 * scores() * act_bytes + 3) / 4;
  }
  int64_t workspace_elements(int64_t act_bytes, bool backward) const {
    return backward ? backward_elements(act_bytes) : forward_elements(act_bytes);
  }
};

// Query and key block of the GPU's attention (CudaOps, and the CPU emulation of its schedule):
// 1024 x 1024 scores per head keep each cuBLAS product large enough to run near peak while a
// block's fp32 scores stay at 4 MiB a head.
inline constexpr int64_t kGpuAttentionBlockTokens = 1024;

// First key any query of [i0, i0 + rows) may see (the earliest document start among them), read
// from host-side position ids.
inline int64_t blocked_attention_first_key(const int32_t* positions_host, int64_t i0, int64_t rows) {
  int64_t first = i0 + rows;
  for (int64_t i = i0; i < i0 + rows; ++i) first = std::min<int64_t>(first, i - positions_host[i]);
  return first;
}

// Forward of queries [q_begin, q_begin + T) of a sequence (layout.T = their count; q, out and lse
// hold just them) against its keys [k_begin, k_begin + Tk) (k and v hold just them): FPDT's chunk
// pairs, and with both ranges the whole sequence the plain attention below. position_ids and
// positions_host cover the whole sequence. A query that sees no key of the range gets out = 0 and
// lse = -inf. `workspace` holds forward_elements(sizeof(Act)) floats: S, O, max, sum (fp32), P (Act).
// Primitives (Ops), with h a q head and g = h / group its kv head:
//   scores(S, a, b, i0, rows, j0, cols): S[h][r][c] = a[i0 + r, h, :] . b[j0 + c, g, :]
//   online_softmax(P, O, m, l, S, positions, i0, rows, j0, cols, scale): masked exp against the new
//       running max, P rounded to Act, O and the sum rescaled
//   accumulate_product(acc, row_stride, head_stride, X, b, j0, rows, cols):
//       acc[h * head_stride + r * row_stride + :] += sum_c X[h][r][c] b[j0 + c, g, :]
//   attention_finish(out, lse, O, m, l, i0, rows): out = O / l, lse = m + log l (0 and -inf if l = 0)
//   statistics_reset(m, l, O, rows): m = -inf, l = 0, O = 0
// The masking primitives see query i0 + r and key j0 + c relative to the query range: they get
// the positions from q_begin on and the key offset shifted by k_begin - q_begin.
template <typename Ops, typename Act>
void blocked_attention_forward_range(Ops& ops, Act* out, float* lse, const Act* q, const Act* k, const Act* v, const int32_t* positions,
                                     const int32_t* positions_host, int64_t q_begin, int64_t k_begin, int64_t Tk,
                                     const BlockedAttentionLayout& layout, float* workspace) {
  const int64_t B = layout.block, T = layout.T, shift = k_begin - q_begin;
  float* S = workspace;
  float* O = S + layout.scores();
  float* m = O + layout.row_accumulator();
  float* l = m + layout.row_statistics();
  Act* P = reinterpret_cast<Act*>(l + layout.row_statistics());
  const float scale = 1.0f / std::sqrt(static_cast<float>(layout.HD));
  for (int64_t i0 = 0; i0 < T; i0 += B) {
    const int64_t rows = std::min(B, T - i0);
    ops.statistics_reset(m, l, O, rows, layout);
    const int64_t first = std::max<int64_t>(0, blocked_attention_first_key(positions_host, q_begin + i0, rows) - k_begin);
    const int64_t end = std::min(Tk, q_begin + i0 + rows - k_begin);  // causal: no key after the last query
    for (int64_t j0 = first / B * B; j0 < end; j0 += B) {
      const int64_t cols = std::min(B, Tk - j0);
      ops.scores(S, q, k, i0, rows, j0, cols, layout);
      ops.online_softmax(P, O, m, l, S, positions + q_begin, i0, rows, j0 + shift, cols, scale, layout);
      ops.accumulate_product(O, layout.HD, B * layout.HD, P, v, j0, rows, cols, layout);
    }
    ops.attention_finish(out, lse, O, m, l, i0, rows, layout);
  }
}

template <typename Ops, typename Act>
void blocked_attention_forward(Ops& ops, Act* out, float* lse, const Act* q, const Act* k, const Act* v, const int32_t* positions,
                               const int32_t* positions_host, const BlockedAttentionLayout& layout, float* workspace) {
  blocked_attention_forward_range(ops, out, lse, q, k, v, positions, positions_host, 0, 0, layout.T, layout, workspace);
}

// Backward of the ranges' share (as the forward_range above), adding into dq, dk and dv. `delta`
// is [NQ, T] fp32 = rowsum(dout * out) of the queries' final output, `lse` their final lse (over
// every key range). `workspace` holds backward_elements(sizeof(Act)) floats: S/dP, dK and dV of
// one key block, dq (fp32), P, dS (Act). Keys are the outer loop (FlashAttention-2's order), so a
// key block's dK and dV accumulate in the block buffers and dq in its accumulator. Primitives
// beyond the forward's:
//   probabilities(P, S, lse, positions, i0, rows, j0, cols, scale): masked exp(S * scale - lse)
//   softmax_gradient(dS, P, dP, delta, i0, rows, cols, scale): dS = P * (dP - delta) * scale
//   accumulate_transposed(acc, X, a, i0, rows, cols): acc[g][c][:] += sum_{h of g, r} X[h][r][c] a[i0 + r, h, :]
//   add_kv_block(dk, acc, j0, cols): dk[j0 + c, g, :] += acc[g][c][:]
//   add_accumulated(dq, dq_acc, n): dq[i] += dq_acc[i];   zero(data, n)
template <typename Ops, typename Act>
void blocked_attention_backward_range(Ops& ops, Act* dq, Act* dk, Act* dv, const float* delta, const Act* dout, const Act* q, const Act* k,
                                      const Act* v, const float* lse, const int32_t* positions, const int32_t* positions_host,
                                      int64_t q_begin, int64_t k_begin, int64_t Tk, const BlockedAttentionLayout& layout, float* workspace) {
  const int64_t B = layout.block, T = layout.T, shift = k_begin - q_begin;
  float* S = workspace;
  float* dK = S + layout.scores();
  float* dV = dK + layout.kv_accumulator();
  float* dq_acc = dV + layout.kv_accumulator();
  Act* P = reinterpret_cast<Act*>(dq_acc + layout.dq_accumulator());
  Act* dS = P + layout.scores();
  const float scale = 1.0f / std::sqrt(static_cast<float>(layout.HD));
  ops.zero(dq_acc, layout.dq_accumulator());
  for (int64_t j0 = 0; j0 < Tk; j0 += B) {
    const int64_t cols = std::min(B, Tk - j0);
    ops.zero(dK, layout.kv_accumulator());
    ops.zero(dV, layout.kv_accumulator());
    // Queries before the key block see none of it.
    const int64_t first_query = std::max<int64_t>(0, k_begin + j0 - q_begin) / B * B;
    for (int64_t i0 = first_query; i0 < T; i0 += B) {
      const int64_t rows = std::min(B, T - i0);
      if (blocked_attention_first_key(positions_host, q_begin + i0, rows) >= k_begin + j0 + cols) continue;  // other documents
      ops.scores(S, q, k, i0, rows, j0, cols, layout);
      ops.probabilities(P, S, lse, positions + q_begin, i0, rows, j0 + shift, cols, scale, layout);
      ops.accumulate_transposed(dV, P, dout, i0, rows, cols, layout);
      ops.scores(S, dout, v, i0, rows, j0, cols, layout);  // dP = dout . v^T
      ops.softmax_gradient(dS, P, S, delta, i0, rows, cols, scale, layout);
      ops.accumulate_product(dq_acc + i0 * layout.NQ * layout.HD, layout.NQ * layout.HD, layout.HD, dS, k, j0, rows, cols, layout);
      ops.accumulate_transposed(dK, dS, q, i0, rows, cols, layout);
    }
    ops.add_kv_block(dk, dK, j0, cols, layout);
    ops.add_kv_block(dv, dV, j0, cols, layout);
  }
  ops.add_accumulated(dq, dq_acc, layout.dq_accumulator());
}

// The plain backward over the whole sequence; `delta` is [NQ, T] fp32 scratch it fills first:
//   softmax_delta(delta, dout, out): delta[h][i] = dout[i, h, :] . out[i, h, :]
template <typename Ops, typename Act>
void blocked_attention_backward(Ops& ops, Act* dq, Act* dk, Act* dv, float* delta, const Act* dout, const Act* q, const Act* k,
                                const Act* v, const Act* out, const float* lse, const int32_t* positions,
                                const int32_t* positions_host, const BlockedAttentionLayout& layout, float* workspace) {
  ops.softmax_delta(delta, dout, out, layout);
  blocked_attention_backward_range(ops, dq, dk, dv, delta, dout, q, k, v, lse, positions, positions_host, 0, 0, layout.T, layout, workspace);
}

}  // namespace longseq
