#include "executor/trainer.hpp"
#include "planner/frameworks.hpp"
#include "kernels/cpu/dense.hpp"
#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/norm_rope.hpp"
#include <limits>
#include <numeric>
#include <cstring>
#include <chrono>
#include <cstdlib>
#include <thread>
#ifdef _OPENMP
#include <omp.h>
#endif

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>

#include <fmt/format.h>

#include "io/config_error.hpp"
#include "io/process.hpp"
#include "planner/cards.hpp"

namespace longseq {

Sample sample_synthetic(int64_t seqlen, int64_t vocab, uint32_t seed) {
  if (vocab < 2 || vocab > kModelDimensionLimit)
    throw ConfigError("--model", "vocab_size", fmt::format("the synthetic task needs 2 to {} tokens, got {}", kModelDimensionLimit, vocab));
  Sample sample;
  std::mt19937 generator(seed);
  const int64_t key_length = std::max<int64_t>(1, std::min<int64_t>(32, seqlen / 8));
  const int32_t marker = static_cast<int32_t>(vocab - 1);
  // Filler cycles through tokens [0, 16) and keys come from [16, V-1); a vocabulary too small for
  // both shares [0, V-1) between them (the marker V-1 stays unique).
  const int32_t filler_tokens = static_cast<int32_t>(std::min<int64_t>(16, vocab - 1));
  const int32_t first_key_token = vocab - 2 >= 16 ? 16 : 0;
  std::uniform_int_distribution<int32_t> key_token(first_key_token, static_cast<int32_t>(vocab) - 2);
  std::vector<int32_t> key(static_cast<size_t>(key_length));
  for (auto& token : key) token = key_token(generator);
  // [key] [filler cycle 0..15 ...] [marker] [key again]
  for (int64_t i = 0; i < seqlen; ++i) {
    const int64_t tail = seqlen - key_length;
    int32_t token;
    if (i < key_length) token = key[static_cast<size_t>(i)];
    else if (i < tail - 1) token = static_cast<int32_t>(i % filler_tokens);
    else if (i == tail - 1) token = marker;
    else token = key[static_cast<size_t>(i - tail)];
    sample.tokens.push_back(token);
    sample.positions.push_back(static_cast<int32_t>(i));
  }
  // Labels are the next token; the key itself is random, so its first copy is not predicted.
  for (int64_t i = 0; i < seqlen; ++i)
    sample.labels.push_back(i + 1 < seqlen && i + 1 >= key_length ? sample.tokens[static_cast<size_t>(i + 1)] : -100);
  return sample;
}

PlanOptions executor_plan(const TrainingOptions& options, int64_t sp, int zero_stage, bool offload_optimizer, bool offload_params,
                          int64_t ring) {
  PlanOptions plan;
  plan.sp = sp;
  plan.ring = ring;
  plan.zero_stage = zero_stage;
  plan.offload_optimizer = offload_optimizer;
  plan.offload_params = offload_params;
  plan.activation_checkpointing = options.activation_checkpointing;
  plan.checkpoint_offload = options.checkpoint_offload;
  plan.tiled_mlp = options.mlp_tiles > 0;
  plan.mlp_tiles = options.mlp_tiles;
  plan.tiled_loss = options.loss_tiles > 0;
  plan.loss_tiles = options.loss_tiles;
  if (options.fpdt_chunk_tokens > 0) {
    // FPDT sets its own MLP and loss chunks (the plan's tiles stay off).
    plan.fpdt = true;
    plan.fpdt_chunk_tokens = options.fpdt_chunk_tokens * sp;
    plan.tiled_mlp = plan.tiled_loss = false;
    plan.mlp_tiles = plan.loss_tiles = 0;
  }
  return plan;
}

std::vector<std::string> executor_plan_problems(const PlanOptions& plan, const std::string& /*device*/) {
  std::vector<std::string> problems;
  if (plan.ring > 1 && plan.fpdt)
    problems.push_back(fmt::format("ring={} with FPDT: the executor's ring attention runs unchunked; drop one of them", plan.ring));
  if (plan.micro_batch != 1)
    problems.push_back(fmt::format("micro batch {}: the executor trains one sample per rank per step", plan.micro_batch));
  if (plan.lora() && plan.zero_stage > 0)
    problems.push_back(fmt::format("LoRA with ZeRO stage {}: the executor trains adapters without ZeRO (drop --zero)", plan.zero_stage));
  if (plan.qlora) problems.push_back("QLoRA: the executor has no 4-bit base yet (LoRA on the fp32/bf16 base runs)");
  if (plan.adam_8bit) problems.push_back("8-bit AdamW: the executor's optimizer is fp32 AdamW");
  if (plan.cp_all_gather) problems.push_back("Megatron's all_gather context parallelism: the executor runs a ring of K/V blocks");
  if (plan.fp8) problems.push_back("FP8: the executor's GEMMs are fp32 on the CPU and bf16 on a GPU");
  if (plan.moe_aux_loss) problems.push_back("the auxiliary load-balancing loss: the executor's MoE block trains without it");
  if (plan.trl_activation_offload) problems.push_back("TRL's activation offloading is TRL's: the executor offloads checkpoints itself (--checkpoint-offload)");
  if (plan.recompute_modules.any())
    problems.push_back("selective recompute of modules is Megatron-Core's: the executor checkpoints every layer or none");
  if (plan.recompute_block_layers > 0)
    problems.push_back("block recompute is Megatron-Core's: the executor checkpoints every layer or none (--checkpointing, --no-checkpointing)");
  if (plan.offload_activation_layers > 0)
    problems.push_back("TE's layer-wise activation offloading is Megatron-Core's: the executor offloads checkpoints (--checkpoint-offload)");
  return problems;
}

TrainingOptions executor_training_options(const PlanOptions& plan, const MemoryPrediction& predicted, int64_t attention_block) {
  TrainingOptions options;
  options.activation_checkpointing = plan.activation_checkpointing;
  options.checkpoint_offload = plan.checkpoint_offload;
  options.mlp_tiles = predicted.mlp_tiles;
  options.loss_tile_tokens = plan.tiled_loss || plan.fpdt ? predicted.loss_tile_tokens : 0;
  options.fpdt_chunk_tokens = plan.fpdt ? plan.fpdt_chunk_tokens / plan.sp : 0;
  options.attention_block = attention_block;
  return options;
}

double gemm_gflops_measure(int64_t m, int64_t k, int64_t n, int repeats) {
  std::vector<float> a(static_cast<size_t>(m * k), 0.5f), w(static_cast<size_t>(n * k), 0.25f), out(static_cast<size_t>(m * n));
  double best = 0;
  for (int repeat = 0; repeat < repeats; ++repeat) {
    const auto start = std::chrono::steady_clock::now();
    kernels::linear_forward(out.data(), a.data(), w.data(), static_cast<const float*>(nullptr), m, k, n);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, 2.0 * static_cast<double>(m * k * n) / seconds / 1e9);
  }
  return best;
}

