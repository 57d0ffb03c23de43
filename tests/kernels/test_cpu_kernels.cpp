// CPU kernels: every backward against central finite differences in double precision, attention
// against a naive full-softmax reference, float against double.
//
// Tolerances: finite differences use step 1e-6 in double, so their truncation and rounding error
// is about 1e-9 relative; analytic and numeric gradients must agree to 1e-6 (absolute, or relative
// to the gradient when it exceeds 1). Blockwise attention must equal the naive reference to 1e-12
// in double; float kernels must equal double ones to 2e-5 relative.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cpu/attention.hpp"
#include "kernels/cuda/bf16.hpp"
#include "kernels/cpu/dense.hpp"
#include "kernels/cpu/loss_optimizer.hpp"
#include "kernels/cpu/norm_rope.hpp"
#include "kernels/cpu/blocked_attention_cpu.hpp"

using namespace longseq::kernels;
using Vector = std::vector<double>;

namespace {

Vector random_vector(size_t n, uint32_t seed, double scale = 1.0) {
  std::mt19937 generator(seed);
  std::normal_distribution<double> normal(0.0, scale);
  Vector values(n);
  for (auto& value : values) value = normal(generator);
  return values;
}

// L(x) = sum(forward(x) .* weights): its gradient with respect to the output is `weights`.
double weighted_sum(const Vector& output, const Vector& weights) {
  return std::inner_product(output.begin(), output.end(), weights.begin(), 0.0);
}

// Compares analytic[i] with the central difference of loss() in x[i], for every i.
void check_gradient(Vector& x, const Vector& analytic, const std::function<double()>& loss, const char* what) {
  CAPTURE(what);
  REQUIRE(analytic.size() == x.size());
  const double step = 1e-6;
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + step;
    const double plus = loss();
    x[i] = saved - step;
    const double minus = loss();
    x[i] = saved;
    const double numeric = (plus - minus) / (2 * step);
    CAPTURE(i);
    CHECK(std::fabs(numeric - analytic[i]) <= 1e-6 * std::max(1.0, std::fabs(numeric)));
  }
}

// Naive causal attention with document masking, one head at a time, in double.
void attention_reference(Vector& out, const Vector& q, const Vector& k, const Vector& v, const std::vector<int32_t>& positions,
                         int64_t T, int64_t NQ, int64_t NKV, int64_t HD) {
  out.assign(static_cast<size_t>(T * NQ * HD), 0.0);
  for (int64_t h = 0; h < NQ; ++h) {
    const int64_t g = h / (NQ / NKV);
    for (int64_t i = 0; i < T; ++i) {
      std::vector<double> scores;
      for (int64_t j = i - positions[i]; j <= i; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < HD; ++d) dot += q[(i * NQ + h) * HD + d] * k[(j * NKV + g) * HD + d];
        scores.push_back(dot / std::sqrt(static_cast<double>(HD)));
      }
      const double maximum = *std::max_element(scores.begin(), scores.end());
      double sum = 0;
      for (auto& score : scores) sum += (score = std::exp(score - maximum));
      for (int64_t j = i - positions[i], n = 0; j <= i; ++j, ++n)
        for (int64_t d = 0; d < HD; ++d) out[(i * NQ + h) * HD + d] += scores[n] / sum * v[(j * NKV + g) * HD + d];
    }
  }
}

}  // namespace

TEST_CASE("linear: forward is x W^T + b, backward matches finite differences") {
  const int64_t T = 5, C = 7, OC = 3;
  Vector x = random_vector(T * C, 1), w = random_vector(OC * C, 2), b = random_vector(OC, 3), weights = random_vector(T * OC, 4);
  Vector out(T * OC);
  auto loss = [&] {
    linear_forward(out.data(), x.data(), w.data(), b.data(), T, C, OC);
    return weighted_sum(out, weights);
  };
  loss();
  CHECK(out[1 * OC + 2] == doctest::Approx(b[2] + std::inner_product(x.begin() + C, x.begin() + 2 * C, w.begin() + 2 * C, 0.0)));
  Vector dx(T * C, 0), dw(OC * C, 0), db(OC, 0);
  linear_backward(dx.data(), dw.data(), db.data(), weights.data(), x.data(), w.data(), T, C, OC);
  check_gradient(x, dx, loss, "dinp");
  check_gradient(w, dw, loss, "dweight");
  check_gradient(b, db, loss, "dbias");
}

