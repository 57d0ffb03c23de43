// kernels.cu: the CUDA kernels of kernels.hpp. Each op is a static __global__ kernel, a static
// launcher choosing the grid, and the checked entry point (ggml's and llm.c's shape): the math
// mirrors kernels/cpu line for line so the GPU suite can compare them on random inputs.
// Compiled wherever nvcc exists; run only on a GPU machine (tests/gpu/gpu_kernels.cpp).
#include "kernels/cuda/kernels.hpp"

#include <vector>

#include "kernels/blocked_attention.hpp"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace longseq::cuda {
namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string("CUDA ") + what + ": " + cudaGetErrorString(status));
}
// After a launch: the launch error now, not at the next synchronising call.
void check_launch(const char* op) { check(cudaGetLastError(), op); }
void check_blas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(std::string("cuBLAS ") + what + ": status " + std::to_string(status));
}

constexpr int kThreads = 256;  // per block: 8 warps, enough to hide latency for row reductions
int blocks_for(int64_t n) { return static_cast<int>((n + kThreads - 1) / kThreads); }

__device__ inline float load(const Bf16* p, int64_t i) { return __uint_as_float(static_cast<uint32_t>(p[i]) << 16); }
__device__ inline Bf16 bf16(float x) { return __bfloat16_as_ushort(__float2bfloat16_rn(x)); }

// Block-wide reductions over kThreads threads (a warp shuffle, then one warp over the warps);
// every thread gets the result. `identity` fills the lanes beyond the block's warps.
template <typename Combine>
__device__ float block_reduce(float value, Combine combine, float identity) {
  __shared__ float partial[kThreads / 32];
  for (int offset = 16; offset > 0; offset /= 2) value = combine(value, __shfl_xor_sync(0xffffffffu, value, offset));
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = value;
  __syncthreads();
  value = threadIdx.x < kThreads / 32 ? partial[threadIdx.x] : identity;
  if (threadIdx.x < 32)
    for (int offset = 16; offset > 0; offset /= 2) value = combine(value, __shfl_xor_sync(0xffffffffu, value, offset));
  __shared__ float result;
  if (threadIdx.x == 0) result = value;
  __syncthreads();
  return result;
}
struct Add {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
__device__ float block_sum(float value) { return block_reduce(value, Add{}, 0.0f); }
__device__ float block_max(float value) { return block_reduce(value, Max{}, -INFINITY); }

// ---- embedding ----
__global__ void embedding_forward_kernel(Bf16* out, const int32_t* tokens, const Bf16* table, int64_t T, int64_t C) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= T * C) return;
  const int64_t t = i / C, c = i % C;
  out[i] = table[static_cast<int64_t>(tokens[t]) * C + c];
}
__global__ void embedding_backward_kernel(float* dtable, const Bf16* dout, const int32_t* tokens, int64_t T, int64_t C) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= T * C) return;
  const int64_t t = i / C, c = i % C;
  atomicAdd(dtable + static_cast<int64_t>(tokens[t]) * C + c, load(dout, i));
}

// ---- RMSNorm: one block per token ----
__global__ void rmsnorm_forward_kernel(Bf16* out, float* rstd, const Bf16* inp, const Bf16* weight, int64_t C, float eps) {
  const int64_t t = blockIdx.x;
  const Bf16* x = inp + t * C;
  float sum_squares = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) sum_squares += load(x, c) * load(x, c);
  const float r = rsqrtf(block_sum(sum_squares) / static_cast<float>(C) + eps);
  if (threadIdx.x == 0) rstd[t] = r;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) out[t * C + c] = bf16(load(x, c) * r * load(weight, c));
}
__global__ void rmsnorm_backward_kernel(Bf16* dinp, float* dweight, const Bf16* dout, const Bf16* inp, const Bf16* weight,
                                        const float* rstd, int64_t C) {
  const int64_t t = blockIdx.x;
  const Bf16* x = inp + t * C;
  const Bf16* d = dout + t * C;
  const float r = rstd[t];
  // y = x r w: dx = r (w d) - x r^3 / C * sum(w d x), as kernels/cpu/norm_rope.cpp.
  float dot = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dot += load(weight, c) * load(d, c) * load(x, c);
  dot = block_sum(dot);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float xc = load(x, c), dc = load(d, c);
    dinp[t * C + c] = bf16(load(dinp, t * C + c) + r * load(weight, c) * dc - xc * r * r * r * dot / static_cast<float>(C));
    if (dweight) atomicAdd(dweight + c, dc * xc * r);  // null: a frozen norm (LoRA)
  }
}

// ---- rotary embedding: one thread per (token, frequency), looping over heads ----
__device__ void rope_angle(double& cosine, double& sine, int32_t position, int64_t k, int64_t HD, double theta) {
  const double angle = static_cast<double>(position) * pow(theta, -2.0 * static_cast<double>(k) / static_cast<double>(HD));
  sincos(angle, &sine, &cosine);
}
// Forward rotates by the angle; backward applies the transpose, the rotation by minus the angle
// (direction -1), and adds into the gradient.
__global__ void rope_rotate_kernel(Bf16* out, const Bf16* inp, const int32_t* position_ids, int64_t T, int64_t NH, int64_t HD,
                                   double theta, double direction, bool accumulate) {
  const int64_t half = HD / 2, i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= T * half) return;
  const int64_t t = i / half, k = i % half;
  double cosine, sine;
  rope_angle(cosine, sine, position_ids[t], k, HD, theta);
  sine *= direction;
  for (int64_t h = 0; h < NH; ++h) {
    const int64_t base = (t * NH + h) * HD;
    const double x1 = load(inp, base + k), x2 = load(inp, base + k + half);
    const float first = static_cast<float>(x1 * cosine - x2 * sine), second = static_cast<float>(x2 * cosine + x1 * sine);
    out[base + k] = bf16(accumulate ? load(out, base + k) + first : first);
    out[base + k + half] = bf16(accumulate ? load(out, base + k + half) + second : second);
  }
}

// ---- SwiGLU ----
__global__ void swiglu_forward_kernel(Bf16* out, const Bf16* gate, const Bf16* up, int64_t N) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= N) return;
  const float g = load(gate, i), sigmoid = 1.0f / (1.0f + expf(-g));
  out[i] = bf16(g * sigmoid * load(up, i));
}
__global__ void swiglu_backward_kernel(Bf16* dgate, Bf16* dup, const Bf16* dout, const Bf16* gate, const Bf16* up, int64_t N) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= N) return;
  const float g = load(gate, i), u = load(up, i), d = load(dout, i), sigmoid = 1.0f / (1.0f + expf(-g));
  // d silu(g) / dg = sigmoid (1 + g (1 - sigmoid))
  dgate[i] = bf16(load(dgate, i) + d * u * sigmoid * (1.0f + g * (1.0f - sigmoid)));
  dup[i] = bf16(load(dup, i) + d * g * sigmoid);
}

