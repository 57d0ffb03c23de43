// gpu_kernels: every CUDA kernel (kernels/cuda/kernels.hpp), forward and backward, against the CPU
// kernel on the same random inputs. Inputs are drawn, rounded to bf16, and given to both sides
// (the CPU in fp32), so the difference is the GPU's bf16 output rounding and its summation order:
// tolerances are relative to the largest reference value, 1e-2 for bf16 outputs (bf16 keeps 8
// significant bits, 2^-8 = 0.4% per rounding, a few roundings per op) and 1e-4 for fp32 outputs.
// Exits 77 (CTest: SKIPPED, never passed) when no GPU is visible.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "executor/ulysses.hpp"
#include "kernels/blocked_attention.hpp"
#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/dense.hpp"
#include "kernels/cpu/loss_optimizer.hpp"
#include "kernels/cpu/norm_rope.hpp"
#include "kernels/cuda/device_query.hpp"
#include "kernels/cuda/kernels.hpp"

namespace {

using longseq::Bf16;
namespace cpu = longseq::kernels;
namespace gpu = longseq::cuda;

constexpr double kBf16Tolerance = 1e-2;
constexpr double kFp32Tolerance = 1e-4;

// Random values already representable in bf16.
std::vector<float> random_values(size_t n, float scale, uint32_t seed) {
  std::mt19937 generator(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> values(n);
  for (float& value : values) value = longseq::bf16_to_float(longseq::bf16_from_float(normal(generator)));
  return values;
}
std::vector<Bf16> to_bf16(const std::vector<float>& values) {
  std::vector<Bf16> result(values.size());
  std::transform(values.begin(), values.end(), result.begin(), longseq::bf16_from_float);
  return result;
}
std::vector<float> from_bf16(const std::vector<Bf16>& values) {
  std::vector<float> result(values.size());
  std::transform(values.begin(), values.end(), result.begin(), longseq::bf16_to_float);
  return result;
}

// A device copy of a host vector, freed on scope exit.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(const std::vector<T>& host) : size_(host.size()) {
    data_ = static_cast<T*>(gpu::device_malloc(bytes()));
    gpu::copy_to_device(data_, host.data(), bytes());
  }
  ~DeviceArray() { gpu::device_free(data_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* get() { return data_; }
  std::vector<T> download() const {
    std::vector<T> host(size_);
    gpu::copy_to_host(host.data(), data_, bytes());
    return host;
  }

 private:
  size_t bytes() const { return size_ * sizeof(T); }
  size_t size_;
  T* data_ = nullptr;
};

// max |gpu - reference| / max |reference|
double relative_error(const std::vector<float>& gpu_values, const std::vector<float>& reference) {
  REQUIRE(gpu_values.size() == reference.size());
  double worst = 0, largest = 1e-30;
  for (size_t i = 0; i < reference.size(); ++i) {
    worst = std::max(worst, std::fabs(static_cast<double>(gpu_values[i]) - reference[i]));
    largest = std::max(largest, std::fabs(static_cast<double>(reference[i])));
  }
  return worst / largest;
}

}  // namespace

TEST_CASE("embedding forward and backward (repeated tokens accumulate)") {
  const int64_t T = 37, C = 64, V = 11;
  const auto table = random_values(static_cast<size_t>(V * C), 1.0f, 1);
  const auto dout = random_values(static_cast<size_t>(T * C), 1.0f, 2);
  std::vector<int32_t> tokens(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) tokens[static_cast<size_t>(t)] = static_cast<int32_t>((t * 7) % V);
  std::vector<float> out(static_cast<size_t>(T * C)), dtable(table.size(), 0.0f);
  cpu::embedding_forward(out.data(), tokens.data(), table.data(), T, C);
  cpu::embedding_backward(dtable.data(), dout.data(), tokens.data(), T, C);
  DeviceArray<Bf16> d_table(to_bf16(table)), d_out(std::vector<Bf16>(out.size())), d_dout(to_bf16(dout));
  DeviceArray<int32_t> d_tokens(tokens);
  DeviceArray<float> d_dtable(std::vector<float>(dtable.size(), 0.0f));
  gpu::embedding_forward(d_out.get(), d_tokens.get(), d_table.get(), T, C);
  gpu::embedding_backward(d_dtable.get(), d_dout.get(), d_tokens.get(), T, C);
  CHECK(relative_error(from_bf16(d_out.download()), out) == 0.0);  // a copy
  CHECK(relative_error(d_dtable.download(), dtable) <= kFp32Tolerance);
}

TEST_CASE("RMSNorm forward and backward") {
  const int64_t T = 19, C = 1000;  // C not a multiple of the block: the strided loops' tails
  const auto inp = random_values(static_cast<size_t>(T * C), 1.0f, 3), weight = random_values(static_cast<size_t>(C), 1.0f, 4);
  const auto dout = random_values(static_cast<size_t>(T * C), 1.0f, 5);
  std::vector<float> out(inp.size()), rstd(static_cast<size_t>(T)), dinp(inp.size(), 0.0f), dweight(weight.size(), 0.0f);
  cpu::rmsnorm_forward(out.data(), rstd.data(), inp.data(), weight.data(), T, C, 1e-5f);
  cpu::rmsnorm_backward(dinp.data(), dweight.data(), dout.data(), inp.data(), weight.data(), rstd.data(), T, C);
  DeviceArray<Bf16> d_inp(to_bf16(inp)), d_weight(to_bf16(weight)), d_out(std::vector<Bf16>(out.size())), d_dout(to_bf16(dout)),
      d_dinp(std::vector<Bf16>(dinp.size(), 0));
  DeviceArray<float> d_rstd(rstd), d_dweight(std::vector<float>(dweight.size(), 0.0f));
  gpu::rmsnorm_forward(d_out.get(), d_rstd.get(), d_inp.get(), d_weight.get(), T, C, 1e-5f);
  gpu::rmsnorm_backward(d_dinp.get(), d_dweight.get(), d_dout.get(), d_inp.get(), d_weight.get(), d_rstd.get(), T, C);
  CHECK(relative_error(from_bf16(d_out.download()), out) <= kBf16Tolerance);
  CHECK(relative_error(d_rstd.download(), rstd) <= kFp32Tolerance);
  CHECK(relative_error(from_bf16(d_dinp.download()), dinp) <= kBf16Tolerance);
  CHECK(relative_error(d_dweight.download(), dweight) <= kFp32Tolerance);
}

TEST_CASE("rotary embedding forward and backward, positions restarting per document") {
  const int64_t T = 33, NH = 4, HD = 64;
  const auto inp = random_values(static_cast<size_t>(T * NH * HD), 1.0f, 6), dout = random_values(inp.size(), 1.0f, 7);
  std::vector<int32_t> positions(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) positions[static_cast<size_t>(t)] = static_cast<int32_t>(t < 20 ? t * 1000 : t - 20);
  std::vector<float> out(inp.size()), dinp(inp.size(), 0.0f);
  cpu::rope_forward(out.data(), inp.data(), positions.data(), T, NH, HD, 500000.0);
  cpu::rope_backward(dinp.data(), dout.data(), positions.data(), T, NH, HD, 500000.0);
  DeviceArray<Bf16> d_inp(to_bf16(inp)), d_out(std::vector<Bf16>(out.size())), d_dout(to_bf16(dout)), d_dinp(std::vector<Bf16>(dinp.size(), 0));
  DeviceArray<int32_t> d_positions(positions);
  gpu::rope_forward(d_out.get(), d_inp.get(), d_positions.get(), T, NH, HD, 500000.0);
  gpu::rope_backward(d_dinp.get(), d_dout.get(), d_positions.get(), T, NH, HD, 500000.0);
  CHECK(relative_error(from_bf16(d_out.download()), out) <= kBf16Tolerance);
  CHECK(relative_error(from_bf16(d_dinp.download()), dinp) <= kBf16Tolerance);
}

TEST_CASE("SwiGLU forward and backward") {
  const int64_t N = 5000;
  const auto gate = random_values(static_cast<size_t>(N), 2.0f, 8), up = random_values(gate.size(), 1.0f, 9), dout = random_values(gate.size(), 1.0f, 10);
  std::vector<float> out(gate.size()), dgate(gate.size(), 0.0f), dup(gate.size(), 0.0f);
  cpu::swiglu_forward(out.data(), gate.data(), up.data(), N);
  cpu::swiglu_backward(dgate.data(), dup.data(), dout.data(), gate.data(), up.data(), N);
  DeviceArray<Bf16> d_gate(to_bf16(gate)), d_up(to_bf16(up)), d_dout(to_bf16(dout)), d_out(std::vector<Bf16>(out.size())),
      d_dgate(std::vector<Bf16>(gate.size(), 0)), d_dup(std::vector<Bf16>(gate.size(), 0));
  gpu::swiglu_forward(d_out.get(), d_gate.get(), d_up.get(), N);
  gpu::swiglu_backward(d_dgate.get(), d_dup.get(), d_dout.get(), d_gate.get(), d_up.get(), N);
  CHECK(relative_error(from_bf16(d_out.download()), out) <= kBf16Tolerance);
  CHECK(relative_error(from_bf16(d_dgate.download()), dgate) <= kBf16Tolerance);
  CHECK(relative_error(from_bf16(d_dup.download()), dup) <= kBf16Tolerance);
}

TEST_CASE("cross entropy forward and backward with ignored labels") {
  const int64_t T = 23, V = 3001;
  const auto logits = random_values(static_cast<size_t>(T * V), 3.0f, 11);
  std::vector<int32_t> labels(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) labels[static_cast<size_t>(t)] = t % 5 == 0 ? cpu::kIgnoreIndex : static_cast<int32_t>((t * 131) % V);
  const float scale = 1.0f / 18.0f;  // 18 counted tokens
  std::vector<float> losses(static_cast<size_t>(T)), dlogits(logits.size(), 0.0f);
  cpu::cross_entropy_forward(losses.data(), logits.data(), labels.data(), T, V);
  cpu::cross_entropy_backward(dlogits.data(), logits.data(), labels.data(), scale, T, V);
  DeviceArray<Bf16> d_logits(to_bf16(logits)), d_dlogits(std::vector<Bf16>(logits.size(), 0));
  DeviceArray<int32_t> d_labels(labels);
  DeviceArray<float> d_losses(std::vector<float>(losses.size(), -1.0f));
  gpu::cross_entropy_forward(d_losses.get(), d_logits.get(), d_labels.get(), T, V);
  gpu::cross_entropy_backward(d_dlogits.get(), d_logits.get(), d_labels.get(), scale, T, V);
  CHECK(relative_error(d_losses.download(), losses) <= kFp32Tolerance);
  CHECK(relative_error(from_bf16(d_dlogits.download()), dlogits) <= kBf16Tolerance);
}

TEST_CASE("AdamW: fp32 master weights, moments and the bf16 copy") {
  const int64_t N = 4099;
  auto params = random_values(static_cast<size_t>(N), 1.0f, 12);
  const auto grads = random_values(params.size(), 0.1f, 13);
  std::vector<float> m(params.size(), 0.0f), v(params.size(), 0.0f);
  DeviceArray<float> d_params(params), d_grads(grads), d_m(m), d_v(v);
  DeviceArray<Bf16> d_copy(std::vector<Bf16>(params.size(), 0));
  for (int64_t step = 1; step <= 3; ++step) {
    cpu::adamw_update(params.data(), grads.data(), m.data(), v.data(), N, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step);
    gpu::adamw_update(d_params.get(), d_copy.get(), d_grads.get(), d_m.get(), d_v.get(), N, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step);
  }
  CHECK(relative_error(d_params.download(), params) <= kFp32Tolerance);
  CHECK(relative_error(d_m.download(), m) <= kFp32Tolerance);
  CHECK(relative_error(d_v.download(), v) <= kFp32Tolerance);
  CHECK(relative_error(from_bf16(d_copy.download()), params) <= kBf16Tolerance);
}

TEST_CASE("linear forward and backward through cuBLAS (bf16 in, fp32 accumulation)") {
  const int64_t T = 45, C = 96, OC = 80;  // no dimension a multiple of another: transposes are checked
  const auto inp = random_values(static_cast<size_t>(T * C), 1.0f, 14), weight = random_values(static_cast<size_t>(OC * C), 0.1f, 15);
  const auto dout = random_values(static_cast<size_t>(T * OC), 1.0f, 16);
  // Backward adds: start both gradients from non-zero values.
  const auto dinp_start = random_values(inp.size(), 1.0f, 17), dweight_start = random_values(weight.size(), 1.0f, 18);
  std::vector<float> out(static_cast<size_t>(T * OC)), dinp = dinp_start, dweight = dweight_start;
  cpu::linear_forward(out.data(), inp.data(), weight.data(), static_cast<const float*>(nullptr), T, C, OC);
  cpu::linear_backward(dinp.data(), dweight.data(), static_cast<float*>(nullptr), dout.data(), inp.data(), weight.data(), T, C, OC);
  gpu::Blas blas;
  DeviceArray<Bf16> d_inp(to_bf16(inp)), d_weight(to_bf16(weight)), d_dout(to_bf16(dout)), d_out(std::vector<Bf16>(out.size())),
      d_dinp(to_bf16(dinp_start));
  DeviceArray<float> d_dweight(dweight_start);
  blas.linear_forward(d_out.get(), d_inp.get(), d_weight.get(), T, C, OC);
  blas.linear_backward(d_dinp.get(), d_dweight.get(), d_dout.get(), d_inp.get(), d_weight.get(), T, C, OC);
  CHECK(relative_error(from_bf16(d_out.download()), out) <= kBf16Tolerance);
  CHECK(relative_error(from_bf16(d_dinp.download()), dinp) <= kBf16Tolerance);
  CHECK(relative_error(d_dweight.download(), dweight) <= kFp32Tolerance);
}

static void attention_check(int64_t HD) {
  CAPTURE(HD);
  const int64_t T = 70, NQ = 4, NKV = 2;
  const auto q = random_values(static_cast<size_t>(T * NQ * HD), 1.0f, 19), dout = random_values(q.size(), 1.0f, 20);
  const auto k = random_values(static_cast<size_t>(T * NKV * HD), 1.0f, 21), v = random_values(k.size(), 1.0f, 22);
  std::vector<int32_t> positions(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) positions[static_cast<size_t>(t)] = static_cast<int32_t>(t < 41 ? t : t - 41);
  std::vector<float> out(q.size()), lse(static_cast<size_t>(NQ * T)), dq(q.size(), 0.0f), dk(k.size(), 0.0f), dv(k.size(), 0.0f);
  cpu::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), positions.data(), T, NQ, NKV, HD, 16);
  // The GPU backward reads the GPU's bf16 output; the reference gets the same rounded output.
  DeviceArray<Bf16> d_q(to_bf16(q)), d_k(to_bf16(k)), d_v(to_bf16(v)), d_out(std::vector<Bf16>(out.size())), d_dout(to_bf16(dout)),
      d_dq(std::vector<Bf16>(dq.size(), 0)), d_dk(std::vector<Bf16>(dk.size(), 0)), d_dv(std::vector<Bf16>(dv.size(), 0));
  DeviceArray<int32_t> d_positions(positions);
  DeviceArray<float> d_lse(lse), d_delta(lse);
  gpu::attention_forward(d_out.get(), d_lse.get(), d_q.get(), d_k.get(), d_v.get(), d_positions.get(), T, NQ, NKV, HD);
  const std::vector<float> gpu_out = from_bf16(d_out.download());
  CHECK(relative_error(gpu_out, out) <= kBf16Tolerance);
  CHECK(relative_error(d_lse.download(), lse) <= kFp32Tolerance);
  std::vector<float> delta(lse.size());
  cpu::attention_backward(dq.data(), dk.data(), dv.data(), delta.data(), dout.data(), q.data(), k.data(), v.data(), gpu_out.data(), lse.data(),
                          positions.data(), T, NQ, NKV, HD, 16);
  gpu::attention_backward(d_dq.get(), d_dk.get(), d_dv.get(), d_delta.get(), d_dout.get(), d_q.get(), d_k.get(), d_v.get(), d_out.get(),
                          d_lse.get(), d_positions.get(), T, NQ, NKV, HD);
  CHECK(relative_error(from_bf16(d_dq.download()), dq) <= kBf16Tolerance);
  CHECK(relative_error(from_bf16(d_dk.download()), dk) <= kBf16Tolerance);
  CHECK(relative_error(from_bf16(d_dv.download()), dv) <= kBf16Tolerance);
  // The blocked kernel (kernels/blocked_attention.hpp, what the executor runs) against the same
  // references: blocks that do not divide T (16), and one block for all of it (128). Its backward
  // reads the forward's output and lse as the references did.
  gpu::Blas blas;
  for (int64_t block : {16, 128}) {
    CAPTURE(block);
    const longseq::BlockedAttentionLayout layout(T, NQ, NKV, HD, block);
    DeviceArray<float> workspace(std::vector<float>(static_cast<size_t>(std::max(layout.forward_elements(2), layout.backward_elements(2))))),
        b_lse(lse), b_delta(lse);
    DeviceArray<Bf16> b_out(std::vector<Bf16>(out.size())), b_dq(std::vector<Bf16>(dq.size(), 0)), b_dk(std::vector<Bf16>(dk.size(), 0)),
        b_dv(std::vector<Bf16>(dv.size(), 0));
    blas.attention_forward(b_out.get(), b_lse.get(), d_q.get(), d_k.get(), d_v.get(), d_positions.get(), T, NQ, NKV, HD, block,
                           workspace.get());
    CHECK(relative_error(from_bf16(b_out.download()), out) <= kBf16Tolerance);
    CHECK(relative_error(b_lse.download(), lse) <= kFp32Tolerance);
    blas.attention_backward(b_dq.get(), b_dk.get(), b_dv.get(), b_delta.get(), d_dout.get(), d_q.get(), d_k.get(), d_v.get(), d_out.get(),
                            d_lse.get(), d_positions.get(), T, NQ, NKV, HD, block, workspace.get());
    CHECK(relative_error(from_bf16(b_dq.download()), dq) <= kBf16Tolerance);
    CHECK(relative_error(from_bf16(b_dk.download()), dk) <= kBf16Tolerance);
    CHECK(relative_error(from_bf16(b_dv.download()), dv) <= kBf16Tolerance);
  }
}

