// memory_placement.hpp: what memory_model.cpp's phases share (internal to the planner): a
// prediction's setup (the layer's shape and implementation, the parameters, the trainable share) and
// the tensors placed beside the decoder layers' own: the model states, runtime overheads and inputs
// held all step, ZeRO's and FSDP2's buffers while a layer runs, the resident activations of the layers
// below, the layers' weight gradients. The definitions, with their sources, are memory_placement.cpp.
#pragma once

#include <cstdint>

#include "models/layer_inventory.hpp"
#include "models/model_spec.hpp"
#include "models/tensor_trace.hpp"
#include "planner/cards.hpp"
#include "planner/plan.hpp"

namespace longseq::memory_detail {

inline double as_double(int64_t value) { return static_cast<double>(value); }

struct Setup {
  LayerShape shape;
  LayerImplementation impl;
  LossImplementation loss = LossImplementation::loss_untiled;
  int64_t loss_tile_tokens = 0;
  ParameterCount params;
  // What backward produces gradients for: every parameter, or the LoRA adapters alone (the frozen
  // base has none, Reference §12 item 11): in all, a decoder layer's, and the largest one tensor.
  double trainable_total = 0, trainable_per_layer = 0, largest_trainable_matrix = 0;
  // QLoRA: a decoder layer's packed NF4 values (what ZeRO-3 gathers of its linears).
  double qlora_packed_per_layer = 0;
  // The routed experts' parameters in setup.params.total (its pipeline stage's under PP): what
  // Megatron's expert parallelism splits over ep ranks rather than over the TP ranks.
  double expert_parameters = 0;
  // Transformer Engine's FP8 copies of the decoder layers' linear weights (the rank's TP share of its
  // stage's), kept from the step's first micro-batch to its end (M10.2); 0 without FP8.
  double fp8_weight_copy_bytes = 0;
};

// The layer's shape and implementation, the loss's tiling and the parameters for a plan at `seqlen`.
Setup setup_make(const ModelSpec& model, const HardwareCard& card, const PlanOptions& plan, const RuntimeProfile& profile, int64_t seqlen);

// The bytes on a GPU of one trainable parameter's gradient, after ZeRO/FSDP2 shard it (0 where
// gradients leave the GPU), and the breakdown's name for the gradients ("gradients_fp32", ...).
double gradient_bytes_per_trainable(const ClusterSpec& cluster, const PlanOptions& plan, const RuntimeProfile& profile);
const char* gradients_name(const PlanOptions& plan, const RuntimeProfile& profile);

// What of the step's inputs a phase holds: none (the executor's live outside its arena), the batch,
// or the batch and RoPE's cos/sin (from the forward to the last backward op that saved them).
enum class StepInputs { none, batch, batch_and_rope };

// Model states, runtime overheads and inputs: live for the whole step. `with_gradients` false: a
// profile whose gradients live from backward to the optimizer step holds none outside backward.
void static_tensors_place(TensorTrace& trace, const ModelSpec& model, const ClusterSpec& cluster, const PlanOptions& plan,
                          const RuntimeProfile& profile, const Setup& setup, int64_t seqlen, StepInputs inputs = StepInputs::batch_and_rope,
                          bool with_gradients = true);

// ZeRO-2/3's gradient bucket, held through backward.
void gradient_reduce_bucket_place(TensorTrace& trace, const PlanOptions& plan, const RuntimeProfile& profile, const Setup& setup);
// FSDP2's [final norm, lm_head] unit and one decoder layer's unit, unsharded.
double fsdp_tail_unit_bytes(const RuntimeProfile& profile, const Setup& setup);
double fsdp_unit_bytes(const PlanOptions& plan, const RuntimeProfile& profile, const Setup& setup);
// What ZeRO (or FSDP2) holds while a decoder layer runs, forward or `backward`, over `world` ranks.
void zero_layer_buffers_place(TensorTrace& trace, const PlanOptions& plan, const RuntimeProfile& profile, const Setup& setup, bool backward,
                              double world);
// TRL's activation offloading's forward stash of recently offloaded GPU tensors.
void trl_forward_stash_place(TensorTrace& trace, const PlanOptions& plan, double x_bytes, double offloaded_layers);

// A MoE model's dense first layers (ModelSpec::dense_layers) among a stage's (chunk's) first layers:
// how many, and what one saves for backward where it is not checkpointed.
struct DenseFirstLayers {
  int64_t in_chunk = 0;
  double saved_bytes = 0;
};

// Checkpoints (or, without checkpointing, whole saved activation sets) of `layers` resident layers of
// `total_layers` (memory_placement.cpp says how earlier micro-batches' chunks and dense layers count).
void resident_activations_place(TensorTrace& trace, const PlanOptions& plan, const RuntimeProfile& profile, const Setup& setup, double layers,
                                double total_layers, double saved_bytes_per_layer, double first_layer_saved_bytes, double chunk_layers = 0,
                                double earlier_chunks = 0, const DenseFirstLayers& dense = {});

// A decoder layer's weight gradients in the order its backward produces them.
LayerWeightGradients layer_weight_gradients(const ModelSpec& model, const PlanOptions& plan, const ParameterCount& params, double gradient_bytes);

}  // namespace longseq::memory_detail
