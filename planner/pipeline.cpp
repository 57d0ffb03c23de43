#include "planner/pipeline.hpp"

#include <algorithm>

namespace longseq {

std::vector<PipelineStage> pipeline_stages(const ModelSpec& model, const ClusterSpec& cluster, const PlanOptions& plan) {
  const ParameterCount params = parameter_count(model);
  if (plan.pp <= 1) return {{"", model.num_layers, 1, true, params.total}};
  const int64_t layers = model.num_layers / plan.pp;
  const int64_t micro_batches = gradient_accumulation_steps(cluster, plan);
  const int64_t head = params.lm_head > 0 ? params.lm_head : params.embedding;
  return {{"first pipeline stage", layers, std::min(plan.pp, micro_batches), false, params.embedding + layers * params.per_layer},
          {"last pipeline stage", layers, 1, true, layers * params.per_layer + params.final_norm + head}};
}

int64_t pipeline_slots(const ClusterSpec& cluster, const PlanOptions& plan) {
  return gradient_accumulation_steps(cluster, plan) + std::max<int64_t>(1, plan.pp) - 1;
}

}  // namespace longseq