// ---- cross entropy: one block per token ----
__device__ float row_logsumexp(const Bf16* row, int64_t V) {
  float maximum = -INFINITY;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) maximum = fmaxf(maximum, load(row, i));
  maximum = block_max(maximum);
  float sum = 0;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) sum += expf(load(row, i) - maximum);
  return maximum + logf(block_sum(sum));
}
__global__ void cross_entropy_forward_kernel(float* losses, const Bf16* logits, const int32_t* labels, int64_t V) {
  const int64_t t = blockIdx.x;
  if (labels[t] == -100) {  // kIgnoreIndex, uniform across the block
    if (threadIdx.x == 0) losses[t] = 0;
    return;
  }
  const Bf16* row = logits + t * V;
  const float logsumexp = row_logsumexp(row, V);
  if (threadIdx.x == 0) losses[t] = logsumexp - load(row, labels[t]);
}
__global__ void cross_entropy_backward_kernel(Bf16* dlogits, const Bf16* logits, const int32_t* labels, float loss_scale, int64_t V) {
  const int64_t t = blockIdx.x;
  const int32_t label = labels[t];
  if (label == -100) return;
  const Bf16* row = logits + t * V;
  const float logsumexp = row_logsumexp(row, V);
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) {
    const float gradient = loss_scale * (expf(load(row, i) - logsumexp) - (i == label ? 1.0f : 0.0f));
    dlogits[t * V + i] = bf16(load(dlogits, t * V + i) + gradient);
  }
}

// ---- attention: one warp per (token, head); lane l holds head channels l, l + 32, ... ----
constexpr int kMaxChannelsPerLane = 8;  // HD <= 256
constexpr int kWarpsPerBlock = 4;
__device__ float warp_sum(float value) {
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}
// Dot product of two head vectors, each lane summing its channels; every lane gets the total.
__device__ float head_dot(const Bf16* a, const Bf16* b, int64_t HD) {
  float partial = 0;
  for (int64_t d = threadIdx.x % 32; d < HD; d += 32) partial += load(a, d) * load(b, d);
  return warp_sum(partial);
}
__device__ int64_t warp_task() { return (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32; }

__global__ void attention_forward_kernel(Bf16* out, float* lse, const Bf16* q, const Bf16* k, const Bf16* v, const int32_t* position_ids,
                                         int64_t T, int64_t NQ, int64_t NKV, int64_t HD, float scale) {
  const int64_t task = warp_task();
  if (task >= T * NQ) return;  // whole warps leave together: T * NQ tasks, 32 lanes each
  const int64_t i = task / NQ, h = task % NQ, g = h / (NQ / NKV), lane = threadIdx.x % 32;
  const Bf16* query = q + (i * NQ + h) * HD;
  float accumulator[kMaxChannelsPerLane] = {};
  float running_max = -INFINITY, running_sum = 0;
  for (int64_t j = i - position_ids[i]; j <= i; ++j) {  // this query's document, causally
    const float score = head_dot(query, k + (j * NKV + g) * HD, HD) * scale;
    const float new_max = fmaxf(running_max, score);
    const float correction = expf(running_max - new_max), weight = expf(score - new_max);
    running_sum = running_sum * correction + weight;
    const Bf16* value = v + (j * NKV + g) * HD;
    for (int c = 0; c * 32 + lane < HD; ++c) accumulator[c] = accumulator[c] * correction + weight * load(value, c * 32 + lane);
    running_max = new_max;
  }
  for (int c = 0; c * 32 + lane < HD; ++c) out[(i * NQ + h) * HD + c * 32 + lane] = bf16(accumulator[c] / running_sum);
  if (lane == 0) lse[h * T + i] = running_max + logf(running_sum);
}

__global__ void attention_delta_kernel(float* delta, const Bf16* dout, const Bf16* out, int64_t T, int64_t NQ, int64_t HD) {
  const int64_t task = warp_task();
  if (task >= T * NQ) return;
  const int64_t i = task / NQ, h = task % NQ;
  const float sum = head_dot(dout + (i * NQ + h) * HD, out + (i * NQ + h) * HD, HD);
  if (threadIdx.x % 32 == 0) delta[h * T + i] = sum;
}

// dq for one (query, head): sum over its keys of scale * p (dp - delta) k_j.
__global__ void attention_dq_kernel(Bf16* dq, const float* delta, const Bf16* dout, const Bf16* q, const Bf16* k, const Bf16* v,
                                    const float* lse, const int32_t* position_ids, int64_t T, int64_t NQ, int64_t NKV, int64_t HD,
                                    float scale) {
  const int64_t task = warp_task();
  if (task >= T * NQ) return;
  const int64_t i = task / NQ, h = task % NQ, g = h / (NQ / NKV), lane = threadIdx.x % 32;
  const Bf16* query = q + (i * NQ + h) * HD;
  const Bf16* output_grad = dout + (i * NQ + h) * HD;
  float gradient[kMaxChannelsPerLane] = {};
  for (int64_t j = i - position_ids[i]; j <= i; ++j) {
    const Bf16* key = k + (j * NKV + g) * HD;
    const float probability = expf(head_dot(query, key, HD) * scale - lse[h * T + i]);
    const float dscore = probability * (head_dot(output_grad, v + (j * NKV + g) * HD, HD) - delta[h * T + i]);
    for (int c = 0; c * 32 + lane < HD; ++c) gradient[c] += scale * dscore * load(key, c * 32 + lane);
  }
  for (int c = 0; c * 32 + lane < HD; ++c) {
    const int64_t index = (i * NQ + h) * HD + c * 32 + lane;
    dq[index] = bf16(load(dq, index) + gradient[c]);
  }
}

// dk and dv for one (key, kv head): every query head of its group, every later query of its
// document (i - position_ids[i] is the document's first token, the same for the whole document).
__global__ void attention_dkv_kernel(Bf16* dk, Bf16* dv, const float* delta, const Bf16* dout, const Bf16* q, const Bf16* k,
                                     const Bf16* v, const float* lse, const int32_t* position_ids, int64_t T, int64_t NQ, int64_t NKV,
                                     int64_t HD, float scale) {
  const int64_t task = warp_task();
  if (task >= T * NKV) return;
  const int64_t j = task / NKV, g = task % NKV, group = NQ / NKV, lane = threadIdx.x % 32;
  const Bf16* key = k + (j * NKV + g) * HD;
  const Bf16* value = v + (j * NKV + g) * HD;
  float key_gradient[kMaxChannelsPerLane] = {}, value_gradient[kMaxChannelsPerLane] = {};
  for (int64_t i = j; i < T && i - position_ids[i] <= j; ++i)
    for (int64_t h = g * group; h < (g + 1) * group; ++h) {
      const Bf16* query = q + (i * NQ + h) * HD;
      const Bf16* output_grad = dout + (i * NQ + h) * HD;
      const float probability = expf(head_dot(query, key, HD) * scale - lse[h * T + i]);
      const float dscore = probability * (head_dot(output_grad, value, HD) - delta[h * T + i]);
      for (int c = 0; c * 32 + lane < HD; ++c) {
        value_gradient[c] += probability * load(output_grad, c * 32 + lane);
        key_gradient[c] += scale * dscore * load(query, c * 32 + lane);
      }
    }
  for (int c = 0; c * 32 + lane < HD; ++c) {
    const int64_t index = (j * NKV + g) * HD + c * 32 + lane;
    dk[index] = bf16(load(dk, index) + key_gradient[c]);
    dv[index] = bf16(load(dv, index) + value_gradient[c]);
  }
}

// ---- AdamW ----
__global__ void adamw_kernel(float* params, Bf16* weights_bf16, const float* grads, float* m, float* v, int64_t N, float lr,
                             float beta1, float beta2, float eps, float weight_decay, float bias1, float bias2) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= N) return;
  float p = params[i] - lr * weight_decay * params[i];
  const float g = grads[i];
  m[i] = beta1 * m[i] + (1.0f - beta1) * g;
  v[i] = beta2 * v[i] + (1.0f - beta2) * g * g;
  p -= lr * (m[i] / bias1) / (sqrtf(v[i] / bias2) + eps);
  params[i] = p;
  if (weights_bf16) weights_bf16[i] = bf16(p);
}

