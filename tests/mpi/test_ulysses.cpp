// Ulysses across MPI ranks: the layout, and the same training as one rank. Run with
//   mpirun --allow-run-as-root --oversubscribe -np 2 (or 4) longseq_mpi_tests
// Every rank runs every check; the program fails when any rank's check fails.
//
// Tolerances: sharding changes only summation order (attention over the same keys, gradients
// summed across ranks), so loss agrees to 1e-6 relative and each gradient to 3e-5 of its
// tensor's largest |gradient|, as for the single-rank memory options (test_llama.cpp).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <mpi.h>

#include <cmath>
#include <limits>
#include <string>
#include <numeric>

#include "executor/mpi_communicator.hpp"
#include "executor/trainer.hpp"
#include "planner/memory_model.hpp"
#include "executor/ulysses.hpp"
#include "executor/llama_step.hpp"
#include "kernels/cpu/loss_optimizer.hpp"
#include "support/bf16_cpu_ops.hpp"
#include "models/model_loader.hpp"
#include "support/lora_fixture.hpp"
#include "support/mpi_test_support.hpp"
#include "support/tiny_llama_fixture.hpp"

using namespace longseq;
using namespace longseq::testing;

namespace longseq {
template class BasicLlamaModel<testing::Bf16CpuOps>;
}

namespace {

struct Outcome {
  StepResult result;
  std::vector<float> gradients;
  double device_peak_bytes = 0;
  std::string peak_moment;
};

// One step of tiny-llama on `batch`: on this rank alone (group null) or sharded over `group`.
Outcome step(const Batch& batch, Communicator* group) {
  const ModelSpec spec = model_load("tiny-llama");
  Arena device("device"), host("host");
  LlamaModel model(spec, device);
  parameters_fill(model);
  const auto S = static_cast<int64_t>(batch.tokens.size());
  Outcome outcome;
  if (!group) {
    outcome.result = model.forward_backward(batch.tokens.data(), batch.labels.data(), batch.positions.data(), S, {}, device, host);
  } else {
    // Labels are pre-shifted over the whole sample before sharding, so none is lost at a boundary.
    const int64_t T = S / group->size(), first = group->rank() * T;
    SequenceParallel parallel{group, batch.positions.data()};
    outcome.result = model.forward_backward(batch.tokens.data() + first, batch.labels.data() + first,
                                            batch.positions.data() + first, T, {}, device, host, parallel);
  }
  outcome.gradients.assign(model.gradients(), model.gradients() + model.parameter_count());
  outcome.device_peak_bytes = device.peak_bytes();
  outcome.peak_moment = std::string(device.peak_moment());
  return outcome;
}

// One step over all ranks against one unsharded rank on the same batch: the same counted tokens,
// the same loss (fp32, 1e-6) and every gradient close.
void check_sharded_equals_single_rank(const Batch& batch) {
  const Outcome single = step(batch, nullptr);
  const Outcome sharded = step(batch, &world());
  CHECK(sharded.result.counted_tokens == single.result.counted_tokens);
  CHECK(sharded.result.loss == doctest::Approx(single.result.loss).epsilon(1e-6));
  gradients_close(sharded.gradients, single.gradients);
}

}  // namespace

TEST_CASE("all-to-all layout: every rank gets all tokens of its heads, and back again exactly") {
  const int64_t sp = world().size(), T = 3, NQ = 4 * sp, HD = 2;
  const int64_t heads = NQ / sp;
  // value(token, head, d) identifies each element: token is the global token index.
  auto value = [](int64_t token, int64_t head, int64_t d) { return static_cast<float>(token * 1000 + head * 10 + d); };
  std::vector<float> local(static_cast<size_t>(T * NQ * HD));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < NQ; ++h)
      for (int64_t d = 0; d < HD; ++d) local[static_cast<size_t>((t * NQ + h) * HD + d)] = value(world().rank() * T + t, h, d);
  const HeadBlocks blocks{heads, 1};
  std::vector<float> send(local.size()), global(local.size());
  heads_pack(send.data(), local.data(), T, NQ, blocks, HD, sp);
  world().all_to_all(send.data(), global.data(), T * heads * HD);
  for (int64_t token = 0; token < sp * T; ++token)  // [global token][my head][d]
    for (int64_t j = 0; j < heads; ++j)
      for (int64_t d = 0; d < HD; ++d)
        CHECK(global[static_cast<size_t>((token * heads + j) * HD + d)] == value(token, world().rank() * heads + j, d));
  std::vector<float> back(local.size()), round_trip(local.size(), 0.0f);
  world().all_to_all(global.data(), back.data(), T * heads * HD);
  heads_unpack_add(round_trip.data(), back.data(), T, NQ, blocks, HD, sp);
  CHECK(round_trip == local);
}

