// export_request.hpp: an ExportRequest as `longseq plan --emit` builds one, for the exporters' tests.
#pragma once

#include <string>

#include "models/model_loader.hpp"
#include "planner/cards.hpp"
#include "reports/export.hpp"

namespace longseq::testing {

// A plan of `gpus` H100s (8 per node) for `model` at `seqlen`, priced with the deepspeed-hf profile.
inline ExportRequest export_request(const std::string& model, int64_t gpus, const PlanOptions& plan, int64_t seqlen) {
  ExportRequest request;
  request.model = model_load(model);
  request.model_source = model;
  request.plan = plan;
  request.cluster = cluster_make(hardware_card_load("h100-sxm-80gb"), gpus, 0, 0, 0);
  request.profile = runtime_profile_load("deepspeed-hf");
  request.seqlen = seqlen;
  request.predicted_peak_bytes = 70.0 * 1024 * 1024 * 1024;
  request.companion_file_name = "plan.deepspeed.json";
  return request;
}

}  // namespace longseq::testing