// The pure-bf16 regime's AdamW: bf16 parameters, gradients and moments, each read into fp32, the
// update computed in fp32 and every state rounded back to bf16 (PyTorch AdamW on bf16 tensors).
__global__ void adamw_bf16_kernel(Bf16* params, const Bf16* grads, Bf16* m, Bf16* v, int64_t N, float lr, float beta1, float beta2,
                                  float eps, float weight_decay, float bias1, float bias2) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= N) return;
  float p = load(params, i) - lr * weight_decay * load(params, i);
  const float g = load(grads, i);
  const float m_new = beta1 * load(m, i) + (1.0f - beta1) * g, v_new = beta2 * load(v, i) + (1.0f - beta2) * g * g;
  p -= lr * (m_new / bias1) / (sqrtf(v_new / bias2) + eps);
  params[i] = bf16(p);
  m[i] = bf16(m_new);
  v[i] = bf16(v_new);
}

// ---- element-wise data movement ----
__global__ void add_f32_to_bf16_kernel(Bf16* inout, const float* addend, int64_t N) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < N) inout[i] = bf16(load(inout, i) + addend[i]);
}
__global__ void add_bf16_kernel(Bf16* inout, const Bf16* addend, int64_t N) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < N) inout[i] = bf16(load(inout, i) + load(addend, i));
}
__global__ void add_f32_kernel(float* inout, const float* addend, int64_t N) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < N) inout[i] += addend[i];
}
__global__ void scale_kernel(float* data, int64_t N, float factor) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < N) data[i] *= factor;
}
__global__ void accumulate_bf16_kernel(float* accumulator, const Bf16* part, int64_t N) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < N) accumulator[i] += load(part, i);
}
__global__ void fill_value_kernel(float* data, int64_t N, float value) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < N) data[i] = value;
}
// One thread per (head, token): the online-softmax merge of a part (out, lse) into the fp32
// accumulator (kernels/cpu/attention.hpp attention_merge).
__global__ void attention_merge_kernel(float* accumulator, float* accumulator_lse, const Bf16* part, const float* part_lse, int64_t T,
                                       int64_t NQ, int64_t HD) {
  const int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (e >= NQ * T) return;
  const int64_t h = e / T, i = e % T;
  const float total = accumulator_lse[e], added = part_lse[e];
  if (added == -INFINITY) return;
  const float merged = total == -INFINITY ? added : fmaxf(total, added) + log1pf(expf(-fabsf(total - added)));
  const float keep = total == -INFINITY ? 0.0f : expf(total - merged), add = expf(added - merged);
  float* row = accumulator + (i * NQ + h) * HD;
  const int64_t offset = (i * NQ + h) * HD;
  for (int64_t d = 0; d < HD; ++d) row[d] = row[d] * keep + load(part, offset + d) * add;
  accumulator_lse[e] = merged;
}
__global__ void bf16_from_master_kernel(Bf16* weights, const float* master, int64_t N) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < N) weights[i] = bf16(master[i]);
}
__device__ inline int64_t ulysses_head(int64_t r, int64_t j, int64_t heads_per_rank, int64_t replication) {
  return replication > 1 ? r / replication : r * heads_per_rank + j;
}
// One thread per element of send: i = ((r * T + t) * heads_per_rank + j) * HD + d.
__global__ void heads_pack_kernel(Bf16* send, const Bf16* source, int64_t T, int64_t heads_total, int64_t heads_per_rank,
                                  int64_t replication, int64_t HD, int64_t sp) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= sp * T * heads_per_rank * HD) return;
  const int64_t d = i % HD, j = (i / HD) % heads_per_rank, t = (i / (HD * heads_per_rank)) % T, r = i / (HD * heads_per_rank * T);
  send[i] = source[(t * heads_total + ulysses_head(r, j, heads_per_rank, replication)) * HD + d];
}
// One thread per element of target [T, heads_total, HD]: sums the blocks that map to its head.
__global__ void heads_unpack_add_kernel(Bf16* target, const Bf16* recv, int64_t T, int64_t heads_total, int64_t heads_per_rank,
                                        int64_t replication, int64_t HD, int64_t sp) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= T * heads_total * HD) return;
  const int64_t d = i % HD, head = (i / HD) % heads_total, t = i / (HD * heads_total);
  float sum = load(target, i);
  bool touched = false;
  for (int64_t r = 0; r < sp; ++r)
    for (int64_t j = 0; j < heads_per_rank; ++j)
      if (ulysses_head(r, j, heads_per_rank, replication) == head) {
        sum += load(recv, ((r * T + t) * heads_per_rank + j) * HD + d);
        touched = true;
      }
  if (touched) target[i] = bf16(sum);
}

}  // namespace