MeasuredCpuRates cpu_rates_measure(int64_t tokens, int64_t hidden, int64_t intermediate, int64_t head_dim, int64_t attention_block) {
  using Clock = std::chrono::steady_clock;
  auto best_of = [](int repeats, auto&& work) {
    double best = std::numeric_limits<double>::infinity();
    for (int i = 0; i < repeats; ++i) {
      const auto start = Clock::now();
      work();
      best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
    }
    return best;
  };
  MeasuredCpuRates rates;
  rates.gemm_m = std::clamp<int64_t>(tokens, 1, 2048);
  rates.gemm_k = std::max<int64_t>(hidden, 1);
  rates.gemm_n = std::max<int64_t>(intermediate, 1);
  rates.matmul_gflops = gemm_gflops_measure(rates.gemm_m, rates.gemm_k, rates.gemm_n, 3);
  {
    // At the step's length up to 4Ki tokens: the causal diagonal's masked tiles are a smaller share
    // of a longer sequence, so a short block's rate under-prices a long step's attention.
    const int64_t T = std::clamp<int64_t>(tokens, 1024, 4096), heads = 4, d = std::max<int64_t>(head_dim, 1);
    const size_t n = static_cast<size_t>(T * heads * d);
    std::vector<float> q(n, 0.01f), k(n, 0.02f), v(n, 0.03f), out(n), dout(n, 0.001f), dq(n), dk(n), dv(n);
    std::vector<float> lse(static_cast<size_t>(T * heads)), delta(static_cast<size_t>(T * heads));
    std::vector<int32_t> positions(static_cast<size_t>(T));
    std::iota(positions.begin(), positions.end(), 0);
    const double seconds = best_of(2, [&] {
      kernels::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), positions.data(), T, heads, heads, d, kernels::cpu_attention_tile(attention_block));
      kernels::attention_backward(dq.data(), dk.data(), dv.data(), delta.data(), dout.data(), q.data(), k.data(), v.data(), out.data(),
                                  lse.data(), positions.data(), T, heads, heads, d, kernels::cpu_attention_tile(attention_block));
    });
    // Causal forward 2 T^2 d H FLOPs, backward 2.5 times that (the time model's split).
    rates.attention_gflops = 3.5 * 2.0 * static_cast<double>(T * T * d * heads) / seconds / 1e9;
  }
  {
    // The element-wise kernels of a layer at the step's widths: bytes read and written over time.
    const int64_t T = std::clamp<int64_t>(tokens, 1024, 4096), h = std::max<int64_t>(hidden, 1), f = std::max<int64_t>(intermediate, 1);
    const int64_t d = std::max<int64_t>(head_dim, 1), heads = std::max<int64_t>(h / d, 1);
    std::vector<float> x(static_cast<size_t>(T * h), 0.5f), y(x.size()), weight(static_cast<size_t>(h), 1.0f), rstd(static_cast<size_t>(T));
    std::vector<float> q(static_cast<size_t>(T * heads * d), 0.25f), q_rope(q.size());
    std::vector<float> gate(static_cast<size_t>(T * f), 0.1f), up(gate.size(), 0.2f), product(gate.size()), dgate(gate.size()), dup(gate.size());
    std::vector<int32_t> positions(static_cast<size_t>(T));
    std::iota(positions.begin(), positions.end(), 0);
    const double seconds = best_of(2, [&] {
      kernels::rmsnorm_forward(y.data(), rstd.data(), x.data(), weight.data(), T, h, 1e-5f);
      kernels::rope_forward(q_rope.data(), q.data(), positions.data(), T, heads, d, 500000.0);
      kernels::swiglu_forward(product.data(), gate.data(), up.data(), T * f);
      kernels::swiglu_backward(dgate.data(), dup.data(), product.data(), gate.data(), up.data(), T * f);
    });
    const double bytes = 4.0 * static_cast<double>(T) * (2.0 * static_cast<double>(h) + 2.0 * static_cast<double>(heads * d) + 8.0 * static_cast<double>(f));
    rates.elementwise_gbps = bytes / seconds / 1e9;
  }
  {
    const size_t bytes = size_t{64} << 20;
    std::vector<char> from(bytes, 1), to(bytes);
    const double seconds = best_of(3, [&] { std::memcpy(to.data(), from.data(), bytes); });
    rates.memcpy_gbps = static_cast<double>(bytes) / seconds / 1e9;
  }
  return rates;
}

