// time_model.hpp: predicted time of one training step (an optimizer step: one micro batch per rank, or
// with a global batch its gradient-accumulation micro-steps), per rank.
//
// Compute: GEMMs at the card's measured matmul rate (MAMF), attention at FlashAttention's
// measured forward+backward rate. Communication: alpha-beta collectives (comm_model.hpp).
// What overlaps and what does not follows the runtimes: DeepSpeed-Ulysses all-to-alls run on the
// compute stream (exposed); ZeRO-3 gathers are prefetched (hidden up to the layer compute time);
// ArcticTraining's checkpoint offload is a synchronous copy (exposed, REFERENCE §3.4), FPDT's is
// overlapped with compute (REFERENCE §3.6); an offloaded optimizer copies gradients down with
// blocking copies in backward and runs its step on the host after backward (exposed; §7.5, §9).
#pragma once

#include <cstdint>
#include <string>

#include "models/model_spec.hpp"
#include "planner/cards.hpp"
#include "planner/compute_model.hpp"
#include "planner/plan.hpp"

namespace longseq {

// Seconds, added as a struct.
struct StepTime {
  double matmul_s = 0;
  double attention_s = 0;
  double ulysses_all_to_all_s = 0;
  double zero_communication_exposed_s = 0;  // parameter gathers, gradient reduction, parameter offload fetches
  double checkpoint_offload_s = 0;          // exposed PCIe time of checkpoint copies
  double fpdt_fetch_exposed_s = 0;          // FPDT chunk traffic not hidden behind attention
  double ring_exposed_s = 0;                // ring attention's key/value passing not hidden behind attention
  double ring_final_hop_s = 0;              // backward's dk/dv accumulators going home after the last step
  double activation_offload_s = 0;          // TE's layer-wise activation offloading's copies not hidden behind the other layers
  double expert_all_to_all_s = 0;           // Megatron's MoE dispatcher exchanging the routed tokens over the ep ranks
  double tensor_parallel_exposed_s = 0;     // Megatron's sequence-parallel all-gathers and reduce-scatters not hidden behind GEMMs
  double pipeline_bubble_s = 0;             // 1F1B's pp - 1 idle micro-batch slots
  double pipeline_p2p_s = 0;                // activations and their gradients sent between pipeline stages
  double gradient_offload_s = 0;            // offloaded optimizer: gradient partitions copied to the host in backward
  double optimizer_s = 0;                   // optimizer step (host or GPU) and the updated weights' copy up
  double elementwise_s = 0;                 // norms, RoPE, SwiGLU, residual adds and the loss's softmax, by bytes moved
  StepTime& operator+=(const StepTime& other);
  double total_s() const;
};

// Bytes the element-wise work of one decoder layer moves per token in one forward pass, in the
// activation dtype: two RMSNorms (read x, write y), RoPE on q and k (read, write), two residual
// adds (two reads, one write), SwiGLU (read gate and up, write the product); a backward moves about
// twice that (it reads the saved inputs and the incoming gradient and writes the input gradient).
double layer_elementwise_bytes_per_token(const ModelSpec& model, int64_t activation_bytes);

// One optimizer step: `accumulation_steps` micro-steps (one micro batch per data-parallel rank each)
// and the optimizer once. The FLOP counts are one micro-step's; the rates are over the whole step.
struct TimePrediction {
  StepTime time;
  int64_t accumulation_steps = 1;
  std::string attention_kernel = "fa2";  // whose rate attention_s is at (attention_kernel_for; attention_kernels_all)
  StepFlops executed_flops;      // per rank, recompute included
  StepFlops model_flops;         // per rank, forward + backward only
  double megatron_flos = 0;      // per rank: the ALST formula's FLOs for this rank's share
  double hardware_tflops_per_gpu = 0;
  double megatron_tflops_per_gpu = 0;  // what the ALST paper prints
  double mfu = 0;                      // model FLOPs / (time * dense bf16 peak)
  double tokens_per_s = 0;             // whole cluster
};

// Precondition: as memory_predict (a valid plan and sequence length).
TimePrediction time_predict(const ModelSpec& model, const ClusterSpec& cluster, const PlanOptions& plan,
                            const RuntimeProfile& profile, int64_t seqlen);

// One attention layer alone, as attention kernel benchmarks time it (ring-flash-attention's,
// yunchang's LongContextAttention): causal, over `seqlen` tokens of `batch` samples on sp x ring
// ranks (Ulysses' all-to-alls of q, k, v and the output; the ring's key/value passing beyond each
// step's compute), its forward, or forward and backward.
struct AttentionBenchmark {
  int64_t q_heads = 0, kv_heads = 0, head_dim = 0, seqlen = 0, batch = 1;
  int64_t sp = 1, ring = 1;
  bool backward = false;
  // A causal split that gives every ring rank the same work (zigzag, stripe). Without it (the
  // plain ring of contiguous chunks) every step waits for the last rank, which computes r - 1/2
  // blocks while the average rank computes r/2.
  bool balanced = true;
  int64_t activation_bytes = 2;  // bf16
};
double attention_benchmark_seconds(const AttentionBenchmark& benchmark, const ClusterSpec& cluster);

// An attention kernel's achieved rate on the model's attention FLOPs at this head size. The kernel
// computes at the smallest head dim it is compiled for that holds this one (attention_kernel_head_dim:
// FlashAttention-2 runs 80 as 96, FlashAttention-3 runs 125 as 128), at the card's rate for that
// head dim (linear between its head_dim 64 and 128 figures, held constant outside them), so a padded
// head dim's rate is lower by head_dim / computed head dim; past the kernel's largest (another SDPA
// backend) the head dim as given. `kernel` an id of attention_kernels_all (a card without its
// figures throws).
double attention_tflops(const HardwareCard& card, int64_t head_dim, const std::string& kernel = "fa2");

// The FP8 GEMM rate a plan in FP8 is priced at: the card's measured bf16 matmul share of its bf16
// peak applied to its dense FP8 peak. No FP8 GEMM measurement is in the sources, so it is an
// approximation, and every FP8 plan says so (fp8_rate_caveat).
double fp8_matmul_achieved_tflops(const HardwareCard& card);
std::string fp8_rate_caveat(const HardwareCard& card);

// The price of a billion tokens: the GPU-hours `gpus` GPUs take for them at `tokens_per_s` (the
// cluster's), times `gpu_hour_cost`. 0 where either is not positive.
double cost_per_billion_tokens(double tokens_per_s, int64_t gpus, double gpu_hour_cost);

// Why `profile`'s attention kernel cannot run on `card` (FlashAttention-3 off Hopper, a kernel the
// card has no rate for) or, given a model's `head_dim`, on that model (past the largest head dim of
// a kernel SDPA does not run: FlashAttention-3); empty when it can.
std::string attention_kernel_problem(const RuntimeProfile& profile, const HardwareCard& card, int64_t head_dim = 0);

}  // namespace longseq