TEST_CASE("all-to-all and all-gather move 2-byte elements (the GPU's bf16) as they move floats") {
  const int64_t sp = world().size(), count = 5;
  std::vector<uint16_t> send(static_cast<size_t>(sp * count)), received(send.size()), gathered(send.size());
  for (int64_t r = 0; r < sp; ++r)
    for (int64_t i = 0; i < count; ++i) send[static_cast<size_t>(r * count + i)] = static_cast<uint16_t>(world().rank() * 1000 + r * 10 + i);
  world().all_to_all(send.data(), received.data(), count);
  world().all_gather(send.data(), gathered.data(), count);
  for (int64_t r = 0; r < sp; ++r)
    for (int64_t i = 0; i < count; ++i) {
      // Block r of what this rank received is block `rank` of what rank r sent.
      CHECK(received[static_cast<size_t>(r * count + i)] == r * 1000 + world().rank() * 10 + i);
      // Block r of the gather is rank r's first block.
      CHECK(gathered[static_cast<size_t>(r * count + i)] == r * 1000 + i);
    }
}

TEST_CASE("GQA with fewer kv heads than ranks: kv heads are replicated, rank r gets head r / (sp / n_kv)") {
  const int64_t sp = world().size(), NKV = 1, T = 2, HD = 1;  // MQA: one kv head for every rank
  Ulysses ulysses;
  ulysses.sp = sp;
  ulysses.replication = sp / NKV;
  ulysses.kv_heads = 1;
  std::vector<float> local(static_cast<size_t>(T * NKV * HD));
  for (int64_t t = 0; t < T; ++t) local[static_cast<size_t>(t)] = static_cast<float>(world().rank() * T + t);
  std::vector<float> send(static_cast<size_t>(sp * T)), global(static_cast<size_t>(sp * T));
  heads_pack(send.data(), local.data(), T, NKV, ulysses.kv_blocks(), HD, sp);
  world().all_to_all(send.data(), global.data(), T);
  for (int64_t token = 0; token < sp * T; ++token) CHECK(global[static_cast<size_t>(token)] == static_cast<float>(token));
  CHECK(ulysses.kv_blocks().head(world().rank(), 0) == 0);
}

TEST_CASE("Ulysses over all ranks: loss and every gradient equal the single-rank run") {
  const Batch batch = batch_make(64);  // two packed documents; tiny-llama has 2 kv heads, so sp = 4 replicates them
  check_sharded_equals_single_rank(batch);
}

TEST_CASE("uneven valid tokens: a rank whose tokens are all ignored still gives the single-rank loss") {
  Batch batch = batch_make(64);
  for (int64_t t = 0; t < 64 / world().size(); ++t) batch.labels[static_cast<size_t>(t)] = -100;  // rank 0: a prompt
  check_sharded_equals_single_rank(batch);
}

TEST_CASE("each rank's measured peak equals the planner's native prediction for sp ranks") {
  const Batch batch = batch_make(64);
  const Outcome sharded = step(batch, &world());
  const int64_t sp = world().size();
  const MemoryPrediction predicted =
      memory_predict(model_load("tiny-llama"), executor_cluster(std::numeric_limits<double>::infinity(), sp),
                     executor_plan({}, sp), runtime_profile_load("native"), 64);
  CHECK(predicted.gpu_peak_bytes == doctest::Approx(sharded.device_peak_bytes).epsilon(0.001));
  CHECK(predicted.gpu_peak_moment == sharded.peak_moment);
}

