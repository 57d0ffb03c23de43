// lora_fixture.hpp: LoRA adapters for the tiny model's tests (single-rank and MPI), and the
// per-adapter gradient comparison.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "executor/llama.hpp"
#include "support/tiny_llama_fixture.hpp"

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
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (const auto& layer : layout.layers)
    for (const LoraLayout::Adapter& adapter : layer)
      if (adapter.present()) {
        ranges.push_back({adapter.a, adapter.a + layout.rank * adapter.in});
        ranges.push_back({adapter.b, adapter.b + adapter.out * layout.rank});
      }
  tensor_ranges_compare(actual, expected, ranges, tolerance);
}

}  // namespace longseq::testing
