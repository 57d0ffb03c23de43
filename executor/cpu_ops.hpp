// cpu_ops.hpp: what one training step asks of a device, for the CPU: the kernels of kernels/cpu
// in fp32, element-wise data movement, and copies to and from the host pool.
//
// The training step (executor/llama_step.hpp) is written once against this set of calls; the GPU
// supplies the same calls over CUDA kernels and cuBLAS (executor/cuda_ops.hpp). `Act` is the type
// activations and weights are stored in (float here, bf16 on the GPU); what accumulates (weight
// gradients, RMSNorm's rstd, attention's lse and delta, per-token losses, the AdamW master
// weights and moments) is float on both. Kernel conventions are kernels/cpu/dense.hpp's: outputs
// first, backward adds into every gradient.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include "executor/component_seconds.hpp"
#include "executor/ulysses.hpp"
#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/dense.hpp"
#include "kernels/cpu/loss_optimizer.hpp"
#include "kernels/cpu/moe.hpp"
#include "kernels/cpu/norm_rope.hpp"

namespace longseq {

// What every Ops whose "device" is host memory shares: copies, fp32 arithmetic on gradients,
// host vectors as scratch, and checkpoint copies that finish at once (CpuOps; the tests' bf16
// emulation). On the GPU (CudaOps) each of these is a CUDA call instead.
class HostMemoryMovement {
 public:
  void add(float* inout, const float* addend, int64_t n) {
    for (int64_t i = 0; i < n; ++i) inout[i] += addend[i];
  }
  template <typename T>
  void copy(T* destination, const T* source, int64_t n) {
    std::copy_n(source, n, destination);
  }
  void fill_zero(float* data, int64_t n) { std::fill_n(data, n, 0.0f); }
  // Ulysses' regrouping before an all-to-all: a copy, whatever the element type.
  template <typename T>
  void heads_pack(T* send, const T* source, int64_t tokens, int64_t heads_total, HeadBlocks blocks, int64_t HD, int64_t sp) {
    longseq::heads_pack(send, source, tokens, heads_total, blocks, HD, sp);
  }
  void fill_value(float* data, int64_t n, float value) { std::fill_n(data, n, value); }
  void scale(float* data, int64_t n, float factor) {
    for (int64_t i = 0; i < n; ++i) data[i] *= factor;
  }
  // Sum of n device values, on the host, accumulated in double in index order.
  double sum(const float* values, int64_t n) { return std::accumulate(values, values + n, 0.0); }

  // Memory the step needs beside the arena (its int32 inputs, checkpoint gathers): here a host
  // vector; on the GPU device memory outside the arena's accounting.
  template <typename T>
  using Scratch = std::vector<T>;
  template <typename T>
  Scratch<T> scratch(int64_t n) {
    return Scratch<T>(static_cast<size_t>(n));
  }
  template <typename T>
  void to_device(T* device, const T* host, int64_t n) {
    std::copy_n(host, n, device);
  }
  template <typename T>
  void to_host(T* host, const T* device, int64_t n) {
    std::copy_n(device, n, host);
  }

  // Checkpoint offload between the device and the host pool. On the GPU a copy runs on a side
  // stream and `copy_wait` makes later device work wait for it; here copies finish at once.
  struct PendingCopy {};
  template <typename T>
  PendingCopy copy_to_host_begin(T* host, const T* device, int64_t n) {
    const ComponentTimer timer(&ComponentSeconds::host_copies);
    std::copy_n(device, n, host);
    return {};
  }
  template <typename T>
  PendingCopy copy_to_device_begin(T* device, const T* host, int64_t n) {
    const ComponentTimer timer(&ComponentSeconds::host_copies);
    std::copy_n(host, n, device);
    return {};
  }
  // Device work issued after this call runs after the copy.
  void copy_wait(PendingCopy&) {}
  // The host waits for the copy (before reusing its host memory).
  void copy_finish(PendingCopy&) {}
  // The host waits for every queued device operation (for timing a step).
  void synchronize() {}
};

class CpuOps : public HostMemoryMovement {
 public:
  using Act = float;
  static constexpr const char* kDevice = "cpu";
  // The fp32 weights are the master weights: no second copy to keep in step.
  static constexpr bool kSeparateMasterWeights = false;

