// pipeline.hpp: Megatron-Core's pipeline parallelism as the cost model sees it (PlanOptions::pp;
// docs/reference-megatron-core.md M4): the stages whose memory can peak, and the 1F1B schedule's
// micro-batches and bubble.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "models/model_spec.hpp"
#include "planner/plan.hpp"

namespace longseq {

// One pipeline stage's share of a step: the decoder layers of the model chunk it runs at its peak
// (all of its layers, or under interleaving one of its vpp chunks), the chunks' activations it holds
// then (micro-batches of that chunk, counting the running one), whether it runs the LM head and the
// loss, and the parameters it holds (all of its chunks).
struct PipelineStage {
  std::string name;           // "" without pipeline parallelism
  int64_t layers = 0;
  int64_t in_flight = 1;
  bool loss = true;
  int64_t parameters = 0;
  // Of its layers (all of its chunks'), the MoE layers, whose routed experts expert parallelism splits
  // (a model's dense first layers sit on the first stage).
  int64_t moe_layers = 0;
  // Of the layers it runs at its peak (`layers`: its first chunk's under interleaving), the model's
  // dense first layers (a MoE model's; 0 elsewhere).
  int64_t dense_layers = 0;
};

// The stages that can set the GPU peak: without pipeline parallelism the whole model, one micro-batch
// in flight. With pp stages under 1F1B (schedules.py forward_backward_pipelining_without_interleaving
// L2093-2096: pp - rank - 1 warm-up forwards, and one more before the first backward): the first
// stage holds min(pp, m) micro-batches of its L / pp layers and the embedding; the last one
// micro-batch, the final norm and the output layer (a tied one as a copy of the embedding: Megatron
// keeps the word embeddings on the last stage for it) and runs the loss. The stages between hold
// fewer micro-batches than the first and no embedding, so neither of the two is below them.
// Interleaved (vpp chunks of L / (pp vpp) layers a rank; schedules.py get_pp_rank_microbatches
// L926-938): rank r warms up (pp - r - 1) x 2 + (vpp - 1) x pp chunk forwards (the group of
// micro-batches a virtual stage runs is pp, its default), capped at m x vpp, so the first rank holds
// 2 (pp - 1) + (vpp - 1) pp + 1 chunks, the last (vpp - 1) pp + 1.
std::vector<PipelineStage> pipeline_stages(const ModelSpec& model, const ClusterSpec& cluster, const PlanOptions& plan);

// How the decoder layers split into pp stages: evenly where pp divides them; otherwise Megatron's
// uneven split (--decoder-first-pipeline-num-layers, --decoder-last-pipeline-num-layers; megatron-core
// 0.19.2 transformer_config.py L1986-2046: the middle stages share what the first and last leave,
// evenly) with the middle stages at ceil(L / pp) and the first and last sharing the rest (Llama 3
// 405B's 126 layers on 16 stages: 7, 8 x 14, 7, as its paper says Meta removed one layer from each).
// first/last 0: no layers there (an invalid split: plan_problems says so).
struct PipelineSplit {
  int64_t first = 0, middle = 0, last = 0;
  bool even() const { return first == middle && last == middle; }
  int64_t largest() const { return std::max({first, middle, last}); }
};
PipelineSplit pipeline_split(const ModelSpec& model, const PlanOptions& plan);
// The layers of one model chunk, L / (pp vpp): a stage's, or under interleaving a vpp-th of it
// (what Megatron's block recompute counts its first n layers in).
int64_t model_chunk_layers(const ModelSpec& model, const PlanOptions& plan);

// The 1F1B schedule's length in micro-batch slots: m micro-batches through pp stages take m + pp - 1
// slots of one micro-batch's forward and backward on one stage (the bubble is pp - 1 of them; M4.1);
// interleaved over vpp chunks, the bubble shrinks to (pp - 1) / vpp slots (M4.2).
double pipeline_slots(const ClusterSpec& cluster, const PlanOptions& plan);

}  // namespace longseq
