// lora_fixture.hpp: LoRA adapters for the tiny model's tests (single-rank and MPI), and the
// per-adapter gradient comparison.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "executor/llama.hpp"

namespace longseq::testing {

// PEFT's lora_A initialisation with a non-zero lora_B (PEFT starts it at zero, where lora_A's
// gradient vanishes and would prove nothing).
inline std::vector<float> test_adapters(const LoraLayout& layout) {
  std::vector<float> values = lora_initial_adapters(layout);
  for (const auto& layer : layout.layers)
    for (const LoraLayout::Adapter& adapter : layer)
      if (adapter.present())
        for (int64_t i = 0; i < adapter.out * layout.rank; ++i)
          values[static_cast<size_t>(adapter.b + i)] = static_cast<float>(0.05 * std::sin(0.9 * static_cast<double>(adapter.b + i) + 1.1));
  return values;
}

inline ModelStates lora_states(int64_t rank, bool all_linear, float alpha = 16.0f) {
  ModelStates states;
  states.lora.rank = rank;
  states.lora.alpha = alpha;
  states.lora.all_linear = all_linear;
  return states;
}

// Every adapter tensor (each lora_A and lora_B): within `tolerance` of its largest |expected|.
template <typename Expected>
void adapter_gradients_compare(const std::vector<float>& actual, const std::vector<Expected>& expected, const LoraLayout& layout,
                               double tolerance) {
  REQUIRE(actual.size() == expected.size());
  int tensors = 0;
  for (size_t layer = 0; layer < layout.layers.size(); ++layer)
    for (size_t kind = 0; kind < kLayerLinears; ++kind) {
      const LoraLayout::Adapter& adapter = layout.layers[layer][kind];
      if (!adapter.present()) continue;
      for (const std::pair<int64_t, int64_t>& tensor : {std::pair{adapter.a, layout.rank * adapter.in}, std::pair{adapter.b, adapter.out * layout.rank}}) {
        const int64_t start = tensor.first, size = tensor.second;  // (not a structured binding: CAPTURE takes it)
        double largest = 0, worst = 0;
        for (int64_t i = start; i < start + size; ++i) {
          const double e = static_cast<double>(expected[static_cast<size_t>(i)]);
          largest = std::max(largest, std::fabs(e));
          worst = std::max(worst, std::fabs(static_cast<double>(actual[static_cast<size_t>(i)]) - e));
        }
        CAPTURE(layer);
        CAPTURE(kLayerLinearNames[kind]);
        CAPTURE(start);
        CHECK(largest > 0);  // every adapter receives gradient in this batch
        CHECK(worst <= tolerance * largest);
        ++tensors;
      }
    }
  CHECK(tensors > 0);
}

}  // namespace longseq::testing
