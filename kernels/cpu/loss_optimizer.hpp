// loss_optimizer.hpp: cross entropy over pre-shifted labels and the AdamW update, on the CPU.
// Conventions as in dense.hpp. A label of -100 (kIgnoreIndex) contributes neither loss nor gradient.
#pragma once

#include <cstdint>

namespace longseq::kernels {

inline constexpr int32_t kIgnoreIndex = -100;

// losses[T] = logsumexp(logits[t, :]) - logits[t, labels[t]], 0 where the label is ignored.
template <typename Real>
void cross_entropy_forward(Real* losses, const Real* logits, const int32_t* labels, int64_t T, int64_t V);

// dlogits[T, V] += loss_scale * (softmax(logits[t, :]) - onehot(labels[t])) for counted tokens.
// loss_scale is d(loss)/d(losses[t]), e.g. 1 / (number of counted tokens) for a mean.
template <typename Real>
void cross_entropy_backward(Real* dlogits, const Real* logits, const int32_t* labels, Real loss_scale, int64_t T, int64_t V);

// PyTorch's AdamW (decoupled weight decay), step counted from 1:
// p -= lr * wd * p; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// p -= lr * (m / (1 - b1^step)) / (sqrt(v / (1 - b2^step)) + eps).
template <typename Real>
void adamw_update(Real* params, const Real* grads, Real* m, Real* v, int64_t N, Real lr, Real beta1, Real beta2, Real eps,
                  Real weight_decay, int64_t step);

}  // namespace longseq::kernels
