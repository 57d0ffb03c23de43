// norm_rope.hpp: RMSNorm and rotary position embedding (HF's rotate_half convention).
// Conventions as in dense.hpp. NH heads of HD channels per token; HD is even.
#pragma once

#include <cstdint>

namespace longseq::kernels {

// out[T, C] = inp * rstd * weight, rstd[T] = 1 / sqrt(mean(inp^2) + eps); rstd is saved for backward.
template <typename Real>
void rmsnorm_forward(Real* out, Real* rstd, const Real* inp, const Real* weight, int64_t T, int64_t C, Real eps);
// dweight may be null (a frozen norm weight: LoRA trains the adapters only).
template <typename Real>
void rmsnorm_backward(Real* dinp, Real* dweight, const Real* dout, const Real* inp, const Real* weight, const Real* rstd,
                      int64_t T, int64_t C);

// x[T, NH, HD] rotated by position: with halves (x1, x2) and angle p * theta^(-2k/HD),
// out = (x1 cos - x2 sin, x2 cos + x1 sin). In place is allowed (out == inp).
template <typename Real>
void rope_forward(Real* out, const Real* inp, const int32_t* position_ids, int64_t T, int64_t NH, int64_t HD, double theta);
// The transpose rotation: dinp += (d1 cos + d2 sin, d2 cos - d1 sin).
template <typename Real>
void rope_backward(Real* dinp, const Real* dout, const int32_t* position_ids, int64_t T, int64_t NH, int64_t HD, double theta);

}  // namespace longseq::kernels
