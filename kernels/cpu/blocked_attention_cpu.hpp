// blocked_attention_cpu.hpp: the primitives of kernels/blocked_attention.hpp as plain loops on the
// CPU, for Act = float (checked against kernels/cpu/attention.hpp) or bf16 (the tests' emulation
// of the GPU's schedule, rounding where the GPU rounds: P and dS to bf16, fp32 accumulators).
// Reference speed: this exists to prove the blocked algorithm, the CUDA primitives to run it.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/blocked_attention.hpp"
#include "kernels/cuda/bf16.hpp"

namespace longseq {

template <typename Act>
class CpuBlockedAttentionOps {
 public:
  using L = BlockedAttentionLayout;

  void scores(float* S, const Act* a, const Act* b, int64_t i0, int64_t rows, int64_t j0, int64_t cols, const L& l) {
    for (int64_t h = 0; h < l.NQ; ++h)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          float sum = 0;
          for (int64_t d = 0; d < l.HD; ++d) sum += load(a[((i0 + r) * l.NQ + h) * l.HD + d]) * load(b[((j0 + c) * l.NKV + h / l.group()) * l.HD + d]);
          S[(h * l.block + r) * l.block + c] = sum;
        }
  }
  void statistics_reset(float* m, float* sum, float* O, int64_t /*rows*/, const L& l) {
    for (int64_t i = 0; i < l.row_statistics(); ++i) {
      m[i] = -std::numeric_limits<float>::infinity();
      sum[i] = 0;
    }
    for (int64_t i = 0; i < l.row_accumulator(); ++i) O[i] = 0;
  }
  void online_softmax(Act* P, float* O, float* m, float* sum, const float* S, const int32_t* positions, int64_t i0, int64_t rows, int64_t j0,
                      int64_t cols, float scale, const L& l) {
    for (int64_t h = 0; h < l.NQ; ++h)
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t row = h * l.block + r;
        const float* s = S + row * l.block;
        float block_max = -std::numeric_limits<float>::infinity();
        for (int64_t c = 0; c < cols; ++c)
          if (visible(positions, i0 + r, j0 + c)) block_max = std::max(block_max, s[c] * scale);
        const float new_max = std::max(m[row], block_max);
        // Nothing visible yet in this row (keys of an earlier document): it adds nothing.
        const float correction = new_max == -std::numeric_limits<float>::infinity() ? 1.0f : std::exp(m[row] - new_max);
        float added = 0;
        for (int64_t c = 0; c < cols; ++c) {
          const float p = visible(positions, i0 + r, j0 + c) ? std::exp(s[c] * scale - new_max) : 0.0f;
          added += p;
          P[row * l.block + c] = store(p);
        }
        sum[row] = sum[row] * correction + added;
        for (int64_t d = 0; d < l.HD; ++d) O[row * l.HD + d] *= correction;
        m[row] = new_max;
      }
  }
  void accumulate_product(float* acc, int64_t row_stride, int64_t head_stride, const Act* X, const Act* b, int64_t j0, int64_t rows,
                          int64_t cols, const L& l) {
    for (int64_t h = 0; h < l.NQ; ++h)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t d = 0; d < l.HD; ++d) {
          float total = 0;
          for (int64_t c = 0; c < cols; ++c)
            total += load(X[(h * l.block + r) * l.block + c]) * load(b[((j0 + c) * l.NKV + h / l.group()) * l.HD + d]);
          acc[h * head_stride + r * row_stride + d] += total;
        }
  }
  void attention_finish(Act* out, float* lse, const float* O, const float* m, const float* sum, int64_t i0, int64_t rows, const L& l) {
    for (int64_t h = 0; h < l.NQ; ++h)
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t row = h * l.block + r;  // 0 only for a query that sees no key of the range
        for (int64_t d = 0; d < l.HD; ++d) out[((i0 + r) * l.NQ + h) * l.HD + d] = store(sum[row] > 0 ? O[row * l.HD + d] / sum[row] : 0.0f);
        lse[h * l.T + i0 + r] = sum[row] > 0 ? m[row] + std::log(sum[row]) : -std::numeric_limits<float>::infinity();
      }
  }
  void softmax_delta(float* delta, const Act* dout, const Act* out, const L& l) {
    for (int64_t h = 0; h < l.NQ; ++h)
      for (int64_t i = 0; i < l.T; ++i) {
        float total = 0;
        for (int64_t d = 0; d < l.HD; ++d) total += load(dout[(i * l.NQ + h) * l.HD + d]) * load(out[(i * l.NQ + h) * l.HD + d]);
        delta[h * l.T + i] = total;
      }
  }
  void zero(float* data, int64_t n) {
    for (int64_t i = 0; i < n; ++i) data[i] = 0;
  }
  void probabilities(Act* P, const float* S, const float* lse, const int32_t* positions, int64_t i0, int64_t rows, int64_t j0, int64_t cols,
                     float scale, const L& l) {
    for (int64_t h = 0; h < l.NQ; ++h)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          const int64_t index = (h * l.block + r) * l.block + c;
          P[index] = store(visible(positions, i0 + r, j0 + c) ? std::exp(S[index] * scale - lse[h * l.T + i0 + r]) : 0.0f);
        }
  }
  void softmax_gradient(Act* dS, const Act* P, const float* dP, const float* delta, int64_t i0, int64_t rows, int64_t cols, float scale,
                        const L& l) {
    for (int64_t h = 0; h < l.NQ; ++h)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          const int64_t index = (h * l.block + r) * l.block + c;
          dS[index] = store(load(P[index]) * (dP[index] - delta[h * l.T + i0 + r]) * scale);
        }
  }
  void accumulate_transposed(float* acc, const Act* X, const Act* a, int64_t i0, int64_t rows, int64_t cols, const L& l) {
    for (int64_t h = 0; h < l.NQ; ++h)
      for (int64_t c = 0; c < cols; ++c)
        for (int64_t d = 0; d < l.HD; ++d) {
          float total = 0;
          for (int64_t r = 0; r < rows; ++r) total += load(X[(h * l.block + r) * l.block + c]) * load(a[((i0 + r) * l.NQ + h) * l.HD + d]);
          acc[((h / l.group()) * l.block + c) * l.HD + d] += total;
        }
  }
  void add_kv_block(Act* target, const float* acc, int64_t j0, int64_t cols, const L& l) {
    for (int64_t g = 0; g < l.NKV; ++g)
      for (int64_t c = 0; c < cols; ++c)
        for (int64_t d = 0; d < l.HD; ++d) {
          Act& value = target[((j0 + c) * l.NKV + g) * l.HD + d];
          value = store(load(value) + acc[(g * l.block + c) * l.HD + d]);
        }
  }
  void add_accumulated(Act* target, const float* acc, int64_t n) {
    for (int64_t i = 0; i < n; ++i) target[i] = store(load(target[i]) + acc[i]);
  }

 private:
  static bool visible(const int32_t* positions, int64_t i, int64_t j) { return j <= i && j >= i - positions[i]; }
  static float load(float value) { return value; }
  static float load(Bf16 value) { return bf16_to_float(value); }
  static Act store(float value) {
    if constexpr (sizeof(Act) == sizeof(float))
      return value;
    else
      return bf16_from_float(value);
  }
};

}  // namespace longseq
