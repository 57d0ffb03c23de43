#include "planner/memory_model.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <stdexcept>
#include <string_view>

#include <fmt/format.h>

#include "models/adapters.hpp"
#include "planner/compute_model.hpp"
#include "models/layer_inventory.hpp"
#include "models/tensor_trace.hpp"
#include "planner/memory_placement.hpp"
#include "planner/pipeline.hpp"
#include "planner/units.hpp"

namespace longseq {

using namespace memory_detail;

namespace {

// One phase of a step as its trace replays it, named for the report.
struct PhaseResult {
  TensorTrace trace;
  std::string phase;
};

}  // namespace

int64_t mlp_tiles_deepspeed_rule(int64_t local_tokens, int64_t hidden) {
  return std::max<int64_t>(1, (local_tokens + hidden - 1) / hidden);
}

int64_t loss_chunk_tokens_liger(int64_t tokens, int64_t vocab, int64_t hidden) {
  const int64_t inc_factor = (vocab + hidden - 1) / hidden;  // chunk_mem_const = 1
  const int64_t wanted = (tokens + inc_factor - 1) / inc_factor;
  int64_t chunk = 1;
  while (chunk < wanted) chunk *= 2;
  return chunk;
}

int64_t loss_chunks_unsloth_rule(int64_t tokens, int64_t vocab) {
  const double logits_gib = static_cast<double>(tokens) * static_cast<double>(vocab) * 4.0 / kBytesPerGib;
  const double target_gib = 4.0;
  if (logits_gib <= target_gib) return 1;
  return 4 * static_cast<int64_t>(std::ceil(logits_gib / target_gib / 4.0));
}

int64_t loss_shards_arctic_rule(int64_t tokens, int64_t vocab) {
  const double bytes = static_cast<double>(tokens) * static_cast<double>(vocab) * 4.0;
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(bytes / kBytesPerGib)));
}

int64_t nccl_communicators(const RuntimeProfile& profile, int64_t gpus, int64_t sequence_ranks) {
  if (gpus <= 1) return 0;
  return 1 + (sequence_ranks > 1 ? profile.nccl_sequence_parallel_communicators : 0);
}

double runtime_overhead_bytes(const RuntimeProfile& profile, int64_t gpus, int64_t sequence_ranks) {
  return profile.cuda_context_gib * kBytesPerGib +
         as_double(nccl_communicators(profile, gpus, sequence_ranks)) * profile.nccl_buffers_gib.at(profile.bound) * kBytesPerGib +
         profile.cublas_workspace_mib * 1024.0 * 1024.0 + profile.allocator_fragmentation_gib.at(profile.bound) * kBytesPerGib;
}