void add(Bf16* inout, const Bf16* addend, int64_t N) {
  add_bf16_kernel<<<blocks_for(N), kThreads>>>(inout, addend, N);
  check_launch("add bf16");
}
void add(float* inout, const float* addend, int64_t N) {
  add_f32_kernel<<<blocks_for(N), kThreads>>>(inout, addend, N);
  check_launch("add fp32");
}
void add(Bf16* inout, const float* addend, int64_t N) {
  add_f32_to_bf16_kernel<<<blocks_for(N), kThreads>>>(inout, addend, N);
  check_launch("add fp32 into bf16");
}
void adamw_update_bf16(Bf16* params, const Bf16* grads, Bf16* m, Bf16* v, int64_t N, float lr, float beta1, float beta2, float eps,
                       float weight_decay, int64_t step) {
  const float bias1 = 1.0f - powf(beta1, static_cast<float>(step)), bias2 = 1.0f - powf(beta2, static_cast<float>(step));
  adamw_bf16_kernel<<<blocks_for(N), kThreads>>>(params, grads, m, v, N, lr, beta1, beta2, eps, weight_decay, bias1, bias2);
  check_launch("adamw_update_bf16");
}
void scale(float* data, int64_t N, float factor) {
  scale_kernel<<<blocks_for(N), kThreads>>>(data, N, factor);
  check_launch("scale");
}
void copy_device(void* destination, const void* source, size_t bytes) {
  check(cudaMemcpyAsync(destination, source, bytes, cudaMemcpyDeviceToDevice, cudaStreamLegacy), "copy_device");
}
void accumulate_bf16(float* accumulator, const Bf16* part, int64_t N) {
  accumulate_bf16_kernel<<<blocks_for(N), kThreads>>>(accumulator, part, N);
  check_launch("accumulate_bf16");
}
void fill(float* data, int64_t N, float value) {
  fill_value_kernel<<<blocks_for(N), kThreads>>>(data, N, value);
  check_launch("fill");
}
void attention_merge(float* accumulator, float* accumulator_lse, const Bf16* part, const float* part_lse, int64_t T, int64_t NQ, int64_t HD) {
  attention_merge_kernel<<<blocks_for(NQ * T), kThreads>>>(accumulator, accumulator_lse, part, part_lse, T, NQ, HD);
  check_launch("attention_merge");
}
void bf16_from_master(Bf16* weights, const float* master, int64_t N) {
  bf16_from_master_kernel<<<blocks_for(N), kThreads>>>(weights, master, N);
  check_launch("bf16_from_master");
}
void heads_pack(Bf16* send, const Bf16* source, int64_t T, int64_t heads_total, int64_t heads_per_rank, int64_t replication,
                int64_t HD, int64_t sp) {
  heads_pack_kernel<<<blocks_for(sp * T * heads_per_rank * HD), kThreads>>>(send, source, T, heads_total, heads_per_rank, replication,
                                                                             HD, sp);
  check_launch("heads_pack");
}
void heads_unpack_add(Bf16* target, const Bf16* recv, int64_t T, int64_t heads_total, int64_t heads_per_rank, int64_t replication,
                      int64_t HD, int64_t sp) {
  heads_unpack_add_kernel<<<blocks_for(T * heads_total * HD), kThreads>>>(target, recv, T, heads_total, heads_per_rank, replication,
                                                                          HD, sp);
  check_launch("heads_unpack_add");
}

void* device_malloc(size_t bytes) {
  void* pointer = nullptr;
  check(cudaMalloc(&pointer, bytes), "cudaMalloc");
  return pointer;
}
void device_free(void* pointer) noexcept { cudaFree(pointer); }
void copy_to_device(void* device, const void* host, size_t bytes) { check(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice), "copy to device"); }
void copy_to_host(void* host, const void* device, size_t bytes) { check(cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost), "copy to host"); }
void device_memset_zero(void* device, size_t bytes) { check(cudaMemset(device, 0, bytes), "cudaMemset"); }
void device_synchronize() { check(cudaDeviceSynchronize(), "synchronize"); }

void embedding_forward(Bf16* out, const int32_t* tokens, const Bf16* table, int64_t T, int64_t C) {
  embedding_forward_kernel<<<blocks_for(T * C), kThreads>>>(out, tokens, table, T, C);
  check_launch("embedding_forward");
}
void embedding_backward(float* dtable, const Bf16* dout, const int32_t* tokens, int64_t T, int64_t C) {
  embedding_backward_kernel<<<blocks_for(T * C), kThreads>>>(dtable, dout, tokens, T, C);
  check_launch("embedding_backward");
}
void rmsnorm_forward(Bf16* out, float* rstd, const Bf16* inp, const Bf16* weight, int64_t T, int64_t C, float eps) {
  rmsnorm_forward_kernel<<<static_cast<unsigned>(T), kThreads>>>(out, rstd, inp, weight, C, eps);
  check_launch("rmsnorm_forward");
}
namespace {
// ---- mixture of experts: one thread per token (routing, combine's dot products) or per element ----
__global__ void moe_route_kernel(float* weights, int32_t* indices, float* probs, const Bf16* logits, int64_t T, int64_t E, int64_t k,
                                 bool normalize) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= T) return;
  float largest = -INFINITY, sum = 0;
  for (int64_t e = 0; e < E; ++e) largest = fmaxf(largest, load(logits, t * E + e));
  for (int64_t e = 0; e < E; ++e) sum += (probs[t * E + e] = expf(load(logits, t * E + e) - largest));
  for (int64_t e = 0; e < E; ++e) probs[t * E + e] /= sum;
  // Top-k by repeated selection: the largest not yet chosen, ties to the lower expert.
  float chosen = 0;
  for (int64_t j = 0; j < k; ++j) {
    int32_t best = -1;
    for (int64_t e = 0; e < E; ++e) {
      bool taken = false;
      for (int64_t i = 0; i < j; ++i) taken = taken || indices[t * k + i] == e;
      if (!taken && (best < 0 || probs[t * E + e] > probs[t * E + best])) best = static_cast<int32_t>(e);
    }
    indices[t * k + j] = best;
    chosen += probs[t * E + best];
  }
  for (int64_t j = 0; j < k; ++j) weights[t * k + j] = normalize ? probs[t * E + indices[t * k + j]] / chosen : probs[t * E + indices[t * k + j]];
}
__global__ void moe_route_backward_kernel(Bf16* dlogits, const float* dweights, const float* probs, const float* weights, const int32_t* indices,
                                          int64_t T, int64_t E, int64_t k, bool normalize) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= T) return;
  float chosen = 0, dot = 0;
  for (int64_t j = 0; j < k; ++j) {
    chosen += probs[t * E + indices[t * k + j]];
    dot += dweights[t * k + j] * weights[t * k + j];
  }
  auto dp = [&](int64_t e) {
    for (int64_t j = 0; j < k; ++j)
      if (indices[t * k + j] == e) return normalize ? (dweights[t * k + j] - dot) / chosen : dweights[t * k + j];
    return 0.0f;
  };
  float inner = 0;
  for (int64_t e = 0; e < E; ++e) inner += dp(e) * probs[t * E + e];
  for (int64_t e = 0; e < E; ++e) dlogits[t * E + e] = bf16(probs[t * E + e] * (dp(e) - inner));
}
__global__ void moe_gather_kernel(Bf16* rows, const Bf16* x, const int32_t* order, int64_t R, int64_t C) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < R * C) rows[i] = x[int64_t{order[i / C]} * C + i % C];
}
__global__ void moe_gather_backward_kernel(Bf16* dx, const Bf16* drows, const int32_t* position, int64_t T, int64_t k, int64_t C) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= T * C) return;
  const int64_t t = i / C, c = i % C;
  float sum = load(dx, i);
  for (int64_t j = 0; j < k; ++j) sum += load(drows, int64_t{position[t * k + j]} * C + c);
  dx[i] = bf16(sum);
}
__global__ void moe_combine_kernel(Bf16* out, const Bf16* rows, const int32_t* position, const float* weights, int64_t T, int64_t k, int64_t C) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= T * C) return;
  const int64_t t = i / C, c = i % C;
  float sum = load(out, i);
  for (int64_t j = 0; j < k; ++j) sum += weights[t * k + j] * load(rows, int64_t{position[t * k + j]} * C + c);
  out[i] = bf16(sum);
}
__global__ void moe_combine_backward_kernel(Bf16* drows, float* dweights, const Bf16* dout, const Bf16* rows, const int32_t* position,
                                            const float* weights, int64_t T, int64_t k, int64_t C) {
  const int64_t pair = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (pair >= T * k) return;
  const int64_t t = pair / k, row = position[pair];
  float dot = 0;
  for (int64_t c = 0; c < C; ++c) {
    drows[row * C + c] = bf16(weights[pair] * load(dout, t * C + c));
    dot += load(dout, t * C + c) * load(rows, row * C + c);
  }
  dweights[pair] += dot;
}
__global__ void moe_shared_gate_forward_kernel(Bf16* out, const Bf16* shared, const Bf16* gate, int64_t T, int64_t C) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= T * C) return;
  const float g = 1.0f / (1.0f + expf(-load(gate, i / C)));
  out[i] = bf16(load(out, i) + g * load(shared, i));
}
__global__ void moe_shared_gate_backward_kernel(Bf16* dshared, Bf16* dgate, const Bf16* dout, const Bf16* shared, const Bf16* gate, int64_t T,
                                                int64_t C) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= T) return;
  const float g = 1.0f / (1.0f + expf(-load(gate, t)));
  float dot = 0;
  for (int64_t c = 0; c < C; ++c) {
    dshared[t * C + c] = bf16(g * load(dout, t * C + c));
    dot += load(dout, t * C + c) * load(shared, t * C + c);
  }
  dgate[t] = bf16(dot * g * (1.0f - g));
}
}  // namespace

