// LoRA in the executor: the base frozen, the adapters trained by the one step text.
//
// References: a float64 step written plainly (support/float64_llama.hpp), itself held to the
// PyTorch float64 golden, through merged weights (the adapted model is the base with W + s B A);
// and central finite differences of that float64 loss. Tolerances, measured and then stated with
// margin: fp32 against float64 within 2e-4 of each adapter tensor's largest |gradient| (measured
// 6.6e-5: more than full training's 2.8e-5, as each adapter gradient contracts a whole weight
// gradient, s B^T G, in fp32); against the finite differences 1e-4 of the largest adapter gradient
// (measured 2.9e-7); memory options within 3e-5 (measured 1.4e-6: summation order only); the
// GPU's bf16 schedule within 0.05 relative L2 of the fp32 adapters (measured 0.015).
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "executor/llama_step.hpp"
#include "executor/trainer.hpp"
#include "models/adapters.hpp"
#include "models/model_loader.hpp"
#include "planner/memory_model.hpp"
#include "support/bf16_cpu_ops.hpp"
#include "support/float64_llama.hpp"
#include "support/lora_fixture.hpp"
#include "support/tiny_llama_fixture.hpp"

using namespace longseq;
using namespace longseq::testing;

namespace {

StepOutcome lora_run(const ModelStates& states, const TrainingOptions& options, const Batch& batch) {
  Arena device("device"), host("host");
  LlamaModel model(model_load("tiny-llama"), device, nullptr, states, nullptr);
  parameters_fill(model);
  model.load_adapters(test_adapters(model.lora_layout()).data());
  return step_outcome(model, batch, options, device, host);
}

std::vector<double> widen(const std::vector<float>& values) { return {values.begin(), values.end()}; }

}  // namespace

TEST_CASE("the float64 reference step equals the PyTorch float64 golden (so it can stand in for it)") {
  const Golden golden = golden_read();
  const Float64Step step = float64_forward_backward(model_load("tiny-llama"), fixture_weights_float64(), batch_make(golden.T));
  CHECK(step.loss == doctest::Approx(golden.loss).epsilon(1e-10));  // measured 2.7e-12: summation order
  // The golden's gradients are stored as float32: agreement to their rounding (2^-24 of a value).
  const std::vector<float> rounded(step.gradients.begin(), step.gradients.end());
  gradients_compare(rounded, golden.gradients, 1e-7);
}

TEST_CASE("LoRA layout: adapters on every linear or on q_proj and v_proj, as many as the planner counts") {
  const ModelSpec spec = model_load("tiny-llama");
  for (bool all_linear : {true, false}) {
    CAPTURE(all_linear);
    const LoraLayout layout = lora_layout(spec, LoraConfig{8, 16.0f, all_linear});
    CHECK(layout.total == lora_parameter_count(spec, 8, all_linear));
    CHECK(layout.scale == 2.0f);  // lora_alpha / r
    // Hand count for tiny-llama (hidden 64, q 64, kv 32, intermediate 176, 4 layers), r = 8:
    // q 8 (64 + 64), k 8 (64 + 32), v 8 (64 + 32), o 8 (64 + 64), gate and up 8 (64 + 176), down 8 (176 + 64).
    const int64_t per_layer = all_linear ? 8 * (128 + 96 + 96 + 128 + 240 + 240 + 240) : 8 * (128 + 96);
    CHECK(layout.total == 4 * per_layer);
    const auto& first = layout.layers[0];
    CHECK(first[static_cast<size_t>(LayerLinearKind::q_proj)].present());
    CHECK(first[static_cast<size_t>(LayerLinearKind::v_proj)].present());
    CHECK(first[static_cast<size_t>(LayerLinearKind::down_proj)].present() == all_linear);
  }
}

TEST_CASE("LoRA: loss and every adapter gradient equal the float64 reference (merged weights), the base gets none") {
  const ModelSpec spec = model_load("tiny-llama");
  const Batch batch = batch_make(64);
  struct Case {
    int64_t rank;
    bool all_linear;
    float alpha;
  };
  for (const Case& c : {Case{4, true, 16.0f}, Case{8, false, 8.0f}, Case{2, true, 3.0f}}) {
    CAPTURE(c.rank);
    CAPTURE(c.all_linear);
    const ModelStates states = lora_states(c.rank, c.all_linear, c.alpha);
    const LoraLayout layout = lora_layout(spec, states.lora);
    const StepOutcome run = lora_run(states, {}, batch);
    const Float64Step reference = float64_lora_step(spec, fixture_weights(), test_adapters(layout), layout, batch);
    CHECK(run.result.counted_tokens == 53);
    CHECK(run.result.loss == doctest::Approx(reference.loss).epsilon(1e-6));
    CHECK(run.gradients.size() == static_cast<size_t>(layout.total));  // the adapters' alone
    adapter_gradients_compare(run.gradients, reference.gradients, layout, 2e-4);
  }
}

