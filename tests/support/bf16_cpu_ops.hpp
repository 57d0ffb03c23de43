// bf16_cpu_ops.hpp: the GPU's step on the CPU. An Ops (executor/cpu_ops.hpp lists the calls)
// whose activations and weights are bf16 like CudaOps's, computed by the CPU kernels in fp32 and
// rounded to bf16 where the GPU kernels round (each op's bf16 outputs, once per op). With it the
// CPU suite runs BasicLlamaModel's mixed-precision schedule exactly as the GPU allocates it
// (bf16 buffers, separate fp32 master weights, bf16 ZeRO-3 gathers) and checks it against the
// native-cuda prediction and the fp32 model; tests/gpu compares the GPU with it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "executor/cpu_ops.hpp"
#include "kernels/cpu/blocked_attention_cpu.hpp"
#include "kernels/cuda/bf16.hpp"

namespace longseq::testing {

class Bf16CpuOps : public HostMemoryMovement {
 public:
  using Act = Bf16;
  static constexpr const char* kDevice = "cpu-bf16";
  static constexpr bool kSeparateMasterWeights = true;

  void embedding_forward(Act* out, const int32_t* tokens, const Act* table, int64_t T, int64_t C) {
    // A lookup: the rows are copied, already bf16.
    for (int64_t t = 0; t < T; ++t) std::copy_n(table + tokens[t] * C, C, out + t * C);
  }
  void embedding_backward(float* dtable, const Act* dout, const int32_t* tokens, int64_t T, int64_t C) {
    kernels::embedding_backward(dtable, wide(dout, T * C).data(), tokens, T, C);
  }
  void rmsnorm_forward(Act* out, float* rstd, const Act* inp, const Act* weight, int64_t T, int64_t C, float eps) {
    std::vector<float> result(static_cast<size_t>(T * C));
    kernels::rmsnorm_forward(result.data(), rstd, wide(inp, T * C).data(), wide(weight, C).data(), T, C, eps);
    narrow(out, result);
  }
  void rmsnorm_backward(Act* dinp, float* dweight, const Act* dout, const Act* inp, const Act* weight, const float* rstd, int64_t T,
                        int64_t C) {
    std::vector<float> gradient = wide(dinp, T * C);
    kernels::rmsnorm_backward(gradient.data(), dweight, wide(dout, T * C).data(), wide(inp, T * C).data(), wide(weight, C).data(), rstd,
                              T, C);
    narrow(dinp, gradient);
  }
  void rope_forward(Act* out, const Act* inp, const int32_t* positions, int64_t T, int64_t NH, int64_t HD, double theta) {
    std::vector<float> values = wide(inp, T * NH * HD);
    kernels::rope_forward(values.data(), values.data(), positions, T, NH, HD, theta);
    narrow(out, values);
  }
  void rope_backward(Act* dinp, const Act* dout, const int32_t* positions, int64_t T, int64_t NH, int64_t HD, double theta) {
    std::vector<float> gradient = wide(dinp, T * NH * HD);
    kernels::rope_backward(gradient.data(), wide(dout, T * NH * HD).data(), positions, T, NH, HD, theta);
    narrow(dinp, gradient);
  }
  void linear_forward(Act* out, const Act* inp, const Act* weight, int64_t T, int64_t C, int64_t OC) {
    std::vector<float> result(static_cast<size_t>(T * OC));
    kernels::linear_forward(result.data(), wide(inp, T * C).data(), wide(weight, OC * C).data(), static_cast<const float*>(nullptr), T,
                            C, OC);
    narrow(out, result);
  }
  // cuBLAS with beta = 1: the bf16 output read, alpha x the product added in fp32, rounded once.
  void linear_forward_add(Act* out, const Act* inp, const Act* weight, int64_t T, int64_t C, int64_t OC, float alpha) {
    std::vector<float> result = wide(out, T * OC);
    kernels::linear_forward_add(result.data(), wide(inp, T * C).data(), wide(weight, OC * C).data(), alpha, T, C, OC);
    narrow(out, result);
  }
  void linear_backward(Act* dinp, float* dweight, const Act* dout, const Act* inp, const Act* weight, int64_t T, int64_t C, int64_t OC,
                       float alpha = 1.0f) {
    std::vector<float> gradient = dinp ? wide(dinp, T * C) : std::vector<float>();
    kernels::linear_backward(dinp ? gradient.data() : nullptr, dweight, static_cast<float*>(nullptr), wide(dout, T * OC).data(),
                             wide(inp, T * C).data(), wide(weight, OC * C).data(), T, C, OC, alpha);
    if (dinp) narrow(dinp, gradient);
  }
  void swiglu_forward(Act* out, const Act* gate, const Act* up, int64_t N) {
    std::vector<float> result(static_cast<size_t>(N));
    kernels::swiglu_forward(result.data(), wide(gate, N).data(), wide(up, N).data(), N);
    narrow(out, result);
  }
  void swiglu_backward(Act* dgate, Act* dup, const Act* dout, const Act* gate, const Act* up, int64_t N) {
    std::vector<float> gate_gradient = wide(dgate, N), up_gradient = wide(dup, N);
    kernels::swiglu_backward(gate_gradient.data(), up_gradient.data(), wide(dout, N).data(), wide(gate, N).data(), wide(up, N).data(), N);
    narrow(dgate, gate_gradient);
    narrow(dup, up_gradient);
  }
  // The GPU's blocked attention, its workspace from the arena, in bf16 with fp32 accumulators.
  int64_t attention_workspace_elements(int64_t T, int64_t NQ, int64_t NKV, int64_t HD, bool backward) const {
    return BlockedAttentionLayout(T, NQ, NKV, HD, kGpuAttentionBlockTokens).workspace_elements(sizeof(Act), backward);
  }
  void attention_forward(Act* out, float* lse, const Act* q, const Act* k, const Act* v, const int32_t* positions, int64_t T,
                         int64_t NQ, int64_t NKV, int64_t HD, int64_t /*block*/, float* workspace) {
    CpuBlockedAttentionOps<Act> blocked;
    blocked_attention_forward(blocked, out, lse, q, k, v, positions, positions, BlockedAttentionLayout(T, NQ, NKV, HD, kGpuAttentionBlockTokens),
                              workspace);
  }
  void attention_backward(Act* dq, Act* dk, Act* dv, float* delta_scratch, const Act* dout, const Act* q, const Act* k, const Act* v,
                          const Act* out, const float* lse, const int32_t* positions, int64_t T, int64_t NQ, int64_t NKV, int64_t HD,
                          int64_t /*block*/, float* workspace) {
    CpuBlockedAttentionOps<Act> blocked;
    blocked_attention_backward(blocked, dq, dk, dv, delta_scratch, dout, q, k, v, out, lse, positions, positions,
                               BlockedAttentionLayout(T, NQ, NKV, HD, kGpuAttentionBlockTokens), workspace);
  }
  // FPDT's chunk pairs through the same blocked algorithm (ranges), and the GPU's merge and
  // accumulation: fp32 accumulators, bf16 parts, rounding where the GPU rounds.
  void attention_chunk_forward(Act* out, float* lse, const Act* q, const Act* k, const Act* v, const int32_t* positions, int64_t q_begin,
                               int64_t Tq, int64_t k_begin, int64_t Tk, int64_t NQ, int64_t NKV, int64_t HD, int64_t /*block*/,
                               float* workspace) {
    CpuBlockedAttentionOps<Act> blocked;
    blocked_attention_forward_range(blocked, out, lse, q, k, v, positions, positions, q_begin, k_begin, Tk,
                                    BlockedAttentionLayout(Tq, NQ, NKV, HD, kGpuAttentionBlockTokens), workspace);
  }
  void attention_softmax_delta(float* delta, const Act* dout, const Act* out, int64_t T, int64_t NQ, int64_t HD) {
    CpuBlockedAttentionOps<Act> blocked;
    blocked.softmax_delta(delta, dout, out, BlockedAttentionLayout(T, NQ, NQ, HD, kGpuAttentionBlockTokens));
  }
  void attention_chunk_backward(Act* dq, Act* dk, Act* dv, const float* delta, const Act* dout, const Act* q, const Act* k, const Act* v,
                                const float* lse, const int32_t* positions, int64_t q_begin, int64_t Tq, int64_t k_begin, int64_t Tk,
                                int64_t NQ, int64_t NKV, int64_t HD, int64_t /*block*/, float* workspace) {
    CpuBlockedAttentionOps<Act> blocked;
    blocked_attention_backward_range(blocked, dq, dk, dv, delta, dout, q, k, v, lse, positions, positions, q_begin, k_begin, Tk,
                                     BlockedAttentionLayout(Tq, NQ, NKV, HD, kGpuAttentionBlockTokens), workspace);
  }
  void attention_merge(float* accumulator, float* accumulator_lse, const Act* part, const float* part_lse, int64_t T, int64_t NQ,
                       int64_t HD) {
    kernels::attention_merge(accumulator, accumulator_lse, wide(part, T * NQ * HD).data(), part_lse, T, NQ, HD);
  }
  void accumulator_to_act(Act* out, const float* accumulator, int64_t n) { weights_from_master(out, accumulator, n); }
  void accumulate(float* accumulator, const Act* part, int64_t n) {
    for (int64_t i = 0; i < n; ++i) accumulator[i] += bf16_to_float(part[i]);
  }
  void cross_entropy_forward(float* losses, const Act* logits, const int32_t* labels, int64_t T, int64_t V) {
    kernels::cross_entropy_forward(losses, wide(logits, T * V).data(), labels, T, V);
  }
  void cross_entropy_backward(Act* dlogits, const Act* logits, const int32_t* labels, float loss_scale, int64_t T, int64_t V) {
    std::vector<float> gradient = wide(dlogits, T * V);
    kernels::cross_entropy_backward(gradient.data(), wide(logits, T * V).data(), labels, loss_scale, T, V);
    narrow(dlogits, gradient);
  }
  // Mixture of experts as the GPU's kernels run it: fp32 routing from bf16 logits, each kernel's
  // bf16 outputs rounded once.
  void moe_route(float* weights, int32_t* indices, float* probs, const Act* logits, int64_t T, int64_t E, int64_t k, bool normalize) {
    kernels::moe_route(weights, indices, probs, wide(logits, T * E).data(), T, E, k, normalize);
  }
  void moe_route_backward(Act* dlogits, const float* dweights, const float* probs, const float* weights, const int32_t* indices, int64_t T,
                          int64_t E, int64_t k, bool normalize) {
    std::vector<float> gradient(static_cast<size_t>(T * E));
    kernels::moe_route_backward(gradient.data(), dweights, probs, weights, indices, T, E, k, normalize);
    narrow(dlogits, gradient);
  }
  void moe_gather(Act* rows, const Act* x, const int32_t* order, int64_t R, int64_t C) {
    for (int64_t r = 0; r < R; ++r) std::copy_n(x + int64_t{order[r]} * C, C, rows + r * C);  // a copy: no rounding
  }
  void moe_gather_backward(Act* dx, const Act* drows, const int32_t* position, int64_t T, int64_t k, int64_t C) {
    std::vector<float> gradient = wide(dx, T * C);
    kernels::moe_gather_backward(gradient.data(), wide(drows, T * k * C).data(), position, T, k, C);
    narrow(dx, gradient);
  }
  void moe_combine(Act* out, const Act* rows, const int32_t* position, const float* weights, int64_t T, int64_t k, int64_t C) {
    std::vector<float> result = wide(out, T * C);
    kernels::moe_combine(result.data(), wide(rows, T * k * C).data(), position, weights, T, k, C);
    narrow(out, result);
  }
  void moe_combine_backward(Act* drows, float* dweights, const Act* dout, const Act* rows, const int32_t* position, const float* weights,
                            int64_t T, int64_t k, int64_t C) {
    std::vector<float> gradient(static_cast<size_t>(T * k * C));
    kernels::moe_combine_backward(gradient.data(), dweights, wide(dout, T * C).data(), wide(rows, T * k * C).data(), position, weights, T, k,
                                  C);
    narrow(drows, gradient);
  }
  void moe_shared_gate_forward(Act* out, const Act* shared, const Act* gate, int64_t T, int64_t C) {
    std::vector<float> result = wide(out, T * C);
    kernels::moe_shared_gate_forward(result.data(), wide(shared, T * C).data(), wide(gate, T).data(), T, C);
    narrow(out, result);
  }
  void moe_shared_gate_backward(Act* dshared, Act* dgate, const Act* dout, const Act* shared, const Act* gate, int64_t T, int64_t C) {
    std::vector<float> shared_gradient(static_cast<size_t>(T * C)), gate_gradient(static_cast<size_t>(T));
    kernels::moe_shared_gate_backward(shared_gradient.data(), gate_gradient.data(), wide(dout, T * C).data(), wide(shared, T * C).data(),
                                      wide(gate, T).data(), T, C);
    narrow(dshared, shared_gradient);
    narrow(dgate, gate_gradient);
  }
  // The pure-bf16 regime, as the GPU's kernels: a module's fp32 gradient into bf16 (rounded once),
  // AdamW computed in fp32 from bf16 states and every state rounded back.
  void fill_zero(Act* data, int64_t n) { std::fill_n(data, n, Act{0}); }
  using HostMemoryMovement::fill_zero;
  void gradient_add_to_act(Act* gradients, const float* module_gradient, int64_t n) {
    for (int64_t i = 0; i < n; ++i) gradients[i] = bf16_from_float(bf16_to_float(gradients[i]) + module_gradient[i]);
  }
  void adamw_update_act(Act* params, const Act* grads, Act* m, Act* v, int64_t N, float lr, float beta1, float beta2, float eps,
                        float weight_decay, int64_t step) {
    std::vector<float> p = wide(params, N), mm = wide(m, N), vv = wide(v, N);
    kernels::adamw_update(p.data(), wide(grads, N).data(), mm.data(), vv.data(), N, lr, beta1, beta2, eps, weight_decay, step);
    narrow(params, p);
    narrow(m, mm);
    narrow(v, vv);
  }
  void adamw_update(float* master, Act* weights, const float* grads, float* m, float* v, int64_t N, float lr, float beta1, float beta2,
                    float eps, float weight_decay, int64_t step) {
    kernels::adamw_update(master, grads, m, v, N, lr, beta1, beta2, eps, weight_decay, step);
    if (weights) weights_from_master(weights, master, N);  // (none kept: FSDP2's regime casts at each gather)
  }

