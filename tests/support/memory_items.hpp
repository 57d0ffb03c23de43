// memory_items.hpp: a named term of a predicted breakdown, for the memory model's tests.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "models/tensor_trace.hpp"
#include "planner/memory_model.hpp"

namespace longseq::testing {

// The bytes of the item named `name` (0 when it is not there).
inline double item_bytes(const std::vector<MemoryItem>& items, const std::string& name) {
  for (const auto& item : items)
    if (item.name == name) return item.bytes;
  return 0;
}

// The bytes of the tensor named `name` live at a trace's peak (0 when it is not).
inline double peak_item_bytes(const TensorTrace& trace, std::string_view name) {
  for (const TraceItem& item : trace.peak_items())
    if (item.name == name) return item.bytes;
  return 0;
}

// The peak of the phase named `name` (0 when it is not there).
inline double phase_bytes(const MemoryPrediction& prediction, const std::string& name) {
  for (const PhasePeak& phase : prediction.phases)
    if (phase.phase == name) return phase.bytes;
  return 0;
}

}  // namespace longseq::testing
