// Micro batches and global batches, and checkpointing one layer in every N (issue 40): gradient accumulation's step count, its time (every
// micro-step's work, the optimizer once), its memory (gradients held through the window), and the
// micro-batch search against a brute-force ladder.
#include <doctest/doctest.h>

#include "models/model_loader.hpp"
#include "planner/cards.hpp"
#include "planner/compute_model.hpp"
#include "planner/frameworks.hpp"
#include "planner/memory_model.hpp"
#include "planner/search.hpp"
#include "planner/time_model.hpp"
#include "support/memory_items.hpp"

using namespace longseq;

namespace {

ClusterSpec h100s(int64_t gpus) { return cluster_make(hardware_card_load("h100-sxm-80gb"), gpus, 0, 0, 0); }

}  // namespace

TEST_CASE("accumulation steps are the global batch over micro batch x dp, and a global batch they do not divide is refused") {
  const ModelSpec model = model_load("llama-3.1-8b");
  const ClusterSpec cluster = h100s(8);
  PlanOptions plan = PlanOptions::alst(2);  // dp = 8 / 2 = 4
  plan.micro_batch = 2;
  CHECK(gradient_accumulation_steps(cluster, plan) == 1);  // no global batch: one micro batch a step
  plan.global_batch = 64;
  CHECK(data_parallel_ranks(cluster, plan) == 4);
  CHECK(gradient_accumulation_steps(cluster, plan) == 8);  // 64 / (2 x 4)
  CHECK(plan_problems(model, cluster, plan).empty());
  plan.global_batch = 60;
  const std::vector<std::string> problems = plan_problems(model, cluster, plan);
  REQUIRE(problems.size() == 1);
  CHECK(problems.front() == "global batch 60 is not a multiple of micro batch 2 x dp 4 = 8 samples a micro-step");
}

TEST_CASE("a step of A micro-steps: each micro-step's compute and traffic A times, the optimizer once, tokens/s over every sample") {
  const ModelSpec model = model_load("llama-3.1-8b");
  const ClusterSpec cluster = h100s(8);
  const RuntimeProfile profile = runtime_profile_load("deepspeed-hf");
  const int64_t seqlen = 65536;
  for (int zero : {1, 3}) {
    CAPTURE(zero);
    PlanOptions plan = PlanOptions::alst(4);  // dp = 2, optimizer offloaded
    plan.zero_stage = zero;
    plan.offload_params = false;
    const TimePrediction one = time_predict(model, cluster, plan, profile, seqlen);
    plan.global_batch = 2 * 4;  // 4 micro-steps of one sample on each of 2 replicas
    const TimePrediction four = time_predict(model, cluster, plan, profile, seqlen);
    CHECK(four.accumulation_steps == 4);
    CHECK(four.time.matmul_s == doctest::Approx(4 * one.time.matmul_s));
    CHECK(four.time.attention_s == doctest::Approx(4 * one.time.attention_s));
    CHECK(four.time.ulysses_all_to_all_s == doctest::Approx(4 * one.time.ulysses_all_to_all_s));
    CHECK(four.time.checkpoint_offload_s == doctest::Approx(4 * one.time.checkpoint_offload_s));
    CHECK(four.time.elementwise_s == doctest::Approx(4 * one.time.elementwise_s));
    CHECK(four.time.optimizer_s == doctest::Approx(one.time.optimizer_s));
    // ZeRO-2/3 reduce (and an offloaded optimizer's gradients come down) every micro-step; ZeRO-1
    // at the boundary only (DeepSpeed engine.py allreduce_gradients).
    const double reductions = zero >= 2 ? 4.0 : 1.0;
    CHECK(one.time.gradient_offload_s > 0);
    CHECK(four.time.gradient_offload_s == doctest::Approx(reductions * one.time.gradient_offload_s));
    if (zero == 3) CHECK(four.time.zero_communication_exposed_s == doctest::Approx(4 * one.time.zero_communication_exposed_s));
    else CHECK(four.time.zero_communication_exposed_s == doctest::Approx(one.time.zero_communication_exposed_s));
    // Tokens per second count the 8 samples of the step; the optimizer's share is spread over them.
    CHECK(four.tokens_per_s == doctest::Approx(8.0 * seqlen / four.time.total_s()));
    CHECK(four.tokens_per_s > one.tokens_per_s);
    CHECK(four.mfu == doctest::Approx(4 * one.model_flops.total() / four.time.total_s() / (cluster.hardware.peak_bf16_tflops * 1e12)));
  }
}

TEST_CASE("under accumulation the gradients of the micro-steps before are held all step: as a profile that never frees them") {
  const ModelSpec model = model_load("qwen3-8b");
  const ClusterSpec cluster = h100s(8);
  const RuntimeProfile profile = runtime_profile_load("fsdp2-accelerate");
  REQUIRE(profile.gradients_freed_after_step);
  RuntimeProfile held_all_step = profile;
  held_all_step.gradients_freed_after_step = false;
  PlanOptions plan;
  plan.sp = 1;
  plan.zero_stage = 3;
  plan.tiled_loss = true;
  const int64_t seqlen = 32768;
  const double freed_peak = memory_predict(model, cluster, plan, profile, seqlen).gpu_peak_bytes;
  const double held_peak = memory_predict(model, cluster, plan, held_all_step, seqlen).gpu_peak_bytes;
  REQUIRE(held_peak > freed_peak);  // the mechanism matters at this plan
  plan.global_batch = 16;           // 2 micro-steps on each of 8 replicas
  CHECK(memory_predict(model, cluster, plan, profile, seqlen).gpu_peak_bytes == doctest::Approx(held_peak));
}