TEST_CASE("attention forward and backward: GQA, two packed documents") {
  attention_check(64);  // two channels per lane
  attention_check(16);  // tiny-llama's head_dim: half the lanes idle
}

TEST_CASE("data movement: residual adds, gradient scaling, bf16 weights from fp32 masters") {
  const int64_t N = 1000;
  const auto a = random_values(N, 1.0f, 30), b = random_values(N, 1.0f, 31);
  DeviceArray<Bf16> d_a(to_bf16(a)), d_b(to_bf16(b));
  gpu::add(d_a.get(), d_b.get(), N);
  const std::vector<Bf16> sums = d_a.download();
  for (int64_t i = 0; i < N; ++i)  // the fp32 sum rounded once, as the CPU's bf16 path rounds it
    CHECK(sums[static_cast<size_t>(i)] == longseq::bf16_from_float(a[static_cast<size_t>(i)] + b[static_cast<size_t>(i)]));
  DeviceArray<float> d_f(a), d_g(b);
  gpu::add(d_f.get(), d_g.get(), N);
  gpu::scale(d_f.get(), N, 0.25f);
  const std::vector<float> scaled = d_f.download();
  for (int64_t i = 0; i < N; ++i) CHECK(scaled[static_cast<size_t>(i)] == (a[static_cast<size_t>(i)] + b[static_cast<size_t>(i)]) * 0.25f);
  std::vector<float> masters(N);
  for (int64_t i = 0; i < N; ++i) masters[static_cast<size_t>(i)] = 0.001f * static_cast<float>(i) - 0.37f;  // not bf16-exact
  DeviceArray<float> d_masters(masters);
  DeviceArray<Bf16> d_weights(std::vector<Bf16>(N, 0));
  gpu::bf16_from_master(d_weights.get(), d_masters.get(), N);
  CHECK(d_weights.download() == to_bf16(masters));  // round to nearest even, as bf16.hpp
}