TEST_CASE("LoRA: adapter gradients equal central finite differences of the float64 loss") {
  // d loss / d theta_i ~ (L(theta + h e_i) - L(theta - h e_i)) / 2h in float64 with h = 1e-4: the
  // truncation error is O(h^2) (~1e-8 here), far under the fp32 step's own 1e-4.
  const ModelSpec spec = model_load("tiny-llama");
  const Batch batch = batch_make(64);
  const ModelStates states = lora_states(4, true);
  const LoraLayout layout = lora_layout(spec, states.lora);
  const StepOutcome run = lora_run(states, {}, batch);
  const std::vector<float> base = fixture_weights(), adapters = test_adapters(layout);
  double largest = 0;
  for (float g : run.gradients) largest = std::max(largest, std::fabs(static_cast<double>(g)));
  REQUIRE(largest > 0);
  const double h = 1e-4;
  int checked = 0;
  for (size_t layer : {size_t{0}, size_t{3}})
    for (size_t kind = 0; kind < kLayerLinears; ++kind) {
      const LoraLayout::Adapter& adapter = layout.layers[layer][kind];
      for (int64_t index : {adapter.a + 5, adapter.b + 3}) {
        // The adapters in float64: the perturbation is not rounded away.
        auto loss_at = [&](double delta) {
          std::vector<double> shifted(adapters.begin(), adapters.end());
          shifted[static_cast<size_t>(index)] += delta;
          return float64_forward_backward(spec, float64_lora_merge(spec, {base.begin(), base.end()}, shifted, layout), batch).loss;
        };
        const double finite_difference = (loss_at(h) - loss_at(-h)) / (2 * h);
        CAPTURE(layer);
        CAPTURE(kLayerLinearNames[kind]);
        CAPTURE(index);
        CHECK(std::fabs(static_cast<double>(run.gradients[static_cast<size_t>(index)]) - finite_difference) <= 1e-4 * largest);
        ++checked;
      }
    }
  CHECK(checked == 2 * 2 * kLayerLinears);
}

TEST_CASE("LoRA: every memory option leaves loss and adapter gradients unchanged, tiles, FPDT and ZeRO are refused") {
  const ModelSpec spec = model_load("tiny-llama");
  const Batch batch = batch_make(64);
  const ModelStates states = lora_states(4, true);
  const LoraLayout layout = lora_layout(spec, states.lora);
  const StepOutcome plain = lora_run(states, {}, batch);
  TrainingOptions checkpointing;
  checkpointing.activation_checkpointing = true;
  TrainingOptions offload = checkpointing;
  offload.checkpoint_offload = true;
  TrainingOptions everything = offload;
  everything.loss_tiles = 3;
  everything.attention_block = 5;
  for (const TrainingOptions& options : {checkpointing, offload, everything}) {
    CAPTURE(options.checkpoint_offload);
    CAPTURE(options.loss_tiles);
    const StepOutcome other = lora_run(states, options, batch);
    CHECK(other.result.loss == doctest::Approx(plain.result.loss).epsilon(1e-6));
    adapter_gradients_compare(other.gradients, widen(plain.gradients), layout, 3e-5);
  }
  TrainingOptions tiled;
  tiled.mlp_tiles = 2;
  CHECK_THROWS_AS(lora_run(states, tiled, batch), std::invalid_argument);
  Arena device("device"), host("host");
  ModelStates zero = states;
  zero.zero_stage = 1;
  CHECK_THROWS_AS(LlamaModel(spec, device, nullptr, zero, nullptr), std::invalid_argument);
  PlanOptions plan = executor_plan({});
  plan.lora_rank = 8;
  plan.zero_stage = 2;
  CHECK(executor_plan_problems(plan, "cpu").size() == 1);
  plan.zero_stage = 0;
  CHECK(executor_plan_problems(plan, "cpu").empty());
  plan.qlora = true;
  CHECK(executor_plan_problems(plan, "cpu").size() == 1);  // no 4-bit base in the executor
}

TEST_CASE("LoRA: measured peak device and host memory equal the planner's native prediction") {
  // The planner's LoRA model states (base_weights, lora_adapters_fp32, lora_gradients_fp32,
  // lora_optimizer_states) and executor_step_replay's adapter tensors against the arena.
  const ModelSpec spec = model_load("tiny-llama");
  const ClusterSpec cluster = executor_cluster(std::numeric_limits<double>::infinity());
  const RuntimeProfile native = runtime_profile_load("native");
  struct Case {
    bool checkpointing, offload;
    int64_t loss_tiles;
  };
  for (int64_t seqlen : {256, 1024})
    for (bool all_linear : {true, false})
      for (const Case& c : {Case{false, false, 0}, Case{true, false, 0}, Case{true, true, 0}, Case{false, false, 4}, Case{true, true, 8}}) {
        CAPTURE(seqlen);
        CAPTURE(all_linear);
        CAPTURE(c.checkpointing);
        CAPTURE(c.offload);
        CAPTURE(c.loss_tiles);
        TrainingOptions options;
        options.activation_checkpointing = c.checkpointing;
        options.checkpoint_offload = c.offload;
        options.loss_tiles = c.loss_tiles;
        const Sample sample = sample_synthetic(seqlen, spec.vocab_size, 3);
        const Batch batch{sample.tokens, sample.labels, sample.positions};
        const StepOutcome run = lora_run(lora_states(16, all_linear), options, batch);
        PlanOptions plan = executor_plan(options);
        plan.lora_rank = 16;
        plan.lora_all_linear = all_linear;
        const MemoryPrediction predicted = memory_predict(spec, cluster, plan, native, seqlen);
        CHECK(predicted.gpu_peak_bytes == doctest::Approx(run.device_peak_bytes).epsilon(1e-9));
        CHECK(predicted.gpu_peak_moment == run.peak_moment);
        if (c.offload) CHECK(predicted.host_bytes_per_node == doctest::Approx(run.host_peak_bytes).epsilon(1e-9));
      }
}