  // ---- kernels ----
  void embedding_forward(Act* out, const int32_t* tokens, const Act* table, int64_t T, int64_t C) {
    kernels::embedding_forward(out, tokens, table, T, C);
  }
  void embedding_backward(float* dtable, const Act* dout, const int32_t* tokens, int64_t T, int64_t C) {
    kernels::embedding_backward(dtable, dout, tokens, T, C);
  }
  void rmsnorm_forward(Act* out, float* rstd, const Act* inp, const Act* weight, int64_t T, int64_t C, float eps) {
    kernels::rmsnorm_forward(out, rstd, inp, weight, T, C, eps);
  }
  void rmsnorm_backward(Act* dinp, float* dweight, const Act* dout, const Act* inp, const Act* weight, const float* rstd, int64_t T,
                        int64_t C) {
    kernels::rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, T, C);
  }
  void rope_forward(Act* out, const Act* inp, const int32_t* positions, int64_t T, int64_t NH, int64_t HD, double theta) {
    kernels::rope_forward(out, inp, positions, T, NH, HD, theta);
  }
  void rope_backward(Act* dinp, const Act* dout, const int32_t* positions, int64_t T, int64_t NH, int64_t HD, double theta) {
    kernels::rope_backward(dinp, dout, positions, T, NH, HD, theta);
  }
  void linear_forward(Act* out, const Act* inp, const Act* weight, int64_t T, int64_t C, int64_t OC) {
    const ComponentTimer timer(&ComponentSeconds::matmul);
    kernels::linear_forward(out, inp, weight, static_cast<const Act*>(nullptr), T, C, OC);
  }
  // out += alpha * inp @ weight^T: a LoRA adapter's scaled product added to its base linear's output.
  void linear_forward_add(Act* out, const Act* inp, const Act* weight, int64_t T, int64_t C, int64_t OC, float alpha) {
    const ComponentTimer timer(&ComponentSeconds::matmul);
    kernels::linear_forward_add(out, inp, weight, alpha, T, C, OC);
  }
  // dinp and dweight (either may be null: a frozen weight) gain alpha x their products.
  void linear_backward(Act* dinp, float* dweight, const Act* dout, const Act* inp, const Act* weight, int64_t T, int64_t C, int64_t OC,
                       float alpha = 1.0f) {
    const ComponentTimer timer(&ComponentSeconds::matmul);
    kernels::linear_backward(dinp, dweight, static_cast<float*>(nullptr), dout, inp, weight, T, C, OC, alpha);
  }
  void swiglu_forward(Act* out, const Act* gate, const Act* up, int64_t N) { kernels::swiglu_forward(out, gate, up, N); }
  void swiglu_backward(Act* dgate, Act* dup, const Act* dout, const Act* gate, const Act* up, int64_t N) {
    kernels::swiglu_backward(dgate, dup, dout, gate, up, N);
  }
  // The CPU kernel tiles by `block` with Eigen temporaries of a few block x block tiles: no
  // workspace from the arena.
  int64_t attention_workspace_elements(int64_t /*T*/, int64_t /*NQ*/, int64_t /*NKV*/, int64_t /*HD*/, bool /*backward*/) const { return 0; }
  void attention_forward(Act* out, float* lse, const Act* q, const Act* k, const Act* v, const int32_t* positions, int64_t T,
                         int64_t NQ, int64_t NKV, int64_t HD, int64_t block, float* /*workspace*/) {
    const ComponentTimer timer(&ComponentSeconds::attention);
    kernels::attention_forward(out, lse, q, k, v, positions, T, NQ, NKV, HD, kernels::cpu_attention_tile(block));
  }
  void attention_backward(Act* dq, Act* dk, Act* dv, float* delta_scratch, const Act* dout, const Act* q, const Act* k, const Act* v,
                          const Act* out, const float* lse, const int32_t* positions, int64_t T, int64_t NQ, int64_t NKV, int64_t HD,
                          int64_t block, float* /*workspace*/) {
    const ComponentTimer timer(&ComponentSeconds::attention);
    kernels::attention_backward(dq, dk, dv, delta_scratch, dout, q, k, v, out, lse, positions, T, NQ, NKV, HD, kernels::cpu_attention_tile(block));
  }
  // FPDT's chunked attention (kernels/cpu/attention.hpp's range kernels), in fp32.
  // (The CPU kernels tile by `block` with their own temporaries: no workspace.)
  void attention_chunk_forward(Act* out, float* lse, const Act* q, const Act* k, const Act* v, const int32_t* positions, int64_t q_begin,
                               int64_t Tq, int64_t k_begin, int64_t Tk, int64_t NQ, int64_t NKV, int64_t HD, int64_t block,
                               float* /*workspace*/) {
    const ComponentTimer timer(&ComponentSeconds::attention);
    kernels::attention_forward_range(out, lse, q, k, v, positions, q_begin, Tq, k_begin, Tk, NQ, NKV, HD, kernels::cpu_attention_tile(block));
  }
  void attention_softmax_delta(float* delta, const Act* dout, const Act* out, int64_t T, int64_t NQ, int64_t HD) {
    const ComponentTimer timer(&ComponentSeconds::attention);
    kernels::attention_softmax_delta(delta, dout, out, T, NQ, HD);
  }
  void attention_chunk_backward(Act* dq, Act* dk, Act* dv, const float* delta, const Act* dout, const Act* q, const Act* k, const Act* v,
                                const float* lse, const int32_t* positions, int64_t q_begin, int64_t Tq, int64_t k_begin, int64_t Tk,
                                int64_t NQ, int64_t NKV, int64_t HD, int64_t block, float* /*workspace*/) {
    const ComponentTimer timer(&ComponentSeconds::attention);
    kernels::attention_backward_range(dq, dk, dv, delta, dout, q, k, v, lse, positions, q_begin, Tq, k_begin, Tk, NQ, NKV, HD, kernels::cpu_attention_tile(block));
  }
  void attention_merge(float* accumulator, float* accumulator_lse, const Act* part, const float* part_lse, int64_t T, int64_t NQ,
                       int64_t HD) {
    const ComponentTimer timer(&ComponentSeconds::attention);
    kernels::attention_merge(accumulator, accumulator_lse, part, part_lse, T, NQ, HD);
  }
  // An fp32 accumulator into the activation type, and a part added into an accumulator.
  void accumulator_to_act(Act* out, const float* accumulator, int64_t n) { std::copy_n(accumulator, n, out); }
  void accumulate(float* accumulator, const Act* part, int64_t n) { add(accumulator, part, n); }

