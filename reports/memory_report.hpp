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
// What a step's time means to the one paying for it: the cluster's GPUs and, when given, the price
// of one GPU-hour (for the cost of a billion tokens).
struct TimeContext {
  int64_t gpus = 1;
  double gpu_hour_cost = 0;  // 0: not given
};

// A duration as a person reads it: "42.1 s", "12 min 5 s", "1 h 25 min", "8 d 17 h".
std::string duration_text(double seconds);

// A step no one would run: longer than this, the output says so (a day of one optimizer step).
inline constexpr double kStepTooLongS = 24 * 3600.0;

std::string time_table_render(const TimePrediction& prediction, const TimeContext& context = {});
nlohmann::json time_prediction_to_json(const TimePrediction& prediction, const TimeContext& context = {});

// Thousands separators: 3712000 -> "3,712,000".
std::string integer_with_commas(int64_t value);

}  // namespace longseq
