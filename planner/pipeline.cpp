#include "planner/pipeline.hpp"

#include <algorithm>

namespace longseq {

PipelineSplit pipeline_split(const ModelSpec& model, const PlanOptions& plan) {
  const int64_t layers = model.num_layers, pp = std::max<int64_t>(1, plan.pp);
  if (layers % pp == 0) return {layers / pp, layers / pp, layers / pp};
  if (pp == 2) return {layers / 2, 0, layers - layers / 2};
  const int64_t middle = (layers + pp - 1) / pp;
  const int64_t rest = layers - middle * (pp - 2);
  return {std::max<int64_t>(0, rest / 2), middle, std::max<int64_t>(0, rest - rest / 2)};
}

std::vector<PipelineStage> pipeline_stages(const ModelSpec& model, const ClusterSpec& cluster, const PlanOptions& plan) {
  const ParameterCount params = parameter_count(model);
  if (plan.pp <= 1) return {{"", model.num_layers, 1, true, params.total}};
  const PipelineSplit split = pipeline_split(model, plan);
  const int64_t micro_batches = gradient_accumulation_steps(cluster, plan);
  const int64_t head = params.lm_head > 0 ? params.lm_head : params.embedding;
  const int64_t first_parameters = params.embedding + split.first * params.per_layer;
  const int64_t last_parameters = split.last * params.per_layer + params.final_norm + head;
  if (plan.vpp <= 1) {
    std::vector<PipelineStage> stages = {{"first pipeline stage", split.first, std::min(plan.pp, micro_batches), false, first_parameters},
                                         {"last pipeline stage", split.last, 1, true, last_parameters}};
    // Uneven: the second stage holds one micro-batch fewer than the first but more layers, and may
    // hold more activations.
    if (!split.even() && plan.pp > 2 && split.middle * std::min(plan.pp - 1, micro_batches) > split.first * std::min(plan.pp, micro_batches))
      stages.insert(stages.begin() + 1, {"second pipeline stage", split.middle, std::min(plan.pp - 1, micro_batches), false,
                                         split.middle * params.per_layer});
    return stages;
  }
  const int64_t chunk_layers = split.first / plan.vpp;  // (interleaving is planned on even splits only)
  const int64_t chunks = micro_batches * plan.vpp;
  return {{"first pipeline stage", chunk_layers, std::min(2 * (plan.pp - 1) + (plan.vpp - 1) * plan.pp + 1, chunks), false, first_parameters},
          {"last pipeline stage", chunk_layers, std::min((plan.vpp - 1) * plan.pp + 1, chunks), true, last_parameters}};
}

double pipeline_slots(const ClusterSpec& cluster, const PlanOptions& plan) {
  return static_cast<double>(gradient_accumulation_steps(cluster, plan)) +
         static_cast<double>(std::max<int64_t>(1, plan.pp) - 1) / static_cast<double>(std::max<int64_t>(1, plan.vpp));
}

}  // namespace longseq
