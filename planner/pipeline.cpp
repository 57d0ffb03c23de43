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

int64_t model_chunk_layers(const ModelSpec& model, const PlanOptions& plan) {
  return model.num_layers / (std::max<int64_t>(1, plan.pp) * std::max<int64_t>(1, plan.vpp));
}

std::vector<PipelineStage> pipeline_stages(const ModelSpec& model, const ClusterSpec& cluster, const PlanOptions& plan) {
  const ParameterCount params = parameter_count(model);
  if (plan.pp <= 1) return {{"", model.num_layers, 1, true, params.total, model.moe_layers(), model.is_moe() ? model.dense_layers : 0}};
  const PipelineSplit split = pipeline_split(model, plan);
  const int64_t micro_batches = gradient_accumulation_steps(cluster, plan);
  const int64_t head = params.lm_head > 0 ? params.lm_head : params.embedding;
  // Layers from the model's first: its dense first layers (a MoE model's) are the first stage's; a
  // MoE model's other layers and every layer of any other model weigh per_layer.
  const int64_t dense_layers = model.is_moe() ? model.dense_layers : 0;
  auto dense_layers_of = [&](int64_t first_layer, int64_t count) { return std::clamp<int64_t>(dense_layers - first_layer, 0, count); };
  auto moe_layers_of = [&](int64_t first_layer, int64_t count) { return model.is_moe() ? count - dense_layers_of(first_layer, count) : 0; };
  auto layer_parameters = [&](int64_t first_layer, int64_t count) {
    const int64_t dense = dense_layers_of(first_layer, count);
    return dense * params.per_dense_layer + (count - dense) * params.per_layer;
  };
  const int64_t first_parameters = params.embedding + layer_parameters(0, split.first);
  const int64_t last_first_layer = model.num_layers - split.last;
  const int64_t last_parameters = layer_parameters(last_first_layer, split.last) + params.final_norm + head;
  if (plan.vpp <= 1) {
    std::vector<PipelineStage> stages = {
        {"first pipeline stage", split.first, std::min(plan.pp, micro_batches), false, first_parameters, moe_layers_of(0, split.first),
         dense_layers_of(0, split.first)},
        {"last pipeline stage", split.last, 1, true, last_parameters, moe_layers_of(last_first_layer, split.last),
         dense_layers_of(last_first_layer, split.last)}};
    // Uneven: the second stage holds one micro-batch fewer than the first but more layers, and may
    // hold more activations.
    if (!split.even() && plan.pp > 2 && split.middle * std::min(plan.pp - 1, micro_batches) > split.first * std::min(plan.pp, micro_batches))
      stages.insert(stages.begin() + 1, {"second pipeline stage", split.middle, std::min(plan.pp - 1, micro_batches), false,
                                         layer_parameters(split.first, split.middle), moe_layers_of(split.first, split.middle),
                                         dense_layers_of(split.first, split.middle)});
    return stages;
  }
  // Interleaved, rank r runs chunks r, r + pp, ...: the first rank's first chunk holds the first layers.
  const int64_t chunk_layers = split.first / plan.vpp;  // (interleaving is planned on even splits only)
  const int64_t chunks = micro_batches * plan.vpp;
  int64_t first_rank_parameters = params.embedding, last_rank_parameters = params.final_norm + head;
  int64_t first_rank_moe_layers = 0, last_rank_moe_layers = 0;
  for (int64_t chunk = 0; chunk < plan.vpp; ++chunk) {
    const int64_t first_layer = chunk * plan.pp * chunk_layers, last_rank_first_layer = first_layer + (plan.pp - 1) * chunk_layers;
    first_rank_parameters += layer_parameters(first_layer, chunk_layers);
    first_rank_moe_layers += moe_layers_of(first_layer, chunk_layers);
    last_rank_parameters += layer_parameters(last_rank_first_layer, chunk_layers);
    last_rank_moe_layers += moe_layers_of(last_rank_first_layer, chunk_layers);
  }
  return {{"first pipeline stage", chunk_layers, std::min(2 * (plan.pp - 1) + (plan.vpp - 1) * plan.pp + 1, chunks), false,
           first_rank_parameters, first_rank_moe_layers, dense_layers_of(0, chunk_layers)},
          {"last pipeline stage", chunk_layers, std::min((plan.vpp - 1) * plan.pp + 1, chunks), true, last_rank_parameters,
           last_rank_moe_layers, dense_layers_of((plan.pp - 1) * chunk_layers, chunk_layers)}};
}

double pipeline_slots(const ClusterSpec& cluster, const PlanOptions& plan) {
  return static_cast<double>(gradient_accumulation_steps(cluster, plan)) +
         static_cast<double>(std::max<int64_t>(1, plan.pp) - 1) / static_cast<double>(std::max<int64_t>(1, plan.vpp));
}

}  // namespace longseq
