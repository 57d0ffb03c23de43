#include "kernels/cpu/norm_rope.hpp"

#include <cmath>

namespace longseq::kernels {

template <typename Real>
void rmsnorm_forward(Real* out, Real* rstd, const Real* inp, const Real* weight, int64_t T, int64_t C, Real eps) {
  for (int64_t t = 0; t < T; ++t) {
    const Real* x = inp + t * C;
    Real sum_squares = 0;
    for (int64_t c = 0; c < C; ++c) sum_squares += x[c] * x[c];
    const Real r = Real(1) / std::sqrt(sum_squares / static_cast<Real>(C) + eps);
    rstd[t] = r;
    for (int64_t c = 0; c < C; ++c) out[t * C + c] = x[c] * r * weight[c];
  }
}

template <typename Real>
void rmsnorm_backward(Real* dinp, Real* dweight, const Real* dout, const Real* inp, const Real* weight, const Real* rstd,
                      int64_t T, int64_t C) {
  for (int64_t t = 0; t < T; ++t) {
    const Real* x = inp + t * C;
    const Real* d = dout + t * C;
    const Real r = rstd[t];
    // y = x r w with r = (mean x^2 + eps)^(-1/2): dx = r (w d) - x r^3 / C * sum(w d x)
    Real dot = 0;
    for (int64_t c = 0; c < C; ++c) dot += weight[c] * d[c] * x[c];
    for (int64_t c = 0; c < C; ++c) {
      dinp[t * C + c] += r * weight[c] * d[c] - x[c] * r * r * r * dot / static_cast<Real>(C);
      if (dweight) dweight[c] += d[c] * x[c] * r;  // null: a frozen norm (LoRA)
    }
  }
}

namespace {
// cos and sin of position p for frequency k (double precision angles, as HF computes inv_freq in fp32
// but positions beyond 2^24 would lose precision in float).
inline void rope_angle(double& cosine, double& sine, int32_t position, int64_t k, int64_t HD, double theta) {
  const double inverse_frequency = std::pow(theta, -2.0 * static_cast<double>(k) / static_cast<double>(HD));
  const double angle = static_cast<double>(position) * inverse_frequency;
  cosine = std::cos(angle);
  sine = std::sin(angle);
}
}  // namespace

namespace {
// Rotates every head of every token by its position's angles (direction +1), or by minus them
// (direction -1: the transpose, which is the backward), writing or adding into `out`. Each pair
// is read before it is written, so out == inp works.
template <typename Real>
void rope_rotate(Real* out, const Real* inp, const int32_t* position_ids, int64_t T, int64_t NH, int64_t HD, double theta,
                 double direction, bool accumulate) {
  const int64_t half = HD / 2;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < half; ++k) {
      double cosine, sine;
      rope_angle(cosine, sine, position_ids[t], k, HD, theta);
      sine *= direction;
      for (int64_t h = 0; h < NH; ++h) {
        const int64_t base = (t * NH + h) * HD;
        const Real x1 = inp[base + k], x2 = inp[base + k + half];
        const auto first = static_cast<Real>(x1 * cosine - x2 * sine), second = static_cast<Real>(x2 * cosine + x1 * sine);
        out[base + k] = accumulate ? out[base + k] + first : first;
        out[base + k + half] = accumulate ? out[base + k + half] + second : second;
      }
    }
}
}  // namespace

template <typename Real>
void rope_forward(Real* out, const Real* inp, const int32_t* position_ids, int64_t T, int64_t NH, int64_t HD, double theta) {
  rope_rotate(out, inp, position_ids, T, NH, HD, theta, 1.0, false);
}

template <typename Real>
void rope_backward(Real* dinp, const Real* dout, const int32_t* position_ids, int64_t T, int64_t NH, int64_t HD, double theta) {
  rope_rotate(dinp, dout, position_ids, T, NH, HD, theta, -1.0, true);
}

#define LONGSEQ_INSTANTIATE(Real)                                                                                           \
  template void rmsnorm_forward<Real>(Real*, Real*, const Real*, const Real*, int64_t, int64_t, Real);                     \
  template void rmsnorm_backward<Real>(Real*, Real*, const Real*, const Real*, const Real*, const Real*, int64_t, int64_t); \
  template void rope_forward<Real>(Real*, const Real*, const int32_t*, int64_t, int64_t, int64_t, double);                  \
  template void rope_backward<Real>(Real*, const Real*, const int32_t*, int64_t, int64_t, int64_t, double);
LONGSEQ_INSTANTIATE(float)
LONGSEQ_INSTANTIATE(double)
#undef LONGSEQ_INSTANTIATE

}  // namespace longseq::kernels
