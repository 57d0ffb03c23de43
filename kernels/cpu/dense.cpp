#include "kernels/cpu/dense.hpp"

#include <Eigen/Core>
#include <cmath>

namespace longseq::kernels {

namespace {
template <typename Real>
using RowMatrix = Eigen::Matrix<Real, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename Real>
using MapMatrix = Eigen::Map<RowMatrix<Real>>;
template <typename Real>
using MapConstMatrix = Eigen::Map<const RowMatrix<Real>>;
}  // namespace

template <typename Real>
void embedding_forward(Real* out, const int32_t* tokens, const Real* table, int64_t T, int64_t C) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) out[t * C + c] = table[int64_t{tokens[t]} * C + c];
}

template <typename Real>
void embedding_backward(Real* dtable, const Real* dout, const int32_t* tokens, int64_t T, int64_t C) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) dtable[int64_t{tokens[t]} * C + c] += dout[t * C + c];
}

template <typename Real>
void linear_forward(Real* out, const Real* inp, const Real* weight, const Real* bias, int64_t T, int64_t C, int64_t OC) {
  MapMatrix<Real> result(out, T, OC);
  result.noalias() = MapConstMatrix<Real>(inp, T, C) * MapConstMatrix<Real>(weight, OC, C).transpose();
  if (bias) result.rowwise() += Eigen::Map<const Eigen::Matrix<Real, 1, Eigen::Dynamic>>(bias, OC);
}

template <typename Real>
void linear_forward_add(Real* out, const Real* inp, const Real* weight, Real alpha, int64_t T, int64_t C, int64_t OC) {
  MapMatrix<Real>(out, T, OC).noalias() += alpha * (MapConstMatrix<Real>(inp, T, C) * MapConstMatrix<Real>(weight, OC, C).transpose());
}

template <typename Real>
void linear_backward(Real* dinp, Real* dweight, Real* dbias, const Real* dout, const Real* inp, const Real* weight, int64_t T,
                     int64_t C, int64_t OC, Real alpha) {
  const MapConstMatrix<Real> gradient(dout, T, OC);
  if (dinp) MapMatrix<Real>(dinp, T, C).noalias() += alpha * (gradient * MapConstMatrix<Real>(weight, OC, C));
  if (dweight) MapMatrix<Real>(dweight, OC, C).noalias() += alpha * (gradient.transpose() * MapConstMatrix<Real>(inp, T, C));
  if (dbias) Eigen::Map<Eigen::Matrix<Real, 1, Eigen::Dynamic>>(dbias, OC) += alpha * gradient.colwise().sum();
}

template <typename Real>
void swiglu_forward(Real* out, const Real* gate, const Real* up, int64_t N) {
  for (int64_t i = 0; i < N; ++i) {
    const Real sigmoid = Real(1) / (Real(1) + std::exp(-gate[i]));
    out[i] = gate[i] * sigmoid * up[i];
  }
}

template <typename Real>
void swiglu_backward(Real* dgate, Real* dup, const Real* dout, const Real* gate, const Real* up, int64_t N) {
  for (int64_t i = 0; i < N; ++i) {
    const Real sigmoid = Real(1) / (Real(1) + std::exp(-gate[i]));
    const Real silu = gate[i] * sigmoid;
    // d silu / dx = sigmoid(x) * (1 + x * (1 - sigmoid(x)))
    dgate[i] += dout[i] * up[i] * sigmoid * (Real(1) + gate[i] * (Real(1) - sigmoid));
    dup[i] += dout[i] * silu;
  }
}

#define LONGSEQ_INSTANTIATE(Real)                                                                                  \
  template void embedding_forward<Real>(Real*, const int32_t*, const Real*, int64_t, int64_t);                     \
  template void embedding_backward<Real>(Real*, const Real*, const int32_t*, int64_t, int64_t);                    \
  template void linear_forward<Real>(Real*, const Real*, const Real*, const Real*, int64_t, int64_t, int64_t);     \
  template void linear_forward_add<Real>(Real*, const Real*, const Real*, Real, int64_t, int64_t, int64_t);         \
  template void linear_backward<Real>(Real*, Real*, Real*, const Real*, const Real*, const Real*, int64_t, int64_t, \
                                      int64_t, Real);                                                              \
  template void swiglu_forward<Real>(Real*, const Real*, const Real*, int64_t);                                    \
  template void swiglu_backward<Real>(Real*, Real*, const Real*, const Real*, const Real*, int64_t);
LONGSEQ_INSTANTIATE(float)
LONGSEQ_INSTANTIATE(double)
#undef LONGSEQ_INSTANTIATE

}  // namespace longseq::kernels
