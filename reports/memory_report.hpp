// memory_report.hpp: renders memory predictions for people (aligned tables) and scripts (JSON).
// Every rendering says it is a prediction and which runtime profile made it.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "planner/max_seqlen.hpp"
#include "planner/memory_model.hpp"
#include "planner/time_model.hpp"

namespace longseq {

// The GPU breakdown (grouped by category, GiB per item, total against capacity, phase peaks)
// followed by the host breakdown per node.
std::string memory_table_render(const MemoryPrediction& prediction, int64_t ranks_per_node);

nlohmann::json memory_prediction_to_json(const MemoryPrediction& prediction);

// The step time breakdown and TFLOPS (hardware, ALST/Megatron formula) and MFU.
std::string time_table_render(const TimePrediction& prediction);
nlohmann::json time_prediction_to_json(const TimePrediction& prediction);

// Thousands separators: 3712000 -> "3,712,000".
std::string integer_with_commas(int64_t value);

}  // namespace longseq
