// kernels.hpp: the CUDA kernels, with the CPU kernels' operations, argument order and sizes
// (kernels/cpu/dense.hpp states the conventions: outputs first, sizes last, backward ADDS into
// every gradient). Storage is bf16 for activations and weights, fp32 for what accumulates: the
// RMSNorm rstd, per-token losses, weight gradients and the AdamW master weights and moments
// (mixed precision as in ALST's DeepSpeed bf16 runs: fp32 gradients and optimizer states).
// Every pointer is a device pointer; every launch goes on the default stream, and every entry
// point checks the launch and throws std::runtime_error naming the op and CUDA's reason.
// Plain C++ (no CUDA types) so host code and tests include it without nvcc.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/bf16.hpp"

namespace longseq::cuda {

// Device memory and copies (cudaMalloc / cudaMemcpy, checked).
void* device_malloc(size_t bytes);
void device_free(void* pointer) noexcept;
void copy_to_device(void* device, const void* host, size_t bytes);
void copy_to_host(void* host, const void* device, size_t bytes);
void device_memset_zero(void* device, size_t bytes);
void device_synchronize();

// out[T, C] = table[tokens[t], :]
void embedding_forward(Bf16* out, const int32_t* tokens, const Bf16* table, int64_t T, int64_t C);
// dtable[tokens[t], :] += dout[t, :] (atomic adds: repeated tokens accumulate)
void embedding_backward(float* dtable, const Bf16* dout, const int32_t* tokens, int64_t T, int64_t C);

// out = inp * rstd * weight, rstd[t] = 1 / sqrt(mean(inp[t]^2) + eps); one block per token.
void rmsnorm_forward(Bf16* out, float* rstd, const Bf16* inp, const Bf16* weight, int64_t T, int64_t C, float eps);
void rmsnorm_backward(Bf16* dinp, float* dweight, const Bf16* dout, const Bf16* inp, const Bf16* weight, const float* rstd,
                      int64_t T, int64_t C);

// Rotary embedding, HF rotate_half convention, angles in double as the CPU kernel computes them.
void rope_forward(Bf16* out, const Bf16* inp, const int32_t* position_ids, int64_t T, int64_t NH, int64_t HD, double theta);
void rope_backward(Bf16* dinp, const Bf16* dout, const int32_t* position_ids, int64_t T, int64_t NH, int64_t HD, double theta);

// out[N] = silu(gate) * up
void swiglu_forward(Bf16* out, const Bf16* gate, const Bf16* up, int64_t N);
void swiglu_backward(Bf16* dgate, Bf16* dup, const Bf16* dout, const Bf16* gate, const Bf16* up, int64_t N);

// losses[t] = logsumexp(logits[t]) - logits[t, labels[t]] (0 for label -100); one block per token.
void cross_entropy_forward(float* losses, const Bf16* logits, const int32_t* labels, int64_t T, int64_t V);
// dlogits[t] += loss_scale * (softmax(logits[t]) - onehot(labels[t])) for counted tokens.
void cross_entropy_backward(Bf16* dlogits, const Bf16* logits, const int32_t* labels, float loss_scale, int64_t T, int64_t V);

// Causal attention with an online softmax, masked by position_ids like kernels/cpu/attention.hpp
// (q[T, NQ, HD], k and v[T, NKV, HD], out[T, NQ, HD], lse[NQ, T] in fp32). One warp per query and
// head walks that query's keys, so memory is O(T) (no T x T scores), but keys are re-read per
// query: the reference the blocked kernel (Blas::attention_forward below, what the executor runs)
// is tested against.
// HD at most 256 (lanes beyond HD idle when it is not a multiple of 32).
void attention_forward(Bf16* out, float* lse, const Bf16* q, const Bf16* k, const Bf16* v, const int32_t* position_ids, int64_t T,
                       int64_t NQ, int64_t NKV, int64_t HD);
// Adds into dq, dk and dv; delta_scratch is an fp32 [NQ, T] buffer the caller provides (the
// arena accounts for it), overwritten with rowsum(dout * out).
void attention_backward(Bf16* dq, Bf16* dk, Bf16* dv, float* delta_scratch, const Bf16* dout, const Bf16* q, const Bf16* k,
                        const Bf16* v, const Bf16* out, const float* lse, const int32_t* position_ids, int64_t T, int64_t NQ,
                        int64_t NKV, int64_t HD);

// PyTorch's AdamW on fp32 master weights (kernels/cpu/loss_optimizer.hpp), also writing the bf16
// copy the forward pass reads (weights_bf16 may be null).
void adamw_update(float* params, Bf16* weights_bf16, const float* grads, float* m, float* v, int64_t N, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int64_t step);

// ---- mixture of experts (kernels/cpu/moe.hpp's conventions and results; one thread per token or
// per element: simple, for the executor's small expert counts) ----
void moe_route(float* weights, int32_t* indices, float* probs, const Bf16* logits, int64_t T, int64_t E, int64_t k, bool normalize);
void moe_route_backward(Bf16* dlogits, const float* dweights, const float* probs, const float* weights, const int32_t* indices, int64_t T,
                        int64_t E, int64_t k, bool normalize);
void moe_gather(Bf16* rows, const Bf16* x, const int32_t* order, int64_t R, int64_t C);
void moe_gather_backward(Bf16* dx, const Bf16* drows, const int32_t* position, int64_t T, int64_t k, int64_t C);
void moe_combine(Bf16* out, const Bf16* rows, const int32_t* position, const float* weights, int64_t T, int64_t k, int64_t C);
void moe_combine_backward(Bf16* drows, float* dweights, const Bf16* dout, const Bf16* rows, const int32_t* position, const float* weights,
                          int64_t T, int64_t k, int64_t C);
void moe_shared_gate_forward(Bf16* out, const Bf16* shared, const Bf16* gate, int64_t T, int64_t C);
void moe_shared_gate_backward(Bf16* dshared, Bf16* dgate, const Bf16* dout, const Bf16* shared, const Bf16* gate, int64_t T, int64_t C);

// ---- element-wise data movement (the step's residual adds, copies and Ulysses regrouping) ----
// inout[N] += addend (bf16 storage, the sum rounded once; fp32 for gradient shards)
void add(Bf16* inout, const Bf16* addend, int64_t N);
void add(float* inout, const float* addend, int64_t N);
// inout[N] (bf16) += addend (fp32), rounded once: a module's fp32 gradient into bf16 gradients.
void add(Bf16* inout, const float* addend, int64_t N);
// The pure-bf16 regime's AdamW: bf16 parameters, gradients and moments, fp32 arithmetic.
void adamw_update_bf16(Bf16* params, const Bf16* grads, Bf16* m, Bf16* v, int64_t N, float lr, float beta1, float beta2, float eps,
                       float weight_decay, int64_t step);
// data[N] *= factor (fp32: averaging gradients over data-parallel groups)
void scale(float* data, int64_t N, float factor);
// Device-to-device copy of `bytes` on the default stream.
void copy_device(void* destination, const void* source, size_t bytes);
// weights[N] = bf16(master[N]): the copy the kernels read, from the fp32 master weights.
void bf16_from_master(Bf16* weights, const float* master, int64_t N);
// FPDT's fp32 accumulators: accumulator += part; data = value; and the online-softmax merge of a
// chunk pair's (out, lse) into (accumulator, accumulator_lse) (kernels/cpu/attention.hpp's).
void accumulate_bf16(float* accumulator, const Bf16* part, int64_t N);
void fill(float* data, int64_t N, float value);
void attention_merge(float* accumulator, float* accumulator_lse, const Bf16* part, const float* part_lse, int64_t T, int64_t NQ, int64_t HD);
// Ulysses' regrouping (executor/ulysses.hpp, same layouts): block j of destination rank r's heads
// is global head (replication > 1 ? r / replication : r * heads_per_rank + j).
// send[r][t][j][d] = source[t][head(r, j)][d]
void heads_pack(Bf16* send, const Bf16* source, int64_t T, int64_t heads_total, int64_t heads_per_rank, int64_t replication,
                int64_t HD, int64_t sp);
// target[t][head(r, j)][d] += recv[r][t][j][d]; one thread per target element sums every block
// that maps to it, in rank order (replicated kv heads), so no two threads write one element.
void heads_unpack_add(Bf16* target, const Bf16* recv, int64_t T, int64_t heads_total, int64_t heads_per_rank, int64_t replication,
                      int64_t HD, int64_t sp);

// Matrix products through cuBLAS (bf16 inputs, fp32 accumulation: CUBLAS_COMPUTE_32F).
class Blas {
 public:
  Blas();
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;
  // out[T, OC] = inp[T, C] @ weight[OC, C]^T
  void linear_forward(Bf16* out, const Bf16* inp, const Bf16* weight, int64_t T, int64_t C, int64_t OC);
  // out[T, OC] += alpha * inp @ weight^T (a LoRA adapter's scaled product onto its base output)
  void linear_forward_add(Bf16* out, const Bf16* inp, const Bf16* weight, float alpha, int64_t T, int64_t C, int64_t OC);
  // dinp[T, C] += alpha * dout @ weight (bf16); dweight[OC, C] += alpha * dout^T @ inp (fp32); either may be null.
  void linear_backward(Bf16* dinp, float* dweight, const Bf16* dout, const Bf16* inp, const Bf16* weight, int64_t T, int64_t C,
                       int64_t OC, float alpha = 1.0f);
  // Causal attention as kernels/blocked_attention.hpp computes it (FlashAttention-2's algorithm):
  // cuBLAS products per block pair (bf16 in, fp32 scores and accumulators) and row-wise kernels,
  // with the results and conventions of attention_forward/backward above. `workspace` is device
  // memory of BlockedAttentionLayout(T, NQ, NKV, HD, block).forward_elements(2) (backward:
  // backward_elements(2)) floats; delta_scratch as attention_backward's. position_ids are read
  // back to the host once per call to skip the blocks of other documents.
  void attention_forward(Bf16* out, float* lse, const Bf16* q, const Bf16* k, const Bf16* v, const int32_t* position_ids, int64_t T,
                         int64_t NQ, int64_t NKV, int64_t HD, int64_t block, float* workspace);
  void attention_backward(Bf16* dq, Bf16* dk, Bf16* dv, float* delta_scratch, const Bf16* dout, const Bf16* q, const Bf16* k,
                          const Bf16* v, const Bf16* out, const float* lse, const int32_t* position_ids, int64_t T, int64_t NQ,
                          int64_t NKV, int64_t HD, int64_t block, float* workspace);
  // FPDT's chunk pairs: queries [q_begin, q_begin + Tq) against keys [k_begin, k_begin + Tk)
  // (kernels/blocked_attention.hpp's ranges); position_ids cover the whole sequence. The backward
  // takes the queries' final lse and their delta (attention_softmax_delta) and adds its share.
  void attention_forward_range(Bf16* out, float* lse, const Bf16* q, const Bf16* k, const Bf16* v, const int32_t* position_ids,
                               int64_t q_begin, int64_t Tq, int64_t k_begin, int64_t Tk, int64_t NQ, int64_t NKV, int64_t HD,
                               int64_t block, float* workspace);
  void attention_softmax_delta(float* delta, const Bf16* dout, const Bf16* out, int64_t T, int64_t NQ, int64_t HD);
  void attention_backward_range(Bf16* dq, Bf16* dk, Bf16* dv, const float* delta, const Bf16* dout, const Bf16* q, const Bf16* k,
                                const Bf16* v, const float* lse, const int32_t* position_ids, int64_t q_begin, int64_t Tq,
                                int64_t k_begin, int64_t Tk, int64_t NQ, int64_t NKV, int64_t HD, int64_t block, float* workspace);

 private:
  void* handle_ = nullptr;  // cublasHandle_t
};

}  // namespace longseq::cuda