void moe_route(float* weights, int32_t* indices, float* probs, const Bf16* logits, int64_t T, int64_t E, int64_t k, bool normalize) {
  moe_route_kernel<<<blocks_for(T), kThreads>>>(weights, indices, probs, logits, T, E, k, normalize);
  check_launch("moe_route");
}
void moe_route_backward(Bf16* dlogits, const float* dweights, const float* probs, const float* weights, const int32_t* indices, int64_t T,
                        int64_t E, int64_t k, bool normalize) {
  moe_route_backward_kernel<<<blocks_for(T), kThreads>>>(dlogits, dweights, probs, weights, indices, T, E, k, normalize);
  check_launch("moe_route_backward");
}
void moe_gather(Bf16* rows, const Bf16* x, const int32_t* order, int64_t R, int64_t C) {
  moe_gather_kernel<<<blocks_for(R * C), kThreads>>>(rows, x, order, R, C);
  check_launch("moe_gather");
}
void moe_gather_backward(Bf16* dx, const Bf16* drows, const int32_t* position, int64_t T, int64_t k, int64_t C) {
  moe_gather_backward_kernel<<<blocks_for(T * C), kThreads>>>(dx, drows, position, T, k, C);
  check_launch("moe_gather_backward");
}
void moe_combine(Bf16* out, const Bf16* rows, const int32_t* position, const float* weights, int64_t T, int64_t k, int64_t C) {
  moe_combine_kernel<<<blocks_for(T * C), kThreads>>>(out, rows, position, weights, T, k, C);
  check_launch("moe_combine");
}
void moe_combine_backward(Bf16* drows, float* dweights, const Bf16* dout, const Bf16* rows, const int32_t* position, const float* weights,
                          int64_t T, int64_t k, int64_t C) {
  moe_combine_backward_kernel<<<blocks_for(T * k), kThreads>>>(drows, dweights, dout, rows, position, weights, T, k, C);
  check_launch("moe_combine_backward");
}
void moe_shared_gate_forward(Bf16* out, const Bf16* shared, const Bf16* gate, int64_t T, int64_t C) {
  moe_shared_gate_forward_kernel<<<blocks_for(T * C), kThreads>>>(out, shared, gate, T, C);
  check_launch("moe_shared_gate_forward");
}
void moe_shared_gate_backward(Bf16* dshared, Bf16* dgate, const Bf16* dout, const Bf16* shared, const Bf16* gate, int64_t T, int64_t C) {
  moe_shared_gate_backward_kernel<<<blocks_for(T), kThreads>>>(dshared, dgate, dout, shared, gate, T, C);
  check_launch("moe_shared_gate_backward");
}

void rmsnorm_backward(Bf16* dinp, float* dweight, const Bf16* dout, const Bf16* inp, const Bf16* weight, const float* rstd,
                      int64_t T, int64_t C) {
  rmsnorm_backward_kernel<<<static_cast<unsigned>(T), kThreads>>>(dinp, dweight, dout, inp, weight, rstd, C);
  check_launch("rmsnorm_backward");
}
void rope_forward(Bf16* out, const Bf16* inp, const int32_t* position_ids, int64_t T, int64_t NH, int64_t HD, double theta) {
  rope_rotate_kernel<<<blocks_for(T * HD / 2), kThreads>>>(out, inp, position_ids, T, NH, HD, theta, 1.0, false);
  check_launch("rope_forward");
}
void rope_backward(Bf16* dinp, const Bf16* dout, const int32_t* position_ids, int64_t T, int64_t NH, int64_t HD, double theta) {
  rope_rotate_kernel<<<blocks_for(T * HD / 2), kThreads>>>(dinp, dout, position_ids, T, NH, HD, theta, -1.0, true);
  check_launch("rope_backward");
}
void swiglu_forward(Bf16* out, const Bf16* gate, const Bf16* up, int64_t N) {
  swiglu_forward_kernel<<<blocks_for(N), kThreads>>>(out, gate, up, N);
  check_launch("swiglu_forward");
}
void swiglu_backward(Bf16* dgate, Bf16* dup, const Bf16* dout, const Bf16* gate, const Bf16* up, int64_t N) {
  swiglu_backward_kernel<<<blocks_for(N), kThreads>>>(dgate, dup, dout, gate, up, N);
  check_launch("swiglu_backward");
}
void cross_entropy_forward(float* losses, const Bf16* logits, const int32_t* labels, int64_t T, int64_t V) {
  cross_entropy_forward_kernel<<<static_cast<unsigned>(T), kThreads>>>(losses, logits, labels, V);
  check_launch("cross_entropy_forward");
}
void cross_entropy_backward(Bf16* dlogits, const Bf16* logits, const int32_t* labels, float loss_scale, int64_t T, int64_t V) {
  cross_entropy_backward_kernel<<<static_cast<unsigned>(T), kThreads>>>(dlogits, logits, labels, loss_scale, V);
  check_launch("cross_entropy_backward");
}
namespace {
void attention_check_shape(int64_t NQ, int64_t NKV, int64_t HD) {
  // Lane l holds channels l, l + 32, ...: a head_dim that is not a multiple of 32 leaves the
  // last round's upper lanes idle (every channel loop stops at HD), so any HD up to 256 works.
  if (HD <= 0 || HD > 32 * kMaxChannelsPerLane || NKV <= 0 || NQ % NKV != 0)
    throw std::runtime_error("CUDA attention: head_dim must be 1..256 and q heads a multiple of kv heads");
}
int warp_blocks(int64_t tasks) { return static_cast<int>((tasks + kWarpsPerBlock - 1) / kWarpsPerBlock); }
}  // namespace

