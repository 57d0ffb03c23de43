// gpu_llama: the tiny model's training step on the GPU (CudaLlamaModel: llama_step.hpp over
// CudaOps) against the same step on the CPU: the bf16 emulation (tests/support/bf16_cpu_ops.hpp,
// the same rounding points) and the fp32 model; every memory option, the asynchronous checkpoint
// offload included; and the arena's measured peak against the native-cuda prediction.
// Tolerances: the emulation's bounds (tests/executor/test_llama_bf16.cpp) where the GPU is held
// to what the emulation meets (gradients within 0.35 relative L2 per tensor of fp32), and
// for GPU against emulation loss 1e-3 relative, gradients 0.1: stated, not yet measured on a GPU
// (cuBLAS sums in another order than Eigen, so bf16 roundings flip). Exits 77 (CTest: SKIPPED,
// never passed) when no GPU is visible.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "executor/cuda_memory.hpp"
#include "executor/llama_cuda.hpp"
#include "executor/llama_step.hpp"
#include "executor/trainer.hpp"
#include "kernels/cuda/device_query.hpp"
#include "planner/memory_model.hpp"
#include "support/bf16_cpu_ops.hpp"
#include "support/lora_fixture.hpp"
#include "support/tiny_llama_fixture.hpp"

namespace longseq {
template class BasicLlamaModel<testing::Bf16CpuOps>;
}

using namespace longseq;
using namespace longseq::testing;

namespace {

template <class Model>
StepOutcome step_run(const TrainingOptions& options, const Sample& sample, MemoryBackend& device_memory, MemoryBackend& host_memory,
                 const ModelStates& states = {}, const ModelSpec& spec = model_load("tiny-llama")) {
  Arena device("device", std::numeric_limits<double>::infinity(), device_memory);
  Arena host("host", std::numeric_limits<double>::infinity(), host_memory);
  Model model(spec, device, nullptr, states, nullptr);
  const std::vector<float> weights = fixture_weights(spec);
  model.load_parameters(weights.data());
  if (model.lora()) model.load_adapters(test_adapters(model.lora_layout()).data());
  return step_outcome(model, sample, options, device, host);
}

Sample fixture_sample() {
  const Batch batch = batch_make(64);
  return Sample{batch.tokens, batch.labels, batch.positions};
}

StepOutcome gpu_run(const TrainingOptions& options, const Sample& sample, const ModelStates& states = {},
                const ModelSpec& spec = model_load("tiny-llama")) {
  CudaDeviceMemoryBackend device_memory;
  PinnedHostMemoryBackend host_memory;
  return step_run<CudaLlamaModel>(options, sample, device_memory, host_memory, states, spec);
}

// ||actual - expected|| / ||expected|| over the whole vector.
double relative_l2(const std::vector<float>& actual, const std::vector<float>& expected) {
  double difference = 0, norm = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    difference += (static_cast<double>(actual[i]) - expected[i]) * (static_cast<double>(actual[i]) - expected[i]);
    norm += static_cast<double>(expected[i]) * expected[i];
  }
  return std::sqrt(difference / norm);
}

}  // namespace

TEST_CASE("the GPU step against the bf16 emulation and the fp32 model") {
  const Sample sample = fixture_sample();
  const StepOutcome gpu = gpu_run({}, sample);
  const StepOutcome emulated = step_run<BasicLlamaModel<Bf16CpuOps>>({}, sample, host_memory_backend(), host_memory_backend());
  const StepOutcome fp32 = step_run<LlamaModel>({}, sample, host_memory_backend(), host_memory_backend());
  CHECK(gpu.result.counted_tokens == fp32.result.counted_tokens);
  CHECK(gpu.result.loss == doctest::Approx(emulated.result.loss).epsilon(1e-3));
  CHECK(gpu.result.loss == doctest::Approx(fp32.result.loss).epsilon(2e-3));
  for (double error : relative_l2_per_tensor(gpu.gradients, emulated.gradients)) CHECK(error <= 0.1);
  for (double error : relative_l2_per_tensor(gpu.gradients, fp32.gradients)) CHECK(error <= 0.35);
}

TEST_CASE("every memory option on the GPU leaves loss and gradients unchanged (asynchronous offload included)") {
  const Sample sample = fixture_sample();
  const StepOutcome plain = gpu_run({}, sample);
  TrainingOptions offload;
  offload.activation_checkpointing = offload.checkpoint_offload = true;
  TrainingOptions everything = offload;
  everything.mlp_tiles = 3;
  everything.loss_tiles = 5;
  for (const TrainingOptions& options : {offload, everything}) {
    CAPTURE(options.mlp_tiles);
    const StepOutcome other = gpu_run(options, sample);
    CHECK(other.result.loss == doctest::Approx(plain.result.loss).epsilon(1e-3));
    for (double error : relative_l2_per_tensor(other.gradients, plain.gradients)) CHECK(error <= 0.05);
  }
}