TEST_CASE("three AdamW steps sharded follow the single-rank loss curve") {
  const ModelSpec spec = model_load("tiny-llama");
  Arena device("device"), host("host"), reference_device("reference"), reference_host("reference host");
  LlamaModel sharded(spec, device), single(spec, reference_device);
  parameters_fill(sharded);
  parameters_fill(single);
  const Batch batch = batch_make(64);
  const int64_t T = 64 / world().size(), first = world().rank() * T;
  for (int step = 1; step <= 3; ++step) {
    SequenceParallel parallel{&world(), batch.positions.data()};
    const double loss = sharded.forward_backward(batch.tokens.data() + first, batch.labels.data() + first,
                                                 batch.positions.data() + first, T, {}, device, host, parallel).loss;
    const double reference = single.forward_backward(batch.tokens.data(), batch.labels.data(), batch.positions.data(), 64, {},
                                                     reference_device, reference_host).loss;
    sharded.adamw_step(1e-2f, 0.9f, 0.95f, 1e-8f, 0.0f);
    single.adamw_step(1e-2f, 0.9f, 0.95f, 1e-8f, 0.0f);
    if (world().rank() == 0) MESSAGE("step " << step << ": loss sp=" << world().size() << " " << loss << ", one rank " << reference);
    CHECK(loss == doctest::Approx(reference).epsilon(1e-5));
  }
}

TEST_CASE("LoRA under Ulysses: loss and every adapter gradient equal one unsharded rank, peaks as predicted, AdamW follows") {
  // Adapters on every linear or on q_proj/v_proj only, with and without checkpointing: each rank
  // computes its tokens' share of every adapter gradient, summed over the sequence's ranks.
  const ModelSpec spec = model_load("tiny-llama");
  const Batch batch = batch_make(64);
  const int64_t sp = world().size(), T = 64 / sp, first = world().rank() * T;
  for (bool all_linear : {true, false})
    for (bool checkpointing : {false, true}) {
      CAPTURE(all_linear);
      CAPTURE(checkpointing);
      const ModelStates states = lora_states(8, all_linear);
      TrainingOptions options;
      options.activation_checkpointing = checkpointing;
      Arena device("device"), host("host"), reference_device("reference"), reference_host("reference host");
      LlamaModel sharded(spec, device, nullptr, states, nullptr), single(spec, reference_device, nullptr, states, nullptr);
      for (LlamaModel* model : {&sharded, &single}) {
        parameters_fill(*model);
        model->load_adapters(test_adapters(model->lora_layout()).data());
      }
      for (int step = 1; step <= 2; ++step) {
        SequenceParallel parallel{&world(), batch.positions.data()};
        const StepResult result = sharded.forward_backward(batch.tokens.data() + first, batch.labels.data() + first,
                                                           batch.positions.data() + first, T, options, device, host, parallel);
        const StepResult reference = single.forward_backward(batch.tokens.data(), batch.labels.data(), batch.positions.data(), 64, options,
                                                             reference_device, reference_host);
        CAPTURE(step);
        CHECK(result.counted_tokens == reference.counted_tokens);
        CHECK(result.loss == doctest::Approx(reference.loss).epsilon(step == 1 ? 1e-6 : 1e-5));
        if (step == 1) {
          // (After an AdamW step the two models differ by Adam's normalised update of gradients
          // that differed in their last bits: the second step compares the loss, as the
          // full-training curve test above does.)
          adapter_gradients_compare(sharded.gradients_full(), single.gradients_full(), sharded.lora_layout(), 3e-5);
          PlanOptions plan = executor_plan(options, sp);
          plan.lora_rank = 8;
          plan.lora_all_linear = all_linear;
          const MemoryPrediction predicted =
              memory_predict(spec, executor_cluster(std::numeric_limits<double>::infinity(), sp), plan, runtime_profile_load("native"), 64);
          CHECK(predicted.gpu_peak_bytes == doctest::Approx(device.peak_bytes()).epsilon(1e-9));
          CHECK(predicted.gpu_peak_moment == device.peak_moment());
        }
        sharded.adamw_step(1e-2f, 0.9f, 0.95f, 1e-8f, 0.0f);
        single.adamw_step(1e-2f, 0.9f, 0.95f, 1e-8f, 0.0f);
      }
    }
}