void attention_forward(Bf16* out, float* lse, const Bf16* q, const Bf16* k, const Bf16* v, const int32_t* position_ids, int64_t T,
                       int64_t NQ, int64_t NKV, int64_t HD) {
  attention_check_shape(NQ, NKV, HD);
  const float scale = 1.0f / sqrtf(static_cast<float>(HD));
  attention_forward_kernel<<<warp_blocks(T * NQ), 32 * kWarpsPerBlock>>>(out, lse, q, k, v, position_ids, T, NQ, NKV, HD, scale);
  check_launch("attention_forward");
}

void attention_backward(Bf16* dq, Bf16* dk, Bf16* dv, float* delta_scratch, const Bf16* dout, const Bf16* q, const Bf16* k,
                        const Bf16* v, const Bf16* out, const float* lse, const int32_t* position_ids, int64_t T, int64_t NQ,
                        int64_t NKV, int64_t HD) {
  attention_check_shape(NQ, NKV, HD);
  const float scale = 1.0f / sqrtf(static_cast<float>(HD));
  attention_delta_kernel<<<warp_blocks(T * NQ), 32 * kWarpsPerBlock>>>(delta_scratch, dout, out, T, NQ, HD);
  check_launch("attention_backward delta");
  attention_dq_kernel<<<warp_blocks(T * NQ), 32 * kWarpsPerBlock>>>(dq, delta_scratch, dout, q, k, v, lse, position_ids, T, NQ, NKV,
                                                                    HD, scale);
  check_launch("attention_backward dq");
  attention_dkv_kernel<<<warp_blocks(T * NKV), 32 * kWarpsPerBlock>>>(dk, dv, delta_scratch, dout, q, k, v, lse, position_ids, T, NQ,
                                                                      NKV, HD, scale);
  check_launch("attention_backward dk dv");
}

void adamw_update(float* params, Bf16* weights_bf16, const float* grads, float* m, float* v, int64_t N, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int64_t step) {
  const float bias1 = 1.0f - powf(beta1, static_cast<float>(step)), bias2 = 1.0f - powf(beta2, static_cast<float>(step));
  adamw_kernel<<<blocks_for(N), kThreads>>>(params, weights_bf16, grads, m, v, N, lr, beta1, beta2, eps, weight_decay, bias1, bias2);
  check_launch("adamw_update");
}

// cuBLAS is column-major: a row-major [R, K] buffer is a column-major [K, R] one, so each product
// below is the transposed product of the row-major formula in the comment.
Blas::Blas() {
  cublasHandle_t handle = nullptr;
  check_blas(cublasCreate(&handle), "create");
  handle_ = handle;
}
Blas::~Blas() { cublasDestroy(static_cast<cublasHandle_t>(handle_)); }

void Blas::linear_forward(Bf16* out, const Bf16* inp, const Bf16* weight, int64_t T, int64_t C, int64_t OC) {
  // out^T [OC, T] = weight [OC, C] (stored as [C, OC]: transposed) x inp^T [C, T]
  const float one = 1.0f, zero = 0.0f;
  check_blas(cublasGemmEx(static_cast<cublasHandle_t>(handle_), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(OC), static_cast<int>(T),
                          static_cast<int>(C), &one, weight, CUDA_R_16BF, static_cast<int>(C), inp, CUDA_R_16BF, static_cast<int>(C),
                          &zero, out, CUDA_R_16BF, static_cast<int>(OC), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
             "linear_forward");
}

void Blas::linear_forward_add(Bf16* out, const Bf16* inp, const Bf16* weight, float alpha, int64_t T, int64_t C, int64_t OC) {
  // As linear_forward with beta = 1: cuBLAS reads out, adds alpha x the product in fp32, rounds once.
  const float one = 1.0f;
  check_blas(cublasGemmEx(static_cast<cublasHandle_t>(handle_), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(OC), static_cast<int>(T),
                          static_cast<int>(C), &alpha, weight, CUDA_R_16BF, static_cast<int>(C), inp, CUDA_R_16BF, static_cast<int>(C),
                          &one, out, CUDA_R_16BF, static_cast<int>(OC), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
             "linear_forward_add");
}

void Blas::linear_backward(Bf16* dinp, float* dweight, const Bf16* dout, const Bf16* inp, const Bf16* weight, int64_t T, int64_t C,
                           int64_t OC, float alpha) {
  const float one = 1.0f;
  auto handle = static_cast<cublasHandle_t>(handle_);
  if (dinp)  // dinp^T [C, T] += alpha weight^T [C, OC] x dout^T [OC, T]
    check_blas(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(C), static_cast<int>(T), static_cast<int>(OC), &alpha,
                            weight, CUDA_R_16BF, static_cast<int>(C), dout, CUDA_R_16BF, static_cast<int>(OC), &one, dinp, CUDA_R_16BF,
                            static_cast<int>(C), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "linear_backward dinp");
  if (dweight)  // dweight^T [C, OC] += alpha inp^T [C, T] x dout [T, OC] (fp32 output)
    check_blas(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_T, static_cast<int>(C), static_cast<int>(OC), static_cast<int>(T), &alpha,
                            inp, CUDA_R_16BF, static_cast<int>(C), dout, CUDA_R_16BF, static_cast<int>(OC), &one, dweight, CUDA_R_32F,
                            static_cast<int>(C), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "linear_backward dweight");
}

// ---- blocked attention: the primitives of kernels/blocked_attention.hpp ----
namespace {

__device__ inline bool key_visible(const int32_t* positions, int64_t i, int64_t j) { return j <= i && j >= i - positions[i]; }

__global__ void fill_kernel(float* data, int64_t n, float value) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) data[i] = value;
}
// One block per (head, query row) of the query block.
__global__ void online_softmax_kernel(Bf16* P, float* O, float* m, float* sum, const float* S, const int32_t* positions, int64_t i0,
                                      int64_t rows, int64_t j0, int64_t cols, float scale, int64_t B, int64_t HD) {
  const int64_t h = blockIdx.x / rows, r = blockIdx.x % rows, row = h * B + r, i = i0 + r;
  const float* s = S + row * B;
  float local_max = -INFINITY;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    if (key_visible(positions, i, j0 + c)) local_max = fmaxf(local_max, s[c] * scale);
  const float old_max = m[row];
  const float new_max = fmaxf(old_max, block_max(local_max));
  // Nothing visible yet in this row (keys of an earlier document): it adds nothing.
  const float correction = new_max == -INFINITY ? 1.0f : expf(old_max - new_max);
  float local_sum = 0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float p = key_visible(positions, i, j0 + c) ? expf(s[c] * scale - new_max) : 0.0f;
    local_sum += p;
    P[row * B + c] = bf16(p);
  }
  const float added = block_sum(local_sum);
  for (int64_t d = threadIdx.x; d < HD; d += blockDim.x) O[row * HD + d] *= correction;
  if (threadIdx.x == 0) {
    sum[row] = sum[row] * correction + added;
    m[row] = new_max;
  }
}
__global__ void attention_finish_kernel(Bf16* out, float* lse, const float* O, const float* m, const float* sum, int64_t i0, int64_t rows,
                                        int64_t T, int64_t NQ, int64_t B, int64_t HD) {
  const int64_t h = blockIdx.x / rows, r = blockIdx.x % rows, row = h * B + r;
  // sum is 0 only for a query that sees no key of the range (FPDT's chunk pairs): out 0, lse -inf.
  const bool seen = sum[row] > 0.0f;
  for (int64_t d = threadIdx.x; d < HD; d += blockDim.x) out[((i0 + r) * NQ + h) * HD + d] = bf16(seen ? O[row * HD + d] / sum[row] : 0.0f);
  if (threadIdx.x == 0) lse[h * T + i0 + r] = seen ? m[row] + logf(sum[row]) : -INFINITY;
}
// Element-wise over [NQ, rows, cols] of the block's [NQ, B, B] buffers.
__global__ void probabilities_kernel(Bf16* P, const float* S, const float* lse, const int32_t* positions, int64_t i0, int64_t rows,
                                     int64_t j0, int64_t cols, float scale, int64_t T, int64_t NQ, int64_t B) {
  const int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (e >= NQ * rows * cols) return;
  const int64_t c = e % cols, r = (e / cols) % rows, h = e / (cols * rows), index = (h * B + r) * B + c;
  P[index] = bf16(key_visible(positions, i0 + r, j0 + c) ? expf(S[index] * scale - lse[h * T + i0 + r]) : 0.0f);
}
__global__ void softmax_gradient_kernel(Bf16* dS, const Bf16* P, const float* dP, const float* delta, int64_t i0, int64_t rows,
                                        int64_t cols, float scale, int64_t T, int64_t NQ, int64_t B) {
  const int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (e >= NQ * rows * cols) return;
  const int64_t c = e % cols, r = (e / cols) % rows, h = e / (cols * rows), index = (h * B + r) * B + c;
  dS[index] = bf16(load(P, index) * (dP[index] - delta[h * T + i0 + r]) * scale);
}
__global__ void add_kv_block_kernel(Bf16* target, const float* acc, int64_t j0, int64_t cols, int64_t NKV, int64_t B, int64_t HD) {
  const int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (e >= NKV * cols * HD) return;
  const int64_t d = e % HD, c = (e / HD) % cols, g = e / (HD * cols), index = ((j0 + c) * NKV + g) * HD + d;
  target[index] = bf16(load(target, index) + acc[(g * B + c) * HD + d]);
}
__global__ void add_accumulated_kernel(Bf16* target, const float* acc, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) target[i] = bf16(load(target, i) + acc[i]);
}

