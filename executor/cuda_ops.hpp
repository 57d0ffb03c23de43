// cuda_ops.hpp: what one training step asks of a device (cpu_ops.hpp lists the calls), for a
// GPU: kernels/cuda in bf16 with fp32 accumulation, matrix products through cuBLAS, checkpoint
// copies on a side stream ordered by events. Every kernel and cuBLAS call runs on the default
// stream; a copy to or from the host pool runs on the side stream after the default stream's
// work so far, and `copy_wait` makes the default stream's later work wait for it, so the next
// layer computes while a checkpoint moves (the ALST paper's blocking copy is what this replaces).
// Plain C++ (the CUDA runtime behind it in cuda_ops.cpp). Compiles here; not run on a GPU yet.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <utility>
#include <vector>

#include "executor/ulysses.hpp"
#include "kernels/blocked_attention.hpp"
#include "kernels/cuda/kernels.hpp"

namespace longseq {

// Device memory beside the arena (the step's int32 inputs, checkpoint gathers): move-only.
template <typename T>
class DeviceVector {
 public:
  DeviceVector() = default;
  explicit DeviceVector(int64_t n) : size_(n) {
    if (n > 0) data_ = static_cast<T*>(cuda::device_malloc(static_cast<size_t>(n) * sizeof(T)));
  }
  DeviceVector(DeviceVector&& other) noexcept { *this = std::move(other); }
  DeviceVector& operator=(DeviceVector&& other) noexcept {
    if (this != &other) {
      cuda::device_free(data_);
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  DeviceVector(const DeviceVector&) = delete;
  DeviceVector& operator=(const DeviceVector&) = delete;
  ~DeviceVector() { cuda::device_free(data_); }
  T* data() { return data_; }
  const T* data() const { return data_; }
  int64_t size() const { return size_; }

 private:
  T* data_ = nullptr;
  int64_t size_ = 0;
};

class CudaOps {
 public:
  using Act = Bf16;
  static constexpr const char* kDevice = "cuda";
  // bf16 weights for the kernels, fp32 master weights for AdamW (DeepSpeed's bf16 mode).
  static constexpr bool kSeparateMasterWeights = true;

  CudaOps();
  ~CudaOps();
  CudaOps(const CudaOps&) = delete;
  CudaOps& operator=(const CudaOps&) = delete;

  // ---- kernels ----
  void embedding_forward(Act* out, const int32_t* tokens, const Act* table, int64_t T, int64_t C) {
    cuda::embedding_forward(out, tokens, table, T, C);
  }
  void embedding_backward(float* dtable, const Act* dout, const int32_t* tokens, int64_t T, int64_t C) {
    cuda::embedding_backward(dtable, dout, tokens, T, C);
  }
  void rmsnorm_forward(Act* out, float* rstd, const Act* inp, const Act* weight, int64_t T, int64_t C, float eps) {
    cuda::rmsnorm_forward(out, rstd, inp, weight, T, C, eps);
  }
  void rmsnorm_backward(Act* dinp, float* dweight, const Act* dout, const Act* inp, const Act* weight, const float* rstd, int64_t T,
                        int64_t C) {
    cuda::rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, T, C);
  }
  void rope_forward(Act* out, const Act* inp, const int32_t* positions, int64_t T, int64_t NH, int64_t HD, double theta) {
    cuda::rope_forward(out, inp, positions, T, NH, HD, theta);
  }
  void rope_backward(Act* dinp, const Act* dout, const int32_t* positions, int64_t T, int64_t NH, int64_t HD, double theta) {
    cuda::rope_backward(dinp, dout, positions, T, NH, HD, theta);
  }
  void linear_forward(Act* out, const Act* inp, const Act* weight, int64_t T, int64_t C, int64_t OC) {
    blas_.linear_forward(out, inp, weight, T, C, OC);
  }
  // Mixture of experts (kernels/cuda/kernels.hpp).
  void moe_route(float* weights, int32_t* indices, float* probs, const Act* logits, int64_t T, int64_t E, int64_t k, bool normalize) {
    cuda::moe_route(weights, indices, probs, logits, T, E, k, normalize);
  }
  void moe_route_backward(Act* dlogits, const float* dweights, const float* probs, const float* weights, const int32_t* indices, int64_t T,
                          int64_t E, int64_t k, bool normalize) {
    cuda::moe_route_backward(dlogits, dweights, probs, weights, indices, T, E, k, normalize);
  }
  void moe_gather(Act* rows, const Act* x, const int32_t* order, int64_t R, int64_t C) { cuda::moe_gather(rows, x, order, R, C); }
  void moe_gather_backward(Act* dx, const Act* drows, const int32_t* position, int64_t T, int64_t k, int64_t C) {
    cuda::moe_gather_backward(dx, drows, position, T, k, C);
  }
  void moe_combine(Act* out, const Act* rows, const int32_t* position, const float* weights, int64_t T, int64_t k, int64_t C) {
    cuda::moe_combine(out, rows, position, weights, T, k, C);
  }
  void moe_combine_backward(Act* drows, float* dweights, const Act* dout, const Act* rows, const int32_t* position, const float* weights,
                            int64_t T, int64_t k, int64_t C) {
    cuda::moe_combine_backward(drows, dweights, dout, rows, position, weights, T, k, C);
  }
  void moe_shared_gate_forward(Act* out, const Act* shared, const Act* gate, int64_t T, int64_t C) {
    cuda::moe_shared_gate_forward(out, shared, gate, T, C);
  }
  void moe_shared_gate_backward(Act* dshared, Act* dgate, const Act* dout, const Act* shared, const Act* gate, int64_t T, int64_t C) {
    cuda::moe_shared_gate_backward(dshared, dgate, dout, shared, gate, T, C);
  }
  void linear_forward_add(Act* out, const Act* inp, const Act* weight, int64_t T, int64_t C, int64_t OC, float alpha) {
    blas_.linear_forward_add(out, inp, weight, alpha, T, C, OC);
  }
  void linear_backward(Act* dinp, float* dweight, const Act* dout, const Act* inp, const Act* weight, int64_t T, int64_t C, int64_t OC,
                       float alpha = 1.0f) {
    blas_.linear_backward(dinp, dweight, dout, inp, weight, T, C, OC, alpha);
  }
  void swiglu_forward(Act* out, const Act* gate, const Act* up, int64_t N) { cuda::swiglu_forward(out, gate, up, N); }
  void swiglu_backward(Act* dgate, Act* dup, const Act* dout, const Act* gate, const Act* up, int64_t N) {
    cuda::swiglu_backward(dgate, dup, dout, gate, up, N);
  }
  // Blocked attention (kernels/blocked_attention.hpp) in kGpuAttentionBlockTokens blocks, its
  // workspace from the arena; `block` is the CPU kernel's tile and does not apply here.
  int64_t attention_workspace_elements(int64_t T, int64_t NQ, int64_t NKV, int64_t HD, bool backward) const {
    return BlockedAttentionLayout(T, NQ, NKV, HD, kGpuAttentionBlockTokens).workspace_elements(sizeof(Act), backward);
  }
  void attention_forward(Act* out, float* lse, const Act* q, const Act* k, const Act* v, const int32_t* positions, int64_t T,
                         int64_t NQ, int64_t NKV, int64_t HD, int64_t /*block*/, float* workspace) {
    blas_.attention_forward(out, lse, q, k, v, positions, T, NQ, NKV, HD, kGpuAttentionBlockTokens, workspace);
  }
  void attention_backward(Act* dq, Act* dk, Act* dv, float* delta_scratch, const Act* dout, const Act* q, const Act* k, const Act* v,
                          const Act* out, const float* lse, const int32_t* positions, int64_t T, int64_t NQ, int64_t NKV, int64_t HD,
                          int64_t /*block*/, float* workspace) {
    blas_.attention_backward(dq, dk, dv, delta_scratch, dout, q, k, v, out, lse, positions, T, NQ, NKV, HD, kGpuAttentionBlockTokens,
                             workspace);
  }
  // FPDT's chunk pairs: the blocked attention over a query range and a key range, the merge of a
  // pair's output into the fp32 accumulator, and the fp32 gradient accumulators.
  void attention_chunk_forward(Act* out, float* lse, const Act* q, const Act* k, const Act* v, const int32_t* positions, int64_t q_begin,
                               int64_t Tq, int64_t k_begin, int64_t Tk, int64_t NQ, int64_t NKV, int64_t HD, int64_t /*block*/,
                               float* workspace) {
    blas_.attention_forward_range(out, lse, q, k, v, positions, q_begin, Tq, k_begin, Tk, NQ, NKV, HD, kGpuAttentionBlockTokens, workspace);
  }
  void attention_softmax_delta(float* delta, const Act* dout, const Act* out, int64_t T, int64_t NQ, int64_t HD) {
    blas_.attention_softmax_delta(delta, dout, out, T, NQ, HD);
  }
  void attention_chunk_backward(Act* dq, Act* dk, Act* dv, const float* delta, const Act* dout, const Act* q, const Act* k, const Act* v,
                                const float* lse, const int32_t* positions, int64_t q_begin, int64_t Tq, int64_t k_begin, int64_t Tk,
                                int64_t NQ, int64_t NKV, int64_t HD, int64_t /*block*/, float* workspace) {
    blas_.attention_backward_range(dq, dk, dv, delta, dout, q, k, v, lse, positions, q_begin, Tq, k_begin, Tk, NQ, NKV, HD,
                                   kGpuAttentionBlockTokens, workspace);
  }
  void attention_merge(float* accumulator, float* accumulator_lse, const Act* part, const float* part_lse, int64_t T, int64_t NQ,
                       int64_t HD) {
    cuda::attention_merge(accumulator, accumulator_lse, part, part_lse, T, NQ, HD);
  }
  void accumulator_to_act(Act* out, const float* accumulator, int64_t n) { cuda::bf16_from_master(out, accumulator, n); }
  void accumulate(float* accumulator, const Act* part, int64_t n) { cuda::accumulate_bf16(accumulator, part, n); }
  void fill_value(float* data, int64_t n, float value) { cuda::fill(data, n, value); }
  void cross_entropy_forward(float* losses, const Act* logits, const int32_t* labels, int64_t T, int64_t V) {
    cuda::cross_entropy_forward(losses, logits, labels, T, V);
  }
  void cross_entropy_backward(Act* dlogits, const Act* logits, const int32_t* labels, float loss_scale, int64_t T, int64_t V) {
    cuda::cross_entropy_backward(dlogits, logits, labels, loss_scale, T, V);
  }
  // AdamW on the fp32 master weights, writing the bf16 weights the kernels read.
  void adamw_update(float* master, Act* weights, const float* grads, float* m, float* v, int64_t N, float lr, float beta1, float beta2,
                    float eps, float weight_decay, int64_t step) {
    cuda::adamw_update(master, weights, grads, m, v, N, lr, beta1, beta2, eps, weight_decay, step);
  }

  // ---- element-wise and data movement on device buffers ----
  void add(Act* inout, const Act* addend, int64_t n) { cuda::add(inout, addend, n); }
  void add(float* inout, const float* addend, int64_t n) { cuda::add(inout, addend, n); }
  template <typename T>
  void copy(T* destination, const T* source, int64_t n) {
    cuda::copy_device(destination, source, static_cast<size_t>(n) * sizeof(T));
  }
  void fill_zero(float* data, int64_t n) { cuda::device_memset_zero(data, static_cast<size_t>(n) * sizeof(float)); }
  void fill_zero(Act* data, int64_t n) { cuda::device_memset_zero(data, static_cast<size_t>(n) * sizeof(Act)); }
  // The pure-bf16 regime: a module's fp32 gradient added into the bf16 gradients; AdamW on bf16.
  void gradient_add_to_act(Act* gradients, const float* module_gradient, int64_t n) { cuda::add(gradients, module_gradient, n); }
  void adamw_update_act(Act* params, const Act* grads, Act* m, Act* v, int64_t N, float lr, float beta1, float beta2, float eps,
                        float weight_decay, int64_t step) {
    cuda::adamw_update_bf16(params, grads, m, v, N, lr, beta1, beta2, eps, weight_decay, step);
  }
  void scale(float* data, int64_t n, float factor) { cuda::scale(data, n, factor); }
  void heads_pack(Act* send, const Act* source, int64_t tokens, int64_t heads_total, HeadBlocks blocks, int64_t HD, int64_t sp) {
    cuda::heads_pack(send, source, tokens, heads_total, blocks.per_rank, blocks.replication, HD, sp);
  }
  void heads_unpack_add(Act* target, const Act* recv, int64_t tokens, int64_t heads_total, HeadBlocks blocks, int64_t HD, int64_t sp) {
    cuda::heads_unpack_add(target, recv, tokens, heads_total, blocks.per_rank, blocks.replication, HD, sp);
  }
  // Sum of n device values on the host, in double and index order (as the CPU path sums).
  double sum(const float* values, int64_t n) {
    std::vector<float> host(static_cast<size_t>(n));
    to_host(host.data(), values, n);
    return std::accumulate(host.begin(), host.end(), 0.0);
  }

  // ---- between the host and the device ----
  template <typename T>
  using Scratch = DeviceVector<T>;
  template <typename T>
  Scratch<T> scratch(int64_t n) {
    return Scratch<T>(n);
  }
  // Synchronous copies (after the default stream's queued work).
  template <typename T>
  void to_device(T* device, const T* host, int64_t n) {
    cuda::copy_to_device(device, host, static_cast<size_t>(n) * sizeof(T));
  }
  template <typename T>
  void to_host(T* host, const T* device, int64_t n) {
    cuda::copy_to_host(host, device, static_cast<size_t>(n) * sizeof(T));
  }
  void weights_from_master(Act* weights, const float* master, int64_t n) { cuda::bf16_from_master(weights, master, n); }
  // From master weights in host memory (the optimizer offloaded): staged to the device in pieces
  // of 64 Mi values (256 MiB), each rounded to bf16 there.
  void weights_from_host_master(Act* weights, const float* host_master, int64_t n) {
    constexpr int64_t kPiece = int64_t{1} << 26;
    DeviceVector<float> staged(std::min(n, kPiece));
    for (int64_t start = 0; start < n; start += kPiece) {
      const int64_t count = std::min(kPiece, n - start);
      to_device(staged.data(), host_master + start, count);
      cuda::bf16_from_master(weights + start, staged.data(), count);
    }
  }

  // A copy in flight on the side stream, with the event that marks its end (move-only).
  class PendingCopy {
   public:
    PendingCopy() = default;
    explicit PendingCopy(void* done) : done_(done) {}
    PendingCopy(PendingCopy&& other) noexcept : done_(std::exchange(other.done_, nullptr)) {}
    PendingCopy& operator=(PendingCopy&& other) noexcept;
    PendingCopy(const PendingCopy&) = delete;
    PendingCopy& operator=(const PendingCopy&) = delete;
    ~PendingCopy();
    void* event() const { return done_; }

   private:
    void* done_ = nullptr;  // cudaEvent_t
  };
  PendingCopy copy_to_host_begin(Act* host, const Act* device, int64_t n);
  PendingCopy copy_to_device_begin(Act* device, const Act* host, int64_t n);
  // The default stream's later work waits for the copy (the host does not).
  void copy_wait(PendingCopy& copy);
  // The host waits for the copy.
  void copy_finish(PendingCopy& copy);
  void synchronize() { cuda::device_synchronize(); }

 private:
  PendingCopy copy_begin(void* destination, const void* source, size_t bytes, bool to_host);
  cuda::Blas blas_;
  void* side_stream_ = nullptr;  // cudaStream_t
};

}  // namespace longseq