TEST_CASE("MoE under Ulysses, alone and with ZeRO-3: loss and every gradient equal one unsharded rank, peaks as predicted") {
  // tiny-moe: every rank routes its own tokens (the block is per token); ZeRO-3 gathers a layer's
  // experts with the rest of it (one module), as DeepSpeed gathers a leaf MoE block.
  const ModelSpec spec = model_load("tiny-moe");
  const Batch batch = batch_make(64);
  const int64_t sp = world().size(), T = 64 / sp, first = world().rank() * T;
  const std::vector<float> weights = fixture_weights(spec);
  Arena reference_device("reference"), reference_host("reference host");
  LlamaModel single(spec, reference_device);
  single.load_parameters(weights.data());
  const StepResult reference = single.forward_backward(batch.tokens.data(), batch.labels.data(), batch.positions.data(), 64, {},
                                                       reference_device, reference_host);
  const std::vector<float> reference_gradients = single.gradients_full();
  for (int zero_stage : {0, 3})
    for (bool checkpointing : {false, true}) {
      CAPTURE(zero_stage);
      CAPTURE(checkpointing);
      TrainingOptions options;
      options.activation_checkpointing = checkpointing;
      Arena device("device"), host("host");
      LlamaModel sharded(spec, device, zero_stage > 0 ? &world() : nullptr, ModelStates{zero_stage, false, false, {}}, &host);
      sharded.load_parameters(weights.data());
      SequenceParallel parallel{&world(), batch.positions.data()};
      const StepResult result = sharded.forward_backward(batch.tokens.data() + first, batch.labels.data() + first,
                                                         batch.positions.data() + first, T, options, device, host, parallel);
      CHECK(result.counted_tokens == reference.counted_tokens);
      CHECK(result.loss == doctest::Approx(reference.loss).epsilon(1e-6));
      gradients_close(sharded.gradients_full(), reference_gradients);
      const MemoryPrediction predicted = memory_predict(spec, executor_cluster(std::numeric_limits<double>::infinity(), sp),
                                                        executor_plan(options, sp, zero_stage), runtime_profile_load("native"), 64);
      CHECK(predicted.gpu_peak_bytes == doctest::Approx(device.peak_bytes()).epsilon(1e-9));
      CHECK(predicted.gpu_peak_moment == device.peak_moment());
    }
}

TEST_CASE("ZeRO-3 with Ulysses: gradients and the AdamW update equal the unsharded single-rank step") {
  const ModelSpec spec = model_load("tiny-llama");
  const Batch batch = batch_make(64);
  Arena reference_device("reference"), reference_host("reference host");
  LlamaModel single(spec, reference_device);
  parameters_fill(single);
  const std::vector<float> initial_weights(single.parameters(), single.parameters() + single.parameter_count());
  single.forward_backward(batch.tokens.data(), batch.labels.data(), batch.positions.data(), 64, {}, reference_device, reference_host);
  const std::vector<float> single_gradients(single.gradients(), single.gradients() + single.parameter_count());
  single.adamw_step(1e-2f, 0.9f, 0.95f, 1e-8f, 0.01f);

  Arena device("device"), host("host");
  LlamaModel sharded(spec, device, world());
  sharded.load_parameters(initial_weights.data());
  CHECK(sharded.local_parameter_count() <= sharded.parameter_count() / world().size() + 6);  // modules padded
  const int64_t T = 64 / world().size(), first = world().rank() * T;
  SequenceParallel parallel{&world(), batch.positions.data()};
  TrainingOptions options;
  options.activation_checkpointing = true;  // ZeRO-3 with recompute gathers each layer twice
  sharded.forward_backward(batch.tokens.data() + first, batch.labels.data() + first, batch.positions.data() + first, T, options,
                           device, host, parallel);
  const std::vector<float> sharded_gradients = sharded.gather_full(sharded.gradients());
  gradients_close(sharded_gradients, single_gradients);
  sharded.adamw_step(1e-2f, 0.9f, 0.95f, 1e-8f, 0.01f);
  const std::vector<float> weights = sharded.gather_full(sharded.parameters());
  // The update is checked against AdamW in float64 over the sharded run's own gradients, not
  // against the single-rank weights: Adam's first step is lr * g / (|g| + eps), about lr * sign(g),
  // so a near-zero gradient whose float rounding differs between the two runs (summation order,
  // FMA or not: 1.7e-5 on this machine, 3e-4 on CI's CPU) flips a whole step. The gradients
  // themselves were compared just above; this proves each shard applies the same update.
  std::vector<double> expected(initial_weights.begin(), initial_weights.end());
  std::vector<double> first_moment(expected.size(), 0.0), second_moment(expected.size(), 0.0);
  std::vector<double> gradients(sharded_gradients.begin(), sharded_gradients.end());
  kernels::adamw_update<double>(expected.data(), gradients.data(), first_moment.data(), second_moment.data(),
                                static_cast<int64_t>(expected.size()), 1e-2, 0.9, 0.95, 1e-8, 0.01, 1);
  double worst = 0;
  for (size_t i = 0; i < expected.size(); ++i)
    worst = std::max(worst, std::fabs(static_cast<double>(weights[i]) - expected[i]));
  // float arithmetic on weights of magnitude <= 1 (norms start at 1): a few ulps of 1 (1.2e-7).
  CHECK(worst <= 1e-6);
  // Each rank holds a 1/sp share of the model states, so the peak is lower than without ZeRO.
  const Outcome replicated = step(batch, &world());
  CHECK(device.peak_bytes() < replicated.device_peak_bytes);
}