TEST_CASE("embedding: rows are looked up, backward scatters into the rows used (repeats add)") {
  const int64_t T = 6, C = 4, V = 5;
  const std::vector<int32_t> tokens = {1, 3, 1, 0, 4, 3};
  Vector table = random_vector(V * C, 5), weights = random_vector(T * C, 6), out(T * C);
  auto loss = [&] {
    embedding_forward(out.data(), tokens.data(), table.data(), T, C);
    return weighted_sum(out, weights);
  };
  loss();
  CHECK(out[2 * C + 1] == table[1 * C + 1]);
  Vector dtable(V * C, 0);
  embedding_backward(dtable.data(), weights.data(), tokens.data(), T, C);
  check_gradient(table, dtable, loss, "dtable");
  CHECK(dtable[2 * C] == 0);  // token 2 never appears
}

TEST_CASE("swiglu: silu(gate) * up and its backward") {
  const int64_t N = 11;
  Vector gate = random_vector(N, 7, 2.0), up = random_vector(N, 8), weights = random_vector(N, 9), out(N);
  auto loss = [&] {
    swiglu_forward(out.data(), gate.data(), up.data(), N);
    return weighted_sum(out, weights);
  };
  loss();
  CHECK(out[3] == doctest::Approx(gate[3] / (1 + std::exp(-gate[3])) * up[3]));
  Vector dgate(N, 0), dup(N, 0);
  swiglu_backward(dgate.data(), dup.data(), weights.data(), gate.data(), up.data(), N);
  check_gradient(gate, dgate, loss, "dgate");
  check_gradient(up, dup, loss, "dup");
}

TEST_CASE("rmsnorm: forward and backward for input and weight") {
  const int64_t T = 4, C = 9;
  Vector x = random_vector(T * C, 10), w = random_vector(C, 11), weights = random_vector(T * C, 12), out(T * C), rstd(T);
  auto loss = [&] {
    rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), T, C, 1e-5);
    return weighted_sum(out, weights);
  };
  loss();
  double mean_square = 0;
  for (int64_t c = 0; c < C; ++c) mean_square += x[c] * x[c] / C;
  CHECK(out[2] == doctest::Approx(x[2] / std::sqrt(mean_square + 1e-5) * w[2]));
  Vector dx(T * C, 0), dw(C, 0);
  rmsnorm_backward(dx.data(), dw.data(), weights.data(), x.data(), w.data(), rstd.data(), T, C);
  check_gradient(x, dx, loss, "dinp");
  check_gradient(w, dw, loss, "dweight");
}

TEST_CASE("rope: a rotation per pair (norm kept, position 0 unchanged), backward matches finite differences") {
  const int64_t T = 5, NH = 2, HD = 8;
  const std::vector<int32_t> positions = {0, 1, 2, 0, 1};  // two packed documents
  Vector x = random_vector(T * NH * HD, 13), weights = random_vector(T * NH * HD, 14), out(T * NH * HD);
  auto loss = [&] {
    rope_forward(out.data(), x.data(), positions.data(), T, NH, HD, 10000.0);
    return weighted_sum(out, weights);
  };
  loss();
  for (int64_t c = 0; c < NH * HD; ++c) CHECK(out[c] == x[c]);  // position 0: angle 0
  const int64_t base = (2 * NH + 1) * HD;
  CHECK(out[base + 1] * out[base + 1] + out[base + 5] * out[base + 5] ==
        doctest::Approx(x[base + 1] * x[base + 1] + x[base + 5] * x[base + 5]));
  Vector dx(T * NH * HD, 0);
  rope_backward(dx.data(), weights.data(), positions.data(), T, NH, HD, 10000.0);
  check_gradient(x, dx, loss, "dinp");
}

TEST_CASE("attention: blockwise online softmax equals the naive reference, any block size, packed documents, GQA") {
  const int64_t T = 13, NQ = 4, NKV = 2, HD = 4;
  const std::vector<int32_t> positions = {0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3, 4};  // three documents
  const Vector q = random_vector(T * NQ * HD, 15), k = random_vector(T * NKV * HD, 16), v = random_vector(T * NKV * HD, 17);
  Vector reference;
  attention_reference(reference, q, k, v, positions, T, NQ, NKV, HD);
  for (int64_t block : {1, 3, 4, 7, 64}) {
    CAPTURE(block);
    Vector out(T * NQ * HD), lse(NQ * T);
    attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), positions.data(), T, NQ, NKV, HD, block);
    for (size_t i = 0; i < out.size(); ++i) CHECK(out[i] == doctest::Approx(reference[i]).epsilon(1e-12));
  }
  // The first token of each document sees only itself: its output is its own value vector.
  Vector out(T * NQ * HD), lse(NQ * T);
  attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), positions.data(), T, NQ, NKV, HD, 4);
  for (int64_t d = 0; d < HD; ++d) CHECK(out[(5 * NQ + 3) * HD + d] == doctest::Approx(v[(5 * NKV + 1) * HD + d]));
}

