// memory_placement.cpp: the setup of a memory prediction and the tensors its phases place beside the
// decoder layers' (memory_placement.hpp); memory_model.cpp replays the phases.
#include "planner/memory_placement.hpp"

#include <algorithm>
#include <cmath>
#include <string_view>

#include <fmt/format.h>

#include "models/adapters.hpp"
#include "planner/memory_model.hpp"
#include "planner/pipeline.hpp"
#include "planner/units.hpp"

namespace longseq::memory_detail {

Setup setup_make(const ModelSpec& model, const HardwareCard& card, const PlanOptions& plan, const RuntimeProfile& profile, int64_t seqlen) {
  Setup setup;
  setup.params = parameter_count(model);
  setup.trainable_total = as_double(setup.params.total);
  setup.trainable_per_layer = as_double(setup.params.per_layer);
  setup.largest_trainable_matrix = as_double(setup.params.largest_layer_matrix);
  if (plan.lora()) {
    setup.trainable_total = as_double(lora_parameter_count(model, plan.lora_rank, plan.lora_all_linear));
    setup.trainable_per_layer = setup.trainable_total / as_double(model.num_layers);
    setup.largest_trainable_matrix = 0;
    for (const LayerLinear& linear : lora_adapted_linears(model, plan.lora_all_linear))
      setup.largest_trainable_matrix = std::max(setup.largest_trainable_matrix, as_double(plan.lora_rank * std::max(linear.in, linear.out)));
  }
  if (plan.qlora) setup.qlora_packed_per_layer = nf4_layer_bytes(model, /*double_quant=*/true).packed;
  setup.expert_parameters = as_double(model.moe_layers()) * as_double(setup.params.per_layer_routed_experts);
  LayerShape& shape = setup.shape;
  shape.tokens = plan.micro_batch * (seqlen / plan.sequence_ranks());
  shape.sp = plan.sp;
  shape.ring = plan.ring;
  shape.hidden = model.hidden_size;
  // Under tensor parallelism a rank holds 1/t of the heads, the MLP's width and the vocabulary
  // (Megatron's column-parallel splits, reference-megatron-core M1), and 1/t of the residual stream.
  const int64_t tp = std::max<int64_t>(1, plan.tp);
  shape.tp = tp;
  shape.ep = std::max<int64_t>(1, plan.ep);
  shape.q_width = model.q_width() / tp;
  shape.kv_width = model.kv_width() / tp;
  shape.kv_replication = tp > 1 ? std::max<int64_t>(1, plan.sp / std::max<int64_t>(1, model.num_kv_heads / tp))
                                : kv_replication_factor(model, plan.sp);
  shape.num_q_heads = model.num_q_heads / tp;
  shape.intermediate = model.intermediate_size / tp;
  shape.vocab = (model.vocab_size + tp - 1) / tp;
  shape.final_logits_softcapped = model.final_logit_softcapping > 0;
  shape.mlp_kind = model.mlp_kind;
  shape.qk_norm = model.qk_norm;
  shape.post_norms = model.norms_per_layer == 4;
  shape.norm_scale_fp32 = model.norm_scale_fp32;
  shape.head_dim = model.head_dim;
  shape.fused_projections = model.fused_projections;
  shape.num_kv_heads = model.num_kv_heads / tp;
  shape.experts = model.experts;
  shape.experts_per_token = model.experts_per_token;
  shape.expert_intermediate = model.expert_intermediate_size;
  shape.shared_expert_intermediate = model.shared_expert_intermediate_size;
  shape.shared_expert_gate = model.shared_expert_gate;
  shape.moe_normalize_topk = model.moe_normalize_topk;
  shape.moe_routing_weights_fp32 = model.moe_routing_weights_fp32;
  shape.moe_router_sigmoid = model.moe_router_sigmoid;
  // moe_router_dtype fp32: what Megatron-Bridge's DeepSeek providers set and the export writes for a
  // sigmoid router (deepseek_v3_bridge.py L75).
  shape.moe_router_fp32 = model.moe_router_sigmoid;
  shape.recompute = plan.recompute_modules;
  if (model.is_latent_attention()) {
    shape.mla_q_rank = model.latent_attention.q_lora_rank;
    shape.mla_kv_rank = model.latent_attention.kv_lora_rank;
    shape.mla_rope_dim = model.latent_attention.qk_rope_head_dim;
    shape.v_width = model.v_width() / tp;
  }
  shape.lora_rank = plan.lora_rank;
  shape.lora_all_linear = plan.lora_all_linear;
  shape.qlora = plan.qlora;
  // fp32 adapters (no master copy: PEFT's dtype) in a bf16 step run under autocast, whose casts of A
  // and B are saved; DeepSpeed's mixed precision keeps bf16 adapters and TRL casts QLoRA's to bf16.
  shape.lora_adapter_casts = plan.lora() && profile.master_weight_bytes == 0 && lora_adapter_bytes(profile, plan) > as_double(profile.activation_bytes);
  // One sequence per sample: the ALST runs measured unpacked samples (paper §5.4), so the kernel
  // sees micro_batch sequences.
  shape.sequences = plan.micro_batch;
  if (plan.tiled_mlp) {
    const int64_t tiles = plan.mlp_tiles > 0 ? plan.mlp_tiles : mlp_tiles_deepspeed_rule(seqlen / plan.sequence_ranks(), model.hidden_size);
    shape.mlp_tiles = std::min(tiles, shape.tokens);
  }
  if (plan.fpdt) {
    // FPDT chunks attention by fpdt_chunk_tokens of the global sequence, its FFN by half a local
    // chunk (Megatron-DeepSpeed: fpdt_chunk_size // P // 2) and its loss by a 32nd of a local chunk
    // (fpdt_chunk_size // P // 32), REFERENCE §3.6.
    const int64_t local_chunk = plan.fpdt_chunk_tokens / plan.sp;
    shape.fpdt_chunk_tokens = std::min(plan.micro_batch * local_chunk, shape.tokens);
    shape.mlp_tiles = std::max<int64_t>(1, (seqlen / plan.sp) / std::max<int64_t>(1, local_chunk / 2));
  }

  LayerImplementation& impl = setup.impl;
  impl.activation_bytes = profile.activation_bytes;
  impl.moe_experts = profile.moe_experts;
  impl.context_parallel_allgather = profile.ring_implementation == RingImplementation::ring_torch_allgather;
  impl.context_parallel_all_to_all = impl.context_parallel_allgather && plan.cp_all_to_all;
  impl.ulysses_staging_copies = profile.ulysses_staging_copies;
  impl.flash_attention_dq_accumulator = profile.flash_attention_dq_accumulator;
  impl.flash_attention_expands_gqa_grads = profile.flash_attention_expands_gqa_grads;
  impl.flash_attention_3 = attention_kernel_for(profile, card, plan) == "fa3";
  impl.flash_attention_varlen_pad_rows = profile.flash_attention_varlen_pad_rows;
  impl.megatron_te_layer = profile.megatron_te_layer;
  impl.megatron_te_cross_entropy = profile.megatron_te_cross_entropy;
  impl.megatron_fused_swiglu = profile.megatron_fused_swiglu;
  impl.te_fp8 = plan.fp8 && profile.megatron_te_layer;
  impl.te_fp8_transposed_copies = card.fp8_transposed_copies;
  impl.megatron_cp_all_gather = plan.cp_all_gather;
  // Liger's kernels are left out when the profile installs them only with the tiled loss and the
  // plan does not tile it: then neither its norm nor its SwiGLU runs. ALST also turns Liger's
  // SwiGLU off when TiledMLP is on (AT-code model/liger_factory.py).
  const bool liger_left_out = profile.liger_kernels == LigerKernels::liger_with_tiled_loss && !plan.tiled_loss;
  const bool liger = profile.liger_kernels != LigerKernels::liger_never && !liger_left_out;
  impl.fused_swiglu = profile.fused_swiglu && !liger_left_out && !plan.tiled_mlp;
  impl.eager_rms_norm = profile.eager_rms_norm_without_liger && !liger;
  if (profile.zero3_tiled_mlp_holds_weight_grads && plan.zero_stage == 3 && shape.mlp_tiles > 0 && !plan.fpdt) {
    const double matrices = model.mlp_kind == MlpKind::mlp_kind_swiglu ? 3.0 : 2.0;
    impl.mlp_tile_weight_grads_bytes = matrices * as_double(model.hidden_size) * as_double(model.intermediate_size) *
                                       as_double(profile.working_gradient_bytes);
  }

  if (plan.tiled_loss) {
    if (profile.loss_tiling == LossTiling::loss_tiling_unsloth) {
      setup.loss = LossImplementation::loss_unsloth_fused;
      const int64_t chunks = plan.loss_tiles > 0 ? plan.loss_tiles : loss_chunks_unsloth_rule(shape.tokens, model.vocab_size);
      setup.loss_tile_tokens = (shape.tokens + chunks - 1) / chunks;
    } else if (profile.loss_tiling == LossTiling::loss_tiling_liger) {
      setup.loss = LossImplementation::loss_liger_chunked;
      setup.loss_tile_tokens = plan.loss_tiles > 0 ? (shape.tokens + plan.loss_tiles - 1) / plan.loss_tiles
                                                   : loss_chunk_tokens_liger(shape.tokens, model.vocab_size, model.hidden_size);
    } else {
      setup.loss = LossImplementation::loss_token_shards;
      const int64_t shards = plan.loss_tiles > 0 ? plan.loss_tiles : loss_shards_arctic_rule(shape.tokens, model.vocab_size);
      setup.loss_tile_tokens = (shape.tokens + shards - 1) / shards;
      // A fixed chunk (TRL's chunked_nll: 256 tokens a chunk) unless the plan sets the tiles.
      if (plan.loss_tiles == 0 && profile.loss_chunk_tokens > 0) setup.loss_tile_tokens = profile.loss_chunk_tokens;
    }
    setup.loss_tile_tokens = std::min(setup.loss_tile_tokens, shape.tokens);
  }
  if (plan.fpdt) {
    setup.loss = LossImplementation::loss_token_shards;
    setup.loss_tile_tokens = std::min(std::max<int64_t>(1, plan.fpdt_chunk_tokens / plan.sp / 32), shape.tokens);
  }
  return setup;
}

// The bytes on a GPU of one trainable parameter's gradient, after ZeRO/FSDP2 shard it; 0 where
// gradients leave the GPU (an offloaded optimizer's fp32 gradients). LoRA: the adapters' (fp32 in
// DeepSpeed's mixed precision, else PEFT's dtype or TRL's bf16 cast, Reference §12 items 8, 13).
double gradient_bytes_per_trainable(const ClusterSpec& cluster, const PlanOptions& plan, const RuntimeProfile& profile) {
  const double gradient_shards = plan.zero_stage >= 2 ? as_double(plan.shard_ranks(cluster.gpus)) : 1;
  if (plan.lora() && plan.offload_optimizer) return 0;  // the adapters' gradients go to the host with their optimizer
  if (plan.lora())
    return (profile.master_weight_bytes > 0 ? as_double(profile.gradient_bytes) : lora_adapter_bytes(profile, plan)) / gradient_shards;
  return plan.offload_optimizer ? 0 : as_double(profile.gradient_bytes) / gradient_shards;
}

const char* gradients_name(const PlanOptions& plan, const RuntimeProfile& profile) {
  const bool bf16 = plan.lora() && profile.master_weight_bytes == 0 ? lora_adapter_bytes(profile, plan) == 2 : profile.gradient_bytes == 2;
  if (plan.lora()) return bf16 ? "lora_gradients_bf16" : "lora_gradients_fp32";
  return bf16 ? "gradients_bf16" : "gradients_fp32";
}

// `with_gradients` false: a profile whose gradients live from backward to the optimizer step
// (gradients_freed_after_step) holds none outside backward; its phases place them.
void static_tensors_place(TensorTrace& trace, const ModelSpec& model, const ClusterSpec& cluster,
                          const PlanOptions& plan, const RuntimeProfile& profile, const Setup& setup, int64_t seqlen,
                          StepInputs inputs, bool with_gradients) {
  // Under tensor parallelism a rank holds 1/t of every linear, the embedding and the LM head
  // (vocabulary-parallel); the norms' weights, replicated over the TP ranks, are a rounding error.
  const double tp = as_double(std::max<int64_t>(1, plan.tp));
  const double params = as_double(setup.params.total) / tp;
  // A rank holds its ep share of the experts, whole (expert tensor parallelism 1, as the export
  // writes it: every TP rank holds its ep share), and its TP share of the rest (reference-megatron-core
  // M6.3): the weights and the DDP's gradient buffer. Without Megatron's layouts (t = ep = 1) that is
  // every parameter.
  const double ep = as_double(std::max<int64_t>(1, plan.ep));
  const double rank_params = (as_double(setup.params.total) - setup.expert_parameters) / tp + setup.expert_parameters / ep;
  // ZeRO partitions over all ranks (data x sequence parallel; REFERENCE training configuration):
  // stage 1 the optimizer states and master weights, stage 2 also gradients (gradient_bytes_per_trainable),
  // stage 3 also weights; FSDP2's HSDP over one replica's ranks (Reference §11 F1.10). Megatron's
  // distributed optimizer (stage 1's layout) shards a TP rank's share of its pipeline stage over the
  // data x context parallel ranks holding the same share (reference-megatron-core M2.4, M3.2):
  // world / (t p) of them. (Under pipeline parallelism setup.params is the stage's.)
  const double shards = as_double(plan.shard_ranks(cluster.gpus)) / tp / as_double(std::max<int64_t>(1, plan.pp));
  const double optimizer_shards = plan.zero_stage >= 1 ? shards : 1;
  const double weight_shards = plan.zero_stage >= 3 ? shards : 1;
  // The distributed optimizer shards the experts' share over the expert-data-parallel ranks that
  // hold the same experts, world / (ep p) of them (distrib_optimizer.py builds one buffer per
  // group, expert parameters with expt_dp_group), the rest as above.
  const double expert_optimizer_shards =
      plan.zero_stage >= 1 ? as_double(plan.shard_ranks(cluster.gpus)) / ep / as_double(std::max<int64_t>(1, plan.pp)) : 1.0;
  const double optimizer_params =
      (as_double(setup.params.total) - setup.expert_parameters) / tp / optimizer_shards + setup.expert_parameters / ep / expert_optimizer_shards;
  if (plan.lora()) {
    // A frozen base and fp32 adapters (Reference §12 (i)): the base in its storage dtype with no
    // gradient, master or optimizer state (items 11-12); QLoRA's linears in NF4 with double
    // quantization, and everything else (embedding, LM head, norms) as the stack keeps it:
    // prepare_model_for_kbit_training's fp32 upcast, or Unsloth's bf16 (item 13). The adapters are
    // fp32 (item 8) with fp32 gradients and AdamW moments: 4 + 4 + 8 bytes each.
    const double linears = as_double(layer_linear_parameter_count(model));
    if (plan.qlora) {
      if (plan.zero_stage == 3) {
        // ZeRO-3 with bnb_4bit_quant_storage=bfloat16 (Reference §12 item 14): the packed values are a
        // bf16 parameter, partitioned like any; the quantization state rides on the Params4bit object,
        // outside what ZeRO partitions, so every rank keeps it whole [inferred from items 14, 17-18].
        const Nf4LayerBytes nf4 = nf4_layer_bytes(model, /*double_quant=*/true);
        trace.alloc(kCategoryModelStates, "base_linears_nf4_packed", as_double(model.num_layers) * nf4.packed / weight_shards);
        trace.alloc(kCategoryModelStates, "base_linears_nf4_quant_state", as_double(model.num_layers) * nf4.quant_state);
      } else {
        trace.alloc(kCategoryModelStates, "base_linears_nf4", nf4_layer_linears_bytes(model, /*double_quant=*/true));
      }
      const double unquantized_bytes = profile.qlora_unquantized_weight_bytes;
      trace.alloc(kCategoryModelStates, unquantized_bytes == 4 ? "base_other_weights_fp32" : "base_other_weights_bf16",
                  (params - linears) * unquantized_bytes / weight_shards);
    } else {
      // The frozen base in the stack's weight dtype (a frozen parameter is not upcast: Accelerate
      // upcasts requires_grad ones, Reference §11 F1.14), sharded under ZeRO-3/FSDP2; longseq's
      // executor keeps it in the kernels' dtype (fp32 on the CPU).
      const double base_bytes = profile.step_schedule == "executor" ? as_double(profile.weight_bytes)
                                                                    : std::min<double>(2.0, as_double(profile.weight_bytes));
      // ZeRO-3's offload_param keeps every partition on the host, frozen ones too (host_items).
      if (!plan.offload_params) trace.alloc(kCategoryModelStates, "base_weights", params * base_bytes / weight_shards);
    }
    const double adapters = as_double(lora_parameter_count(model, plan.lora_rank, plan.lora_all_linear));
    if (profile.master_weight_bytes > 0) {
      // DeepSpeed's mixed precision trains the adapters as any parameter: bf16 weights, fp32
      // master, fp32 gradients and AdamW moments, each sharded by its stage.
      // ZeRO-Offload moves the adapters' master, gradients and moments to the host as it would any
      // trainable partition; offload_param their bf16 partitions (host_items).
      if (!plan.offload_params) trace.alloc(kCategoryModelStates, "lora_adapters", adapters * as_double(profile.weight_bytes) / weight_shards);
      if (!plan.offload_optimizer)
        trace.alloc(kCategoryModelStates, "lora_master_weights", adapters * as_double(profile.master_weight_bytes) / optimizer_shards);
    } else {
      // PEFT's fp32 adapters (autocast_adapter_dtype, item 8), or FSDP2's upcast of them; TRL's
      // bf16 cast of a quantized model's trainable parameters (item 13).
      const double adapter_bytes = lora_adapter_bytes(profile, plan);
      trace.alloc(kCategoryModelStates, adapter_bytes == 2 ? "lora_adapters_bf16" : "lora_adapters_fp32", adapters * adapter_bytes / weight_shards);
    }
    if (with_gradients) trace.alloc(kCategoryModelStates, gradients_name(plan, profile), adapters * gradient_bytes_per_trainable(cluster, plan, profile));
    // AdamW's exp_avg and exp_avg_sq take the parameter's dtype (zeros_like; Reference §11 F1.5).
    const double moment_bytes = profile.master_weight_bytes > 0 ? 4.0 : lora_adapter_bytes(profile, plan);
    if (plan.adam_8bit)
      trace.alloc(kCategoryModelStates, "lora_optimizer_states_8bit", adam_8bit_lora_state_bytes(model, plan.lora_rank, plan.lora_all_linear));
    else if (!plan.offload_optimizer)
      trace.alloc(kCategoryModelStates, "lora_optimizer_states", adapters * 2.0 * moment_bytes / optimizer_shards);
  } else {
    if (!plan.offload_params)
      trace.alloc(kCategoryModelStates, "weights", rank_params * as_double(profile.weight_bytes) / weight_shards);
    if (!plan.offload_optimizer) {
      // Named by dtype: the optimizer's copy is fp32 beside bf16 weights (DeepSpeed, FSDP2's upcast),
      // or the parameter's own dtype in the pure-bf16 regime (Reference §11 F1.5).
      if (with_gradients)
        trace.alloc(kCategoryModelStates, gradients_name(plan, profile), rank_params * gradient_bytes_per_trainable(cluster, plan, profile));
      trace.alloc(kCategoryModelStates, "master_weights", optimizer_params * as_double(profile.master_weight_bytes));
      if (plan.adam_8bit)
        trace.alloc(kCategoryModelStates, "optimizer_states_8bit", adam_8bit_model_state_bytes(model) / optimizer_shards);
      else
        trace.alloc(kCategoryModelStates, "optimizer_states", optimizer_params * as_double(profile.optimizer_state_bytes));
    }
  }

  if (setup.fp8_weight_copy_bytes > 0) trace.alloc(kCategoryModelStates, "fp8_weight_copies", setup.fp8_weight_copy_bytes);

  // DDP (replicas without ZeRO): its all-reduce buckets copy every gradient (PyTorch DDP docs,
  // gradient_as_bucket_view).
  if (profile.ddp_gradient_bucket_copy && plan.zero_stage == 0 && cluster.gpus > plan.sequence_ranks())
    trace.alloc(kCategoryModelStates, "ddp_gradient_buckets",
                plan.lora() ? as_double(lora_parameter_count(model, plan.lora_rank, plan.lora_all_linear)) * lora_adapter_bytes(profile, plan)
                            : params * as_double(profile.working_gradient_bytes));

  // The terms of runtime_overhead_bytes, by name.
  trace.alloc(kCategoryRuntime, "cuda_context", profile.cuda_context_gib * kBytesPerGib);
  if (const int64_t communicators = nccl_communicators(profile, cluster.gpus, plan.model_parallel_ranks()); communicators > 0)
    trace.alloc(kCategoryRuntime, "nccl_buffers", as_double(communicators) * profile.nccl_buffers_gib.at(profile.bound) * kBytesPerGib,
                as_double(communicators));
  trace.alloc(kCategoryRuntime, "cublas_workspace", profile.cublas_workspace_mib * 1024.0 * 1024.0);
  if (const double fragmentation = profile.allocator_fragmentation_gib.at(profile.bound); fragmentation > 0)
    trace.alloc(kCategoryRuntime, "allocator_fragmentation", fragmentation * kBytesPerGib);

  // input_ids and shift_labels (int64) for this rank's tokens; position_ids all-gathered to the
  // full sequence for attention when sp > 1 (REFERENCE §3.1); RoPE cos and sin [b, S_l, d].
  if (inputs == StepInputs::none) return;
  const double tokens = as_double(setup.shape.tokens);
  trace.alloc(kCategoryInputs, "input_ids_and_labels", tokens * 16.0);
  trace.alloc(kCategoryInputs, "position_ids", as_double(plan.micro_batch) * as_double(plan.sp > 1 ? seqlen / plan.ring : seqlen / plan.sequence_ranks()) * 8.0);
  if (inputs != StepInputs::batch_and_rope) return;
  // MLA rotates only its qk_rope_head_dim part (YarnRotaryEmbedding over qk_pos_emb_head_dim, M9.1).
  const double rotary_dim = as_double(model.is_latent_attention() ? model.latent_attention.qk_rope_head_dim : model.head_dim);
  if (profile.rope_table_whole_sequence_fp32)
    trace.alloc(kCategoryInputs, "rope_table_whole_sequence", as_double(seqlen) * rotary_dim * 4.0);
  else
    trace.alloc(kCategoryInputs, "rope_cos_sin", 2.0 * tokens * rotary_dim * as_double(profile.activation_bytes));
}

// ZeRO-2/3's gradient bucket, allocated at the first gradient and held through backward
// (DeepSpeed stage3 `__ipg_bucket_flat_buffer`, reduce_bucket_size elements).
void gradient_reduce_bucket_place(TensorTrace& trace, const PlanOptions& plan, const RuntimeProfile& profile,
                                  const Setup& setup) {
  if (plan.zero_stage < 2) return;
  const double bucket = std::min(as_double(profile.zero_reduce_bucket_elements), setup.trainable_total);
  trace.alloc(kCategoryZero, "gradient_reduce_bucket", bucket * as_double(profile.working_gradient_bytes));
}

// FSDP2's [final norm, lm_head] unit, unsharded (in the gathered dtype) from the end of forward
// to its backward (Accelerate fsdp_utils.py L751-768; Reference §11 F1.16); a tied head is the
// embedding's weight.
double fsdp_tail_unit_bytes(const RuntimeProfile& profile, const Setup& setup) {
  const int64_t head = setup.params.lm_head > 0 ? setup.params.lm_head : setup.params.embedding;
  return (as_double(head) + as_double(setup.params.final_norm)) * as_double(profile.gathered_weight_bytes_or_default());
}

// One decoder layer's FSDP2 unit, unsharded: its parameters in the gathered dtype; under FSDP-QLoRA
// the packed NF4 values in their bf16 storage (half a byte a weight; MixedPrecisionPolicy's bf16
// cast leaves them as they are) and the norms cast to bf16, the quantization state being no
// parameter and staying whole on every rank (static_tensors_place).
double fsdp_unit_bytes(const PlanOptions& plan, const RuntimeProfile& profile, const Setup& setup) {
  const double gathered = as_double(profile.gathered_weight_bytes_or_default());
  return plan.qlora ? setup.qlora_packed_per_layer + as_double(setup.params.per_layer_norms) * gathered
                    : as_double(setup.params.per_layer) * gathered;
}

// What ZeRO holds while a decoder layer runs: the layer's gathered weights and the prefetched
// next ones (stage 3), and in backward the reduce bucket and the weight gradient being produced.
void zero_layer_buffers_place(TensorTrace& trace, const PlanOptions& plan, const RuntimeProfile& profile,
                              const Setup& setup, bool backward, double world) {
  const double layer_params = as_double(setup.params.per_layer);
  if (plan.zero_stage == 3 && profile.parameter_sharding == ParameterSharding::sharding_fsdp2) {
    // FSDP2, one unit a decoder layer (Reference §11 F1.6-F1.9): in forward the layer's unsharded
    // parameters, its flat all-gather output (freed late, at the next unit's wait) and the next
    // unit's all-gather in flight; in backward the unsharded layer, the previous unit's prefetched
    // all-gather, the unsharded gradients (param dtype) and the reduce-scatter's input and output
    // (reduce dtype). The [norm, lm_head] unit is never resharded after forward (F1.16).
    const double reduced = as_double(profile.reduce_bytes_or_default());
    const double unit_bytes = fsdp_unit_bytes(plan, profile, setup);
    trace.alloc(kCategoryZero, "fsdp.unsharded_layer", unit_bytes);
    trace.alloc(kCategoryZero, backward ? "fsdp.prefetched_all_gather" : "fsdp.all_gather_output", unit_bytes);
    // CPUOffloadPolicy copies the next unit's shard to the device before its all-gather (F1.12).
    if (fsdp2_cpu_offload(profile, plan))
      trace.alloc(kCategoryZero, "fsdp.sharded_unit_on_device", layer_params * as_double(profile.weight_bytes) / world);
    if (!backward) {
      trace.alloc(kCategoryZero, "fsdp.next_all_gather_in_flight", unit_bytes);
      return;
    }
    // Gradients of the unit's trainable parameters (with LoRA: its adapters, fp32 after the upcast).
    const double layer_trainable = setup.trainable_per_layer;
    // Adapters reduce in their own dtype (PEFT's fp32, or TRL's bf16 under QLoRA: lora_adapter_bytes).
    const double adapter_bytes = plan.lora() ? lora_adapter_bytes(profile, plan) : 0.0;
    const double gradient_bytes = plan.lora() ? adapter_bytes : as_double(profile.working_gradient_bytes);
    trace.alloc(kCategoryZero, "fsdp.unsharded_gradients", layer_trainable * gradient_bytes);
    trace.alloc(kCategoryZero, "fsdp.reduce_scatter_input", layer_trainable * (plan.lora() ? adapter_bytes : reduced));
    trace.alloc(kCategoryZero, "fsdp.reduce_scatter_output", layer_trainable * (plan.lora() ? adapter_bytes : reduced) / world);
    // HSDP: the all-reduce over the replicas keeps its buffer (the reduce dtype, the shard's size)
    // across layers (F1.10).
    if (plan.dp_replicate > 1) trace.alloc(kCategoryZero, "fsdp.hsdp_all_reduce_buffer", layer_trainable * reduced / world);
    // Reference §11 D counts the tail unit in the layers' backward too.
    trace.alloc(kCategoryZero, "fsdp.unsharded_norm_and_lm_head", fsdp_tail_unit_bytes(profile, setup));
    return;
  }
  const bool high_end = profile.bound == EstimateBound::estimate_high_memory;
  if (plan.zero_stage == 3) {
    // A layer gathered in its storage: bf16, or with QLoRA the packed NF4 values (half a byte a
    // weight, in bf16 storage elements) and the norms, which prepare_model_for_kbit_training or the
    // stack keeps in qlora_unquantized_weight_bytes (item 13).
    const double gathered_bytes = plan.qlora ? setup.qlora_packed_per_layer + as_double(setup.params.per_layer_norms) *
                                                                                 profile.qlora_unquantized_weight_bytes
                                             : layer_params * as_double(profile.weight_bytes);
    trace.alloc(kCategoryZero, "gathered_layer_weights", gathered_bytes);
    // The prefetch bucket counts elements of the stored parameters (bf16, or the packed values' bf16 storage).
    const double prefetch = std::min(as_double(profile.zero_prefetch_bucket_elements), gathered_bytes / as_double(profile.weight_bytes));
    trace.alloc(kCategoryZero, "prefetched_weights", prefetch * as_double(profile.weight_bytes));
    // The band's high end: parameters kept gathered up to stage3_max_live_parameters.
    const double extra_live = std::min(as_double(profile.zero3_max_live_parameters), as_double(setup.params.total)) - layer_params - prefetch;
    if (high_end && extra_live > 0)
      trace.alloc(kCategoryZero, "live_parameters_beyond_layer", extra_live * as_double(profile.weight_bytes));
  }
  if (backward && plan.zero_stage >= 2) {
    gradient_reduce_bucket_place(trace, plan, profile, setup);
    // One weight's gradient, produced whole before ZeRO reduces it. A grouped-GEMM MoE keeps each
    // projection of all experts as one parameter (ArcticMoE expert_gate_up [E, h, 2 I_e], moe.py
    // L99-115; transformers 5's MixtralExperts.gate_up_proj [E, 2 I, h]): its gradient spans every expert.
    double largest_matrix = setup.largest_trainable_matrix;
    if (setup.shape.experts > 0 && setup.impl.moe_experts != MoeExperts::moe_hf_expert_loop)
      largest_matrix = std::max(largest_matrix, 2.0 * as_double(setup.shape.experts) * as_double(setup.shape.hidden) *
                                                    as_double(setup.shape.expert_intermediate));
    trace.alloc(kCategoryZero, "weight_gradient_in_flight", largest_matrix * as_double(profile.working_gradient_bytes));
    // The band's high end: the reduce-scatter's flat torch.cat copy of a full bucket, if it falls
    // on the peak (DeepSpeed ZeRO-3 only; comm/coalesced_collectives.py).
    if (high_end && plan.zero_stage == 3 && profile.zero3_max_live_parameters > 0) {
      const double bucket = std::min(as_double(profile.zero_reduce_bucket_elements), setup.trainable_total);
      trace.alloc(kCategoryZero, "reduce_scatter_flat_copy", bucket * as_double(profile.working_gradient_bytes));
    }
  }
}

// TRL's activation offloading keeps the last max_fwd_stash_size = 5 offloaded GPU tensors alive
// through the forward (trl/models/activation_offloading.py; Reference §11 F5.2): under full
// checkpointing the inputs of the last min(5, offloaded) layers.
void trl_forward_stash_place(TensorTrace& trace, const PlanOptions& plan, double x_bytes, double offloaded_layers) {
  if (!plan.trl_activation_offload || offloaded_layers <= 0) return;
  const double stashed = std::min(5.0, offloaded_layers);
  trace.alloc(kCategoryCheckpoints, "trl.offload_forward_stash", stashed * x_bytes, stashed);
}

// Checkpoints (or, without checkpointing, whole saved activation sets) of `layers` layers.
// Without checkpointing the first layer may keep less than the others (`first_layer_saved_bytes`:
// LayerShape::input_requires_grad).
// `layers` resident below the running one, of `total_layers`; of them `earlier_chunks` whole copies of
// the stage's (or chunk's) `chunk_layers` from earlier micro-batches in flight (1F1B), whose
// checkpointed layers block recompute counts a copy at a time, and whose first `dense.in_chunk`
// layers save a dense layer's tensors rather than `saved_bytes_per_layer`.
void resident_activations_place(TensorTrace& trace, const PlanOptions& plan, const RuntimeProfile& profile, const Setup& setup,
                                double layers, double total_layers, double saved_bytes_per_layer, double first_layer_saved_bytes,
                                double chunk_layers, double earlier_chunks, const DenseFirstLayers& dense) {
  const double x_bytes = as_double(setup.shape.hidden_state_tokens()) * as_double(setup.shape.hidden) * as_double(setup.impl.activation_bytes);
  if (plan.activation_checkpointing && plan.checkpoint_offload) {
    // Unsloth's offload reloads into reused device buffers (one or two of the largest hidden
    // state, held all step) and never offloads the last layer's input (Reference §12 items 26, 28).
    if (profile.checkpoint_offload_reload_buffers > 0)
      trace.alloc(kCategoryCheckpoints, "checkpoint_reload_buffers", as_double(profile.checkpoint_offload_reload_buffers) * x_bytes,
                  as_double(profile.checkpoint_offload_reload_buffers));
    if (profile.checkpoint_offload_keeps_last_layer && layers >= total_layers)
      trace.alloc(kCategoryCheckpoints, "hidden_states_last_checkpoint", x_bytes);
    // ALST's copy to the host is synchronous (AT-code monkey_patches.py), so no checkpoint stays
    // on the GPU beyond the layer input the schedule already holds.
    return;
  }
  // TE's activation offloading (M5.3): the first n layers' saved activations are on the host by the
  // time the last n layers run (each copy finished before layer L - n + i; cpu_offload.py L602-622),
  // and reloaded as backward reaches layer L - 1 - n + i: the GPU holds L - n layers' at most.
  if (plan.offload_activation_layers > 0) layers = std::max(0.0, layers - as_double(plan.offload_activation_layers));
  if (layers <= 0) return;
  // The layers below: the checkpointed ones keep their input, the others every tensor they save
  // (all of them without checkpointing; all but one in every N under torchtitan's layer SAC).
  const int64_t resident = static_cast<int64_t>(layers);
  // The resident layers as whole chunks of earlier micro-batches and the running one's layers below it.
  const int64_t whole = static_cast<int64_t>(chunk_layers);
  const int64_t running = std::max<int64_t>(0, resident - static_cast<int64_t>(earlier_chunks) * whole);
  double checkpointed = as_double(plan.checkpointed_layers(resident));
  // Block recompute checkpoints the first n layers of each chunk: n of every earlier micro-batch's
  // copy, and of the running micro-batch's layers below the first n of them.
  if (plan.recompute_block_layers > 0 && chunk_layers > 0)
    checkpointed = earlier_chunks * as_double(plan.checkpointed_layers(whole)) + as_double(plan.checkpointed_layers(running));
  const double saving = layers - checkpointed;
  if (saving > 0) {
    const bool first_saves = !plan.layer_checkpointed(0);
    double saved = (first_saves ? first_layer_saved_bytes : 0.0) + saved_bytes_per_layer * (saving - (first_saves ? 1.0 : 0.0));
    // The dense first layers that save, in each earlier copy and below the running layer.
    if (dense.in_chunk > 0 && chunk_layers > 0) {
      auto dense_saving = [&](int64_t resident_in_copy) {
        int64_t count = 0;
        for (int64_t index = 0; index < std::min(dense.in_chunk, resident_in_copy); ++index) count += plan.layer_checkpointed(index) ? 0 : 1;
        return as_double(count);
      };
      const double dense_saving_layers = earlier_chunks * dense_saving(whole) + dense_saving(running);
      saved -= dense_saving_layers * (saved_bytes_per_layer - dense.saved_bytes);
    }
    trace.alloc(kCategoryCheckpoints, "saved_activations", saved, saving);
  }
  if (checkpointed <= 0) return;
  // Under op-level selective checkpointing a layer keeps its save list's outputs beside its input.
  if (plan.checkpoint_ops)
    trace.alloc(kCategoryCheckpoints, "op_selective_saved", decoder_layer_op_selective_saved_bytes(setup.shape, setup.impl) * checkpointed,
                checkpointed);
  else trace.alloc(kCategoryCheckpoints, "hidden_states_checkpoints", x_bytes * checkpointed, checkpointed);
}

// A decoder layer's weight gradients in the order its backward produces them (LayerWeightGradients):
// the parameters' own, `gradient_bytes` each; with LoRA the adapters' alone (the base is frozen).
LayerWeightGradients layer_weight_gradients(const ModelSpec& model, const PlanOptions& plan, const ParameterCount& params,
                                            double gradient_bytes) {
  LayerWeightGradients gradients;
  if (plan.lora()) {
    for (const LayerLinear& linear : lora_adapted_linears(model, plan.lora_all_linear)) {
      const double adapter = as_double(plan.lora_rank) * as_double(linear.in + linear.out) * gradient_bytes;
      const std::string_view name = linear.name;
      if (name == "gate_proj" || name == "up_proj" || name == "down_proj" || name == "gate_up_proj") gradients.mlp_rest += adapter;
      else gradients.attention_rest += adapter;
    }
    return gradients;
  }
  const double h = as_double(model.hidden_size);
  gradients.attention_output = (h * as_double(model.q_width()) + (model.o_proj_bias ? h : 0)) * gradient_bytes;
  gradients.attention_rest = as_double(params.per_layer_attention + params.per_layer_norms) * gradient_bytes - gradients.attention_output;
  if (!model.is_moe()) gradients.mlp_down = (h * as_double(model.intermediate_size) + (model.mlp_bias ? h : 0)) * gradient_bytes;
  gradients.mlp_rest = as_double(params.per_layer_mlp) * gradient_bytes - gradients.mlp_down;
  return gradients;
}

}  // namespace longseq::memory_detail