TEST_CASE("ZeRO-3 built sharded (zero.Init): each rank's measured peak equals the planner's prediction") {
  const ModelSpec spec = model_load("tiny-llama");
  const Batch batch = batch_make(64);
  const int64_t sp = world().size(), T = 64 / sp, first = world().rank() * T;
  // The same weights on every rank, loaded into shards.
  Arena whole_device("whole");
  LlamaModel whole(spec, whole_device);
  parameters_fill(whole);
  const std::vector<float> full(whole.parameters(), whole.parameters() + whole.parameter_count());
  struct Case {
    const char* name;
    TrainingOptions options;
  };
  TrainingOptions checkpointed;
  checkpointed.activation_checkpointing = true;
  TrainingOptions offloaded = checkpointed;
  offloaded.checkpoint_offload = true;
  TrainingOptions tiled = checkpointed;
  tiled.mlp_tiles = 4;
  tiled.loss_tiles = 4;
  for (const Case& c : {Case{"no checkpointing", {}}, Case{"checkpointing", checkpointed}, Case{"checkpoint offload", offloaded},
                        Case{"tiled MLP and loss", tiled}}) {
    CAPTURE(c.name);
    Arena device("device"), host("host");
    LlamaModel sharded(spec, device, world());
    sharded.load_parameters(full.data());
    CHECK(sharded.local_parameter_count() <= sharded.parameter_count() / world().size() + 6);  // modules padded
    CHECK(sharded.gather_full(sharded.parameters()) == full);  // the shards hold exactly the loaded weights
    SequenceParallel parallel{&world(), batch.positions.data()};
    sharded.forward_backward(batch.tokens.data() + first, batch.labels.data() + first, batch.positions.data() + first, T, c.options,
                             device, host, parallel);
    const MemoryPrediction predicted = memory_predict(spec, executor_cluster(std::numeric_limits<double>::infinity(), sp),
                                                      executor_plan(c.options, sp, /*zero_stage=*/3), runtime_profile_load("native"), 64);
    CHECK(predicted.gpu_peak_bytes == doctest::Approx(device.peak_bytes()).epsilon(0.001));
    CHECK(predicted.gpu_peak_moment == device.peak_moment());
  }
}

TEST_CASE("ZeRO-3 with the optimizer offloaded across ranks: the same step as on the device, and as predicted") {
  const ModelSpec spec = model_load("tiny-llama");
  const Batch batch = batch_make(64);
  const int64_t sp = world().size(), T = 64 / sp, first = world().rank() * T;
  const std::vector<float> full = fixture_weights();
  auto step = [&](bool offload, double& device_peak, double& host_peak) {
    Arena device("device"), host("host");
    LlamaModel model = offload ? LlamaModel(spec, device, world(), host) : LlamaModel(spec, device, world());
    model.load_parameters(full.data());
    SequenceParallel parallel{&world(), batch.positions.data()};
    model.forward_backward(batch.tokens.data() + first, batch.labels.data() + first, batch.positions.data() + first, T, {}, device, host,
                           parallel);
    model.adamw_step(1e-2f, 0.9f, 0.95f, 1e-8f, 0.01f);
    device_peak = device.peak_bytes();
    host_peak = host.peak_bytes();
    return model.gather_full(model.parameters());
  };
  double device_peak = 0, host_peak = 0, unused = 0;
  const std::vector<float> on_device = step(false, unused, unused);
  CHECK(step(true, device_peak, host_peak) == on_device);  // bitwise: the same reductions and AdamW
  const MemoryPrediction predicted = memory_predict(spec, executor_cluster(std::numeric_limits<double>::infinity(), sp),
                                                    executor_plan({}, sp, 3, /*offload_optimizer=*/true), runtime_profile_load("native"), 64);
  CHECK(predicted.gpu_peak_bytes == doctest::Approx(device_peak).epsilon(1e-9));
  // The host item is per node: every rank of this one-node run holds its shard's states.
  CHECK(predicted.host_bytes_per_node == doctest::Approx(host_peak * static_cast<double>(sp)).epsilon(1e-9));
}

