#include "kernels/cpu/attention.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace longseq::kernels {

namespace {

template <typename Real>
using RowMatrix = Eigen::Matrix<Real, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
// A [rows, HD] slice of one head out of a [T, heads, HD] buffer: rows are heads * HD apart.
template <typename Real>
using HeadSlice = Eigen::Map<const RowMatrix<Real>, 0, Eigen::OuterStride<>>;
template <typename Real>
using MutableHeadSlice = Eigen::Map<RowMatrix<Real>, 0, Eigen::OuterStride<>>;

// First key each query of [i0, i1) may see: the start of its document.
int64_t block_first_key(const int32_t* position_ids, int64_t i0, int64_t i1) {
  int64_t first = i1;
  for (int64_t i = i0; i < i1; ++i) first = std::min<int64_t>(first, i - position_ids[i]);
  return first;
}

// The key blocks a query block [i0, i1) of the query range may see, in key-range coordinates: the
// block holding the earliest document start among its queries, up to its last query (causal).
struct KeyBlocks {
  int64_t first, end;
};
KeyBlocks key_blocks(const int32_t* position_ids, int64_t q_begin, int64_t i0, int64_t i1, int64_t k_begin, int64_t Tk, int64_t block) {
  const int64_t first = std::max<int64_t>(0, block_first_key(position_ids, q_begin + i0, q_begin + i1) - k_begin);
  return {first / block * block, std::min(Tk, q_begin + i1 - k_begin)};
}

// Scores of the query block against the key block, masked (-inf) outside each query's window.
template <typename Real>
void block_scores(RowMatrix<Real>& scores, const HeadSlice<Real>& queries, const HeadSlice<Real>& keys,
                  const int32_t* position_ids, int64_t i0, int64_t j0, Real scale) {
  scores.noalias() = queries * keys.transpose();
  scores *= scale;
  // A key block wholly before every query of the block and inside each one's document needs no
  // mask (most blocks of a long sequence): the per-element test is skipped.
  const int64_t last_key = j0 + scores.cols() - 1;
  bool all_visible = last_key <= i0;
  for (int64_t r = 0; all_visible && r < scores.rows(); ++r) all_visible = j0 >= i0 + r - position_ids[i0 + r];
  if (all_visible) return;
  for (int64_t r = 0; r < scores.rows(); ++r) {
    const int64_t i = i0 + r;
    const int64_t first = i - position_ids[i];
    for (int64_t c = 0; c < scores.cols(); ++c) {
      const int64_t j = j0 + c;
      if (j > i || j < first) scores(r, c) = -std::numeric_limits<Real>::infinity();
    }
  }
}

}  // namespace

// Queries [q_begin, q_begin + Tq) of a sequence against its keys [k_begin, k_begin + Tk): q, out
// and lse ([NQ, Tq]) hold the queries' rows, k and v the keys' rows; position_ids cover the whole
// sequence (indexed by global token). A query with no visible key in the range gets out = 0 and
// lse = -inf, which is what merging it with other ranges needs.
template <typename Real>
void attention_forward_range(Real* out, Real* lse, const Real* q, const Real* k, const Real* v, const int32_t* position_ids,
                             int64_t q_begin, int64_t Tq, int64_t k_begin, int64_t Tk, int64_t NQ, int64_t NKV, int64_t HD,
                             int64_t block) {
  const Real scale = Real(1) / std::sqrt(static_cast<Real>(HD));
  const int64_t group = NQ / NKV;
  const Real negative_infinity = -std::numeric_limits<Real>::infinity();
  // Heads are independent: one per thread (OpenMP; the machine's cores), each with its own tiles.
#pragma omp parallel for schedule(dynamic)
  for (int64_t h = 0; h < NQ; ++h) {
    RowMatrix<Real> scores, accumulator;
    std::vector<Real> row_max, row_sum;
    const int64_t g = h / group;
    for (int64_t i0 = 0; i0 < Tq; i0 += block) {
      const int64_t i1 = std::min(Tq, i0 + block), rows = i1 - i0;
      const HeadSlice<Real> queries(q + (i0 * NQ + h) * HD, rows, HD, Eigen::OuterStride<>(NQ * HD));
      accumulator.setZero(rows, HD);
      row_max.assign(rows, negative_infinity);
      row_sum.assign(rows, Real(0));
      const KeyBlocks keys_seen = key_blocks(position_ids, q_begin, i0, i1, k_begin, Tk, block);
      for (int64_t j0 = keys_seen.first; j0 < keys_seen.end; j0 += block) {
        const int64_t j1 = std::min(Tk, j0 + block), cols = j1 - j0;
        const HeadSlice<Real> keys(k + (j0 * NKV + g) * HD, cols, HD, Eigen::OuterStride<>(NKV * HD));
        const HeadSlice<Real> values(v + (j0 * NKV + g) * HD, cols, HD, Eigen::OuterStride<>(NKV * HD));
        block_scores(scores, queries, keys, position_ids, q_begin + i0, k_begin + j0, scale);
        // Online softmax: rescale what was accumulated when a row's maximum grows.
        for (int64_t r = 0; r < rows; ++r) {
          const Real block_max = scores.row(r).maxCoeff();
          const Real new_max = std::max(row_max[r], block_max);
          if (new_max == negative_infinity) {  // nothing visible yet in this row: contributes nothing
            scores.row(r).setZero();
            continue;
          }
          const Real correction = std::exp(row_max[r] - new_max);
          scores.row(r) = (scores.row(r).array() - new_max).exp().matrix();
          row_sum[r] = row_sum[r] * correction + scores.row(r).sum();
          accumulator.row(r) *= correction;
          row_max[r] = new_max;
        }
        accumulator.noalias() += scores * values;
      }
      MutableHeadSlice<Real> output(out + (i0 * NQ + h) * HD, rows, HD, Eigen::OuterStride<>(NQ * HD));
      for (int64_t r = 0; r < rows; ++r) {
        if (row_sum[r] > 0) {
          output.row(r) = accumulator.row(r) / row_sum[r];
          lse[h * Tq + i0 + r] = row_max[r] + std::log(row_sum[r]);
        } else {  // no key of this range is visible to the query
          output.row(r).setZero();
          lse[h * Tq + i0 + r] = negative_infinity;
        }
      }
    }
  }
}