int64_t ranks_on_this_node(int64_t world_size) {
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  const int64_t ranks = local ? std::atoll(local) : 0;
  return ranks > 0 ? ranks : std::max<int64_t>(world_size, 1);
}

namespace {
int64_t cores_here() { return std::max<int64_t>(1, static_cast<int64_t>(std::thread::hardware_concurrency())); }
int64_t threads_per_rank() {
#ifdef _OPENMP
  return std::max(1, omp_get_max_threads());
#else
  return 1;
#endif
}
}  // namespace

void rank_threads_set(int64_t ranks_on_node) {
#ifdef _OPENMP
  if (std::getenv("OMP_NUM_THREADS") || ranks_on_node <= 1) return;
  omp_set_num_threads(static_cast<int>(std::max<int64_t>(1, cores_here() / ranks_on_node)));
#else
  (void)ranks_on_node;
#endif
}

double rank_core_share(int64_t ranks_on_node) {
  const double wanted = static_cast<double>(std::max<int64_t>(ranks_on_node, 1) * threads_per_rank());
  return std::min(1.0, static_cast<double>(cores_here()) / wanted);
}

HardwareCard cpu_card_with_rates(HardwareCard card, const MeasuredCpuRates& rates) {
  card.matmul_achieved_tflops = card.peak_bf16_tflops = rates.matmul_gflops / 1000.0;
  card.flash_attention_tflops_hd64 = card.flash_attention_tflops_hd128 = rates.attention_gflops / 1000.0;
  card.pcie_host_to_device_gbps = card.pcie_device_to_host_gbps = card.hbm_gbps = rates.memcpy_gbps;
  card.elementwise_gbps = rates.elementwise_gbps;
  return card;
}