// The primitives, each a cuBLAS call per q head of a kv group (batched over the kv heads) or a
// kernel. cuBLAS is column-major: a row-major [n, HD] slice with row stride s is a column-major
// [HD, n] matrix with leading dimension s; each product below is written in that form.
class CudaBlockedAttentionOps {
 public:
  explicit CudaBlockedAttentionOps(cublasHandle_t handle) : handle_(handle) {}
  using L = BlockedAttentionLayout;

  // S[h][r][c] = a[i0 + r, h] . b[j0 + c, g]: S_h^T [cols, rows] = b_g^T (as [HD, cols], transposed) x a_h [HD, rows].
  void scores(float* S, const Bf16* a, const Bf16* b, int64_t i0, int64_t rows, int64_t j0, int64_t cols, const L& l) {
    const float one = 1.0f, zero = 0.0f;
    for (int64_t hl = 0; hl < l.group(); ++hl)
      check_blas(cublasGemmStridedBatchedEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, narrow(cols), narrow(rows), narrow(l.HD), &one,
                                            b + j0 * l.NKV * l.HD, CUDA_R_16BF, narrow(l.NKV * l.HD), l.HD, a + i0 * l.NQ * l.HD + hl * l.HD,
                                            CUDA_R_16BF, narrow(l.NQ * l.HD), l.group() * l.HD, &zero, S + hl * l.block * l.block, CUDA_R_32F,
                                            narrow(l.block), l.group() * l.block * l.block, narrow(l.NKV), CUBLAS_COMPUTE_32F,
                                            CUBLAS_GEMM_DEFAULT),
                 "blocked attention scores");
  }
  // acc_h[r][:] += X_h[r][:] . b_g[j0..]: acc_h^T [HD, rows] += b_g^T [HD, cols] x X_h^T [cols, rows].
  void accumulate_product(float* acc, int64_t row_stride, int64_t head_stride, const Bf16* X, const Bf16* b, int64_t j0, int64_t rows,
                          int64_t cols, const L& l) {
    const float one = 1.0f;
    for (int64_t hl = 0; hl < l.group(); ++hl)
      check_blas(cublasGemmStridedBatchedEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, narrow(l.HD), narrow(rows), narrow(cols), &one,
                                            b + j0 * l.NKV * l.HD, CUDA_R_16BF, narrow(l.NKV * l.HD), l.HD, X + hl * l.block * l.block,
                                            CUDA_R_16BF, narrow(l.block), l.group() * l.block * l.block, &one, acc + hl * head_stride,
                                            CUDA_R_32F, narrow(row_stride), l.group() * head_stride, narrow(l.NKV), CUBLAS_COMPUTE_32F,
                                            CUBLAS_GEMM_DEFAULT),
                 "blocked attention accumulate");
  }
  // acc_g[c][:] += sum over the group's heads of X_h^T a_h: acc_g^T [HD, cols] += a_h [HD, rows] x (X_h^T [cols, rows])^T.
  void accumulate_transposed(float* acc, const Bf16* X, const Bf16* a, int64_t i0, int64_t rows, int64_t cols, const L& l) {
    const float one = 1.0f;
    for (int64_t hl = 0; hl < l.group(); ++hl)
      check_blas(cublasGemmStridedBatchedEx(handle_, CUBLAS_OP_N, CUBLAS_OP_T, narrow(l.HD), narrow(cols), narrow(rows), &one,
                                            a + i0 * l.NQ * l.HD + hl * l.HD, CUDA_R_16BF, narrow(l.NQ * l.HD), l.group() * l.HD,
                                            X + hl * l.block * l.block, CUDA_R_16BF, narrow(l.block), l.group() * l.block * l.block, &one,
                                            acc, CUDA_R_32F, narrow(l.HD), l.block * l.HD, narrow(l.NKV), CUBLAS_COMPUTE_32F,
                                            CUBLAS_GEMM_DEFAULT),
                 "blocked attention accumulate transposed");
  }
  void statistics_reset(float* m, float* sum, float* O, int64_t /*rows*/, const L& l) {
    fill_kernel<<<blocks_for(l.row_statistics()), kThreads>>>(m, l.row_statistics(), -INFINITY);
    check_launch("blocked attention reset");
    zero(sum, l.row_statistics());
    zero(O, l.row_accumulator());
  }
  void online_softmax(Bf16* P, float* O, float* m, float* sum, const float* S, const int32_t* positions, int64_t i0, int64_t rows,
                      int64_t j0, int64_t cols, float scale, const L& l) {
    online_softmax_kernel<<<narrow(l.NQ * rows), kThreads>>>(P, O, m, sum, S, positions, i0, rows, j0, cols, scale, l.block, l.HD);
    check_launch("blocked attention online softmax");
  }
  void attention_finish(Bf16* out, float* lse, const float* O, const float* m, const float* sum, int64_t i0, int64_t rows, const L& l) {
    attention_finish_kernel<<<narrow(l.NQ * rows), kThreads>>>(out, lse, O, m, sum, i0, rows, l.T, l.NQ, l.block, l.HD);
    check_launch("blocked attention finish");
  }
  void softmax_delta(float* delta, const Bf16* dout, const Bf16* out, const L& l) {
    attention_delta_kernel<<<warp_blocks(l.T * l.NQ), 32 * kWarpsPerBlock>>>(delta, dout, out, l.T, l.NQ, l.HD);
    check_launch("blocked attention delta");
  }
  void zero(float* data, int64_t n) {
    check(cudaMemsetAsync(data, 0, static_cast<size_t>(n) * sizeof(float), cudaStreamLegacy), "blocked attention zero");
  }
  void probabilities(Bf16* P, const float* S, const float* lse, const int32_t* positions, int64_t i0, int64_t rows, int64_t j0,
                     int64_t cols, float scale, const L& l) {
    probabilities_kernel<<<blocks_for(l.NQ * rows * cols), kThreads>>>(P, S, lse, positions, i0, rows, j0, cols, scale, l.T, l.NQ, l.block);
    check_launch("blocked attention probabilities");
  }
  void softmax_gradient(Bf16* dS, const Bf16* P, const float* dP, const float* delta, int64_t i0, int64_t rows, int64_t cols, float scale,
                        const L& l) {
    softmax_gradient_kernel<<<blocks_for(l.NQ * rows * cols), kThreads>>>(dS, P, dP, delta, i0, rows, cols, scale, l.T, l.NQ, l.block);
    check_launch("blocked attention softmax gradient");
  }
  void add_kv_block(Bf16* target, const float* acc, int64_t j0, int64_t cols, const L& l) {
    add_kv_block_kernel<<<blocks_for(l.NKV * cols * l.HD), kThreads>>>(target, acc, j0, cols, l.NKV, l.block, l.HD);
    check_launch("blocked attention add kv block");
  }
  void add_accumulated(Bf16* target, const float* acc, int64_t n) {
    add_accumulated_kernel<<<blocks_for(n), kThreads>>>(target, acc, n);
    check_launch("blocked attention add dq");
  }

 private:
  static int narrow(int64_t value) {
    if (value > INT32_MAX) throw std::runtime_error("blocked attention: a dimension exceeds cuBLAS's int");
    return static_cast<int>(value);
  }
  cublasHandle_t handle_;
};