TEST_CASE("micro-batch search: the largest that fits is the brute-force ladder's, the fastest its best tokens/s") {
  const ModelSpec model = model_load("llama-3.1-8b");
  const ClusterSpec cluster = h100s(8);
  const RuntimeProfile profile = runtime_profile_load("deepspeed-hf");
  SearchOptions options;
  options.seqlen = 131072;
  const MicroBatchSearch largest = micro_batch_search(model, cluster, profile, options, MicroBatchObjective::micro_batch_largest);
  REQUIRE(largest.micro_batch > 1);
  auto best_fits = [&](int64_t micro_batch) {
    SearchOptions each = options;
    each.objective = SearchObjective::objective_throughput;
    each.held.micro_batch = micro_batch;
    const SearchResult result = plan_search(model, cluster, profile, each);
    return result.winner() ? result.winner()->time.tokens_per_s : 0.0;
  };
  for (int64_t micro_batch = 1; micro_batch <= largest.micro_batch; ++micro_batch) CHECK(best_fits(micro_batch) > 0);
  CHECK(best_fits(largest.micro_batch + 1) == 0);
  CHECK(largest.result.winner() != nullptr);
  CHECK(largest.result.winner()->plan.micro_batch == largest.micro_batch);

  const MicroBatchSearch fastest = micro_batch_search(model, cluster, profile, options, MicroBatchObjective::micro_batch_fastest);
  double best = 0;
  for (const MicroBatchTried& tried : fastest.tried)
    if (tried.fits) best = std::max(best, tried.tokens_per_s);
  REQUIRE(fastest.micro_batch > 0);
  CHECK(best_fits(fastest.micro_batch) >= best / (1 + kSearchLengthResolution));

  // With a global batch only its divisors are tried (whole accumulation steps).
  options.held.global_batch = 48;
  const MicroBatchSearch divisors = micro_batch_search(model, cluster, profile, options, MicroBatchObjective::micro_batch_largest);
  for (const MicroBatchTried& tried : divisors.tried) CHECK(48 % tried.micro_batch == 0);
  REQUIRE(divisors.micro_batch > 0);
  CHECK(48 % divisors.micro_batch == 0);
  CHECK(divisors.result.winner()->plan.global_batch == 48);
}

TEST_CASE("one layer in every N checkpointed (torchtitan's layer SAC): the others keep what they save, 1/N of the layers recomputed") {
  const ModelSpec model = model_load("llama-3.1-8b");  // 32 layers
  const ClusterSpec cluster = h100s(8);
  const RuntimeProfile profile = runtime_profile_load("fsdp2-torchtitan");
  const int64_t seqlen = 65536;
  PlanOptions full;
  full.sp = 1;
  full.ring = 8;
  full.zero_stage = 3;
  full.activation_checkpointing = true;
  // torchtitan's counter starts at 1 and wraps layers whose count is a multiple of N: 0-based 1, 3, 5, ...
  PlanOptions every_second = full;
  every_second.checkpoint_every = 2;
  CHECK_FALSE(every_second.layer_checkpointed(0));
  CHECK(every_second.layer_checkpointed(1));
  CHECK(every_second.layer_checkpointed(31));
  CHECK(every_second.checkpointed_layers(31) == 15);

  // At the backward of the last layer (checkpointed in both) the 31 layers below hold 31 inputs
  // under full checkpointing; under one in two, 15 inputs and 16 layers' saved tensors.
  const MemoryPrediction checkpointed = memory_predict(model, cluster, full, profile, seqlen, true);
  const MemoryPrediction selective = memory_predict(model, cluster, every_second, profile, seqlen, true);
  PlanOptions none = full;
  none.activation_checkpointing = false;
  double saved_per_layer = 0;
  for (const MemoryItem& item : layer_saved_tensors(model, cluster, none, profile, seqlen)) saved_per_layer += item.bytes;
  const double x_bytes = 65536.0 / 8 * 4096 * 2;  // a layer input: bf16, 8,192 tokens a rank
  auto last_layer_backward = [](const MemoryPrediction& prediction) { return testing::phase_bytes(prediction, "backward of the last decoder layer"); };
  REQUIRE(last_layer_backward(checkpointed) > 0);
  CHECK(last_layer_backward(selective) - last_layer_backward(checkpointed) == doctest::Approx(16 * (saved_per_layer - x_bytes)).epsilon(1e-6));
  CHECK(selective.gpu_peak_bytes > checkpointed.gpu_peak_bytes);

  // Compute: the layers' forward once more for 16 of 32 layers.
  const LayerForwardFlops layer = layer_forward_flops(model, 1, seqlen, 8);
  CHECK(step_flops_executed(model, full, seqlen).matmul - step_flops_executed(model, every_second, seqlen).matmul ==
        doctest::Approx(16 * (layer.projections + layer.mlp)));
  CHECK(recomputed_layer_share(model, every_second) == 0.5);

  // Only torchtitan runs it; the others say where it lives.
  CHECK(framework_unsupported(Framework::framework_torchtitan, model, every_second, 8).empty());
  CHECK(framework_unsupported(Framework::framework_accelerate_fsdp2, model, every_second, 8).find("torchtitan's layer-selective AC") !=
        std::string::npos);
}