TEST_CASE("the GPU's schedule across ranks (bf16 emulation): Ulysses, ZeRO-3, FPDT and parameter offload peaks equal the native-cuda prediction") {
  // Blocked attention over all S tokens for this rank's heads, its workspace, bf16 gathers and
  // all-to-alls: the GPU's allocations, measured on the CPU.
  const ModelSpec spec = model_load("tiny-llama");
  const Batch batch = batch_make(64);
  const int64_t sp = world().size(), T = 64 / sp, first = world().rank() * T;
  const std::vector<float> full = fixture_weights();
  const RuntimeProfile profile = runtime_profile_load("native-cuda");
  TrainingOptions offloaded;
  offloaded.activation_checkpointing = offloaded.checkpoint_offload = true;
  for (int zero_stage : {0, 3}) {
    CAPTURE(zero_stage);
    Arena device("device"), host("host");
    BasicLlamaModel<Bf16CpuOps> model = zero_stage == 3 ? BasicLlamaModel<Bf16CpuOps>(spec, device, world())
                                                        : BasicLlamaModel<Bf16CpuOps>(spec, device);
    model.load_parameters(full.data());
    SequenceParallel parallel{&world(), batch.positions.data()};
    model.forward_backward(batch.tokens.data() + first, batch.labels.data() + first, batch.positions.data() + first, T, offloaded, device,
                           host, parallel);
    const MemoryPrediction predicted = memory_predict(spec, executor_cluster(std::numeric_limits<double>::infinity(), sp),
                                                      executor_plan(offloaded, sp, zero_stage), profile, 64);
    // Less what lives beside the arena: CUDA context, cuBLAS workspace, NCCL buffers.
    CHECK(predicted.gpu_peak_bytes - runtime_overhead_bytes(profile, sp) == doctest::Approx(device.peak_bytes()).epsilon(1e-9));
    CHECK(predicted.gpu_peak_moment == device.peak_moment());
  }
  // FPDT under Ulysses (2 chunks), ZeRO-3 with parameter offload: device and host pool.
  PlanOptions plan = executor_plan(offloaded, sp, 3, false, true);
  plan.fpdt = true;
  plan.fpdt_chunk_tokens = 32;
  const MemoryPrediction predicted =
      memory_predict(spec, executor_cluster(std::numeric_limits<double>::infinity(), sp), plan, profile, 64);
  const TrainingOptions options = executor_training_options(plan, predicted);
  const int64_t chunk_local = options.fpdt_chunk_tokens;
  const auto tokens = fpdt_layout_rank_tokens(batch.tokens, sp, world().rank(), chunk_local);
  const auto labels = fpdt_layout_rank_tokens(batch.labels, sp, world().rank(), chunk_local);
  const auto positions = fpdt_layout_rank_tokens(batch.positions, sp, world().rank(), chunk_local);
  Arena device("device"), host("host");
  BasicLlamaModel<Bf16CpuOps> model(spec, device, &world(), ModelStates{3, false, true, {}}, &host);
  model.load_parameters(full.data());
  SequenceParallel parallel{&world(), batch.positions.data()};
  model.forward_backward(tokens.data(), labels.data(), positions.data(), T, options, device, host, parallel);
  CHECK(predicted.gpu_peak_bytes - runtime_overhead_bytes(profile, sp) == doctest::Approx(device.peak_bytes()).epsilon(1e-9));
  CHECK(predicted.gpu_peak_moment == device.peak_moment());
  CHECK(predicted.host_bytes_per_node == doctest::Approx(host.peak_bytes() * static_cast<double>(sp)).epsilon(1e-9));
}