std::vector<int32_t> positions_to_host(const int32_t* positions, int64_t T) {
  std::vector<int32_t> host(static_cast<size_t>(T));
  check(cudaMemcpy(host.data(), positions, static_cast<size_t>(T) * sizeof(int32_t), cudaMemcpyDeviceToHost), "position ids to host");
  return host;
}

}  // namespace

void Blas::attention_forward_range(Bf16* out, float* lse, const Bf16* q, const Bf16* k, const Bf16* v, const int32_t* position_ids,
                                   int64_t q_begin, int64_t Tq, int64_t k_begin, int64_t Tk, int64_t NQ, int64_t NKV, int64_t HD,
                                   int64_t block, float* workspace) {
  if (NKV <= 0 || NQ % NKV != 0) throw std::runtime_error("CUDA blocked attention: q heads must be a multiple of kv heads");
  CudaBlockedAttentionOps ops(static_cast<cublasHandle_t>(handle_));
  const std::vector<int32_t> positions_host = positions_to_host(position_ids, q_begin + Tq);
  blocked_attention_forward_range(ops, out, lse, q, k, v, position_ids, positions_host.data(), q_begin, k_begin, Tk,
                                  BlockedAttentionLayout(Tq, NQ, NKV, HD, block), workspace);
}

void Blas::attention_softmax_delta(float* delta, const Bf16* dout, const Bf16* out, int64_t T, int64_t NQ, int64_t HD) {
  CudaBlockedAttentionOps ops(static_cast<cublasHandle_t>(handle_));
  ops.softmax_delta(delta, dout, out, BlockedAttentionLayout(T, NQ, NQ, HD, kGpuAttentionBlockTokens));
}

void Blas::attention_backward_range(Bf16* dq, Bf16* dk, Bf16* dv, const float* delta, const Bf16* dout, const Bf16* q, const Bf16* k,
                                    const Bf16* v, const float* lse, const int32_t* position_ids, int64_t q_begin, int64_t Tq,
                                    int64_t k_begin, int64_t Tk, int64_t NQ, int64_t NKV, int64_t HD, int64_t block, float* workspace) {
  if (NKV <= 0 || NQ % NKV != 0) throw std::runtime_error("CUDA blocked attention: q heads must be a multiple of kv heads");
  CudaBlockedAttentionOps ops(static_cast<cublasHandle_t>(handle_));
  const std::vector<int32_t> positions_host = positions_to_host(position_ids, q_begin + Tq);
  blocked_attention_backward_range(ops, dq, dk, dv, delta, dout, q, k, v, lse, position_ids, positions_host.data(), q_begin, k_begin, Tk,
                                   BlockedAttentionLayout(Tq, NQ, NKV, HD, block), workspace);
}

void Blas::attention_forward(Bf16* out, float* lse, const Bf16* q, const Bf16* k, const Bf16* v, const int32_t* position_ids, int64_t T,
                             int64_t NQ, int64_t NKV, int64_t HD, int64_t block, float* workspace) {
  if (NKV <= 0 || NQ % NKV != 0) throw std::runtime_error("CUDA blocked attention: q heads must be a multiple of kv heads");
  CudaBlockedAttentionOps ops(static_cast<cublasHandle_t>(handle_));
  const std::vector<int32_t> positions_host = positions_to_host(position_ids, T);
  blocked_attention_forward(ops, out, lse, q, k, v, position_ids, positions_host.data(), BlockedAttentionLayout(T, NQ, NKV, HD, block),
                            workspace);
}

void Blas::attention_backward(Bf16* dq, Bf16* dk, Bf16* dv, float* delta_scratch, const Bf16* dout, const Bf16* q, const Bf16* k,
                              const Bf16* v, const Bf16* out, const float* lse, const int32_t* position_ids, int64_t T, int64_t NQ,
                              int64_t NKV, int64_t HD, int64_t block, float* workspace) {
  if (NKV <= 0 || NQ % NKV != 0) throw std::runtime_error("CUDA blocked attention: q heads must be a multiple of kv heads");
  CudaBlockedAttentionOps ops(static_cast<cublasHandle_t>(handle_));
  const std::vector<int32_t> positions_host = positions_to_host(position_ids, T);
  blocked_attention_backward(ops, dq, dk, dv, delta_scratch, dout, q, k, v, out, lse, position_ids, positions_host.data(),
                             BlockedAttentionLayout(T, NQ, NKV, HD, block), workspace);
}

}  // namespace longseq::cuda