TEST_CASE("LoRA: the model states are the frozen base and the adapters' fp32 training states, by hand") {
  // tiny-llama: 217,664 parameters (test_llama.cpp's budget test); r = 8 on every linear: 4 x 9,344
  // adapter values (the layout test). fp32 base 4 B, adapters 4 + gradients 4 + two moments 8.
  const ModelSpec spec = model_load("tiny-llama");
  Arena device("device");
  LlamaModel model(spec, device, nullptr, lora_states(8, true), nullptr);
  CHECK(device.current_bytes() == doctest::Approx(4.0 * 217664 + 16.0 * 4 * 9344));
}

TEST_CASE("LoRA: three AdamW steps lower the loss and move only the adapters") {
  const ModelSpec spec = model_load("tiny-llama");
  Arena device("device"), host("host");
  LlamaModel model(spec, device, nullptr, lora_states(8, true), nullptr);
  parameters_fill(model);  // lora_B starts at zero (PEFT): the first step's loss is the base's
  const Sample sample = sample_synthetic(128, spec.vocab_size, 3);
  const std::vector<float> initial = model.parameters_full();
  std::vector<double> losses;
  for (int step = 0; step < 3; ++step) {
    losses.push_back(
        model.forward_backward(sample.tokens.data(), sample.labels.data(), sample.positions.data(), 128, {}, device, host).loss);
    model.adamw_step(1e-2f, 0.9f, 0.999f, 1e-8f, 0.0f);
  }
  CHECK(losses[2] < losses[0]);
  CHECK(model.parameters_full() != initial);
  // The base: a full model loaded with the same weights gives the first step's loss again.
  Arena other_device("device"), other_host("host");
  LlamaModel base(spec, other_device);
  parameters_fill(base);
  const double base_loss =
      base.forward_backward(sample.tokens.data(), sample.labels.data(), sample.positions.data(), 128, {}, other_device, other_host).loss;
  CHECK(base_loss == doctest::Approx(losses[0]).epsilon(1e-6));
}

TEST_CASE("LoRA on the GPU's schedule (bf16 emulation): adapter gradients track fp32, peak equals the native-cuda prediction") {
  const ModelSpec spec = model_load("tiny-llama");
  const ClusterSpec cluster = executor_cluster(std::numeric_limits<double>::infinity());
  const RuntimeProfile profile = runtime_profile_load("native-cuda");
  const ModelStates states = lora_states(8, true);
  const LoraLayout layout = lora_layout(spec, states.lora);
  const Batch batch = batch_make(64);
  const StepOutcome fp32 = lora_run(states, {}, batch);
  for (bool checkpointing : {false, true}) {
    CAPTURE(checkpointing);
    Arena device("device"), host("host");
    BasicLlamaModel<Bf16CpuOps> model(spec, device, nullptr, states, nullptr);
    model.load_parameters(fixture_weights().data());
    model.load_adapters(test_adapters(layout).data());
    TrainingOptions options;
    options.activation_checkpointing = checkpointing;
    const StepResult result = model.forward_backward(batch.tokens.data(), batch.labels.data(), batch.positions.data(), 64, options, device, host);
    // bf16 against fp32: the loss as the full step's (test_llama_bf16.cpp), the adapters in relative L2.
    CHECK(result.loss == doctest::Approx(fp32.result.loss).epsilon(2e-4));
    const std::vector<float> gradients = model.gradients_full();
    double difference = 0, norm = 0;
    for (size_t i = 0; i < gradients.size(); ++i) {
      difference += std::pow(static_cast<double>(gradients[i]) - fp32.gradients[i], 2);
      norm += std::pow(static_cast<double>(fp32.gradients[i]), 2);
    }
    CHECK(std::sqrt(difference / norm) < 0.05);
    PlanOptions plan = executor_plan(options);
    plan.lora_rank = 8;
    const MemoryPrediction predicted = memory_predict(spec, cluster, plan, profile, 64);
    double runtime = 0;
    for (const MemoryItem& item : predicted.gpu_items)
      if (item.category == kCategoryRuntime) runtime += item.bytes;
    CHECK(predicted.gpu_peak_bytes - runtime == doctest::Approx(device.peak_bytes()).epsilon(1e-9));
    CHECK(predicted.gpu_peak_moment == device.peak_moment());
  }
}
