// plan_file.hpp: one plan handed from `longseq plan` to `longseq run` / `longseq launch`, with
// what it was made for (model, sequence length, ranks, device budget), so the runner can refuse a
// plan made for something else rather than run it wrongly.
//
// The file is JSON (`longseq plan ... --plan-out FILE`); `prediction` in it is for people and is
// not read back. Every other key is checked: an unknown key, a wrong type or a value out of range
// is a ConfigError naming the file, the key and the reason.
#pragma once

#include <cstdint>
#include <string>

#include "planner/plan.hpp"

namespace longseq {

inline constexpr int64_t kPlanFileVersion = 1;

struct PlanFile {
  std::string model;           // as given to --model: a card name or a path
  std::string model_name;      // the loaded model's name
  int64_t layers = 0;          // --layers (0: the model's own)
  int64_t parameters = 0;      // of the planned model, to catch a card that changed since
  int64_t seqlen = 0;
  int64_t ranks = 1;           // world size the plan is for
  std::string device = "cpu";  // "cpu" (the executor's CPU device) or "cuda"
  double device_budget_bytes = 0;  // per rank; what the plan had to fit
  std::string hardware;        // the hardware card planned for (cpu-device for this machine)
  std::string profile;         // the runtime profile of the prediction
  PlanOptions plan;
  double predicted_peak_bytes = 0;  // informational (written, not read)
  double predicted_host_bytes = 0;  // per node, informational
};

std::string plan_file_to_json(const PlanFile& file);
// Parses and checks a plan file's text; `source` names it in errors.
PlanFile plan_file_parse(const std::string& text, const std::string& source);
PlanFile plan_file_read(const std::string& path);

}  // namespace longseq