TEST_CASE("FSDP2's precision regime across ranks (bf16 emulation): the same step as DeepSpeed's ZeRO-3 under Ulysses, peaks as predicted") {
  // The fp32 shards cast per gather give the gathered weights DeepSpeed's bf16 shards give:
  // loss and every gradient equal bit for bit; each rank's peak is the FSDP2 profile's.
  const ModelSpec spec = model_load("tiny-llama");
  const Batch batch = batch_make(64);
  const int64_t sp = world().size(), T = 64 / sp, first = world().rank() * T;
  const std::vector<float> full = fixture_weights();
  MachineTarget gpu;
  gpu.device = "cuda";
  gpu.ranks = sp;
  std::vector<float> gradients[2];
  double losses[2] = {0, 0};
  for (PrecisionRegime precision : {PrecisionRegime::mixed_master, PrecisionRegime::fsdp2}) {
    const auto which = static_cast<size_t>(precision == PrecisionRegime::fsdp2);
    CAPTURE(which);
    Arena device("device"), host("host");
    ModelStates states;
    states.zero_stage = 3;
    states.precision = precision;
    BasicLlamaModel<Bf16CpuOps> model(spec, device, &world(), states, &host);
    model.load_parameters(full.data());
    TrainingOptions options;
    options.activation_checkpointing = true;
    SequenceParallel parallel{&world(), batch.positions.data()};
    losses[which] = model.forward_backward(batch.tokens.data() + first, batch.labels.data() + first, batch.positions.data() + first, T,
                                           options, device, host, parallel).loss;
    gradients[which] = model.gradients_full();
    const RuntimeProfile profile = machine_profile(gpu, precision);
    const MemoryPrediction predicted =
        memory_predict(spec, executor_cluster(std::numeric_limits<double>::infinity(), sp), executor_plan(options, sp, 3), profile, 64);
    CHECK(predicted.gpu_peak_bytes - runtime_overhead_bytes(profile, sp) == doctest::Approx(device.peak_bytes()).epsilon(1e-9));
    CHECK(predicted.gpu_peak_moment == device.peak_moment());
  }
  CHECK(losses[1] == losses[0]);
  CHECK(gradients[1] == gradients[0]);
}

int main(int argc, char** argv) { return mpi_doctest_main(argc, argv); }

// ZeRO-1, ZeRO-2 and parameter offload change where states live and how gradients are summed
// (whole, or reduce-scattered into shards), never the arithmetic: the communicator sums in rank
// order either way, so three AdamW steps leave the same weights, bit for bit, as the plan without
// them; and each run's device and host peaks are the native prediction for its plan.
TEST_CASE("ZeRO-1, ZeRO-2 and parameter offload: the same weights after three AdamW steps, bitwise, peaks as predicted") {
  const ModelSpec spec = model_load("tiny-llama");
  const Batch batch = batch_make(64);
  const int64_t sp = world().size(), T = 64 / sp, first = world().rank() * T;
  const std::vector<float> full = fixture_weights();
  const RuntimeProfile native = runtime_profile_load("native");
  struct Case {
    const char* name;
    ModelStates states;
  };
  TrainingOptions checkpointed;
  checkpointed.activation_checkpointing = true;
  std::vector<float> expected_weights;
  std::vector<double> expected_losses;
  for (const Case& c : {Case{"ZeRO-0", {0, false, false, {}, {}}}, Case{"ZeRO-1", {1, false, false, {}, {}}}, Case{"ZeRO-2", {2, false, false, {}, {}}},
                        Case{"ZeRO-3", {3, false, false, {}, {}}}, Case{"ZeRO-1 + optimizer offload", {1, true, false, {}, {}}},
                        Case{"ZeRO-2 + optimizer offload", {2, true, false, {}, {}}}, Case{"ZeRO-3 + parameter offload", {3, false, true, {}, {}}},
                        Case{"ZeRO-3 + both offloads", {3, true, true, {}, {}}}}) {
    CAPTURE(c.name);
    Arena device("device"), host("host");
    BasicLlamaModel<CpuOps> model(spec, device, &world(), c.states, &host);
    model.load_parameters(full.data());
    CHECK(model.parameters_full() == full);
    std::vector<double> losses;
    for (int step = 0; step < 3; ++step) {
      SequenceParallel parallel{&world(), batch.positions.data()};
      losses.push_back(model.forward_backward(batch.tokens.data() + first, batch.labels.data() + first, batch.positions.data() + first, T,
                                              checkpointed, device, host, parallel)
                           .loss);
      model.adamw_step(1e-2f, 0.9f, 0.95f, 1e-8f, 0.01f);
    }
    const std::vector<float> weights = model.parameters_full();
    if (expected_weights.empty()) {
      expected_weights = weights;
      expected_losses = losses;
      CHECK(weights != full);  // the steps changed something
    } else {
      CHECK(losses == expected_losses);
      CHECK(weights == expected_weights);
    }
    const MemoryPrediction predicted =
        memory_predict(spec, executor_cluster(std::numeric_limits<double>::infinity(), sp),
                       executor_plan(checkpointed, sp, c.states.zero_stage, c.states.offload_optimizer, c.states.offload_params), native, 64);
    CHECK(predicted.gpu_peak_bytes == doctest::Approx(device.peak_bytes()).epsilon(0.001));
    CHECK(predicted.gpu_peak_moment == device.peak_moment());
    CHECK(predicted.host_bytes_per_node == doctest::Approx(host.peak_bytes() * static_cast<double>(sp)).epsilon(0.001));
  }
}

