// trainer.hpp: training steps on one rank with measurement — data, steps, and the measured
// memory breakdown to set beside the planner's prediction.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "executor/llama.hpp"
#include "planner/memory_model.hpp"
#include "planner/plan.hpp"
#include "planner/search.hpp"

namespace longseq {

// One training sample: tokens, pre-shifted labels (-100 = ignored), position ids.
struct Sample {
  std::vector<int32_t> tokens, labels, positions;
};

// A synthetic long-range task: a random key span appears early and must be copied at the end,
// after filler that follows a fixed cycle (easy to learn, so the loss visibly falls while the
// copy needs attention across the whole sequence). Deterministic for a seed.
Sample sample_synthetic(int64_t seqlen, int64_t vocab, uint32_t seed);

// Byte-level sample from a text file (the bytes are the tokens; vocab must be >= 256), starting
// at `offset` and wrapping around. Throws ConfigError when the file cannot be read or is empty.
Sample sample_from_text(const std::string& text, int64_t seqlen, int64_t offset);

// The planner's view of an executor run: Ulysses over `sp` ranks (times `ring` with ring attention), the model's states as
// `states` (ZeRO stage and offloads, ZeRO over every rank), with the executor's options.
PlanOptions executor_plan(const TrainingOptions& options, int64_t sp = 1, int zero_stage = 0, bool offload_optimizer = false,
                          bool offload_params = false, int64_t ring = 1);

// What of `plan` this executor cannot run on `device` ("cpu" or "cuda"), one reason per option,
// naming it; empty when it runs all of it. Checked before anything is allocated.
std::vector<std::string> executor_plan_problems(const PlanOptions& plan, const std::string& device);

// The executor's options for `plan`, with the tile sizes of the prediction for it (its rules
// when the plan leaves a count open), so that the run allocates what was predicted.
TrainingOptions executor_training_options(const PlanOptions& plan, const MemoryPrediction& predicted, int64_t attention_block = 64);

// This machine as the planner's target: `ranks` ranks, each with a device of `budget_bytes`
// (infinite: unbounded): the CPU ("cpu", card cpu-device, profile native) or a GPU per rank
// ("cuda", profile native-cuda, whose runtime terms are added to the budget: the arena holds
// the budget, the runtime sits beside it).
// The largest device budget a plan or run for this machine takes: 1 TiB per rank, beyond any
// device built (a larger value is a typo, and would send the length search past any plausible run).
inline constexpr double kMostBudgetMib = 1024.0 * 1024.0;

struct MachineTarget {
  std::string device = "cpu";
  int64_t ranks = 1;
  double budget_bytes = std::numeric_limits<double>::infinity();
};
// The executor's runtime profile: native (CPU, fp32) or native-cuda (bf16), in a precision regime.
RuntimeProfile machine_profile(const MachineTarget& target, PrecisionRegime precision = PrecisionRegime::mixed_master);
ClusterSpec machine_cluster(const MachineTarget& target);
// The search `longseq plan --ranks/--budget-mib` and `longseq run --auto` both run: the planner's
// search, restricted to what this executor runs on the device, with FPDT chunks this machine's
// lengths can use; `held` as every plan's adapters (LoRA) and other held choices.
SearchResult machine_plan_search(const ModelSpec& model, const MachineTarget& target, const HeldChoices& held = {});

// The CPU card's rates measured now on this machine, for the time model to price a run here at its
// real speed (the built-in cpu-device card's are one VM's, measured once): an fp32 GEMM at the
// step's MLP shape ([tokens, hidden] x [hidden, intermediate], tokens capped at 2048: small models'
// GEMMs run far below a large one's rate), causal attention forward and backward at 1024 tokens, 4
// heads of `head_dim` (the run's block), and a 64 MiB memcpy for the host-pool copies. Collectives
// keep the card's rates (not measured). About 0.1-0.5 s.
// The fp32 GEMM rate of the CPU kernels at [m, k] x [k, n], best of `repeats` (GFLOP/s).
double gemm_gflops_measure(int64_t m, int64_t k, int64_t n, int repeats);
struct MeasuredCpuRates {
  double matmul_gflops = 0, attention_gflops = 0, memcpy_gbps = 0;
  // The element-wise kernels' bytes a second (RMSNorm, RoPE, SwiGLU forward and backward at the
  // step's widths), counted as the time model counts them.
  double elementwise_gbps = 0;
  int64_t gemm_m = 0, gemm_k = 0, gemm_n = 0;  // the shape the GEMM rate was measured at
};
MeasuredCpuRates cpu_rates_measure(int64_t tokens, int64_t hidden, int64_t intermediate, int64_t head_dim, int64_t attention_block);
HardwareCard cpu_card_with_rates(HardwareCard card, const MeasuredCpuRates& rates);

// Ranks of this job on this machine (Open MPI's OMPI_COMM_WORLD_LOCAL_SIZE; else `world_size`).
int64_t ranks_on_this_node(int64_t world_size);
// Each of `ranks_on_node` ranks runs its kernels on its share of the cores: OpenMP threads set to
// cores / ranks (at least 1) unless OMP_NUM_THREADS says otherwise (more threads than cores spin
// against each other; torchrun sets one thread a process for the same reason).
void rank_threads_set(int64_t ranks_on_node);
// The share of the rates measured with this process's threads alone that one rank gets while all
// `ranks_on_node` run: 1 when their threads fit the cores, else cores / (ranks x threads).
double rank_core_share(int64_t ranks_on_node);

// The CPU "device" as a cluster of `ranks` one-device ranks on one node (machine_cluster's).
ClusterSpec executor_cluster(double budget_bytes, int64_t ranks = 1);

// FPDT's input layout (Megatron-DeepSpeed's FPDT_InputConstruct): the sequence in chunks of
// chunk_local x sp tokens, rank `rank` holding piece `rank` of every chunk, in chunk order, so that
// the all-to-all of every rank's chunk i is the i-th chunk of the sequence in order. With sp = 1
// it is the sequence itself. values.size() must be a multiple of chunk_local x sp.
std::vector<int32_t> fpdt_layout_rank_tokens(const std::vector<int32_t>& values, int64_t sp, int64_t rank, int64_t chunk_local);

// Ring attention's input layout (the zigzag split, llama_step.hpp ring_attention_forward): the
// sequence in 2r chunks, ring group i (sequence ranks i*sp .. i*sp+sp-1, Ulysses inside) holding
// chunks i and 2r-1-i back to back, its rank j holding the j-th of sp equal slices of those. With
// ring = 1 it is Ulysses' contiguous slice. values.size() must be a multiple of 2 x sp x ring.
std::vector<int32_t> ring_layout_rank_tokens(const std::vector<int32_t>& values, int64_t sp, int64_t ring, int64_t sequence_rank);

struct StepMeasurement {
  int64_t step = 0;
  double loss = 0;
  double seconds = 0;
  double tokens_per_s = 0;
  double device_peak_bytes = 0;  // the arena's peak so far
  double host_peak_bytes = 0;
};

}  // namespace longseq