namespace {

// With `stop_when_over`, the phases go heaviest first (backward, forward, the loss) and the first
// one over the usable GPU memory ends the prediction (see memory_predict_until_over).
// `stage`: the pipeline stage predicted (pipeline_stages): its layers, the micro-batches it holds,
// whether it runs the loss, its parameters; the whole model without pipeline parallelism.
MemoryPrediction memory_predict_phases(const ModelSpec& model, const ClusterSpec& cluster, const PlanOptions& plan,
                                       const RuntimeProfile& profile, int64_t seqlen, bool with_breakdown, bool stop_when_over,
                                       const PipelineStage& stage) {
  if (!plan_problems(model, cluster, plan).empty() || !seqlen_problems(plan, seqlen).empty())
    throw std::invalid_argument("memory_predict: invalid plan or sequence length (check plan_problems first)");
  Setup setup = setup_make(model, cluster.hardware, plan, profile, seqlen);
  if (plan.pp > 1) {
    setup.params.total = stage.parameters, setup.trainable_total = as_double(stage.parameters);
    setup.expert_parameters = as_double(stage.moe_layers) * as_double(setup.params.per_layer_routed_experts);
  }
  const double layers = as_double(stage.layers);
  // TE's FP8 weight copies (M10.2): every linear of the layers the rank holds (all its chunks under
  // interleaving), quantized for both GEMMs that read it (forward and input gradient): the attention's
  // and a dense MLP's TP share, a MoE layer's experts its ep share, whole (M10.4; its router is not TE's).
  if (setup.impl.te_fp8) {
    const double held_layers = plan.pp > 1 ? layers * as_double(std::max<int64_t>(1, plan.vpp)) : as_double(model.num_layers);
    const double held_moe_layers = !model.is_moe() ? 0.0 : plan.pp > 1 ? as_double(stage.moe_layers) : as_double(model.moe_layers());
    setup.fp8_weight_copy_bytes = te_fp8_linear_parameters(model, plan, held_layers - held_moe_layers, held_moe_layers) *
                                  (setup.impl.te_fp8_transposed_copies ? 2.0 : 1.0);
  }
  // Under 1F1B the micro-batches before this one are in flight whole: their layers' activations too.
  const double earlier_micro_batch_layers = as_double(stage.in_flight - 1) * layers;
  const double x_bytes = as_double(setup.shape.hidden_state_tokens()) * as_double(model.hidden_size) * as_double(profile.activation_bytes);
  // What a layer that is not checkpointed keeps for its backward (no layer, under full checkpointing).
  const bool layers_save = !plan.activation_checkpointing || plan.checkpoint_every > 1 || plan.recompute_block_layers > 0;  // (selective: none checkpointed)
  const double saved_per_layer = layers_save ? decoder_layer_saved_bytes(setup.shape, setup.impl) : 0;
  // LoRA freezes the embedding, so the first layer's input needs no gradient (LayerShape::input_requires_grad).
  LayerShape first_layer_shape = setup.shape;
  first_layer_shape.input_requires_grad = !plan.lora();
  const double saved_first_layer = layers_save ? decoder_layer_saved_bytes(first_layer_shape, setup.impl) : 0;
  // A MoE model's dense first layers where the stage holds them: the dense MLP's tensors (its
  // intermediate_size over the TP ranks) in place of the MoE layer's.
  DenseFirstLayers dense;
  if (layers_save && stage.dense_layers > 0) {
    LayerShape dense_shape = setup.shape;
    dense_shape.experts = 0;
    dense.in_chunk = stage.dense_layers;
    dense.saved_bytes = decoder_layer_saved_bytes(dense_shape, setup.impl);
  }
  const double router_logits_bytes = as_double(setup.shape.tokens) * as_double(model.experts) * as_double(profile.activation_bytes);
  // transformers' load-balancing loss over every layer's kept logits (Megatron's router computes
  // its own per layer, inside the layer's inventory).
  const bool aux_loss = model.is_moe() && !setup.impl.megatron_te_layer && (plan.moe_aux_loss || model.output_router_logits);
  // What each of the stage's Megatron MoE layers' dispatchers keeps all step (M6.5).
  const double dispatcher_held_bytes = setup.impl.megatron_te_layer ? megatron_moe_dispatcher_held_bytes(setup.shape, setup.impl) : 0.0;
  // The usable GPU memory: the card's less the headroom the profile keeps free.
  const double headroom = profile.usable_memory_headroom_gib.at(profile.bound) * kBytesPerGib;
  const double capacity = cluster.hardware.gpu_memory_gib * kBytesPerGib - headroom;

  // A profile whose gradients live from backward to the optimizer step adds two phases: the
  // backward of the first decoder layer (every later layer's gradients, one layer's activations)
  // and the optimizer step (every gradient, no activation). Under gradient accumulation the
  // gradients of the micro-steps before live through the next one's forward and backward: held all step.
  const bool gradients_in_backward = profile.gradients_freed_after_step && gradient_accumulation_steps(cluster, plan) == 1;
  std::vector<PhaseResult> phases(profile.step_schedule == "executor" ? 1 : gradients_in_backward ? 5 : 3);
  // The executor's host pool (offloaded checkpoints, FPDT's chunks), replayed with its step.
  TensorTrace executor_host;
  // Every phase starts from the static tensors and the activations of the layers below it.
  auto phase_begin = [&](PhaseResult& result, const char* name, double resident_layers,
                         StepInputs inputs = StepInputs::batch_and_rope) -> TensorTrace& {
    result.phase = stage.name.empty() ? std::string(name) : fmt::format("{} ({})", name, stage.name);
    result.trace.set_record_peak_items(with_breakdown);
    static_tensors_place(result.trace, model, cluster, plan, profile, setup, seqlen, inputs, /*with_gradients=*/!gradients_in_backward);
    resident_activations_place(result.trace, plan, profile, setup, resident_layers + earlier_micro_batch_layers,
                               layers + earlier_micro_batch_layers, saved_per_layer, saved_first_layer, layers, as_double(stage.in_flight - 1),
                               dense);
    // One per MoE layer the rank holds (all its chunks', under interleaving), whatever micro-batches are in flight.
    if (dispatcher_held_bytes > 0 && stage.moe_layers > 0)
      result.trace.alloc(kCategoryCheckpoints, "moe.dispatcher_state", as_double(stage.moe_layers) * dispatcher_held_bytes, as_double(stage.moe_layers));
    return result.trace;
  };
  // Gradients backward has produced before a decoder layer's own: the LM head's and final norm's
  // (a tied head's is the embedding's) and every layer above it.
  const double gradient_bytes = gradient_bytes_per_trainable(cluster, plan, profile);
  auto gradients_above_place = [&](TensorTrace& trace, double layers_above) {
    if (!gradients_in_backward || gradient_bytes <= 0) return;
    if (!plan.lora()) {
      const int64_t head = setup.params.lm_head > 0 ? setup.params.lm_head : setup.params.embedding;
      trace.alloc(kCategoryModelStates, "gradients.lm_head_and_final_norm", as_double(head + setup.params.final_norm) * gradient_bytes);
    }
    if (layers_above > 0)
      trace.alloc(kCategoryModelStates, plan.lora() ? "lora_gradients.layers_above" : "gradients.layers_above",
                  layers_above * setup.trainable_per_layer * gradient_bytes, layers_above);
  };
  // The layer's own weight gradients as its backward produces them, where they are the parameters'
  // own (ZeRO-2/3 and FSDP2 reduce them through their buffers, zero_layer_buffers_place).
  LayerImplementation backward_impl = setup.impl;
  if (gradients_in_backward && plan.zero_stage < 2 && gradient_bytes > 0)
    backward_impl.weight_gradients = layer_weight_gradients(model, plan, setup.params, gradient_bytes);

  if (profile.step_schedule == "executor") {
    // longseq's executor: the whole step replayed, every layer, as executor/llama_step.hpp allocates.
    // Its inputs (tokens, labels, positions) live outside the arena, so they are not counted.
    TensorTrace& trace = phases[0].trace;
    phases[0].phase = "training step (executor schedule)";
    trace.set_record_peak_items(with_breakdown);
    static_tensors_place(trace, model, cluster, plan, profile, setup, seqlen, StepInputs::none);
    ExecutorStepOptions options;
    options.layers = model.num_layers;
    options.activation_bytes = profile.activation_bytes;
    options.attention_block_tokens = profile.attention_block_tokens;
    options.checkpointing = plan.activation_checkpointing;
    options.checkpoint_offload = plan.checkpoint_offload;
    options.loss_tile_tokens = plan.tiled_loss || plan.fpdt ? setup.loss_tile_tokens : 0;
    // The executor's ZeRO partitions every module over all ranks: ZeRO-3 gathers the weights,
    // ZeRO-2/3 (and an offloaded optimizer) reduce-scatter the gradients.
    options.gather_weights = plan.zero_stage == 3;
    options.scatter_gradients = plan.zero_stage >= 2 || (plan.zero_stage >= 1 && plan.offload_optimizer);
    options.offload_params = plan.offload_params;
    // FSDP2's regime (a profile whose sharded parameters are wider than its kernels' dtype).
    options.cast_shards = options.gather_weights && profile.parameter_sharding == ParameterSharding::sharding_fsdp2 &&
                          profile.weight_bytes != profile.activation_bytes;
    // The pure-bf16 regime (gradients narrower than fp32): each module's produced in fp32 first.
    options.module_gradients_fp32 = profile.gradient_bytes < 4;
    // A ring run as PyTorch CP's all-gather rotation (a profile that says so, and the plan's rotation).
    options.context_parallel_all_gather = context_parallel_all_gather(profile, plan);
    if (options.gather_weights || options.scatter_gradients || options.module_gradients_fp32) {
      if (options.gather_weights || options.scatter_gradients) options.zero_ranks = cluster.gpus;
      options.embedding_parameters = setup.params.embedding;
      options.layer_parameters = setup.params.per_layer;
      options.final_parameters = setup.params.final_norm + setup.params.lm_head;
      options.tied_embeddings = model.tied_embeddings;
    }
    executor_step_replay(trace, setup.shape, options, &executor_host);
  } else {
    // Forward of the last layer: the checkpoints of all layers below it are resident.
    auto forward_phase = [&] {
      TensorTrace& trace = phase_begin(phases[0], "forward of the last decoder layer", layers - 1);
      trl_forward_stash_place(trace, plan, x_bytes, layers - 1);
      // The auxiliary loss keeps every layer's router logits (bf16 T x E) through the forward (item 67).
      if (aux_loss) trace.alloc(kCategoryCheckpoints, "moe.router_logits_kept", (layers - 1) * router_logits_bytes, layers - 1);
      zero_layer_buffers_place(trace, plan, profile, setup, /*backward=*/false, as_double(plan.shard_ranks(cluster.gpus)));
      trace.alloc(kCategoryLayer, "layer.input", x_bytes);
      // The op-level policy's saved outputs of this layer, counted whole from its start (a bound:
      // down_proj's appears only at the layer's end).
      if (plan.checkpoint_ops)
        trace.alloc(kCategoryCheckpoints, "layer.op_selective_saved", decoder_layer_op_selective_saved_bytes(setup.shape, setup.impl) - x_bytes);
      // The stage's (or chunk's) last layer, counted from its first (block recompute counts there).
      decoder_layer_forward(trace, setup.shape, setup.impl, /*keep=*/!plan.layer_checkpointed(static_cast<int64_t>(layers) - 1));
      return trace.peak_bytes();
    };
    // Logits and loss: every layer's checkpoint is resident, the LM head is gathered.
    auto loss_phase = [&] {
      TensorTrace& trace = phase_begin(phases[1], "logits and loss", layers);
      trl_forward_stash_place(trace, plan, x_bytes, layers);
      if (plan.zero_stage == 3 && profile.parameter_sharding == ParameterSharding::sharding_fsdp2) {
        // The [norm, lm_head] unit kept unsharded from the end of forward (F1.16), and the last
        // layer's unit prefetched for its backward (Reference §11 D's loss phase).
        trace.alloc(kCategoryZero, "fsdp.unsharded_norm_and_lm_head", fsdp_tail_unit_bytes(profile, setup));
        trace.alloc(kCategoryZero, "fsdp.prefetched_all_gather", fsdp_unit_bytes(plan, profile, setup));
      } else {
        if (plan.zero_stage == 3)
          trace.alloc(kCategoryZero, "gathered_lm_head", as_double(model.vocab_size) * as_double(model.hidden_size) *
                                                             as_double(profile.weight_bytes));
        gradient_reduce_bucket_place(trace, plan, profile, setup);
      }
      trace.alloc(kCategoryLayer, "final_norm.input", x_bytes);
      if (aux_loss) {
        // load_balancing_loss_func (Reference §12 item 67): torch.cat of every layer's logits, their
        // fp32 softmax, the int64 one_hot of the top-k choices (L T, k, E) and its fp32 copy, on top
        // of the kept logits. Its backward runs first in backward (the later node), so its saved
        // softmax is gone before the LM loss's backward peak; the moment is taken on its own.
        const double routed = layers * as_double(setup.shape.tokens) * as_double(model.experts_per_token) * as_double(model.experts);
        trace.set_moment("auxiliary loss");
        trace.alloc(kCategoryLoss, "moe.router_logits_kept", layers * router_logits_bytes, layers);
        trace.alloc(kCategoryLoss, "aux_loss.logits_cat", layers * router_logits_bytes);
        trace.alloc(kCategoryLoss, "aux_loss.probs_fp32", 2.0 * layers * router_logits_bytes);
        trace.alloc(kCategoryLoss, "aux_loss.expert_mask_int64", routed * 8.0);
        trace.alloc(kCategoryLoss, "aux_loss.expert_mask_fp32", routed * 4.0);
        for (const char* name : {"aux_loss.expert_mask_fp32", "aux_loss.expert_mask_int64", "aux_loss.probs_fp32", "aux_loss.logits_cat",
                                 "moe.router_logits_kept"})
          trace.free(name);
      }
      lm_loss_forward_backward(trace, setup.shape, setup.impl, setup.loss, setup.loss_tile_tokens, profile.weight_bytes);
      return trace.peak_bytes();
    };
    // Recompute + backward of a decoder layer. The last layer's is the heaviest backward step where
    // gradients are held all step (later ones hold fewer checkpoints); where backward produces them,
    // each layer it passes adds its gradients as it drops its activations, so the first layer's
    // (every gradient but the embedding's, no checkpoint below) is the other end. With
    // checkpointing the incoming gradient exists before the recompute starts.
    auto layer_backward_phase = [&](PhaseResult& result, const char* name, double layers_below) {
      const LayerShape& shape = layers_below == 0 ? first_layer_shape : setup.shape;
      // This layer (0-based index layers_below) recomputes its forward only if it is checkpointed.
      const bool checkpointed = plan.layer_checkpointed(static_cast<int64_t>(layers_below));
      TensorTrace& trace = phase_begin(result, name, layers_below);
      gradients_above_place(trace, layers - 1 - layers_below);
      zero_layer_buffers_place(trace, plan, profile, setup, /*backward=*/true, as_double(plan.shard_ranks(cluster.gpus)));
      trace.alloc(kCategoryLayer, "layer.input", x_bytes);
      if (checkpointed) trace.alloc(kCategoryLayer, "layer.output_grad", x_bytes);
      decoder_layer_forward(trace, shape, backward_impl, /*keep=*/true);
      // Without a checkpoint nothing holds the layer's input once an eager norm has copied it.
      if (!checkpointed && setup.impl.eager_rms_norm) trace.free("layer.input");
      // Nothing holds the layer's output in its backward: without checkpointing the next layer (or
      // the final norm) has run its backward already, and a non-reentrant recompute drops it. A
      // reentrant one holds it (torch.autograd.backward(outputs, grads)).
      if (!checkpointed || profile.checkpointing_non_reentrant) trace.free("layer.output");
      if (!checkpointed) trace.alloc(kCategoryLayer, "layer.output_grad", x_bytes);
      decoder_layer_backward(trace, shape, backward_impl);
      return trace.peak_bytes();
    };
    auto backward_phase = [&] { return layer_backward_phase(phases[2], "backward of the last decoder layer", layers - 1); };
    auto first_layer_backward_phase = [&] { return layer_backward_phase(phases[3], "backward of the first decoder layer", 0); };
    // The optimizer step: every gradient beside the model states (the batch is still referenced
    // by the trainer's step). The fused AdamW the Trainer runs by default (adamw_torch_fused,
    // training_args.py) updates in place; clip_grad_norm_'s per-tensor norms are scalars.
    auto optimizer_phase = [&] {
      // RoPE's cos and sin die with the last backward op that saved them; the batch lives on.
      TensorTrace& trace = phase_begin(phases[4], "optimizer step", 0, StepInputs::batch);
      trace.set_moment("AdamW update");
      if (gradient_bytes > 0) trace.alloc(kCategoryModelStates, gradients_name(plan, profile), setup.trainable_total * gradient_bytes);
      return trace.peak_bytes();
    };
    if (!stop_when_over) {
      forward_phase();
      if (stage.loss) loss_phase();
      backward_phase();
      if (gradients_in_backward) {
        first_layer_backward_phase();
        optimizer_phase();
      }
    } else {
      // A probe that only asks "does it fit?": the first phase over the usable memory answers it.
      const double reserve = profile.calibrated_reserve_gib * kBytesPerGib;
      std::vector<std::function<double()>> heaviest_first = {backward_phase, forward_phase};
      if (stage.loss) heaviest_first.push_back(loss_phase);
      if (gradients_in_backward) {
        heaviest_first.push_back(first_layer_backward_phase);
        heaviest_first.push_back(optimizer_phase);
      }
      for (const auto& phase : heaviest_first)
        if (const double peak = phase() + reserve; peak > capacity) {
          MemoryPrediction over;
          over.seqlen = seqlen;
          over.local_tokens = setup.shape.tokens;
          over.gpu_headroom_bytes = headroom;
          over.gpu_capacity_bytes = capacity;
          over.gpu_peak_bytes = peak;
          return over;
        }
    }
  }

  MemoryPrediction prediction;
  prediction.seqlen = seqlen;
  prediction.local_tokens = setup.shape.tokens;
  prediction.mlp_tiles = setup.shape.mlp_tiles;
  prediction.loss_tile_tokens = setup.loss_tile_tokens;
  prediction.kv_replication = setup.shape.kv_replication;
  prediction.gpu_headroom_bytes = headroom;
  prediction.gpu_capacity_bytes = capacity;
  // The profile's calibrated reserve is constant in S, so it moves every phase alike and never
  // changes which phase or moment is the peak.
  const double reserve_bytes = profile.calibrated_reserve_gib * kBytesPerGib;
  // A stage without the loss runs no loss phase.
  phases.erase(std::remove_if(phases.begin(), phases.end(), [](const PhaseResult& phase) { return phase.phase.empty(); }), phases.end());
  size_t worst = 0;
  for (size_t index = 0; index < phases.size(); ++index) {
    const TensorTrace& trace = phases[index].trace;
    prediction.phases.push_back({phases[index].phase, std::string(trace.peak_moment()), trace.peak_bytes() + reserve_bytes, {}});
    // (Empty without the breakdown: the traces record no peak items then.)
    for (const auto& item : trace.peak_items())
      if (item.bytes > 0) prediction.phases.back().items.push_back({std::string(item.category), std::string(item.name), item.bytes, item.count});
    if (trace.peak_bytes() > phases[worst].trace.peak_bytes()) worst = index;
  }
  prediction.gpu_peak_phase = prediction.phases[worst].phase;
  prediction.gpu_peak_moment = prediction.phases[worst].moment;
  prediction.gpu_peak_bytes = prediction.phases[worst].bytes;
  prediction.gpu_calibrated_bytes = reserve_bytes;
  prediction.gpu_items = prediction.phases[worst].items;
  if (with_breakdown && reserve_bytes > 0) prediction.gpu_items.push_back({kCategoryCalibrated, "unexplained_reserve", reserve_bytes, 1});

  // Host memory of the fullest node. No pinned staging buffers are counted for deepspeed-hf:
  // offload_optimizer's pin_memory defaults to false and the ALST recipes leave it so, and the
  // checkpoint offload copies to pageable memory (.to("cpu"), REFERENCE §3.4).
  const double ranks = as_double(cluster.ranks_per_node());
  const double params = as_double(setup.params.total);
  const double world = as_double(plan.shard_ranks(cluster.gpus));
  // What the optimizer steps: every parameter, or the adapters alone (their weights beside the base's).
  const double trainable = setup.trainable_total;
  const double adapters = plan.lora() ? trainable : 0.0;
  auto host_add = [&](const char* name, double bytes_per_rank) {
    if (bytes_per_rank > 0) prediction.host_items.push_back({kCategoryHost, name, bytes_per_rank * ranks, ranks});
  };
  if (fsdp2_cpu_offload(profile, plan)) {
    // FSDP2's CPUOffloadPolicy (Reference §11 F1.12): each rank's fp32 parameter and gradient
    // shards pinned on the host, tensor by tensor (F1.3: each parameter's shard its own pinned
    // allocation, rounded by PyTorch's pinned allocator where the profile says so), and AdamW's
    // moments as zeros_like of them (not pinned [inferred in F1.12]).
    double pinned_shards = 0;
    const int64_t shard_ranks = plan.shard_ranks(cluster.gpus);
    for (int64_t elements : parameter_tensor_elements(model))
      pinned_shards += pinned_host_allocation_bytes(as_double((elements + shard_ranks - 1) / shard_ranks) * as_double(profile.weight_bytes),
                                                    profile.pinned_host_allocations_power_of_two);
    host_add("fsdp.sharded_parameters_pinned", pinned_shards);
    host_add("fsdp.sharded_gradients_pinned", pinned_shards);
    host_add("optimizer_states", plan.adam_8bit ? adam_8bit_model_state_bytes(model) / world
                                                : params * as_double(profile.optimizer_state_bytes) / world);
  } else if (plan.offload_optimizer) {
    // DeepSpeed ZeRO-Offload keeps each rank's partition of fp32 master weights, Adam states
    // and fp32 gradients in host memory and runs the step there (cpu_adam). A runtime that trains
    // in fp32 without a master copy (native) needs one once the optimizer leaves the device.
    const double master_bytes = profile.master_weight_bytes > 0 ? as_double(profile.master_weight_bytes) : 4.0;
    host_add("master_weights", trainable * master_bytes / world);
    host_add("optimizer_states", trainable * as_double(profile.optimizer_state_bytes) / world);
    host_add("gradients_fp32", trainable * as_double(profile.gradient_bytes) / world);
    if (plan.zero_stage == 3)
      host_add("grad_partitions_flat_buffer", trainable * as_double(profile.zero3_offload_gradient_buffer_bytes) / world);
  }
  if (plan.offload_params && !fsdp2_cpu_offload(profile, plan)) {
    const double weight_bytes = (params + adapters) * as_double(profile.weight_bytes) / world;
    host_add("weights", pinned_host_allocation_bytes(weight_bytes, profile.pinned_host_allocations_power_of_two));
  }
  host_add("process_runtime", profile.host_process_runtime_gb.at(profile.bound) * 1e9);
  host_add("dataloader_workers", profile.host_dataloader_workers_gb.at(profile.bound) * 1e9);
  if (plan.offload_optimizer)
    host_add("forked_workers_page_copies", trainable / world * profile.host_forked_workers_copy_bytes_per_parameter.at(profile.bound));
  if (profile.step_schedule == "executor") {
    // What the executor's host pool held at its peak, tensor by tensor (same-named ones summed).
    std::vector<std::pair<std::string_view, double>> pooled;
    for (const auto& item : executor_host.peak_items()) {
      auto found = std::find_if(pooled.begin(), pooled.end(), [&](const auto& entry) { return entry.first == item.name; });
      if (found == pooled.end()) pooled.emplace_back(item.name, item.bytes);
      else found->second += item.bytes;
    }
    for (const auto& [name, bytes] : pooled) host_add(std::string(name).c_str(), bytes);
  } else {
    if (plan.checkpoint_offload) {
      const double offloaded = layers - (profile.checkpoint_offload_keeps_last_layer ? 1.0 : 0.0);
      const double per_layer = profile.checkpoint_offload_pinned
                                   ? pinned_host_allocation_bytes(x_bytes, profile.pinned_host_allocations_power_of_two)
                                   : x_bytes;
      host_add("hidden_states_checkpoints", offloaded * per_layer);
    }
    host_add("fpdt_chunks_pinned", fpdt_host_bytes(setup.shape, setup.impl, profile.pinned_host_allocations_power_of_two));
    // TE's offloaded layers' saved activations, in pinned host buffers (cpu_offload.py L292).
    host_add("te_offloaded_activations_pinned", as_double(plan.offload_activation_layers) * saved_per_layer);
  }
  host_add("dataloader_buffers", profile.dataloader_host_bytes_per_token * as_double(seqlen) * as_double(plan.micro_batch));
  for (const auto& item : prediction.host_items) prediction.host_bytes_per_node += item.bytes;
  prediction.host_capacity_bytes = cluster.host_memory_gib * kBytesPerGib;
  return prediction;
}

}  // namespace