TEST_CASE("attention: backward for q, k and v matches finite differences (GQA, packed, uneven blocks)") {
  const int64_t T = 9, NQ = 4, NKV = 2, HD = 4, block = 4;
  const std::vector<int32_t> positions = {0, 1, 2, 3, 0, 1, 2, 3, 4};
  Vector q = random_vector(T * NQ * HD, 18), k = random_vector(T * NKV * HD, 19), v = random_vector(T * NKV * HD, 20);
  const Vector weights = random_vector(T * NQ * HD, 21);
  Vector out(T * NQ * HD), lse(NQ * T);
  auto loss = [&] {
    attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), positions.data(), T, NQ, NKV, HD, block);
    return weighted_sum(out, weights);
  };
  loss();
  Vector dq(q.size(), 0), dk(k.size(), 0), dv(v.size(), 0), delta(NQ * T);
  attention_backward(dq.data(), dk.data(), dv.data(), delta.data(), weights.data(), q.data(), k.data(), v.data(), out.data(), lse.data(),
                     positions.data(), T, NQ, NKV, HD, block);
  check_gradient(q, dq, loss, "dq");
  check_gradient(k, dk, loss, "dk");
  check_gradient(v, dv, loss, "dv");
}

TEST_CASE("attention in float equals attention in double") {
  const int64_t T = 40, NQ = 2, NKV = 1, HD = 8, block = 16;
  std::vector<int32_t> positions(T);
  std::iota(positions.begin(), positions.end(), 0);
  const Vector q = random_vector(T * NQ * HD, 22), k = random_vector(T * NKV * HD, 23), v = random_vector(T * NKV * HD, 24);
  Vector out(T * NQ * HD), lse(NQ * T);
  attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), positions.data(), T, NQ, NKV, HD, block);
  std::vector<float> qf(q.begin(), q.end()), kf(k.begin(), k.end()), vf(v.begin(), v.end()), outf(out.size()), lsef(lse.size());
  attention_forward(outf.data(), lsef.data(), qf.data(), kf.data(), vf.data(), positions.data(), T, NQ, NKV, HD, block);
  for (size_t i = 0; i < out.size(); ++i) CHECK(outf[i] == doctest::Approx(out[i]).epsilon(2e-5).scale(1.0));
}

TEST_CASE("cross entropy over pre-shifted labels: ignored tokens count for nothing") {
  const int64_t T = 4, V = 6;
  const std::vector<int32_t> labels = {2, kIgnoreIndex, 5, 0};
  Vector logits = random_vector(T * V, 25), losses(T);
  cross_entropy_forward(losses.data(), logits.data(), labels.data(), T, V);
  double logsumexp = 0;
  for (int64_t i = 0; i < V; ++i) logsumexp += std::exp(logits[2 * V + i]);
  CHECK(losses[2] == doctest::Approx(std::log(logsumexp) - logits[2 * V + 5]));
  CHECK(losses[1] == 0);
  // The mean over the three counted tokens, differentiated.
  auto loss = [&] {
    cross_entropy_forward(losses.data(), logits.data(), labels.data(), T, V);
    return (losses[0] + losses[2] + losses[3]) / 3;
  };
  Vector dlogits(T * V, 0);
  cross_entropy_backward(dlogits.data(), logits.data(), labels.data(), 1.0 / 3, T, V);
  check_gradient(logits, dlogits, loss, "dlogits");
  for (int64_t i = 0; i < V; ++i) CHECK(dlogits[1 * V + i] == 0);
}

TEST_CASE("adamw: one step by hand") {
  double param = 1.0, grad = 0.5, m = 0, v = 0;
  adamw_update(&param, &grad, &m, &v, 1, 0.1, 0.9, 0.999, 1e-8, 0.01, 1);
  // decay: 1 - 0.1*0.01 = 0.999; m = 0.05, v = 0.00025; m_hat = 0.5, v_hat = 0.25; step 0.1 * 0.5 / (0.5 + 1e-8)
  CHECK(m == doctest::Approx(0.05));
  CHECK(v == doctest::Approx(0.00025));
  CHECK(param == doctest::Approx(0.999 - 0.1 * 0.5 / (0.5 + 1e-8)));
}

