// The executor's tiny Llama against an independent PyTorch float64 reference (tests/golden), and
// every memory option against the plain run.
//
// Tolerances, measured and then stated with about 4x margin: float32 training against the float64
// reference differs by at most 2.8e-5 of each tensor's largest |gradient| (tolerance 1e-4) and
// 1e-6 relative in the loss; memory options change only summation order and differ from the
// plain run by at most 7.3e-6 of each tensor's largest |gradient| (tolerance 3e-5).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <fstream>
#include <vector>

#include "executor/llama.hpp"
#include "executor/trainer.hpp"
#include "io/config_error.hpp"
#include "planner/scenario.hpp"
#include "support/tiny_llama_fixture.hpp"
#include "models/model_loader.hpp"
#include "planner/memory_model.hpp"

using namespace longseq;
using namespace longseq::testing;

namespace {

struct Run {
  StepResult result;
  std::vector<float> gradients;
  double peak_bytes = 0;
};

Run run(const TrainingOptions& options) {
  const ModelSpec spec = model_load("tiny-llama");
  Arena device("device"), host("host");
  LlamaModel model(spec, device);
  parameters_fill(model);
  const Batch batch = batch_make(64);
  Run out;
  out.result = model.forward_backward(batch.tokens.data(), batch.labels.data(), batch.positions.data(), 64, options, device, host);
  out.gradients.assign(model.gradients(), model.gradients() + model.parameter_count());
  out.peak_bytes = device.peak_bytes();
  return out;
}


}  // namespace

TEST_CASE("tiny Llama: loss and every parameter gradient match the PyTorch float64 reference") {
  const Golden golden = golden_read();
  REQUIRE(golden.T == 64);
  const Run plain = run({});
  CHECK(plain.result.counted_tokens == 53);  // 64 - 2 document ends - 9 ignored (i % 7 == 3)
  CHECK(plain.result.loss == doctest::Approx(golden.loss).epsilon(1e-6));
  gradients_compare(plain.gradients, golden.gradients, 1e-4);
}

TEST_CASE("every memory option leaves loss and gradients unchanged") {
  const Run plain = run({});
  struct Case {
    const char* name;
    TrainingOptions options;
  };
  std::vector<Case> cases;
  TrainingOptions o;
  o.activation_checkpointing = true;
  cases.push_back({"checkpointing", o});
  o.checkpoint_offload = true;
  cases.push_back({"checkpointing + offload", o});
  for (int64_t tiles : {1, 3, 64}) {
    TrainingOptions tiled;
    tiled.mlp_tiles = tiles;
    cases.push_back({"tiled MLP", tiled});
  }
  TrainingOptions loss;
  loss.loss_tiles = 5;
  cases.push_back({"tiled loss", loss});
  TrainingOptions everything;
  everything.activation_checkpointing = everything.checkpoint_offload = true;
  everything.mlp_tiles = 7;
  everything.loss_tiles = 3;
  everything.attention_block = 5;
  cases.push_back({"all options, attention block 5", everything});
  for (const auto& c : cases) {
    CAPTURE(c.name);
    const Run other = run(c.options);
    CHECK(other.result.loss == doctest::Approx(plain.result.loss).epsilon(1e-6));
    gradients_compare(other.gradients, plain.gradients, 3e-5);
  }
}

TEST_CASE("memory options lower the measured peak, an exceeded budget is a clean error with the breakdown") {
  const Run plain = run({});
  TrainingOptions saving;
  saving.activation_checkpointing = saving.checkpoint_offload = true;
  saving.mlp_tiles = 8;
  saving.loss_tiles = 8;
  CHECK(run(saving).peak_bytes < plain.peak_bytes);

  const ModelSpec spec = model_load("tiny-llama");
  // Room for weights, gradients, Adam moments and 64 KiB more: the step's activations cannot fit.
  Arena device("device", 4.0 * 217664 * 4 + 64 * 1024), host("host");
  LlamaModel model(spec, device);
  parameters_fill(model);
  const Batch batch = batch_make(64);
  try {
    model.forward_backward(batch.tokens.data(), batch.labels.data(), batch.positions.data(), 64, {}, device, host);
    FAIL("expected DeviceOutOfMemory");
  } catch (const DeviceOutOfMemory& error) {
    CHECK(std::string(error.what()).find("device out of memory") != std::string::npos);
    CHECK(error.live.size() >= 5);  // weights, gradients, two moments and what the step held
    CHECK(device.current_bytes() == doctest::Approx(4.0 * 217664 * 4));  // everything else was released
  }
}