std::vector<MemoryItem> layer_saved_tensors(const ModelSpec& model, const ClusterSpec& cluster, const PlanOptions& plan,
                                            const RuntimeProfile& profile, int64_t seqlen) {
  if (!plan_problems(model, cluster, plan).empty() || !seqlen_problems(plan, seqlen).empty())
    throw std::invalid_argument("layer_saved_tensors: invalid plan or sequence length (check plan_problems first)");
  const Setup setup = setup_make(model, cluster.hardware, plan, profile, seqlen);
  TensorTrace trace;
  const double x_bytes = as_double(setup.shape.hidden_state_tokens()) * as_double(model.hidden_size) * as_double(setup.impl.activation_bytes);
  trace.alloc(kCategoryLayer, "layer.input", x_bytes);
  decoder_layer_forward(trace, setup.shape, setup.impl, /*keep_for_backward=*/true);
  trace.free("layer.output");  // the next layer's input, not this layer's saved tensor
  if (setup.impl.eager_rms_norm) trace.free("layer.input");  // an eager norm saves its fp32 copy instead
  std::vector<MemoryItem> items;
  for (const TraceItem& item : trace.live_items())
    if (item.bytes > 0) items.push_back({std::string(item.category), std::string(item.name), item.bytes * item.count, item.count});
  return items;
}

