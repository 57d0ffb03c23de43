// Ring attention (with Ulysses inside each ring group) across MPI ranks: the same training as one
// unsharded rank, and the memory the native replay predicts. Run with
//   mpirun --allow-run-as-root --oversubscribe -np 2 (4, 8) longseq_mpi_ring_tests
// Each run tries every (Ulysses u, ring r) with u x r = ranks: (1,2) on 2; (2,2) and (1,4) on 4;
// (2,4) and (4,2) on 8 (u = 4 > tiny-llama's 2 kv heads: kv heads replicated on the Ulysses axis).
//
// The batch is 96 tokens in two packed documents ([0, 40) and [40, 96)): with r = 2 and 4 the
// document boundary falls inside a ring chunk, so the causal and document masks are tested across
// block boundaries with global token indices.
//
// Tolerances, as for Ulysses (test_ulysses.cpp): sharding changes only the summation order (the
// same keys per query, partial outputs merged by their lse, gradients summed across ranks), so
// the fp32 loss agrees to 1e-6 relative and each gradient to 3e-5 of its tensor's largest
// |gradient|.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <mpi.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "executor/llama_step.hpp"
#include "executor/mpi_communicator.hpp"
#include "executor/trainer.hpp"
#include "models/model_loader.hpp"
#include "planner/memory_model.hpp"
#include "support/bf16_cpu_ops.hpp"
#include "support/mpi_test_support.hpp"
#include "support/tiny_llama_fixture.hpp"

using namespace longseq;
using namespace longseq::testing;

namespace longseq {
template class BasicLlamaModel<testing::Bf16CpuOps>;
}

namespace {

constexpr int64_t kTokens = 96;

// The (u, r) pairs this many ranks run, each with its two groups (as `longseq run` splits them:
// Ulysses groups of u consecutive ranks, rings of the ranks with the same heads).
struct Layout {
  int64_t sp, ring;
  MpiCommunicator ulysses, ring_peers;
  Layout(int64_t u, int64_t r)
      : sp(u), ring(r), ulysses(world().split(world().rank() / static_cast<int>(u), world().rank())),
        ring_peers(world().split(world().rank() % static_cast<int>(u), world().rank())) {}
  template <typename T>
  std::vector<T> rank_values(const std::vector<T>& values) const {
    return ring_layout_rank_tokens(values, sp, ring, world().rank());
  }
};

std::vector<std::pair<int64_t, int64_t>> layouts() {
  switch (world().size()) {
    case 2: return {{1, 2}};
    case 4: return {{2, 2}, {1, 4}};
    case 8: return {{2, 4}, {4, 2}};
    default: return {};
  }
}

struct Outcome {
  StepResult result;
  std::vector<float> gradients;
  double device_peak_bytes = 0, host_peak_bytes = 0;
  std::string peak_moment;
};

template <class Ops>
Outcome ring_step(Layout& layout, const Batch& batch, const TrainingOptions& options, int zero_stage = 0) {
  const ModelSpec spec = model_load("tiny-llama");
  Arena device("device"), host("host");
  BasicLlamaModel<Ops> model(spec, device, zero_stage > 0 ? &world() : nullptr, ModelStates{zero_stage, false, false, {}}, &host);
  const std::vector<float> weights = fixture_weights();
  model.load_parameters(weights.data());
  const auto tokens = layout.rank_values(batch.tokens), labels = layout.rank_values(batch.labels),
             positions = layout.rank_values(batch.positions);
  SequenceParallel parallel{&layout.ulysses, batch.positions.data(), &layout.ring_peers};
  Outcome outcome;
  outcome.result = model.forward_backward(tokens.data(), labels.data(), positions.data(), kTokens / (layout.sp * layout.ring), options,
                                          device, host, parallel);
  outcome.gradients = model.gradients_full();
  outcome.device_peak_bytes = device.peak_bytes();
  outcome.host_peak_bytes = host.peak_bytes();
  outcome.peak_moment = std::string(device.peak_moment());
  return outcome;
}

Outcome single_rank_step(const Batch& batch, const TrainingOptions& options) {
  Arena device("device"), host("host");
  LlamaModel model(model_load("tiny-llama"), device);
  parameters_fill(model);
  Outcome outcome;
  outcome.result = model.forward_backward(batch.tokens.data(), batch.labels.data(), batch.positions.data(), kTokens, options, device, host);
  outcome.gradients.assign(model.gradients(), model.gradients() + model.parameter_count());
  return outcome;
}

MemoryPrediction predicted_for(const Layout& layout, const TrainingOptions& options, const RuntimeProfile& profile, int zero_stage = 0) {
  const PlanOptions plan = executor_plan(options, layout.sp, zero_stage, false, false, layout.ring);
  return memory_predict(model_load("tiny-llama"), executor_cluster(std::numeric_limits<double>::infinity(), world().size()), plan, profile,
                        kTokens);
}

}  // namespace