TEST_CASE("measured peak device memory equals the planner's native prediction, across lengths and options") {
  // The planner replays the executor's schedule from the shared inventory; the arena measures
  // what really ran. The bar is 3%; both sides describe the same tensors, so they agree
  // exactly and this test holds them to 0.1%.
  const ModelSpec spec = model_load("tiny-llama");
  const ClusterSpec cluster = executor_cluster(std::numeric_limits<double>::infinity());
  const RuntimeProfile native = runtime_profile_load("native");
  struct Case {
    bool checkpointing, offload;
    int64_t mlp_tiles, loss_tiles;
  };
  for (int64_t seqlen : {256, 1024}) {
    for (const Case& c : {Case{false, false, 0, 0}, Case{true, false, 0, 0}, Case{true, true, 0, 0}, Case{false, false, 4, 0},
                          Case{false, false, 0, 4}, Case{true, true, 8, 8}}) {
      CAPTURE(seqlen);
      CAPTURE(c.checkpointing);
      CAPTURE(c.offload);
      CAPTURE(c.mlp_tiles);
      CAPTURE(c.loss_tiles);
      Arena device("device"), host("host");
      LlamaModel model(spec, device);
      parameters_fill(model);
      Batch batch;
      for (int64_t i = 0; i < seqlen; ++i) {
        batch.tokens.push_back(static_cast<int32_t>(i % 251));
        batch.labels.push_back(static_cast<int32_t>((i + 1) % 251));
        batch.positions.push_back(static_cast<int32_t>(i));
      }
      TrainingOptions options;
      options.activation_checkpointing = c.checkpointing;
      options.checkpoint_offload = c.offload;
      options.mlp_tiles = c.mlp_tiles;
      options.loss_tiles = c.loss_tiles;
      model.forward_backward(batch.tokens.data(), batch.labels.data(), batch.positions.data(), seqlen, options, device, host);
      const MemoryPrediction predicted = memory_predict(spec, cluster, executor_plan(options), native, seqlen);
      CHECK(predicted.gpu_peak_bytes == doctest::Approx(device.peak_bytes()).epsilon(0.001));
      CHECK(predicted.gpu_peak_moment == device.peak_moment());
      if (c.offload) CHECK(predicted.host_bytes_per_node == doctest::Approx(host.peak_bytes()).epsilon(0.001));
    }
  }
}

TEST_CASE("training data: labels are pre-shifted next tokens, positions count from 0") {
  const Sample synthetic = sample_synthetic(256, 256, 7);
  REQUIRE(synthetic.tokens.size() == 256);
  CHECK(synthetic.positions[255] == 255);
  const int64_t key = 32;  // min(32, 256 / 8)
  for (int64_t i = key - 1; i < 255; ++i) CHECK(synthetic.labels[static_cast<size_t>(i)] == synthetic.tokens[static_cast<size_t>(i + 1)]);
  CHECK(synthetic.labels[0] == -100);    // the random key is not predictable
  CHECK(synthetic.labels[255] == -100);  // nothing follows the last token
  // The key is copied at the end, after the marker.
  for (int64_t i = 0; i < key; ++i) CHECK(synthetic.tokens[static_cast<size_t>(256 - key + i)] == synthetic.tokens[static_cast<size_t>(i)]);
  CHECK(synthetic.tokens[static_cast<size_t>(256 - key - 1)] == 255);
  CHECK(sample_synthetic(256, 256, 7).tokens == synthetic.tokens);  // deterministic per seed

  const Sample text = sample_from_text("abc", 5, 1);  // bytes from offset 1, wrapping around
  CHECK(text.tokens == std::vector<int32_t>{'b', 'c', 'a', 'b', 'c'});
  CHECK(text.labels == std::vector<int32_t>{'c', 'a', 'b', 'c', 'a'});
}

