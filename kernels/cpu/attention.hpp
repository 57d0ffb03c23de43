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

}  // namespace longseq::kernels
