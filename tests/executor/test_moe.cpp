// Mixture of experts in the executor: tiny-moe (4 experts, top-2, a shared expert behind a sigmoid
// gate) trained by the one step text.
//
// References: the float64 step (support/float64_llama.hpp) whose MoE block runs token by token as
// HF's loop reads, with none of the executor's dispatch, sorting or combine; and central finite
// differences of its loss for the router and the shared expert's gate, whose gradients pass through
// the softmax, the top-k renormalization and the sigmoid. Tolerances, measured and then stated
// with margin: fp32 against float64 within 5e-4 of each tensor's largest |gradient| (measured
// 1.4e-4 for tiny-moe's card, 3.3e-5 and 5.1e-5 for the other variants; the dense step's is 2.8e-5:
// the router's and the gate's gradients are small differences of per-token products); the
// reference against finite differences 1e-8 of the largest gradient (measured 4.5e-10), the fp32
// step 1e-6 (measured 1.9e-8); memory options 3e-5 (measured 2.4e-6); the bf16 schedule within 0.1
// relative L2 of fp32 (measured 0.021) and 2e-4 in the loss (measured 1.9e-5).
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "executor/llama_step.hpp"
#include "executor/trainer.hpp"
#include "kernels/cpu/moe.hpp"
#include "models/model_loader.hpp"
#include "planner/memory_model.hpp"
#include "support/bf16_cpu_ops.hpp"
#include "support/float64_llama.hpp"
#include "support/tiny_llama_fixture.hpp"

using namespace longseq;
using namespace longseq::testing;

namespace {

template <class Model = LlamaModel>
StepOutcome moe_run(const ModelSpec& spec, const TrainingOptions& options, const Batch& batch) {
  Arena device("device"), host("host");
  Model model(spec, device);
  model.load_parameters(fixture_weights(spec).data());
  return step_outcome(model, batch, options, device, host);
}

// The variants the tests cover: tiny-moe's card (shared expert behind a sigmoid gate, renormalized
// top-2), an ungated shared expert kept as it is (Qwen2-MoE's norm_topk_prob false), and no shared
// expert (Mixtral, Qwen3-MoE).
std::vector<std::pair<const char*, ModelSpec>> moe_variants() {
  const ModelSpec card = model_load("tiny-moe");
  ModelSpec ungated = card;
  ungated.shared_expert_gate = false;
  ungated.moe_normalize_topk = false;
  ModelSpec routed_only = card;
  routed_only.shared_expert_intermediate_size = 0;
  routed_only.shared_expert_gate = false;
  return {{"gated shared expert", card}, {"ungated shared expert, no renormalization", ungated}, {"routed experts only", routed_only}};
}

// Each parameter tensor of the layout: [start, end) ranges (the MoE layer's router, every expert's
// three matrices, the shared expert's and its gate, beside the dense tensors).
std::vector<std::pair<int64_t, int64_t>> tensor_ranges(const ModelSpec& spec) {
  const LlamaLayout layout = llama_layout(spec);
  const int64_t C = spec.hidden_size, FE = spec.expert_intermediate_size, FS = spec.shared_expert_intermediate_size;
  std::vector<std::pair<int64_t, int64_t>> ranges = {{layout.embedding, layout.embedding + spec.vocab_size * C}};
  for (const auto& l : layout.layers) {
    ranges.push_back({l.attention_norm, l.q_proj});
    ranges.push_back({l.q_proj, l.k_proj});
    ranges.push_back({l.k_proj, l.v_proj});
    ranges.push_back({l.v_proj, l.o_proj});
    ranges.push_back({l.o_proj, l.mlp_norm});
    ranges.push_back({l.mlp_norm, l.router});
    ranges.push_back({l.router, l.experts});
    for (int64_t e = 0; e < spec.experts; ++e)
      for (int64_t m = 0; m < 3; ++m) ranges.push_back({l.experts + (3 * e + m) * FE * C, l.experts + (3 * e + m + 1) * FE * C});
    if (FS > 0)
      for (int64_t offset : {l.gate_proj, l.up_proj, l.down_proj}) ranges.push_back({offset, offset + FS * C});
    if (l.shared_expert_gate >= 0) ranges.push_back({l.shared_expert_gate, l.shared_expert_gate + C});
  }
  ranges.push_back({layout.final_norm, layout.lm_head});
  ranges.push_back({layout.lm_head, layout.total});
  return ranges;
}

}  // namespace