TEST_CASE("the zigzag layout: ring group i holds chunks i and 2r-1-i, its Ulysses ranks slice them in order") {
  std::vector<int32_t> sequence(16);
  for (int32_t i = 0; i < 16; ++i) sequence[static_cast<size_t>(i)] = i;
  // u = 2, r = 2: chunks of 4 tokens; group 0 holds chunks 0 and 3, group 1 chunks 1 and 2.
  CHECK(ring_layout_rank_tokens(sequence, 2, 2, 0) == std::vector<int32_t>{0, 1, 2, 3});
  CHECK(ring_layout_rank_tokens(sequence, 2, 2, 1) == std::vector<int32_t>{12, 13, 14, 15});
  CHECK(ring_layout_rank_tokens(sequence, 2, 2, 2) == std::vector<int32_t>{4, 5, 6, 7});
  CHECK(ring_layout_rank_tokens(sequence, 2, 2, 3) == std::vector<int32_t>{8, 9, 10, 11});
  // u = 1, r = 4: chunks of 2; rank 1 holds chunks 1 and 6.
  CHECK(ring_layout_rank_tokens(sequence, 1, 4, 1) == std::vector<int32_t>{2, 3, 12, 13});
  // No ring: Ulysses' contiguous slice.
  CHECK(ring_layout_rank_tokens(sequence, 4, 1, 3) == std::vector<int32_t>{12, 13, 14, 15});
  CHECK_THROWS_AS(ring_layout_rank_tokens(sequence, 2, 3, 0), std::invalid_argument);  // 16 is not a multiple of 12
}

TEST_CASE("a ring pass: every rank receives its predecessor's block, over MPI") {
  const int rank = world().rank(), size = world().size();
  const std::vector<uint16_t> block(3, static_cast<uint16_t>(100 + rank));
  std::vector<uint16_t> arrived(3, 0);
  world().send_receive(block.data(), (rank + 1) % size, arrived.data(), (rank + size - 1) % size, 3);
  CHECK(arrived == std::vector<uint16_t>(3, static_cast<uint16_t>(100 + (rank + size - 1) % size)));
}

TEST_CASE("ring x Ulysses: loss and every gradient equal one unsharded rank, every rank's peak equals the native prediction") {
  const Batch batch = batch_make(kTokens);
  TrainingOptions checkpointed;
  checkpointed.activation_checkpointing = true;
  TrainingOptions everything = checkpointed;
  everything.checkpoint_offload = true;
  everything.mlp_tiles = 3;
  everything.loss_tiles = 2;
  const RuntimeProfile native = runtime_profile_load("native");
  for (const auto& degrees : layouts()) {
    const int64_t u = degrees.first, r = degrees.second;  // (CAPTURE's lambda cannot capture structured bindings before C++20)
    Layout layout(u, r);
    for (const TrainingOptions& options : {TrainingOptions{}, checkpointed, everything}) {
      CAPTURE(u);
      CAPTURE(r);
      CAPTURE(options.activation_checkpointing);
      CAPTURE(options.mlp_tiles);
      const Outcome expected = single_rank_step(batch, options);
      const Outcome sharded = ring_step<CpuOps>(layout, batch, options);
      CHECK(sharded.result.counted_tokens == expected.result.counted_tokens);
      CHECK(sharded.result.loss == doctest::Approx(expected.result.loss).epsilon(1e-6));
      gradients_close(sharded.gradients, expected.gradients);
      const MemoryPrediction predicted = predicted_for(layout, options, native);
      CHECK(predicted.gpu_peak_bytes == doctest::Approx(sharded.device_peak_bytes).epsilon(1e-9));
      CHECK(predicted.gpu_peak_moment == sharded.peak_moment);
      CHECK(predicted.host_bytes_per_node == doctest::Approx(sharded.host_peak_bytes * static_cast<double>(world().size())).epsilon(1e-9));
    }
  }
}

