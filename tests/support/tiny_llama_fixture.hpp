// tiny_llama_fixture.hpp: the tiny-llama weights and packed batch of the golden reference
// (tests/golden/make_tiny_llama_golden.py computes them with the same formulas).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <fstream>
#include <cstring>
#include <utility>
#include <vector>

#include <doctest/doctest.h>

#include <algorithm>

#include "executor/llama.hpp"
#include "models/model_loader.hpp"

namespace longseq::testing {

// The tiny model's weights by the golden script's formulas (tests/golden/make_tiny_llama_golden.py),
// in float64 as the script computes them.
// (Another model of the executor's, e.g. tiny-moe: the same formulas over its layout.)
inline std::vector<double> fixture_weights_float64(const ModelSpec& spec = model_load("tiny-llama")) {
  const LlamaLayout layout = llama_layout(spec);
  std::vector<bool> norm(static_cast<size_t>(layout.total), false);
  auto mark = [&](int64_t offset) {
    for (int64_t i = 0; i < spec.hidden_size; ++i) norm[static_cast<size_t>(offset + i)] = true;
  };
  for (const auto& layer : layout.layers) {
    mark(layer.attention_norm);
    mark(layer.mlp_norm);
  }
  mark(layout.final_norm);
  std::vector<double> weights(static_cast<size_t>(layout.total));
  for (int64_t i = 0; i < layout.total; ++i) {
    const double index = static_cast<double>(i);
    weights[static_cast<size_t>(i)] = norm[static_cast<size_t>(i)] ? 1.0 + 0.1 * std::sin(0.37 * index) : 0.08 * std::sin(1.3 * index + 0.1);
  }
  return weights;
}

// The same as a full fp32 host vector (what load_parameters takes).
inline std::vector<float> fixture_weights(const ModelSpec& spec = model_load("tiny-llama")) {
  const std::vector<double> weights = fixture_weights_float64(spec);
  return {weights.begin(), weights.end()};
}

// One training step's outcome for the tests: loss, the trained parameters' gradients
// (gradients_full: every weight, or the adapters with LoRA) and the arenas' peaks.
struct StepOutcome {
  StepResult result;
  std::vector<float> gradients;
  double device_peak_bytes = 0, host_peak_bytes = 0;
  std::string peak_moment;
};
// `batch`: anything with tokens, labels and positions (a Batch, a trainer Sample).
template <class Model, class Tokens>
StepOutcome step_outcome(Model& model, const Tokens& batch, const TrainingOptions& options, Arena& device, Arena& host) {
  StepOutcome out;
  const auto T = static_cast<int64_t>(batch.tokens.size());
  out.result = model.forward_backward(batch.tokens.data(), batch.labels.data(), batch.positions.data(), T, options, device, host);
  out.gradients = model.gradients_full();
  model.ops().synchronize();
  out.device_peak_bytes = device.peak_bytes();
  out.host_peak_bytes = host.peak_bytes();
  out.peak_moment = std::string(device.peak_moment());
  return out;
}

// The same weights into an unsharded CPU model.
inline void parameters_fill(LlamaModel& model) { model.load_parameters(fixture_weights().data()); }

struct Batch {
  std::vector<int32_t> tokens, labels, positions;
};

inline Batch batch_make(int64_t T) {
  Batch batch;
  for (int64_t i = 0; i < T; ++i) batch.tokens.push_back(static_cast<int32_t>((37 * i + 11) % 256));
  for (int64_t i = 0; i < 40; ++i) batch.positions.push_back(static_cast<int32_t>(i));
  for (int64_t i = 40; i < T; ++i) batch.positions.push_back(static_cast<int32_t>(i - 40));
  for (int64_t i = 0; i < T; ++i) {
    const bool last_of_document = i == T - 1 || batch.positions[static_cast<size_t>(i + 1)] == 0;
    batch.labels.push_back(last_of_document || i % 7 == 3 ? -100 : batch.tokens[static_cast<size_t>(i + 1)]);
  }
  return batch;
}

#ifdef LONGSEQ_TEST_DATA_DIR
// The PyTorch float64 reference step of tiny-llama on batch_make(64) (tests/golden): its loss and
// every gradient (stored as float32).
struct Golden {
  int64_t T = 0;
  double loss = 0;
  std::vector<float> gradients;
};

inline Golden golden_read() {
  std::ifstream stream(std::string(LONGSEQ_TEST_DATA_DIR) + "/tiny_llama_golden.bin", std::ios::binary);
  REQUIRE(stream.good());
  char magic[8];
  stream.read(magic, 8);
  REQUIRE(std::memcmp(magic, "LSGOLD01", 8) == 0);
  Golden golden;
  int64_t count = 0;
  stream.read(reinterpret_cast<char*>(&golden.T), 8);
  stream.read(reinterpret_cast<char*>(&count), 8);
  stream.read(reinterpret_cast<char*>(&golden.loss), 8);
  golden.gradients.resize(static_cast<size_t>(count));
  stream.read(reinterpret_cast<char*>(golden.gradients.data()), count * 4);
  REQUIRE(stream.good());
  return golden;
}
#endif

// Where each parameter tensor of tiny-llama starts in the flat layout, then the total.
inline std::vector<int64_t> tensor_starts() {
  const LlamaLayout layout = llama_layout(model_load("tiny-llama"));
  std::vector<int64_t> starts = {layout.embedding};
  for (const auto& l : layout.layers)
    for (int64_t s : {l.attention_norm, l.q_proj, l.k_proj, l.v_proj, l.o_proj, l.mlp_norm, l.gate_proj, l.up_proj, l.down_proj})
      starts.push_back(s);
  for (int64_t s : {layout.final_norm, layout.lm_head, layout.total}) starts.push_back(s);
  return starts;
}

// Each tensor, a [start, end) range of the flat vectors: every gradient within `tolerance` of that
// tensor's largest |expected| gradient, and every tensor receiving some gradient in the batch.
template <typename Expected>
void tensor_ranges_compare(const std::vector<float>& actual, const std::vector<Expected>& expected,
                           const std::vector<std::pair<int64_t, int64_t>>& ranges, double tolerance) {
  REQUIRE(actual.size() == expected.size());
  CHECK(!ranges.empty());
  for (const std::pair<int64_t, int64_t>& range : ranges) {
    const int64_t start = range.first, end = range.second;  // (not a structured binding: CAPTURE takes it)
    double largest = 0, worst = 0;
    for (int64_t i = start; i < end; ++i) {
      const double e = static_cast<double>(expected[static_cast<size_t>(i)]);
      largest = std::max(largest, std::fabs(e));
      worst = std::max(worst, std::fabs(static_cast<double>(actual[static_cast<size_t>(i)]) - e));
    }
    CAPTURE(start);
    CAPTURE(end);
    CHECK(largest > 0);
    CHECK(worst <= tolerance * largest);
  }
}

// Every tensor of tiny-llama's layout.
inline void gradients_compare(const std::vector<float>& actual, const std::vector<float>& expected, double tolerance) {
  const std::vector<int64_t> starts = tensor_starts();
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (size_t t = 0; t + 1 < starts.size(); ++t) ranges.push_back({starts[t], starts[t + 1]});
  tensor_ranges_compare(actual, expected, ranges, tolerance);
}

// Per tensor of the layout: ||actual - expected|| / ||expected|| (the norm bf16's error is judged
// by: single elements near zero carry the 2^-8 rounding of their larger neighbours).
inline std::vector<double> relative_l2_per_tensor(const std::vector<float>& actual, const std::vector<float>& expected) {
  const std::vector<int64_t> starts = tensor_starts();
  std::vector<double> errors;
  for (size_t t = 0; t + 1 < starts.size(); ++t) {
    double difference = 0, norm = 0;
    for (int64_t i = starts[t]; i < starts[t + 1]; ++i) {
      const double e = expected[static_cast<size_t>(i)], a = actual[static_cast<size_t>(i)];
      difference += (a - e) * (a - e);
      norm += e * e;
    }
    errors.push_back(std::sqrt(difference / norm));
  }
  return errors;
}

}  // namespace longseq::testing