TEST_CASE("tiny-moe's layout: every parameter the planner counts, the experts and the shared expert where the step reads them") {
  const ModelSpec spec = model_load("tiny-moe");
  const LlamaLayout layout = llama_layout(spec);
  CHECK(layout.total == parameter_count(spec).total);
  // By hand: 256 x 64 embedding and LM head, a final norm of 64; a layer: norms 2 x 64, q 64 x 64,
  // k and v 32 x 64, o 64 x 64, router 4 x 64, four experts of 3 x 48 x 64, a shared expert of
  // 3 x 32 x 64 and its gate 64: 128 + 12,288 + 256 + 36,864 + 6,144 + 64 = 55,744.
  CHECK(layout.total == 2 * 256 * 64 + 64 + 4 * 55744);
  const auto& first = layout.layers[0];
  CHECK(first.experts - first.router == 4 * 64);
  CHECK(first.gate_proj - first.experts == 4 * 3 * 48 * 64);
  CHECK(first.shared_expert_gate == first.down_proj + 32 * 64);
}

TEST_CASE("MoE routing kernels: softmax, top-k with ties to the lower expert, renormalization, and the dispatch's rows by expert") {
  // One token, logits ln(1), ln(3), ln(3), ln(1): probabilities 1/8, 3/8, 3/8, 1/8; top-2 experts
  // 1 and 2 (the tie to the lower first), weights 1/2 each renormalized, 3/8 each not.
  const std::vector<float> logits = {0.0f, std::log(3.0f), std::log(3.0f), 0.0f};
  std::vector<float> weights(2), probs(4);
  std::vector<int32_t> indices(2);
  kernels::moe_route(weights.data(), indices.data(), probs.data(), logits.data(), 1, 4, 2, true);
  CHECK(probs[0] == doctest::Approx(0.125));
  CHECK(probs[1] == doctest::Approx(0.375));
  CHECK(indices == std::vector<int32_t>{1, 2});
  CHECK(weights[0] == doctest::Approx(0.5));
  kernels::moe_route(weights.data(), indices.data(), probs.data(), logits.data(), 1, 4, 2, false);
  CHECK(weights[1] == doctest::Approx(0.375));
  // Three tokens choosing (2, 0), (0, 1), (2, 1): expert 0's rows first (tokens 0, 1), then 1's
  // (tokens 1, 2), then 2's (tokens 0, 2).
  const std::vector<int32_t> chosen = {2, 0, 0, 1, 2, 1};
  const kernels::MoeDispatch dispatch = kernels::moe_dispatch(chosen.data(), 3, 4, 2);
  CHECK(dispatch.offsets == std::vector<int64_t>{0, 2, 4, 6, 6});
  CHECK(dispatch.order == std::vector<int32_t>{0, 1, 1, 2, 0, 2});
  CHECK(dispatch.position == std::vector<int32_t>{4, 0, 1, 2, 5, 3});
}

TEST_CASE("the float64 reference with experts still equals the PyTorch golden on the dense model it extends") {
  // (Its dense path is unchanged; this guards the shared fixture against the MoE edit.)
  const Golden golden = golden_read();
  const Float64Step step = float64_forward_backward(model_load("tiny-llama"), fixture_weights_float64(), batch_make(golden.T));
  CHECK(step.loss == doctest::Approx(golden.loss).epsilon(1e-10));
}

TEST_CASE("MoE: loss and every gradient (router, each expert, shared expert and its gate) equal the float64 reference") {
  const Batch batch = batch_make(64);
  for (const auto& variant : moe_variants()) {
    const char* name = variant.first;
    const ModelSpec& spec = variant.second;
    CAPTURE(name);
    const StepOutcome run = moe_run(spec, {}, batch);
    const Float64Step reference = float64_forward_backward(spec, fixture_weights_float64(spec), batch);
    CHECK(run.result.loss == doctest::Approx(reference.loss).epsilon(1e-6));
    tensor_ranges_compare(run.gradients, reference.gradients, tensor_ranges(spec), 5e-4);
  }
}

TEST_CASE("MoE: router and shared-gate gradients equal central finite differences of the float64 loss") {
  // h = 1e-5 in float64: truncation O(h^2); a perturbation this small changes no token's top-2
  // (the batch has no near-tie at that scale, else the difference would jump).
  const ModelSpec spec = model_load("tiny-moe");
  const Batch batch = batch_make(64);
  const StepOutcome run = moe_run(spec, {}, batch);
  const std::vector<double> weights = fixture_weights_float64(spec);
  const Float64Step reference = float64_forward_backward(spec, weights, batch);
  const LlamaLayout layout = llama_layout(spec);
  double largest = 0;
  for (double g : reference.gradients) largest = std::max(largest, std::fabs(g));
  const double h = 1e-5;
  for (size_t layer : {size_t{0}, size_t{3}})
    for (int64_t index : {layout.layers[layer].router + 3, layout.layers[layer].router + 64 * 2 + 17, layout.layers[layer].shared_expert_gate + 5,
                          layout.layers[layer].experts + 100}) {
      std::vector<double> shifted = weights;
      shifted[static_cast<size_t>(index)] += h;
      const double up = float64_forward_backward(spec, shifted, batch).loss;
      shifted[static_cast<size_t>(index)] -= 2 * h;
      const double down = float64_forward_backward(spec, shifted, batch).loss;
      const double finite_difference = (up - down) / (2 * h);
      CAPTURE(layer);
      CAPTURE(index);
      // The reference's analytic gradient to the difference, and the executor's fp32 one.
      CHECK(std::fabs(reference.gradients[static_cast<size_t>(index)] - finite_difference) <= 1e-8 * largest);
      CHECK(std::fabs(static_cast<double>(run.gradients[static_cast<size_t>(index)]) - finite_difference) <= 1e-6 * largest);
    }
}

