// cards.hpp: the hardware cards (scenarios/hardware/*.yaml) and runtime profiles
// (planner/profiles/*.yaml), compiled into the binary and also loadable from a path.
//
// Units live in the names: _gib (2^30 bytes), _gbps (10^9 bytes per second), _tflops.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "models/layer_inventory.hpp"

namespace longseq {

// One GPU type and the node it usually sits in. Sources are in the card files.
struct HardwareCard {
  std::string name;
  // Other names --gpu takes for this card (the YAML's `names`): what nvidia-smi prints and the
  // common spellings, compared as hardware_name_normalized writes them.
  std::vector<std::string> names;
  double gpu_memory_gib = 0;          // what the allocator can reach (nvidia-smi total)
  double peak_bf16_tflops = 0;        // dense
  // Dense FP8 tensor peak (the datasheet's, half its "with sparsity" figure); 0: the card has no FP8
  // tensor cores, or no datasheet figure is in its card, and FP8 plans are refused on it.
  double peak_fp8_tflops = 0;
  // FP8 GEMMs here take only the TN layout (compute capability below 10.0, or 12.x: Transformer Engine
  // 2.20.2 utils.py is_non_tn_fp8_gemm_supported), so TE keeps a transposed copy beside each FP8
  // tensor a GEMM reads both ways (Float8TensorStorage._transpose): two bytes an element, one on
  // Blackwell's data-centre parts (10.x), which read the one copy either way.
  bool fp8_transposed_copies = true;
  int64_t gpus_per_node = 0;
  double host_memory_gib = 0;         // per node
  double pcie_host_to_device_gbps = 0;
  double pcie_device_to_host_gbps = 0;
  double nvlink_gbps = 0;             // unidirectional, per GPU
  double internode_gbps_per_node = 0; // unidirectional, per node
  // Achieved rates for the time model.
  double matmul_achieved_tflops = 0;        // measured max bf16 matmul (MAMF)
  double flash_attention_tflops_hd128 = 0;  // FlashAttention fwd+bwd, causal, FA FLOP convention
  double flash_attention_tflops_hd64 = 0;
  // FlashAttention-3 (Hopper only; 0: the card cannot run it), fwd+bwd causal, same convention.
  double flash_attention3_tflops_hd128 = 0;
  double flash_attention3_tflops_hd64 = 0;
  // SDPA's cuDNN backend (PyTorch's "cuDNN Fused Flash Attention"), fwd+bwd causal, same
  // convention; 0: not priced on this card.
  double sdpa_cudnn_tflops_hd128 = 0;
  double sdpa_cudnn_tflops_hd64 = 0;
  // The attention kernel a stack runs on this card unless its profile or the plan says otherwise:
  // "fa3" where FlashAttention-3 runs (Hopper), else "fa2".
  std::string default_attention_kernel = "fa2";
  // The backend PyTorch's SDPA picks here by default (what a profile's "sdpa" runs): "sdpa-cudnn",
  // or "fa2" (SDPA's flash backend is FlashAttention-2's code, Reference §11 F3.1).
  std::string sdpa_default_backend = "fa2";
  double hbm_gbps = 0;
  // Bytes a second the element-wise kernels achieve (0: hbm_gbps, the datasheet's); the CPU device
  // measures its own kernels' (executor/trainer.cpp cpu_rates_measure).
  double elementwise_gbps = 0;
  double nccl_intranode_busbw_gbps = 0;     // NCCL bus bandwidth inside a node
  double nccl_latency_us = 0;               // per collective (alpha)
  double host_memory_gbps = 0;              // host DRAM bandwidth per node (CPU optimizer step)
  // Which of the card's rates no measurement of it backs (scaled from another card's measured share
  // of its peak); every plan on the card says so. Empty: its rates are measured or derived.
  std::string approximate_rates;
};

enum class LossTiling { loss_tiling_liger, loss_tiling_shards, loss_tiling_unsloth };
enum class ParameterSharding { sharding_deepspeed_zero, sharding_fsdp2 };
enum class RingImplementation { ring_usp, ring_torch_allgather };

// Which kernels replace Hugging Face's eager modules (Liger: RMSNorm, RoPE, SwiGLU, fused linear
// cross entropy). ArcticTraining installs them as one set (`model.type: liger`) in the runs that
// tile the loss, and not in the ALST paper's "no-liger" baseline (REFERENCE §2).
enum class LigerKernels { liger_never, liger_always, liger_with_tiled_loss };

// Which end of a term's sourced range a prediction takes. The point prediction takes each term's
// central estimate and the calibrated reserve; the band around it takes, for the longest length,
// every term at its low end without the reserve (the sourced terms alone), and for the shortest,
// every term at its high end with the reserve and the transients ZeRO-3 may add.
enum class EstimateBound { estimate_point, estimate_low_memory, estimate_high_memory };

// A quantity the sources give as a range: an estimate (process runtime, NCCL buffers) with its
// spread, or a transient that may or may not coincide with the peak (low 0).
struct EstimateRange {
  double low = 0, point = 0, high = 0;
  double at(EstimateBound bound) const {
    return bound == EstimateBound::estimate_low_memory ? low : bound == EstimateBound::estimate_high_memory ? high : point;
  }
};

// How a runtime spends memory: dtypes, overheads outside the allocator, and the implementation
// choices that decide which tensors exist (see the profile files for the sources).
struct RuntimeProfile {
  std::string name;
  int64_t activation_bytes = 2;
  int64_t weight_bytes = 2;
  int64_t gradient_bytes = 4;         // the optimizer's gradient copy
  int64_t master_weight_bytes = 4;
  int64_t optimizer_state_bytes = 8;  // Adam m + v
  int64_t working_gradient_bytes = 2; // a weight gradient as backward produces it
  double cuda_context_gib = 0;
  // NCCL's device buffers per communicator the training process creates (none on one rank).
  EstimateRange nccl_buffers_gib;
  // Communicators beside the world's: 1 when the runtime builds a sequence-parallel group of its
  // own whenever sp > 1 (DeepSpeed's parallel_state_sp), 0 when it does not.
  int64_t nccl_sequence_parallel_communicators = 0;
  // The caching allocator's stranded partial pages at the limit, independent of S (REFERENCE §7.3).
  EstimateRange allocator_fragmentation_gib;
  double cublas_workspace_mib = 0;
  // How parameters are sharded when a plan shards them (zero_stage 3): DeepSpeed ZeRO-3's gathered
  // layer, prefetch bucket and reduce bucket, or FSDP2's per-unit all-gather and reduce-scatter
  // buffers (Reference §11 F1.6-F1.9, F1.16).
  ParameterSharding parameter_sharding = ParameterSharding::sharding_deepspeed_zero;
  // Bytes of a weight as a layer computes with it once gathered (FSDP2's param_dtype; 0: weight_bytes)
  // and of a gradient as it is reduced (FSDP2's reduce_dtype; 0: working_gradient_bytes).
  int64_t gathered_weight_bytes = 0;
  int64_t reduce_bytes = 0;
  int64_t gathered_weight_bytes_or_default() const { return gathered_weight_bytes > 0 ? gathered_weight_bytes : weight_bytes; }
  int64_t reduce_bytes_or_default() const { return reduce_bytes > 0 ? reduce_bytes : working_gradient_bytes; }
  // What a ring degree r > 1 runs: USP's ring of key/value blocks, or PyTorch's context
  // parallelism with its default all-gather rotation (Reference §11 F2.2-F2.5).
  RingImplementation ring_implementation = RingImplementation::ring_usp;
  // The tiled loss's shard in tokens when it is a fixed size (TRL's chunked_nll: 256, Reference
  // §11 F5.5); 0: loss_tiling's own rule.
  int64_t loss_chunk_tokens = 0;
  // DistributedDataParallel's all-reduce buckets hold a copy of every gradient (its default
  // gradient_as_bucket_view=False): a second gradients-sized term whenever it replicates the model
  // over more than one rank without ZeRO. False: the runtime runs no DDP (DeepSpeed, the executor).
  bool ddp_gradient_bucket_copy = false;
  // Gradients exist from the backward that produces them to the optimizer step: PyTorch creates
  // param.grad on its first accumulation and zero_grad(set_to_none=True), its default since 2.0
  // (torch/nn/modules/module.py Module.zero_grad), drops it after the step (transformers Trainer
  // _inner_training_loop: optimizer.step() then model.zero_grad(); torchtitan train_step: zero_grad
  // before the step's forward; FSDP2's sharded gradient, Reference §11 F1.4). So no forward holds
  // them and backward holds those of the layers it has passed. False: held all step (DeepSpeed's
  // flat gradient partitions, allocated once; longseq's executor).
  bool gradients_freed_after_step = false;
  // Activation checkpointing is PyTorch's non-reentrant checkpoint (transformers >= 5's default,
  // modeling_utils.py gradient_checkpointing_enable: use_reentrant False; torchtitan's
  // checkpoint_wrapper): the recompute's output is dropped (early_stop ends the recompute at the
  // last saved tensor, torch/utils/checkpoint.py). False: reentrant (transformers 4's default,
  // Unsloth's offloaded checkpointer), whose backward runs torch.autograd.backward(outputs, grads)
  // and holds the recomputed output through the layer's backward.
  bool checkpointing_non_reentrant = false;
  int64_t zero_reduce_bucket_elements = 0;
  int64_t zero_prefetch_bucket_elements = 0;
  int64_t ulysses_staging_copies = 2;
  bool flash_attention_dq_accumulator = false;
  bool flash_attention_expands_gqa_grads = false;
  bool fused_swiglu = false;           // with Liger's kernels installed: SwiGLU is among them
  LigerKernels liger_kernels = LigerKernels::liger_never;
  // Without Liger's RMSNorm, the model's own norm runs eagerly and saves an fp32 upcast of its
  // input and its bf16 normalized value (HF LlamaRMSNorm); false: a fused norm (Megatron, longseq).
  bool eager_rms_norm_without_liger = false;
  // FlashAttention-2's varlen backward pads dq_accum and softmax_d by this many rows per packed
  // sequence (flash_api.cpp mha_varlen_bwd: total_q + 128 * batch_size); 0: no varlen padding.
  int64_t flash_attention_varlen_pad_rows = 0;
  // ZeRO-3 keeps every TiledMLP shard's weight gradients (gate, up, down) until the last shard's
  // backward is done (ulysses_sp.py L829-836; stage3.py L1272-1273), not one matrix in flight.
  bool zero3_tiled_mlp_holds_weight_grads = false;
  // ZeRO-3's stage3_max_live_parameters (0: not modelled). Parameters stay gathered until this
  // many are live, beyond one layer and the prefetch (REFERENCE §7.2): the high end of the band
  // counts them, and the reduce-scatter's flat copy of the bucket (coalesced_collectives.py).
  int64_t zero3_max_live_parameters = 0;
  LossTiling loss_tiling = LossTiling::loss_tiling_shards;
  // How the model code runs a mixture-of-experts block's experts (layer_inventory.hpp MoeExperts);
  // a framework with a MoE implementation of its own overrides it (FrameworkFacts::moe_experts).
  MoeExperts moe_experts = MoeExperts::moe_hf_expert_loop;
  double dataloader_host_bytes_per_token = 0;
  // Host memory DeepSpeed and the training process take beside the offloaded tensors, per rank
  // (REFERENCE §7.5; 0 / false where a runtime has none):
  // ZeRO-3 with the optimizer offloaded stages each reduce-scattered gradient partition in a flat
  // buffer of grad_accum_dtype (the model dtype by default) before the fp32 copy the step reads.
  int64_t zero3_offload_gradient_buffer_bytes = 0;
  EstimateRange host_process_runtime_gb;    // CUDA context and libraries, Python, NCCL host state (RSS)
  EstimateRange host_dataloader_workers_gb; // the DataLoader's worker processes
  // DataLoader workers forked after the optimizer's host buffers exist share their pages; each
  // later write copies them (REFERENCE §7.5): bytes per parameter of the rank's partition.
  EstimateRange host_forked_workers_copy_bytes_per_parameter;
  // The stack's pinned host memory comes from PyTorch's pinned host allocator, which rounds every
  // allocation up to a power of two: DeepSpeed's offload_param buffer (pinned unconditionally) and
  // FPDT's host-resident chunks (models/layer_inventory.hpp pinned_host_allocation_bytes).
  bool pinned_host_allocations_power_of_two = false;
  // Checkpoint offload that reloads into reused device buffers (Unsloth's offloaded checkpointing:
  // one, or two for double buffering, of the largest hidden state; Reference §12 item 28) and keeps
  // the last layer's input on the device (item 26). 0 and false: the offload of ALST (synchronous
  // copies back into fresh tensors, every layer's input offloaded).
  int64_t checkpoint_offload_reload_buffers = 0;
  bool checkpoint_offload_keeps_last_layer = false;
  // Checkpoint offload into pinned host memory, one allocation a layer (Unsloth's CPU_BUFFERS,
  // transformers' offload): rounded as pinned_host_allocations_power_of_two says.
  bool checkpoint_offload_pinned = false;
  // The stack builds its RoPE table for the whole sequence on every rank, one fp32 [S, head_dim]
  // tensor (Megatron-DeepSpeed's RotaryEmbedding(seq_length), issue 25's reading of MDS main
  // 4efb479d), instead of cos/sin for the rank's own tokens in the activation dtype (HF).
  bool rope_table_whole_sequence_fp32 = false;
  // Whose decoder layer and loss the stack runs: a Hugging Face model's (transformers' modeling
  // code, the inventory's default), or Megatron-Core's GPT layer with Transformer Engine and its
  // vocabulary-parallel loss (models/inventory/megatron.cpp): layer_code "megatron_te". Beside it,
  // TE's fused cross entropy (cross_entropy_fusion_impl "te") or Megatron's native one, and the
  // fused SwiGLU (bias_activation_fusion) or the unfused glu.
  bool megatron_te_layer = false;
  bool megatron_te_cross_entropy = false;
  bool megatron_fused_swiglu = true;
  // The share of the node's DRAM bandwidth the offloaded optimizer's host passes achieve (CPU Adam
  // and the casts around it are bandwidth-bound; time_model.cpp offloaded_optimizer_step counts
  // their bytes); 1 = the theoretical bandwidth.
  double cpu_adam_bandwidth_efficiency = 1.0;
  // Under QLoRA, the bytes a parameter of what stays unquantized (embedding, LM head, norms):
  // PEFT's prepare_model_for_kbit_training upcasts it to fp32 (4), Unsloth keeps the model's bf16
  // for frozen parameters (2; Reference §12 item 13).
  double qlora_unquantized_weight_bytes = 4;
  // Under QLoRA, the bytes an adapter parameter is trained in (its gradient and AdamW moments take
  // its dtype): PEFT's fp32 (4; autocast_adapter_dtype, Reference §12 item 8; Unsloth too), or TRL's
  // SFTTrainer, which casts every trainable parameter of a quantized model to bf16 (2; item 13).
  double qlora_adapter_bytes = 4;
  // The attention kernel the stack runs (an id of attention_kernels_all, or "sdpa": whichever
  // backend PyTorch's SDPA picks on the card): its backward buffers (layer_inventory.hpp) and its
  // speed. Empty: the card's default (attention_kernel_for resolves it).
  std::string attention_kernel;
  // How a step's memory is predicted: "phases" replays the three heaviest phases of a framework
  // stack through the layer inventory; "executor" replays longseq's executor step, every layer.
  std::string step_schedule = "phases";
  // With the executor's schedule: the block of its blocked attention kernel, whose workspace it
  // allocates around each attention (kernels/blocked_attention.hpp); 0: a kernel without one.
  int64_t attention_block_tokens = 0;
  // CALIBRATED, not derived: GPU memory the sourced terms do not explain, constant in S (the shape
  // the evidence shows, REFERENCE §7.4), one named line of every breakdown. 0 = none.
  double calibrated_reserve_gib = 0;
  // Published runs of this stack in the record (shared/data, reports/validation.md): 0 says its
  // predictions rest on code reading alone.
  int64_t published_runs = 0;
  // What those runs showed, where no reserve is calibrated on them (one plain sentence, said with
  // every plan of this stack); empty: nothing to add.
  std::string published_evidence;
  // GPU memory a stack cannot use at its limit: a length fits when its peak stays this far below
  // the card's memory (ALST paper §5.3 footnote 17: "when trying to use the last few GiBs of GPU
  // memory the loss would go to NaN"). Not part of any peak; 0 = the whole card.
  EstimateRange usable_memory_headroom_gib;
  // Which end of every EstimateRange the predictions take (runtime_profile_bounded).
  EstimateBound bound = EstimateBound::estimate_point;
};

// The same profile with its ranged terms at one end: estimate_low_memory also drops the
// calibrated reserve (the sourced terms alone), estimate_high_memory keeps it.
RuntimeProfile runtime_profile_bounded(const RuntimeProfile& profile, EstimateBound bound);

// Resolve a built-in card by name (case-insensitive, file stem) or read a YAML file by path.
// Throws ConfigError naming the file and key.
HardwareCard hardware_card_load(const std::string& name_or_path);
RuntimeProfile runtime_profile_load(const std::string& name_or_path);

// The attention kernels a plan can run, each described once: the id --attention, profiles,
// scenarios and cards name it by, how reports label it, what transformers is told to load for it,
// whether PyTorch's SDPA runs it (so PyTorch context parallelism can: its ring calls SDPA's
// flash, efficient and cuDNN kernels only, Reference §11 F2.1), and its rates on a card (the
// YAML keys PREFIX_hd128 and PREFIX_hd64; 0: the card has none, for the reason `availability`).
struct AttentionKernelFacts {
  std::string_view id;
  std::string_view label;
  std::string_view hf_attn_implementation;
  bool sdpa_backend = false;
  double HardwareCard::*tflops_hd128 = nullptr;
  double HardwareCard::*tflops_hd64 = nullptr;
  std::string_view card_rate_prefix;  // "flash_attention3_tflops"
  std::string_view availability;      // "runs on Hopper GPUs only"
  // The head dims the kernel is compiled for, ascending: a head dim between two runs on the larger
  // one's kernel, padded, so it costs that one's FLOPs. Empty: no source says (priced as given).
  std::vector<int64_t> compiled_head_dims;
  std::string_view compiled_head_dims_source;
};
// The head dim `kernel` computes at for a model's `head_dim`: the smallest compiled one at least
// as large, `head_dim` itself where the kernel's list is unknown, 0 past the largest (the kernel
// refuses it: flash_api.cpp's TORCH_CHECK(head_size <= 256)).
int64_t attention_kernel_head_dim(const AttentionKernelFacts& kernel, int64_t head_dim);
const std::vector<AttentionKernelFacts>& attention_kernels_all();
// Throws std::invalid_argument for an id not in the table.
const AttentionKernelFacts& attention_kernel_facts(std::string_view id);
// Every id, plus "sdpa" (SDPA's default backend on the card) where that is accepted: for --attention.
std::vector<std::string> attention_kernel_ids(bool with_sdpa);
bool attention_kernel_known(const std::string& id, bool with_sdpa);
// The same as text, "fa2, fa3, sdpa-cudnn or sdpa": for messages and help.
std::string attention_kernel_choices(bool with_sdpa);
// The kernel `requested` runs on `card`: "" is the card's default, "sdpa" SDPA's default backend
// there; any other id is itself.
std::string attention_kernel_resolve(const std::string& requested, const HardwareCard& card);

HardwareCard hardware_card_from_text(const std::string& yaml_text, const std::string& source_name);
RuntimeProfile runtime_profile_from_text(const std::string& yaml_text, const std::string& source_name);

std::vector<std::string> builtin_hardware_names();
// How --gpu compares names: lower case, '-' between words, no "nvidia-" prefix.
std::string hardware_name_normalized(const std::string& name);
std::vector<std::string> builtin_profile_names();

}  // namespace longseq