template <typename Real>
void attention_forward(Real* out, Real* lse, const Real* q, const Real* k, const Real* v, const int32_t* position_ids,
                       int64_t T, int64_t NQ, int64_t NKV, int64_t HD, int64_t block) {
  attention_forward_range(out, lse, q, k, v, position_ids, 0, T, 0, T, NQ, NKV, HD, block);
}

template <typename Real>
void attention_softmax_delta(Real* delta, const Real* dout, const Real* out, int64_t T, int64_t NQ, int64_t HD) {
  for (int64_t h = 0; h < NQ; ++h)
    for (int64_t i = 0; i < T; ++i) {
      Real sum = 0;
      for (int64_t d = 0; d < HD; ++d) sum += dout[(i * NQ + h) * HD + d] * out[(i * NQ + h) * HD + d];
      delta[h * T + i] = sum;
    }
}

template <typename Real>
void attention_backward_range(Real* dq, Real* dk, Real* dv, const Real* delta, const Real* dout, const Real* q, const Real* k,
                              const Real* v, const Real* lse, const int32_t* position_ids, int64_t q_begin, int64_t Tq,
                              int64_t k_begin, int64_t Tk, int64_t NQ, int64_t NKV, int64_t HD, int64_t block) {
  const Real scale = Real(1) / std::sqrt(static_cast<Real>(HD));
  const int64_t group = NQ / NKV;
  // One kv head's group of q heads per thread: dk and dv of a kv head are written by one thread.
#pragma omp parallel for schedule(dynamic)
  for (int64_t g = 0; g < NKV; ++g) {
    RowMatrix<Real> probabilities, dprobabilities;
    for (int64_t h = g * group; h < (g + 1) * group; ++h) {
      for (int64_t i0 = 0; i0 < Tq; i0 += block) {
        const int64_t i1 = std::min(Tq, i0 + block), rows = i1 - i0;
        const HeadSlice<Real> queries(q + (i0 * NQ + h) * HD, rows, HD, Eigen::OuterStride<>(NQ * HD));
        const HeadSlice<Real> output_grad(dout + (i0 * NQ + h) * HD, rows, HD, Eigen::OuterStride<>(NQ * HD));
        MutableHeadSlice<Real> query_grad(dq + (i0 * NQ + h) * HD, rows, HD, Eigen::OuterStride<>(NQ * HD));
        const KeyBlocks keys_seen = key_blocks(position_ids, q_begin, i0, i1, k_begin, Tk, block);
        for (int64_t j0 = keys_seen.first; j0 < keys_seen.end; j0 += block) {
          const int64_t j1 = std::min(Tk, j0 + block), cols = j1 - j0;
          const HeadSlice<Real> keys(k + (j0 * NKV + g) * HD, cols, HD, Eigen::OuterStride<>(NKV * HD));
          const HeadSlice<Real> values(v + (j0 * NKV + g) * HD, cols, HD, Eigen::OuterStride<>(NKV * HD));
          MutableHeadSlice<Real> key_grad(dk + (j0 * NKV + g) * HD, cols, HD, Eigen::OuterStride<>(NKV * HD));
          MutableHeadSlice<Real> value_grad(dv + (j0 * NKV + g) * HD, cols, HD, Eigen::OuterStride<>(NKV * HD));
          block_scores(probabilities, queries, keys, position_ids, q_begin + i0, k_begin + j0, scale);
          for (int64_t r = 0; r < rows; ++r)
            probabilities.row(r) = (probabilities.row(r).array() - lse[h * Tq + i0 + r]).exp().matrix();  // exp(-inf) = 0
          value_grad.noalias() += probabilities.transpose() * output_grad;
          dprobabilities.noalias() = output_grad * values.transpose();
          for (int64_t r = 0; r < rows; ++r)
            dprobabilities.row(r) = (probabilities.row(r).array() * (dprobabilities.row(r).array() - delta[h * Tq + i0 + r])).matrix();
          query_grad.noalias() += scale * (dprobabilities * keys);
          key_grad.noalias() += scale * (dprobabilities.transpose() * queries);
        }
      }
    }
  }
}