TEST_CASE("MoE: checkpointing, its offload and a tiled loss leave loss and gradients unchanged, tiles and FPDT are refused") {
  const ModelSpec spec = model_load("tiny-moe");
  const Batch batch = batch_make(64);
  const StepOutcome plain = moe_run(spec, {}, batch);
  TrainingOptions offload;
  offload.activation_checkpointing = offload.checkpoint_offload = true;
  TrainingOptions everything = offload;
  everything.loss_tiles = 3;
  everything.attention_block = 5;
  for (const TrainingOptions& options : {offload, everything}) {
    CAPTURE(options.loss_tiles);
    const StepOutcome other = moe_run(spec, options, batch);
    CHECK(other.result.loss == doctest::Approx(plain.result.loss).epsilon(1e-6));
    tensor_ranges_compare(other.gradients, plain.gradients, tensor_ranges(spec), 3e-5);
  }
  TrainingOptions tiled;
  tiled.mlp_tiles = 2;
  CHECK_THROWS_AS(moe_run(spec, tiled, batch), std::invalid_argument);
}

TEST_CASE("MoE: measured peak device and host memory equal the planner's native prediction, every variant and option") {
  const ClusterSpec cluster = executor_cluster(std::numeric_limits<double>::infinity());
  const RuntimeProfile native = runtime_profile_load("native");
  for (const auto& variant : moe_variants())
    for (int64_t seqlen : {256, 1024})
      for (int option = 0; option < 4; ++option) {
        const char* name = variant.first;
        const ModelSpec& spec = variant.second;
        CAPTURE(name);
        CAPTURE(seqlen);
        CAPTURE(option);
        TrainingOptions options;
        options.activation_checkpointing = option >= 1;
        options.checkpoint_offload = option >= 2;
        options.loss_tiles = option == 3 ? 4 : 0;
        const Sample sample = sample_synthetic(seqlen, spec.vocab_size, 3);
        const StepOutcome run = moe_run(spec, options, Batch{sample.tokens, sample.labels, sample.positions});
        const MemoryPrediction predicted = memory_predict(spec, cluster, executor_plan(options), native, seqlen);
        CHECK(predicted.gpu_peak_bytes == doctest::Approx(run.device_peak_bytes).epsilon(1e-9));
        CHECK(predicted.gpu_peak_moment == run.peak_moment);
        if (options.checkpoint_offload) CHECK(predicted.host_bytes_per_node == doctest::Approx(run.host_peak_bytes).epsilon(1e-9));
      }
}

TEST_CASE("MoE on the GPU's schedule (bf16 emulation): gradients track fp32, the peak equals the native-cuda prediction") {
  const ModelSpec spec = model_load("tiny-moe");
  const Batch batch = batch_make(64);
  const ClusterSpec cluster = executor_cluster(std::numeric_limits<double>::infinity());
  const RuntimeProfile profile = runtime_profile_load("native-cuda");
  const StepOutcome fp32 = moe_run(spec, {}, batch);
  for (bool checkpointing : {false, true}) {
    CAPTURE(checkpointing);
    TrainingOptions options;
    options.activation_checkpointing = checkpointing;
    const StepOutcome bf16 = moe_run<BasicLlamaModel<Bf16CpuOps>>(spec, options, batch);
    CHECK(bf16.result.loss == doctest::Approx(fp32.result.loss).epsilon(2e-4));
    double difference = 0, norm = 0;
    for (size_t i = 0; i < fp32.gradients.size(); ++i) {
      difference += std::pow(static_cast<double>(bf16.gradients[i]) - fp32.gradients[i], 2);
      norm += std::pow(static_cast<double>(fp32.gradients[i]), 2);
    }
    CHECK(std::sqrt(difference / norm) < 0.1);
    const MemoryPrediction predicted = memory_predict(spec, cluster, executor_plan(options), profile, 64);
    CHECK(predicted.gpu_peak_bytes - runtime_overhead_bytes(profile, 1) == doctest::Approx(bf16.device_peak_bytes).epsilon(1e-9));
    CHECK(predicted.gpu_peak_moment == bf16.peak_moment);
  }
}