RuntimeProfile machine_profile(const MachineTarget& target, PrecisionRegime precision) {
  RuntimeProfile profile = runtime_profile_load(target.device == "cuda" ? "native-cuda" : "native");
  if (precision == PrecisionRegime::fsdp2 && profile.weight_bytes != 4) {
    // FSDP2's regime (ModelStates::precision; Reference §11 F1.1, F1.14, F6.4): the fp32 shards are
    // the only copy of the weights, the optimizer's master too; gathers in the kernels' dtype,
    // reduction in fp32 (torchtitan's reduce_dtype). On the CPU (fp32) it is the mixed regime.
    profile.name += "-fsdp2";
    profile.weight_bytes = 4;
    profile.master_weight_bytes = 0;
    profile.parameter_sharding = ParameterSharding::sharding_fsdp2;
    profile.gathered_weight_bytes = profile.activation_bytes;
    profile.reduce_bytes = 4;
  }
  if (precision == PrecisionRegime::pure_bf16 && profile.weight_bytes == 2) {
    // The plain HF Trainer with a bf16-loaded model (Reference §11 F1.5): bf16 weights, gradients
    // and AdamW moments, no master copy: 8 bytes a parameter. On the CPU (fp32) the plain step.
    profile.name += "-pure-bf16";
    profile.gradient_bytes = 2;
    profile.master_weight_bytes = 0;
    profile.optimizer_state_bytes = 4;
    profile.working_gradient_bytes = 2;
  }
  return profile;
}

ClusterSpec machine_cluster(const MachineTarget& target) {
  // The rates of the CPU card order plans of equal length; on a GPU the H100 card's do (the
  // memory is the budget either way).
  HardwareCard card = hardware_card_load(target.device == "cuda" ? "h100-sxm-80gb" : "cpu-device");
  const double runtime_bytes = target.device == "cuda" ? runtime_overhead_bytes(machine_profile(target), target.ranks) : 0.0;
  card.gpu_memory_gib = std::isfinite(target.budget_bytes) ? (target.budget_bytes + runtime_bytes) / (1024.0 * 1024.0 * 1024.0) : 1e6;
  card.gpus_per_node = target.ranks;
  // On the CPU every rank's "device" arena and the host pool share this machine's memory: the host
  // pool gets what the arenas leave. A GPU plan is for the machine with the GPUs, whose memory
  // this one does not know (the run checks it there).
  const double physical_bytes = machine_memory_total_bytes();
  card.host_memory_gib = target.device == "cuda" ? 1e6
                         : std::isfinite(target.budget_bytes)
                             ? std::max(physical_bytes - static_cast<double>(target.ranks) * target.budget_bytes, 1024.0 * 1024.0) /
                                   (1024.0 * 1024.0 * 1024.0)
                             : physical_bytes / (1024.0 * 1024.0 * 1024.0);
  return cluster_make(card, target.ranks, 1, target.ranks, 0);
}

