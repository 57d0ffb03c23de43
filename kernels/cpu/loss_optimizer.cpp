#include "kernels/cpu/loss_optimizer.hpp"

#include <algorithm>
#include <cmath>

namespace longseq::kernels {

namespace {
template <typename Real>
Real row_logsumexp(const Real* row, int64_t V) {
  const Real maximum = *std::max_element(row, row + V);
  Real sum = 0;
  for (int64_t i = 0; i < V; ++i) sum += std::exp(row[i] - maximum);
  return maximum + std::log(sum);
}
}  // namespace

template <typename Real>
void cross_entropy_forward(Real* losses, const Real* logits, const int32_t* labels, int64_t T, int64_t V) {
  for (int64_t t = 0; t < T; ++t) {
    if (labels[t] == kIgnoreIndex) {
      losses[t] = 0;
      continue;
    }
    const Real* row = logits + t * V;
    losses[t] = row_logsumexp(row, V) - row[labels[t]];
  }
}

template <typename Real>
void cross_entropy_backward(Real* dlogits, const Real* logits, const int32_t* labels, Real loss_scale, int64_t T, int64_t V) {
  for (int64_t t = 0; t < T; ++t) {
    if (labels[t] == kIgnoreIndex) continue;
    const Real* row = logits + t * V;
    const Real logsumexp = row_logsumexp(row, V);
    for (int64_t i = 0; i < V; ++i) dlogits[t * V + i] += loss_scale * std::exp(row[i] - logsumexp);
    dlogits[t * V + labels[t]] -= loss_scale;
  }
}

template <typename Real>
void adamw_update(Real* params, const Real* grads, Real* m, Real* v, int64_t N, Real lr, Real beta1, Real beta2, Real eps,
                  Real weight_decay, int64_t step) {
  const Real bias1 = Real(1) - std::pow(beta1, static_cast<Real>(step));
  const Real bias2 = Real(1) - std::pow(beta2, static_cast<Real>(step));
  // Element-wise and independent, so threads change nothing in the result; with the optimizer
  // offloaded this is the host's step over a whole shard (DeepSpeed's cpu_adam is threaded too).
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    params[i] -= lr * weight_decay * params[i];
    m[i] = beta1 * m[i] + (Real(1) - beta1) * grads[i];
    v[i] = beta2 * v[i] + (Real(1) - beta2) * grads[i] * grads[i];
    params[i] -= lr * (m[i] / bias1) / (std::sqrt(v[i] / bias2) + eps);
  }
}

#define LONGSEQ_INSTANTIATE(Real)                                                                                  \
  template void cross_entropy_forward<Real>(Real*, const Real*, const int32_t*, int64_t, int64_t);                 \
  template void cross_entropy_backward<Real>(Real*, const Real*, const int32_t*, Real, int64_t, int64_t);          \
  template void adamw_update<Real>(Real*, const Real*, Real*, Real*, int64_t, Real, Real, Real, Real, Real, int64_t);
LONGSEQ_INSTANTIATE(float)
LONGSEQ_INSTANTIATE(double)
#undef LONGSEQ_INSTANTIATE

}  // namespace longseq::kernels
