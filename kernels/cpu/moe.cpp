#include "kernels/cpu/moe.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace longseq::kernels {

template <typename Real>
void moe_route(Real* weights, int32_t* indices, Real* probs, const Real* logits, int64_t T, int64_t E, int64_t k, bool normalize) {
  std::vector<int32_t> experts(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const Real* z = logits + t * E;
    Real* p = probs + t * E;
    const Real largest = *std::max_element(z, z + E);
    Real sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += (p[e] = std::exp(z[e] - largest));
    for (int64_t e = 0; e < E; ++e) p[e] /= sum;
    std::iota(experts.begin(), experts.end(), 0);
    // torch.topk's order: descending probability; equal ones by the lower expert (stable).
    std::stable_sort(experts.begin(), experts.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
    Real chosen = 0;
    for (int64_t j = 0; j < k; ++j) chosen += p[experts[static_cast<size_t>(j)]];
    for (int64_t j = 0; j < k; ++j) {
      indices[t * k + j] = experts[static_cast<size_t>(j)];
      weights[t * k + j] = normalize ? p[experts[static_cast<size_t>(j)]] / chosen : p[experts[static_cast<size_t>(j)]];
    }
  }
}

template <typename Real>
void moe_route_backward(Real* dlogits, const Real* dweights, const Real* probs, const Real* weights, const int32_t* indices, int64_t T,
                        int64_t E, int64_t k, bool normalize) {
  std::vector<Real> dp(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const Real* p = probs + t * E;
    const Real* w = weights + t * k;
    const Real* dw = dweights + t * k;
    std::fill(dp.begin(), dp.end(), Real(0));
    if (normalize) {
      // w_j = p_j / S with S the chosen probabilities' sum: dp_i = (dw_i - sum_j dw_j w_j) / S.
      Real chosen = 0, dot = 0;
      for (int64_t j = 0; j < k; ++j) {
        chosen += p[indices[t * k + j]];
        dot += dw[j] * w[j];
      }
      for (int64_t j = 0; j < k; ++j) dp[static_cast<size_t>(indices[t * k + j])] = (dw[j] - dot) / chosen;
    } else {
      for (int64_t j = 0; j < k; ++j) dp[static_cast<size_t>(indices[t * k + j])] = dw[j];
    }
    // Softmax: dz = p (dp - sum(dp p)).
    Real inner = 0;
    for (int64_t e = 0; e < E; ++e) inner += dp[static_cast<size_t>(e)] * p[e];
    for (int64_t e = 0; e < E; ++e) dlogits[t * E + e] = p[e] * (dp[static_cast<size_t>(e)] - inner);
  }
}

MoeDispatch moe_dispatch(const int32_t* indices, int64_t T, int64_t E, int64_t k) {
  MoeDispatch dispatch;
  dispatch.offsets.assign(static_cast<size_t>(E + 1), 0);
  for (int64_t i = 0; i < T * k; ++i) ++dispatch.offsets[static_cast<size_t>(indices[i]) + 1];
  for (int64_t e = 0; e < E; ++e) dispatch.offsets[static_cast<size_t>(e + 1)] += dispatch.offsets[static_cast<size_t>(e)];
  std::vector<int64_t> next(dispatch.offsets.begin(), dispatch.offsets.end() - 1);
  dispatch.order.resize(static_cast<size_t>(T * k));
  dispatch.position.resize(static_cast<size_t>(T * k));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t row = next[static_cast<size_t>(indices[t * k + j])]++;
      dispatch.order[static_cast<size_t>(row)] = static_cast<int32_t>(t);
      dispatch.position[static_cast<size_t>(t * k + j)] = static_cast<int32_t>(row);
    }
  return dispatch;
}

template <typename Real>
void moe_gather(Real* rows, const Real* x, const int32_t* order, int64_t R, int64_t C) {
  for (int64_t r = 0; r < R; ++r) std::copy_n(x + int64_t{order[r]} * C, C, rows + r * C);
}

template <typename Real>
void moe_gather_backward(Real* dx, const Real* drows, const int32_t* position, int64_t T, int64_t k, int64_t C) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const Real* d = drows + int64_t{position[t * k + j]} * C;
      for (int64_t c = 0; c < C; ++c) dx[t * C + c] += d[c];
    }
}

template <typename Real, typename Weight>
void moe_combine(Real* out, const Real* rows, const int32_t* position, const Weight* weights, int64_t T, int64_t k, int64_t C) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const Real* row = rows + int64_t{position[t * k + j]} * C;
      const auto w = static_cast<Real>(weights[t * k + j]);
      for (int64_t c = 0; c < C; ++c) out[t * C + c] += w * row[c];
    }
}

template <typename Real, typename Weight>
void moe_combine_backward(Real* drows, Weight* dweights, const Real* dout, const Real* rows, const int32_t* position, const Weight* weights,
                          int64_t T, int64_t k, int64_t C) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t row = position[t * k + j];
      const auto w = static_cast<Real>(weights[t * k + j]);
      Real dot = 0;
      for (int64_t c = 0; c < C; ++c) {
        drows[row * C + c] = w * dout[t * C + c];
        dot += dout[t * C + c] * rows[row * C + c];
      }
      dweights[t * k + j] += static_cast<Weight>(dot);
    }
}

template <typename Real>
void moe_shared_gate_forward(Real* out, const Real* shared, const Real* gate, int64_t T, int64_t C) {
  for (int64_t t = 0; t < T; ++t) {
    const Real g = Real(1) / (Real(1) + std::exp(-gate[t]));
    for (int64_t c = 0; c < C; ++c) out[t * C + c] += g * shared[t * C + c];
  }
}

template <typename Real>
void moe_shared_gate_backward(Real* dshared, Real* dgate, const Real* dout, const Real* shared, const Real* gate, int64_t T, int64_t C) {
  for (int64_t t = 0; t < T; ++t) {
    const Real g = Real(1) / (Real(1) + std::exp(-gate[t]));
    Real dot = 0;
    for (int64_t c = 0; c < C; ++c) {
      dshared[t * C + c] = g * dout[t * C + c];
      dot += dout[t * C + c] * shared[t * C + c];
    }
    dgate[t] = dot * g * (Real(1) - g);
  }
}

#define LONGSEQ_INSTANTIATE(Real)                                                                                             \
  template void moe_route<Real>(Real*, int32_t*, Real*, const Real*, int64_t, int64_t, int64_t, bool);                        \
  template void moe_route_backward<Real>(Real*, const Real*, const Real*, const Real*, const int32_t*, int64_t, int64_t,     \
                                         int64_t, bool);                                                                    \
  template void moe_gather<Real>(Real*, const Real*, const int32_t*, int64_t, int64_t);                                       \
  template void moe_gather_backward<Real>(Real*, const Real*, const int32_t*, int64_t, int64_t, int64_t);                     \
  template void moe_combine<Real, Real>(Real*, const Real*, const int32_t*, const Real*, int64_t, int64_t, int64_t);          \
  template void moe_combine_backward<Real, Real>(Real*, Real*, const Real*, const Real*, const int32_t*, const Real*, int64_t, \
                                                 int64_t, int64_t);                                                          \
  template void moe_shared_gate_forward<Real>(Real*, const Real*, const Real*, int64_t, int64_t);                             \
  template void moe_shared_gate_backward<Real>(Real*, Real*, const Real*, const Real*, const Real*, int64_t, int64_t);
LONGSEQ_INSTANTIATE(float)
LONGSEQ_INSTANTIATE(double)
#undef LONGSEQ_INSTANTIATE

}  // namespace longseq::kernels
