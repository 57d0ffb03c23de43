// tiny_llama_fixture.hpp: the tiny-llama weights and packed batch of the golden reference
// (tests/golden/make_tiny_llama_golden.py computes them with the same formulas).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "executor/llama.hpp"

namespace longseq::testing {

// The golden script's formulas (tests/golden/make_tiny_llama_golden.py).
inline void parameters_fill(LlamaModel& model) {
  const LlamaLayout& layout = model.layout();
  std::vector<bool> norm(static_cast<size_t>(layout.total), false);
  const int64_t C = model.spec().hidden_size;
  auto mark = [&](int64_t offset) {
    for (int64_t i = 0; i < C; ++i) norm[static_cast<size_t>(offset + i)] = true;
  };
  for (const auto& layer : layout.layers) {
    mark(layer.attention_norm);
    mark(layer.mlp_norm);
  }
  mark(layout.final_norm);
  for (int64_t i = 0; i < layout.total; ++i) {
    const double index = static_cast<double>(i);
    model.parameters()[i] = static_cast<float>(norm[static_cast<size_t>(i)] ? 1.0 + 0.1 * std::sin(0.37 * index)
                                                                             : 0.08 * std::sin(1.3 * index + 0.1));
  }
}

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

}  // namespace longseq::testing