  void cross_entropy_forward(float* losses, const Act* logits, const int32_t* labels, int64_t T, int64_t V) {
    kernels::cross_entropy_forward(losses, logits, labels, T, V);
  }
  void cross_entropy_backward(Act* dlogits, const Act* logits, const int32_t* labels, float loss_scale, int64_t T, int64_t V) {
    kernels::cross_entropy_backward(dlogits, logits, labels, loss_scale, T, V);
  }
  // ---- mixture of experts (kernels/cpu/moe.hpp): routing in fp32, rows of the dispatch ----
  void moe_route(float* weights, int32_t* indices, float* probs, const Act* logits, int64_t T, int64_t E, int64_t k, bool normalize) {
    kernels::moe_route(weights, indices, probs, logits, T, E, k, normalize);
  }
  void moe_route_backward(Act* dlogits, const float* dweights, const float* probs, const float* weights, const int32_t* indices, int64_t T,
                          int64_t E, int64_t k, bool normalize) {
    kernels::moe_route_backward(dlogits, dweights, probs, weights, indices, T, E, k, normalize);
  }
  void moe_gather(Act* rows, const Act* x, const int32_t* order, int64_t R, int64_t C) { kernels::moe_gather(rows, x, order, R, C); }
  void moe_gather_backward(Act* dx, const Act* drows, const int32_t* position, int64_t T, int64_t k, int64_t C) {
    kernels::moe_gather_backward(dx, drows, position, T, k, C);
  }
  void moe_combine(Act* out, const Act* rows, const int32_t* position, const float* weights, int64_t T, int64_t k, int64_t C) {
    kernels::moe_combine(out, rows, position, weights, T, k, C);
  }
  void moe_combine_backward(Act* drows, float* dweights, const Act* dout, const Act* rows, const int32_t* position, const float* weights,
                            int64_t T, int64_t k, int64_t C) {
    kernels::moe_combine_backward(drows, dweights, dout, rows, position, weights, T, k, C);
  }
  void moe_shared_gate_forward(Act* out, const Act* shared, const Act* gate, int64_t T, int64_t C) {
    kernels::moe_shared_gate_forward(out, shared, gate, T, C);
  }
  void moe_shared_gate_backward(Act* dshared, Act* dgate, const Act* dout, const Act* shared, const Act* gate, int64_t T, int64_t C) {
    kernels::moe_shared_gate_backward(dshared, dgate, dout, shared, gate, T, C);
  }

  // The pure-bf16 regime's calls, which in fp32 are the plain ones (gradients and moments fp32).
  void gradient_add_to_act(Act* gradients, const float* module_gradient, int64_t n) { add(gradients, module_gradient, n); }
  void adamw_update_act(Act* params, const Act* grads, Act* m, Act* v, int64_t N, float lr, float beta1, float beta2, float eps,
                        float weight_decay, int64_t step) {
    const ComponentTimer timer(&ComponentSeconds::optimizer);
    kernels::adamw_update(params, grads, m, v, N, lr, beta1, beta2, eps, weight_decay, step);
  }

  // AdamW on the fp32 master weights; `weights` (the Act copy the kernels read) is the same
  // storage here.
  void adamw_update(float* master, Act* /*weights*/, const float* grads, float* m, float* v, int64_t N, float lr, float beta1,
                    float beta2, float eps, float weight_decay, int64_t step) {
    const ComponentTimer timer(&ComponentSeconds::optimizer);
    kernels::adamw_update(master, grads, m, v, N, lr, beta1, beta2, eps, weight_decay, step);
  }

  // ---- element-wise and data movement (the rest, add included, is HostMemoryMovement's) ----
  void heads_unpack_add(Act* target, const Act* recv, int64_t tokens, int64_t heads_total, HeadBlocks blocks, int64_t HD, int64_t sp) {
    longseq::heads_unpack_add(target, recv, tokens, heads_total, blocks, HD, sp);
  }
  // The weights the kernels read, from the master weights (nothing to do here: they are one).
  void weights_from_master(Act* /*weights*/, const float* /*master*/, int64_t /*n*/) {}
  // ... and from master weights in host memory (the optimizer offloaded): a copy.
  void weights_from_host_master(Act* weights, const float* host_master, int64_t n) {
    const ComponentTimer timer(&ComponentSeconds::host_copies);
    std::copy_n(host_master, n, weights);
  }
};

}  // namespace longseq