TEST_CASE("PyTorch CP's all-gather rotation: the whole sequence's K/V gathered and dK/dV passed, loss and gradients equal one rank, peaks as predicted") {
  // Reference §11 F2.3, F2.5: each attention pass all-gathers every ring rank's K and V (forward
  // and again in backward); the fp32 dK/dV accumulators pass rank to rank as the ring's do.
  const Batch batch = batch_make(kTokens);
  TrainingOptions checkpointed;
  checkpointed.activation_checkpointing = true;
  checkpointed.context_parallel_all_gather = true;
  TrainingOptions plain;
  plain.context_parallel_all_gather = true;
  RuntimeProfile torch_cp = runtime_profile_load("native");
  torch_cp.ring_implementation = RingImplementation::ring_torch_allgather;
  for (const auto& degrees : layouts()) {
    const int64_t u = degrees.first, r = degrees.second;  // (CAPTURE's lambda cannot capture structured bindings before C++20)
    Layout layout(u, r);
    for (const TrainingOptions& options : {plain, checkpointed}) {
      CAPTURE(u);
      CAPTURE(r);
      CAPTURE(options.activation_checkpointing);
      const Outcome expected = single_rank_step(batch, options);
      const Outcome gathered = ring_step<CpuOps>(layout, batch, options);
      CHECK(gathered.result.counted_tokens == expected.result.counted_tokens);
      CHECK(gathered.result.loss == doctest::Approx(expected.result.loss).epsilon(1e-6));
      gradients_close(gathered.gradients, expected.gradients);
      const MemoryPrediction predicted = predicted_for(layout, options, torch_cp);
      CHECK(predicted.gpu_peak_bytes == doctest::Approx(gathered.device_peak_bytes).epsilon(1e-9));
      CHECK(predicted.gpu_peak_moment == gathered.peak_moment);
      // The gathered K/V make the peak no lower than the ring's passing.
      TrainingOptions passed = options;
      passed.context_parallel_all_gather = false;
      CHECK(ring_step<CpuOps>(layout, batch, passed).device_peak_bytes <= gathered.device_peak_bytes);
    }
  }
}

TEST_CASE("ring x Ulysses with ZeRO-3: the same gradients, reduce-scattered into shards, peaks as predicted") {
  const Batch batch = batch_make(kTokens);
  TrainingOptions checkpointed;
  checkpointed.activation_checkpointing = true;
  for (const auto& degrees : layouts()) {
    const int64_t u = degrees.first, r = degrees.second;  // (CAPTURE's lambda cannot capture structured bindings before C++20)
    CAPTURE(u);
    CAPTURE(r);
    Layout layout(u, r);
    const Outcome expected = single_rank_step(batch, checkpointed);
    const Outcome sharded = ring_step<CpuOps>(layout, batch, checkpointed, /*zero_stage=*/3);
    CHECK(sharded.result.loss == doctest::Approx(expected.result.loss).epsilon(1e-6));
    gradients_close(sharded.gradients, expected.gradients);
    const MemoryPrediction predicted = predicted_for(layout, checkpointed, runtime_profile_load("native"), 3);
    CHECK(predicted.gpu_peak_bytes == doctest::Approx(sharded.device_peak_bytes).epsilon(1e-9));
  }
}

TEST_CASE("the GPU's schedule (bf16 emulation, blocked attention): ring peaks equal the native-cuda prediction, loss tracks fp32") {
  // The CPU's Bf16CpuOps allocates what CudaOps allocates (the blocked kernel's workspace per chunk
  // pair, bf16 blocks and fp32 accumulators on the ring), so the GPU's ring schedule is checked here.
  const Batch batch = batch_make(kTokens);
  for (const bool all_gather : {false, true})
  for (const auto& degrees : layouts()) {
    // The ring's passing, and PyTorch CP's all-gather rotation.
    RuntimeProfile profile = runtime_profile_load("native-cuda");
    if (all_gather) profile.ring_implementation = RingImplementation::ring_torch_allgather;
    TrainingOptions options;
    options.activation_checkpointing = true;
    options.context_parallel_all_gather = all_gather;
    const int64_t u = degrees.first, r = degrees.second;  // (CAPTURE's lambda cannot capture structured bindings before C++20)
    CAPTURE(u);
    CAPTURE(r);
    CAPTURE(all_gather);
    Layout layout(u, r);
    const Outcome expected = single_rank_step(batch, options);
    const Outcome sharded = ring_step<Bf16CpuOps>(layout, batch, options);
    // bf16's loss tolerance against fp32 (test_llama_bf16.cpp): 2e-4 relative.
    CHECK(sharded.result.loss == doctest::Approx(expected.result.loss).epsilon(2e-4));
    const PlanOptions plan = executor_plan(options, layout.sp, 0, false, false, layout.ring);
    const MemoryPrediction predicted = memory_predict(model_load("tiny-llama"),
                                                      executor_cluster(std::numeric_limits<double>::infinity(), world().size()), plan,
                                                      profile, kTokens);
    CHECK(predicted.gpu_peak_bytes - runtime_overhead_bytes(profile, world().size()) ==
          doctest::Approx(sharded.device_peak_bytes).epsilon(1e-9));
    CHECK(predicted.gpu_peak_moment == sharded.peak_moment);
  }
}

int main(int argc, char** argv) { return mpi_doctest_main(argc, argv); }