SearchResult machine_plan_search(const ModelSpec& model, const MachineTarget& target, const HeldChoices& held) {
  SearchOptions options;
  options.held = held;
  // FPDT chunks (global tokens) at the scale of the lengths a CPU budget reaches.
  options.fpdt_chunks = {256, 1024, 4096, 16384};
  options.unsupported = [device = target.device, &model](const PlanOptions& plan) {
    const std::vector<std::string> problems = executor_plan_problems(plan, device);
    return problems.empty() ? framework_unsupported(Framework::framework_longseq, model, plan) : problems.front();
  };
  return plan_search(model, machine_cluster(target), machine_profile(target), options);
}

ClusterSpec executor_cluster(double budget_bytes, int64_t ranks) { return machine_cluster({"cpu", ranks, budget_bytes}); }

std::vector<int32_t> fpdt_layout_rank_tokens(const std::vector<int32_t>& values, int64_t sp, int64_t rank, int64_t chunk_local) {
  const auto size = static_cast<int64_t>(values.size());
  const int64_t global_chunk = chunk_local * sp;
  if (chunk_local < 1 || size % global_chunk != 0 || rank < 0 || rank >= sp)
    throw std::invalid_argument("fpdt_layout_rank_tokens: the sequence must be whole chunks of chunk_local x sp tokens");
  std::vector<int32_t> local;
  local.reserve(static_cast<size_t>(size / sp));
  for (int64_t start = 0; start < size; start += global_chunk)
    local.insert(local.end(), values.begin() + start + rank * chunk_local, values.begin() + start + (rank + 1) * chunk_local);
  return local;
}

std::vector<int32_t> ring_layout_rank_tokens(const std::vector<int32_t>& values, int64_t sp, int64_t ring, int64_t sequence_rank) {
  const auto size = static_cast<int64_t>(values.size());
  const int64_t granule = ring > 1 ? 2 * sp * ring : sp;
  if (sp < 1 || ring < 1 || size % granule != 0 || sequence_rank < 0 || sequence_rank >= sp * ring)
    throw std::invalid_argument("ring_layout_rank_tokens: the sequence must be a multiple of 2 x sp x ring tokens (sp without a ring)");
  if (ring == 1) return std::vector<int32_t>(values.begin() + sequence_rank * (size / sp), values.begin() + (sequence_rank + 1) * (size / sp));
  const int64_t chunk = size / (2 * ring), group = sequence_rank / sp, slice = size / (sp * ring);
  std::vector<int32_t> group_tokens(values.begin() + group * chunk, values.begin() + (group + 1) * chunk);
  const int64_t late = 2 * ring - 1 - group;
  group_tokens.insert(group_tokens.end(), values.begin() + late * chunk, values.begin() + (late + 1) * chunk);
  const int64_t first = (sequence_rank % sp) * slice;
  return std::vector<int32_t>(group_tokens.begin() + first, group_tokens.begin() + first + slice);
}

Sample sample_from_text(const std::string& text, int64_t seqlen, int64_t offset) {
  if (text.empty()) throw ConfigError("--data", "", "the text file is empty");
  Sample sample;
  const auto size = static_cast<int64_t>(text.size());
  for (int64_t i = 0; i <= seqlen; ++i) {
    const auto byte = static_cast<unsigned char>(text[static_cast<size_t>((offset + i) % size)]);
    if (i < seqlen) {
      sample.tokens.push_back(byte);
      sample.positions.push_back(static_cast<int32_t>(i));
    }
    if (i > 0) sample.labels.push_back(byte);
  }
  return sample;
}

}  // namespace longseq