  // ---- element-wise and data movement (the rest is HostMemoryMovement's) ----
  using HostMemoryMovement::add;
  void add(Act* inout, const Act* addend, int64_t n) {
    for (int64_t i = 0; i < n; ++i) inout[i] = bf16_from_float(bf16_to_float(inout[i]) + bf16_to_float(addend[i]));
  }
  void heads_unpack_add(Act* target, const Act* recv, int64_t tokens, int64_t heads_total, HeadBlocks blocks, int64_t HD, int64_t sp) {
    std::vector<float> sums = wide(target, tokens * heads_total * HD);
    longseq::heads_unpack_add(sums.data(), wide(recv, sp * tokens * blocks.per_rank * HD).data(), tokens, heads_total, blocks, HD, sp);
    narrow(target, sums);
  }
  void weights_from_master(Act* weights, const float* master, int64_t n) {
    for (int64_t i = 0; i < n; ++i) weights[i] = bf16_from_float(master[i]);
  }
  void weights_from_host_master(Act* weights, const float* host_master, int64_t n) { weights_from_master(weights, host_master, n); }

 private:
  static std::vector<float> wide(const Act* values, int64_t n) {
    std::vector<float> result(static_cast<size_t>(n));
    std::transform(values, values + n, result.begin(), bf16_to_float);
    return result;
  }
  static void narrow(Act* out, const std::vector<float>& values) { std::transform(values.begin(), values.end(), out, bf16_from_float); }
};

}  // namespace longseq::testing