// bf16 conversions (kernels/cuda/bf16.hpp) are host code shared with the GPU suite's reference
// inputs, so they are tested here, where CI runs.
TEST_CASE("bf16: round to nearest even, exact for representable values, NaN stays NaN") {
  using longseq::bf16_from_float;
  using longseq::bf16_to_float;
  CHECK(bf16_from_float(1.0f) == 0x3f80);
  CHECK(bf16_to_float(0x3f80) == 1.0f);
  CHECK(bf16_from_float(-2.0f) == 0xc000);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  CHECK(bf16_from_float(1.0f + 0x1p-8f) == 0x3f80);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): it rounds up.
  CHECK(bf16_from_float(1.0f + 3 * 0x1p-8f) == 0x3f82);
  // Just above halfway rounds up.
  CHECK(bf16_from_float(1.0f + 0x1p-8f + 0x1p-20f) == 0x3f81);
  // Every bf16 value converts to float and back unchanged.
  for (uint32_t bits = 0; bits < 0x7f80; bits += 37) CHECK(bf16_from_float(bf16_to_float(static_cast<uint16_t>(bits))) == bits);
  CHECK(std::isnan(bf16_to_float(bf16_from_float(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(bf16_to_float(bf16_from_float(std::numeric_limits<float>::infinity())) == std::numeric_limits<float>::infinity());
  // The largest float rounds to infinity (beyond bf16's largest finite value), as in PyTorch.
  CHECK(std::isinf(bf16_to_float(bf16_from_float(std::numeric_limits<float>::max()))));
}

TEST_CASE("blocked attention (the GPU's algorithm) equals the CPU attention, forward and backward") {
  // fp32 on both sides; the blocked form only reorders sums. Measured worst difference 2.2e-7 of
  // the largest value; tolerance 1e-5. Blocks that do not divide T, a block wider than T, GQA, two documents.
  const int64_t T = 37, NQ = 4, NKV = 2, HD = 8;
  std::vector<int32_t> positions(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) positions[static_cast<size_t>(t)] = static_cast<int32_t>(t < 22 ? t : t - 22);
  auto as_float = [](const Vector& values) { return std::vector<float>(values.begin(), values.end()); };
  const std::vector<float> q = as_float(random_vector(T * NQ * HD, 41)), k = as_float(random_vector(T * NKV * HD, 42)),
                           v = as_float(random_vector(T * NKV * HD, 43)), dout = as_float(random_vector(T * NQ * HD, 44));
  std::vector<float> out(q.size()), lse(static_cast<size_t>(NQ * T)), delta(lse.size());
  std::vector<float> dq(q.size(), 0.0f), dk(k.size(), 0.0f), dv(v.size(), 0.0f);
  attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), positions.data(), T, NQ, NKV, HD, 64);
  attention_backward(dq.data(), dk.data(), dv.data(), delta.data(), dout.data(), q.data(), k.data(), v.data(), out.data(), lse.data(),
                     positions.data(), T, NQ, NKV, HD, 64);
  auto close = [](const std::vector<float>& actual, const std::vector<float>& expected) {
    double worst = 0, largest = 0;
    for (size_t i = 0; i < expected.size(); ++i) {
      worst = std::max(worst, std::fabs(static_cast<double>(actual[i]) - expected[i]));
      largest = std::max(largest, std::fabs(static_cast<double>(expected[i])));
    }
    return worst <= 1e-5 * largest;
  };
  for (int64_t block : {8, 5, 64}) {
    CAPTURE(block);
    const longseq::BlockedAttentionLayout layout(T, NQ, NKV, HD, block);
    longseq::CpuBlockedAttentionOps<float> ops;
    std::vector<float> workspace(static_cast<size_t>(std::max(layout.forward_elements(4), layout.backward_elements(4))));
    std::vector<float> blocked_out(q.size()), blocked_lse(lse.size()), blocked_delta(lse.size());
    longseq::blocked_attention_forward(ops, blocked_out.data(), blocked_lse.data(), q.data(), k.data(), v.data(), positions.data(),
                                       positions.data(), layout, workspace.data());
    CHECK(close(blocked_out, out));
    CHECK(close(blocked_lse, lse));
    // Backward adds into what is there: start from ones to see it add.
    std::vector<float> bdq(q.size(), 1.0f), bdk(k.size(), 1.0f), bdv(v.size(), 1.0f);
    longseq::blocked_attention_backward(ops, bdq.data(), bdk.data(), bdv.data(), blocked_delta.data(), dout.data(), q.data(), k.data(),
                                        v.data(), out.data(), lse.data(), positions.data(), positions.data(), layout, workspace.data());
    for (auto* values : {&bdq, &bdk, &bdv})
      for (float& value : *values) value -= 1.0f;
    CHECK(close(bdq, dq));
    CHECK(close(bdk, dk));
    CHECK(close(bdv, dv));
    CHECK(close(blocked_delta, delta));
  }
}