// FPDT under Ulysses: each rank holds its piece of every chunk (FPDT's layout); the all-to-all of
// chunk i is the sequence's chunk i for this rank's heads. Loss and every gradient equal one
// unsharded, unchunked rank within the memory options' tolerance (summation order only); peaks
// equal the native prediction per rank, device and host.
TEST_CASE("FPDT with Ulysses: loss and gradients equal one unchunked rank, for 1, 2 and 8 chunks, peaks as predicted") {
  const ModelSpec spec = model_load("tiny-llama");
  const Batch batch = batch_make(64);  // two documents; GQA: kv heads replicated on 4 ranks
  const int64_t sp = world().size(), T = 64 / sp;
  Arena reference_device("reference device"), reference_host("reference host");
  LlamaModel reference(spec, reference_device);
  parameters_fill(reference);
  TrainingOptions checkpointed;
  checkpointed.activation_checkpointing = true;
  const StepResult expected =
      reference.forward_backward(batch.tokens.data(), batch.labels.data(), batch.positions.data(), 64, checkpointed, reference_device,
                                 reference_host);
  const std::vector<float> expected_gradients(reference.gradients(), reference.gradients() + reference.parameter_count());
  for (int64_t chunks : {1, 2, 8}) {
    CAPTURE(chunks);
    const int64_t chunk_local = T / chunks;
    PlanOptions plan = executor_plan(checkpointed, sp);
    plan.fpdt = true;
    plan.fpdt_chunk_tokens = chunk_local * sp;
    const MemoryPrediction predicted =
        memory_predict(spec, executor_cluster(std::numeric_limits<double>::infinity(), sp), plan, runtime_profile_load("native"), 64);
    TrainingOptions options = executor_training_options(plan, predicted, /*attention_block=*/4);
    REQUIRE(options.fpdt_chunk_tokens == chunk_local);
    const auto tokens = fpdt_layout_rank_tokens(batch.tokens, sp, world().rank(), chunk_local);
    const auto labels = fpdt_layout_rank_tokens(batch.labels, sp, world().rank(), chunk_local);
    const auto positions = fpdt_layout_rank_tokens(batch.positions, sp, world().rank(), chunk_local);
    Arena device("device"), host("host");
    LlamaModel model(spec, device);
    parameters_fill(model);
    SequenceParallel parallel{&world(), batch.positions.data()};
    const StepResult result =
        model.forward_backward(tokens.data(), labels.data(), positions.data(), T, options, device, host, parallel);
    CHECK(result.counted_tokens == expected.counted_tokens);
    CHECK(result.loss == doctest::Approx(expected.loss).epsilon(1e-6));
    gradients_close(std::vector<float>(model.gradients(), model.gradients() + model.parameter_count()), expected_gradients);
    CHECK(predicted.gpu_peak_bytes == doctest::Approx(device.peak_bytes()).epsilon(1e-9));
    CHECK(predicted.gpu_peak_moment == device.peak_moment());
    CHECK(predicted.host_bytes_per_node == doctest::Approx(host.peak_bytes() * static_cast<double>(sp)).epsilon(1e-9));
  }
}