TEST_CASE("Ulysses regrouping: pack and unpack-add match executor/ulysses.hpp, replicated kv heads summed") {
  const int64_t T = 7, HD = 16, sp = 4;
  struct Shape {
    int64_t heads_total;
    longseq::HeadBlocks blocks;
  };
  // q heads (8 over 4 ranks: 2 each) and one kv head replicated on every rank (MQA, sp > NKV).
  for (const Shape& shape : {Shape{8, {2, 1}}, Shape{1, {1, 4}}}) {
    CAPTURE(shape.heads_total);
    const int64_t source_size = T * shape.heads_total * HD, send_size = sp * T * shape.blocks.per_rank * HD;
    const auto source = random_values(static_cast<size_t>(source_size), 1.0f, 32);
    std::vector<float> send(static_cast<size_t>(send_size)), target(static_cast<size_t>(source_size), 0.0f);
    longseq::heads_pack(send.data(), source.data(), T, shape.heads_total, shape.blocks, HD, sp);
    longseq::heads_unpack_add(target.data(), send.data(), T, shape.heads_total, shape.blocks, HD, sp);
    DeviceArray<Bf16> d_source(to_bf16(source)), d_send(std::vector<Bf16>(send.size(), 0)),
        d_target(std::vector<Bf16>(target.size(), 0));
    gpu::heads_pack(d_send.get(), d_source.get(), T, shape.heads_total, shape.blocks.per_rank, shape.blocks.replication, HD, sp);
    gpu::heads_unpack_add(d_target.get(), d_send.get(), T, shape.heads_total, shape.blocks.per_rank, shape.blocks.replication, HD, sp);
    CHECK(from_bf16(d_send.download()) == send);  // a copy of bf16-exact values
    CHECK(relative_error(from_bf16(d_target.download()), target) <= kBf16Tolerance);
  }
}

int main(int argc, char** argv) {
  const longseq::CudaDeviceInfo info = longseq::cuda_device_query();
  if (info.device_count == 0) {
    std::printf("SKIPPED: no CUDA device visible (%s)\n", info.error.empty() ? "none found" : info.error.c_str());
    return 77;
  }
  std::printf("GPU kernels against the CPU kernels on %s\n", info.name.c_str());
  doctest::Context context(argc, argv);
  return context.run();
}