TEST_CASE("run scenarios: the run section is checked, and the executor scenarios parse") {
  const std::string base = "name: r\nmodel: tiny-llama\n";
  CHECK(scenario_from_text(base + "run: {seqlen: 1Ki, steps: 2}\n", "r.yaml").run->steps == 2);
  CHECK_THROWS_WITH_AS(scenario_from_text(base + "run: {auto: true}\n", "r.yaml"), doctest::Contains("r.yaml: key 'run.auto': needs run.budget_mib"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(scenario_from_text(base + "run: {steps: 2}\n", "r.yaml"), doctest::Contains("key 'run.seqlen': required"), ConfigError);
  CHECK_THROWS_WITH_AS(scenario_from_text(base + "run: {seqlen: 1Ki, stepz: 2}\n", "r.yaml"), doctest::Contains("key 'run.stepz': unknown key"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(scenario_from_text(base, "r.yaml"), doctest::Contains("key 'cluster': required section is missing"), ConfigError);
  int found = 0;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(LONGSEQ_SCENARIOS_DIR) + "/executor")) {
    CAPTURE(entry.path().string());
    const Scenario scenario = scenario_load(entry.path().string());
    CHECK(scenario.run.has_value());
    CHECK_NOTHROW(model_load(scenario.model));
    ++found;
  }
  CHECK(found >= 2);
}

TEST_CASE("ZeRO-3 with the optimizer offloaded: the same training, 12 bytes a parameter off the device, as predicted") {
  // One rank is a ZeRO-3 group of one. Offloading moves the fp32 master weights, gradients and
  // Adam moments to the host and runs AdamW there with the same kernel: losses and weights after
  // two steps are bitwise those of the model that keeps them on the device.
  const ModelSpec spec = model_load("tiny-llama");
  const std::vector<float> weights = fixture_weights();
  const Sample sample = sample_synthetic(256, spec.vocab_size, 11);
  TrainingOptions options;
  options.activation_checkpointing = options.checkpoint_offload = true;
  struct Outcome {
    std::vector<double> losses;
    std::vector<float> weights;
    double device_peak = 0, host_peak = 0;
  };
  auto train = [&](bool offload) {
    Arena device("device"), host("host");
    SingleRankCommunicator one_rank;
    LlamaModel model = offload ? LlamaModel(spec, device, one_rank, host) : LlamaModel(spec, device, one_rank);
    CHECK(model.optimizer_offloaded() == offload);
    model.load_parameters(weights.data());
    Outcome outcome;
    for (int step = 0; step < 2; ++step) {
      outcome.losses.push_back(model.forward_backward(sample.tokens.data(), sample.labels.data(), sample.positions.data(), 256, options,
                                                      device, host).loss);
      model.adamw_step(1e-2f, 0.9f, 0.95f, 1e-8f, 0.01f);
    }
    outcome.weights = model.gather_full(model.parameters());
    outcome.device_peak = device.peak_bytes();
    outcome.host_peak = host.peak_bytes();
    const MemoryPrediction predicted =
        memory_predict(spec, executor_cluster(std::numeric_limits<double>::infinity()), executor_plan(options, 1, 3, offload),
                       runtime_profile_load("native"), 256);
    CHECK(predicted.gpu_peak_bytes == doctest::Approx(device.peak_bytes()).epsilon(1e-9));
    CHECK(predicted.host_bytes_per_node == doctest::Approx(host.peak_bytes()).epsilon(1e-9));
    return outcome;
  };
  const Outcome on_device = train(false), offloaded = train(true);
  CHECK(offloaded.losses == on_device.losses);
  CHECK(offloaded.weights == on_device.weights);
  // fp32 master, gradients and two moments (16 B) leave; an fp32 copy for the kernels (4 B) stays.
  CHECK(on_device.device_peak - offloaded.device_peak == doctest::Approx(12.0 * 217664));
  CHECK(offloaded.host_peak - on_device.host_peak == doctest::Approx(16.0 * 217664));
}

TEST_CASE("FPDT on one rank: loss and every gradient equal the unchunked step, for 1, 2 and 8 chunks") {
  // The batch packs two documents (positions restart at token 40) and tiny-llama has GQA (4 q
  // heads over 2 kv heads); chunks of 8 tokens cut through both documents. Chunking only changes
  // summation order (partial softmaxes merged by their lse), so the memory options' tolerance holds.
  TrainingOptions unchunked;
  unchunked.activation_checkpointing = true;
  const Run plain = run(unchunked);
  for (int64_t chunks : {1, 2, 8}) {
    CAPTURE(chunks);
    TrainingOptions fpdt = unchunked;
    fpdt.fpdt_chunk_tokens = 64 / chunks;
    fpdt.attention_block = 4;  // blocks inside a chunk too
    const Run chunked = run(fpdt);
    CHECK(chunked.result.loss == doctest::Approx(plain.result.loss).epsilon(1e-6));
    CHECK(chunked.result.counted_tokens == plain.result.counted_tokens);
    // FPDT chunks the MLP too, which re-associates every weight gradient's sum over the tokens. The
    // MLP norms' weight gradients are sums of terms of both signs far larger than the result: built
    // for the vector instruction set (FMA in Eigen's products) 8 chunks move them by up to 6e-5 of
    // their largest element, where the SSE2 build stayed within 3e-5. fp32 noise either way.
    gradients_compare(chunked.gradients, plain.gradients, 1e-4);
  }
}

TEST_CASE("FPDT on one rank: measured device and host peaks equal the native prediction, and the device peak falls with the chunk") {
  const ModelSpec spec = model_load("tiny-llama");
  const RuntimeProfile native = runtime_profile_load("native");
  const ClusterSpec cluster = executor_cluster(std::numeric_limits<double>::infinity());
  const int64_t seqlen = 1024;
  Batch batch;
  for (int64_t i = 0; i < seqlen; ++i) {
    batch.tokens.push_back(static_cast<int32_t>((37 * i + 11) % 256));
    batch.labels.push_back(static_cast<int32_t>((37 * i + 48) % 256));
    batch.positions.push_back(static_cast<int32_t>(i < 600 ? i : i - 600));  // two documents
  }
  double previous_peak = std::numeric_limits<double>::infinity();
  for (int64_t chunk : {1024, 512, 256, 128}) {
    for (bool offload : {false, true}) {
      CAPTURE(chunk);
      CAPTURE(offload);
      PlanOptions plan;
      plan.sp = 1;
      plan.zero_stage = 0;
      plan.activation_checkpointing = true;
      plan.checkpoint_offload = offload;
      plan.fpdt = true;
      plan.fpdt_chunk_tokens = chunk;
      const MemoryPrediction predicted = memory_predict(spec, cluster, plan, native, seqlen);
      const TrainingOptions options = executor_training_options(plan, predicted);
      CHECK(options.fpdt_chunk_tokens == chunk);
      Arena device("device"), host("host");
      LlamaModel model(spec, device);
      parameters_fill(model);
      model.forward_backward(batch.tokens.data(), batch.labels.data(), batch.positions.data(), seqlen, options, device, host);
      CHECK(predicted.gpu_peak_bytes == doctest::Approx(device.peak_bytes()).epsilon(1e-9));
      CHECK(predicted.gpu_peak_moment == device.peak_moment());
      CHECK(predicted.host_bytes_per_node == doctest::Approx(host.peak_bytes()).epsilon(1e-9));
      CHECK(host.current_bytes() == 0.0);  // every chunk and checkpoint went back
      if (!offload) {
        CHECK(device.peak_bytes() < previous_peak);  // smaller chunks, lower peak (as predicted)
        previous_peak = device.peak_bytes();
      }
    }
  }
}