// Under pipeline parallelism the stage with the highest GPU peak is the answer (its phases named by
// stage); every stage's phases are listed, stage by stage.
MemoryPrediction memory_predict(const ModelSpec& model, const ClusterSpec& cluster, const PlanOptions& plan,
                                const RuntimeProfile& profile, int64_t seqlen, bool with_breakdown) {
  MemoryPrediction worst;
  std::vector<PhasePeak> phases;
  for (const PipelineStage& stage : pipeline_stages(model, cluster, plan)) {
    MemoryPrediction prediction = memory_predict_phases(model, cluster, plan, profile, seqlen, with_breakdown, /*stop_when_over=*/false, stage);
    for (const PhasePeak& phase : prediction.phases) phases.push_back(phase);
    if (worst.phases.empty() || prediction.gpu_peak_bytes > worst.gpu_peak_bytes) worst = std::move(prediction);
  }
  worst.phases = std::move(phases);
  return worst;
}

MemoryPrediction memory_predict_until_over(const ModelSpec& model, const ClusterSpec& cluster, const PlanOptions& plan,
                                           const RuntimeProfile& profile, int64_t seqlen) {
  MemoryPrediction worst;
  for (const PipelineStage& stage : pipeline_stages(model, cluster, plan)) {
    MemoryPrediction prediction = memory_predict_phases(model, cluster, plan, profile, seqlen, /*with_breakdown=*/false, /*stop_when_over=*/true, stage);
    if (!prediction.fits_gpu()) return prediction;
    if (worst.phases.empty() || prediction.gpu_peak_bytes > worst.gpu_peak_bytes) worst = std::move(prediction);
  }
  return worst;
}

}  // namespace longseq
