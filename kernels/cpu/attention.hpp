// attention.hpp: causal attention computed blockwise with an online softmax (FlashAttention-2's
// algorithm) on the CPU. Never forms the T x T score matrix: scratch memory is a few
// block x block and block x HD tiles per call.
//
// Shapes: q[T, NQ, HD], k and v[T, NKV, HD] (GQA: q head h reads kv head h / (NQ / NKV)),
// out[T, NQ, HD], lse[NQ, T] (log of the softmax denominator, saved for backward).
// Masking follows position_ids, so packed samples do not attend across their boundaries: token i
// at position p sees keys i - p .. i (its own document, causally). Plain causal attention is
// position_ids = 0, 1, ..., T-1.
#pragma once

#include <cstdint>

namespace longseq::kernels {

// The CPU kernels allocate no workspace, so the block they tile by is theirs to choose: at least 256
// tokens, which amortizes each tile's online-softmax bookkeeping over more work (measured on this
// project's machine at 16Ki tokens, d = 16: from 64 to 256 tokens the forward runs 1.3x faster,
// the backward 1.06x). Callers pass the step's block; the kernels and the rate measurement use this.
inline int64_t cpu_attention_tile(int64_t block) { return block > 256 ? block : 256; }


template <typename Real>
void attention_forward(Real* out, Real* lse, const Real* q, const Real* k, const Real* v, const int32_t* position_ids,
                       int64_t T, int64_t NQ, int64_t NKV, int64_t HD, int64_t block);

// Adds into dq, dk and dv (conventions of dense.hpp). delta_scratch[NQ, T] is the caller's buffer
// for D = rowsum(dout * out), as FlashAttention-2's backward keeps it (softmax_d, [b, h, S] fp32),
// and as the CUDA kernel takes it, so both paths allocate the same tensors.
template <typename Real>
void attention_backward(Real* dq, Real* dk, Real* dv, Real* delta_scratch, const Real* dout, const Real* q, const Real* k, const Real* v,
                        const Real* out, const Real* lse, const int32_t* position_ids, int64_t T, int64_t NQ, int64_t NKV,
                        int64_t HD, int64_t block);

// FPDT's pieces (chunked attention): queries [q_begin, q_begin + Tq) of a sequence against its
// keys [k_begin, k_begin + Tk), with q/out/lse ([NQ, Tq]) and k/v holding just those rows and
// position_ids the whole sequence's. A query that sees no key of the range gets out = 0, lse = -inf.
template <typename Real>
void attention_forward_range(Real* out, Real* lse, const Real* q, const Real* k, const Real* v, const int32_t* position_ids,
                             int64_t q_begin, int64_t Tq, int64_t k_begin, int64_t Tk, int64_t NQ, int64_t NKV, int64_t HD,
                             int64_t block);
// delta[NQ, T] = rowsum(dout * out) per head: the softmax backward's correction term.
template <typename Real>
void attention_softmax_delta(Real* delta, const Real* dout, const Real* out, int64_t T, int64_t NQ, int64_t HD);
// The range's share of the gradients (added into dq, dk, dv), given the final lse and delta of
// the queries (over every key range), as FlashAttention's backward splits over key blocks.
template <typename Real>
void attention_backward_range(Real* dq, Real* dk, Real* dv, const Real* delta, const Real* dout, const Real* q, const Real* k,
                              const Real* v, const Real* lse, const int32_t* position_ids, int64_t q_begin, int64_t Tq,
                              int64_t k_begin, int64_t Tk, int64_t NQ, int64_t NKV, int64_t HD, int64_t block);
// Merges a range's normalized output and lse into an accumulator of the ranges so far (out [T,
// NQ, HD], lse [NQ, T]; an accumulator starts at out 0, lse -inf): the online-softmax merge.
template <typename Real>
void attention_merge(Real* accumulator, Real* accumulator_lse, const Real* part, const Real* part_lse, int64_t T, int64_t NQ, int64_t HD);

}  // namespace longseq::kernels
