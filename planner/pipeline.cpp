#include "planner/pipeline.hpp"

#include <algorithm>

namespace longseq {

std::vector<PipelineStage> pipeline_stages(const ModelSpec& model, const ClusterSpec& cluster, const PlanOptions& plan) {
  const ParameterCount params = parameter_count(model);
  if (plan.pp <= 1) return {{"", model.num_layers, 1, true, params.total}};
  const int64_t stage_layers = model.num_layers / plan.pp;
  const int64_t micro_batches = gradient_accumulation_steps(cluster, plan);
  const int64_t head = params.lm_head > 0 ? params.lm_head : params.embedding;
  const int64_t first_parameters = params.embedding + stage_layers * params.per_layer;
  const int64_t last_parameters = stage_layers * params.per_layer + params.final_norm + head;
  if (plan.vpp <= 1)
    return {{"first pipeline stage", stage_layers, std::min(plan.pp, micro_batches), false, first_parameters},
            {"last pipeline stage", stage_layers, 1, true, last_parameters}};
  const int64_t chunk_layers = stage_layers / plan.vpp;
  const int64_t chunks = micro_batches * plan.vpp;
  return {{"first pipeline stage", chunk_layers, std::min(2 * (plan.pp - 1) + (plan.vpp - 1) * plan.pp + 1, chunks), false, first_parameters},
          {"last pipeline stage", chunk_layers, std::min((plan.vpp - 1) * plan.pp + 1, chunks), true, last_parameters}};
}

double pipeline_slots(const ClusterSpec& cluster, const PlanOptions& plan) {
  return static_cast<double>(gradient_accumulation_steps(cluster, plan)) +
         static_cast<double>(std::max<int64_t>(1, plan.pp) - 1) / static_cast<double>(std::max<int64_t>(1, plan.vpp));
}

}  // namespace longseq