template <typename Real>
void attention_backward(Real* dq, Real* dk, Real* dv, Real* delta_scratch, const Real* dout, const Real* q, const Real* k, const Real* v,
                        const Real* out, const Real* lse, const int32_t* position_ids, int64_t T, int64_t NQ, int64_t NKV,
                        int64_t HD, int64_t block) {
  // D_i = rowsum(dO_i * O_i), the softmax backward's correction term.
  attention_softmax_delta(delta_scratch, dout, out, T, NQ, HD);
  attention_backward_range(dq, dk, dv, delta_scratch, dout, q, k, v, lse, position_ids, 0, T, 0, T, NQ, NKV, HD, block);
}

template <typename Real>
void attention_merge(Real* accumulator, Real* accumulator_lse, const Real* part, const Real* part_lse, int64_t T, int64_t NQ,
                     int64_t HD) {
  const Real negative_infinity = -std::numeric_limits<Real>::infinity();
  for (int64_t h = 0; h < NQ; ++h)
    for (int64_t i = 0; i < T; ++i) {
      Real& total_lse = accumulator_lse[h * T + i];
      const Real added_lse = part_lse[h * T + i];
      if (added_lse == negative_infinity) continue;  // the part saw no key of this query
      const Real merged = total_lse == negative_infinity
                              ? added_lse
                              : std::max(total_lse, added_lse) + std::log1p(std::exp(-std::fabs(total_lse - added_lse)));
      const Real keep = total_lse == negative_infinity ? Real(0) : std::exp(total_lse - merged), add = std::exp(added_lse - merged);
      Real* row = accumulator + (i * NQ + h) * HD;
      const Real* added = part + (i * NQ + h) * HD;
      for (int64_t d = 0; d < HD; ++d) row[d] = row[d] * keep + added[d] * add;
      total_lse = merged;
    }
}

#define LONGSEQ_INSTANTIATE(Real)                                                                                     \
  template void attention_forward<Real>(Real*, Real*, const Real*, const Real*, const Real*, const int32_t*, int64_t, \
                                        int64_t, int64_t, int64_t, int64_t);                                          \
  template void attention_forward_range<Real>(Real*, Real*, const Real*, const Real*, const Real*, const int32_t*, int64_t,   \
                                              int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t);              \
  template void attention_softmax_delta<Real>(Real*, const Real*, const Real*, int64_t, int64_t, int64_t);                 \
  template void attention_backward_range<Real>(Real*, Real*, Real*, const Real*, const Real*, const Real*, const Real*,    \
                                               const Real*, const Real*, const int32_t*, int64_t, int64_t, int64_t, int64_t, \
                                               int64_t, int64_t, int64_t, int64_t);                                         \
  template void attention_merge<Real>(Real*, Real*, const Real*, const Real*, int64_t, int64_t, int64_t);                   \
  template void attention_backward<Real>(Real*, Real*, Real*, Real*, const Real*, const Real*, const Real*, const Real*,     \
                                         const Real*, const Real*, const int32_t*, int64_t, int64_t, int64_t, int64_t, \
                                         int64_t);
LONGSEQ_INSTANTIATE(float)
LONGSEQ_INSTANTIATE(double)
#undef LONGSEQ_INSTANTIATE

}  // namespace longseq::kernels