TEST_CASE("the GPU arena's measured peak equals the native-cuda prediction, the runtime's bytes are measured beside it") {
  const ModelSpec spec = model_load("tiny-llama");
  const RuntimeProfile profile = runtime_profile_load("native-cuda");
  const ClusterSpec cluster = executor_cluster(std::numeric_limits<double>::infinity());
  const Sample sample = sample_synthetic(2048, spec.vocab_size, 5);
  TrainingOptions options;
  options.activation_checkpointing = options.checkpoint_offload = true;
  options.mlp_tiles = 4;
  const StepOutcome run = gpu_run(options, sample);
  const MemoryPrediction predicted = memory_predict(spec, cluster, executor_plan(options), profile, 2048);
  const double runtime = runtime_overhead_bytes(profile, 1);
  CHECK(predicted.gpu_peak_bytes - runtime == doctest::Approx(run.device_peak_bytes).epsilon(1e-9));
  CHECK(predicted.gpu_peak_moment == run.peak_moment);
  CHECK(predicted.host_bytes_per_node == doctest::Approx(run.host_peak_bytes).epsilon(1e-9));
  // What CUDA, cuBLAS and this process hold beyond an empty arena: printed beside the profile's
  // 1 GiB + 32 MiB, and bounded (a leak of the step's buffers would show here).
  Arena empty("device");
  const double outside = device_memory_outside_arena_bytes(empty);
  std::printf("outside the arena: measured %.1f MiB, native-cuda predicts %.1f MiB\n", outside / (1 << 20), runtime / (1 << 20));
  CHECK(outside > 0);
  CHECK(outside < 4.0 * 1024 * 1024 * 1024);
}

TEST_CASE("LoRA on the GPU: adapter gradients against the bf16 emulation and fp32, peak equal to the native-cuda prediction") {
  // The emulation's bound against fp32 (0.05 relative L2 over the adapters, test_lora.cpp) and the
  // GPU against the emulation 0.1 as above: stated, not yet measured on a GPU.
  const Sample sample = fixture_sample();
  const ModelStates states = lora_states(8, true);
  TrainingOptions options;
  options.activation_checkpointing = options.checkpoint_offload = true;
  const StepOutcome gpu = gpu_run(options, sample, states);
  const StepOutcome emulated = step_run<BasicLlamaModel<Bf16CpuOps>>(options, sample, host_memory_backend(), host_memory_backend(), states);
  const StepOutcome fp32 = step_run<LlamaModel>(options, sample, host_memory_backend(), host_memory_backend(), states);
  CHECK(gpu.result.loss == doctest::Approx(emulated.result.loss).epsilon(1e-3));
  CHECK(relative_l2(gpu.gradients, emulated.gradients) <= 0.1);
  CHECK(relative_l2(gpu.gradients, fp32.gradients) <= 0.1);
  PlanOptions plan = executor_plan(options);
  plan.lora_rank = 8;
  const RuntimeProfile profile = runtime_profile_load("native-cuda");
  const MemoryPrediction predicted = memory_predict(model_load("tiny-llama"), executor_cluster(std::numeric_limits<double>::infinity()), plan,
                                                    profile, static_cast<int64_t>(sample.tokens.size()));
  CHECK(predicted.gpu_peak_bytes - runtime_overhead_bytes(profile, 1) == doctest::Approx(gpu.device_peak_bytes).epsilon(1e-9));
  CHECK(predicted.gpu_peak_moment == gpu.peak_moment);
}

TEST_CASE("MoE on the GPU: tiny-moe against the bf16 emulation and fp32, its peak equal to the native-cuda prediction") {
  // The emulation's bounds (test_moe.cpp: 0.1 relative L2 of fp32, measured 0.021 there); the GPU
  // against the emulation 0.1 as above. Stated, not yet measured on a GPU.
  const ModelSpec spec = model_load("tiny-moe");
  const Sample sample = fixture_sample();
  TrainingOptions options;
  options.activation_checkpointing = options.checkpoint_offload = true;
  const StepOutcome gpu = gpu_run(options, sample, {}, spec);
  const StepOutcome emulated =
      step_run<BasicLlamaModel<Bf16CpuOps>>(options, sample, host_memory_backend(), host_memory_backend(), {}, spec);
  const StepOutcome fp32 = step_run<LlamaModel>(options, sample, host_memory_backend(), host_memory_backend(), {}, spec);
  CHECK(gpu.result.loss == doctest::Approx(emulated.result.loss).epsilon(1e-3));
  for (double error : {relative_l2(gpu.gradients, emulated.gradients), relative_l2(gpu.gradients, fp32.gradients)}) CHECK(error <= 0.1);
  const RuntimeProfile profile = runtime_profile_load("native-cuda");
  const MemoryPrediction predicted = memory_predict(spec, executor_cluster(std::numeric_limits<double>::infinity()), executor_plan(options),
                                                    profile, static_cast<int64_t>(sample.tokens.size()));
  CHECK(predicted.gpu_peak_bytes - runtime_overhead_bytes(profile, 1) == doctest::Approx(gpu.device_peak_bytes).epsilon(1e-9));
  CHECK(predicted.gpu_peak_moment == gpu.peak_moment);
}

int main(int argc, char** argv) {
  const CudaDeviceInfo info = cuda_device_query();
  if (info.device_count == 0) {
    std::printf("SKIPPED: no CUDA device visible (%s)\n", info.error.empty() ? "none found" : info.error.c_str());
    return 77;
  }
  std::printf("tiny-llama training step on %s against the CPU\n", info.name.c_str());
  doctest::Context context(argc, argv);
  return context.run();
}
