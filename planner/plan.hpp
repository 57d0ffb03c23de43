// plan.hpp: where a model is trained (ClusterSpec) and how (PlanOptions), with the checks that
// make a plan impossible reported as reasons rather than crashes.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "models/layer_inventory.hpp"
#include "models/model_spec.hpp"
#include "planner/cards.hpp"

namespace longseq {

struct ClusterSpec {
  HardwareCard hardware;
  int64_t gpus = 1;            // world size: one rank per GPU
  int64_t nodes = 1;
  int64_t gpus_per_node = 8;   // defaults to the card's
  double host_memory_gib = 0;  // per node; defaults to the card's

  // Ranks that share one node's host memory (the fullest node).
  int64_t ranks_per_node() const { return gpus < gpus_per_node ? gpus : gpus_per_node; }
};

// Builds a ClusterSpec from what the user gave; 0 means "not given". Throws ConfigError naming the
// flag when the numbers contradict each other (more GPUs than the nodes hold, and so on).
ClusterSpec cluster_make(const HardwareCard& hardware, int64_t gpus, int64_t nodes, int64_t gpus_per_node,
                         double host_memory_gib);

// What the user chooses and every searched plan holds (never searched): the adapters, the
// optimizer's state format, PyTorch CP's rotation and FSDP2's replicate x shard mesh. One struct,
// so a new held choice is one field here (the search copies it whole: SearchOptions::held).
struct HeldChoices {
  // LoRA adapters on a frozen base (PEFT; Reference §12 part A): rank r (0: full fine-tuning), on
  // every linear of a decoder layer (q, k, v, o, gate, up, down: Unsloth's default, PEFT's
  // "all-linear") or on q_proj and v_proj only (PEFT's default for Llama, Qwen, Mistral, Gemma);
  // with `qlora` the base's linears are 4-bit NF4 with double quantization and bf16 compute (the
  // QLoRA recipes' BitsAndBytesConfig).
  int64_t lora_rank = 0;
  bool lora_all_linear = true;
  bool qlora = false;
  bool lora() const { return lora_rank > 0; }
  // Reads the adapters' targets as the CLI and scenarios spell them: "all-linear" (true) or "q,v"
  // (false); throws ConfigError(source, key, ...) for anything else.
  static bool lora_targets_parse(const std::string& text, const std::string& source, const std::string& key);
  // bitsandbytes' 8-bit AdamW (the Trainer's optim="adamw_8bit"): uint8 moments in blocks of 256
  // with an fp32 absmax each, fp32 moments for tensors under 4,096 values (Reference §12 item 23).
  bool adam_8bit = false;
  // Transformer Engine's FP8 under Megatron-Core (--fp8-format hybrid: E4M3 activations and weights,
  // E5M2 gradients; Megatron's default recipe, "delayed" per-tensor scaling; docs/reference-megatron-core.md
  // M10): the decoder layers' linears run FP8 GEMMs, save their inputs in FP8 and keep FP8 copies of
  // their weights across the step's micro-batches. Attention, the norms and the output layer stay bf16.
  bool fp8 = false;
  // PyTorch context parallelism's K/V rotation: all-gather (false: its default, and Accelerate's
  // and torchtitan's) or all-to-all, passing one block to the next rank per step (Reference §11
  // F2.2-F2.3, F4.3, F6.1).
  bool cp_all_to_all = false;
  // Megatron-Core's cp_comm_type all_gather (reference-megatron-core M2.2) for the ring degree: each
  // attention gathers the whole sequence's K and V from the ring's ranks before it runs (not
  // overlapped), and its backward gathers them again and reduce-scatters their gradients; false: p2p.
  bool cp_all_gather = false;
  // A mixture-of-experts model trained with its auxiliary load-balancing loss (transformers'
  // output_router_logits): every layer's router logits kept through the forward and concatenated,
  // one-hot encoded and upcast at the loss (Reference §12 item 67).
  bool moe_aux_loss = false;
  // TRL's activation_offloading=True (Reference §11 F5.2-F5.3): saved_tensors_hooks over the whole
  // step; under full checkpointing exactly each layer's input goes to pinned host memory on a side
  // stream (as checkpoint offload does), and up to max_fwd_stash_size = 5 recently offloaded GPU
  // tensors stay alive through the forward. Planned with checkpointing and its offload (without
  // checkpointing it would offload every saved tensor: not modelled).
  bool trl_activation_offload = false;
  // Samples per rank per step (the papers always use 1; --micro-batch holds another through a search).
  int64_t micro_batch = 1;
  // Samples per optimizer step over the whole cluster (--global-batch; 0: one micro batch per data-
  // parallel rank, no accumulation). Each data-parallel rank runs global / (micro batch x dp)
  // micro-steps and the optimizer steps once (gradient_accumulation_steps).
  int64_t global_batch = 0;
  // FSDP2's HSDP: the model replicated over `dp_replicate` groups and sharded within each over the
  // rest of the ranks (gpus / dp_replicate; Reference §11 F1.10, F1.17); 1: shard over all.
  int64_t dp_replicate = 1;
  // The ranks a sharded state is split over: all of them, or under HSDP one replica's.
  int64_t shard_ranks(int64_t gpus) const { return gpus / dp_replicate; }
};

// 2^20 tiles is more than any length a plan reaches needs; larger counts are typos (the same bound
// for a flag and a scenario key).
inline constexpr int64_t kTileCountLimit = int64_t{1} << 20;

struct PlanOptions : HeldChoices {
  int64_t sp = 1;                       // Ulysses sequence-parallel degree u (heads over u ranks)
  // Ring attention (context parallelism) degree r: r Ulysses groups on one sequence pass key/value
  // blocks around a ring (USP/LoongTrain's 2D sequence parallelism); dp = gpus / (u x r). The
  // causal work is balanced by the zigzag split: the sequence in 2r chunks, ring rank i holding
  // chunks i and 2r-1-i (as Megatron-Core's context parallelism does), so S divides by 2 u r.
  int64_t ring = 1;
  // Ranks one sequence is spread over: u x r (each holds S / (u r) tokens).
  int64_t sequence_ranks() const { return sp * ring; }
  // Megatron-Core's tensor parallelism t with its sequence parallelism (docs/reference-megatron-core.md
  // M1): every linear's weight split over t ranks (column- then row-parallel), the attention's heads
  // and the MLP's width with it, and outside those regions the residual stream split along the
  // sequence (a [S/(u r t), h] shard a rank). The t ranks hold one sequence's u r share together.
  int64_t tp = 1;
  // Megatron-Core's pipeline parallelism: the decoder layers split evenly into `pp` stages on
  // different ranks, run by the 1F1B schedule over the gradient-accumulation micro-batches
  // (reference-megatron-core M4.1): stage 0 holds min(pp, m) micro-batches' activations, the last
  // one; the step pays (pp - 1) micro-batches of bubble.
  int64_t pp = 1;
  // The interleaved schedule (reference-megatron-core M4.2): each rank holds `vpp` model chunks of
  // L / (pp vpp) layers (--num-virtual-stages-per-pipeline-rank); 1: plain 1F1B.
  int64_t vpp = 1;
  // Megatron-Core's expert parallelism (reference-megatron-core M6.3): a MoE layer's experts split
  // over `ep` ranks, each holding experts / ep whole (expert_tensor_parallel_size 1), the routed tokens
  // exchanged among them by all-to-all. The expert ranks come from the same world as the dense
  // layout's (ep divides world / pp: Megatron's expert grid etp-ep-edp-pp), so ep adds no rank.
  int64_t ep = 1;
  // Ranks one model replica spans: t x u x r x p (world = dp x t x u x r x p).
  int64_t model_parallel_ranks() const { return tp * sp * ring * pp; }
  int zero_stage = 3;                   // 0..3
  bool offload_optimizer = false;       // fp32 master, Adam states and fp32 gradients on the host
  bool offload_params = false;          // ZeRO-3 offload_param: bf16 weight partitions on the host
  bool activation_checkpointing = true; // per decoder layer, recomputed in backward
  // With checkpointing, one decoder layer in every `checkpoint_every` is checkpointed and the
  // others keep every tensor they save (torchtitan's layer-selective AC, activation_checkpoint.py
  // _apply_layer_sac: its counter starts at 1, so layers N, 2N, ... (1-based) are wrapped).
  int64_t checkpoint_every = 1;
  // With checkpointing, Megatron-Core's block recompute (recompute_method "block", recompute_num_layers
  // n; reference-megatron-core M5.2): only the first n decoder layers of each pipeline stage (of each
  // model chunk under interleaving) are checkpointed, the others keep every tensor they save. 0: every
  // layer checkpointed (uniform, one layer a chunk).
  int64_t recompute_block_layers = 0;
  // Without checkpointing, Megatron-Core's selective recompute of these modules' outputs
  // (MegatronRecomputeModules; --recompute-granularity selective --recompute-modules).
  MegatronRecomputeModules recompute_modules;
  // Whether the decoder layer at 0-based `index` (counted from its stage's, or chunk's, first) is
  // checkpointed, and how many of the first `count` are.
  bool layer_checkpointed(int64_t index) const {
    if (!activation_checkpointing) return false;
    if (recompute_block_layers > 0) return index < recompute_block_layers;
    return checkpoint_every <= 1 || (index + 1) % checkpoint_every == 0;
  }
  int64_t checkpointed_layers(int64_t count) const {
    if (!activation_checkpointing) return 0;
    if (recompute_block_layers > 0) return std::min(count, recompute_block_layers);
    return checkpoint_every <= 1 ? count : count / checkpoint_every;
  }
  // With checkpointing, every decoder layer under torchtitan's op-level selective AC instead
  // (activation_checkpoint.py _apply_op_sac, selective_ac_option = "op"): each layer keeps its input
  // and the outputs of the ops in its save list (SDPA, and every other mm: q_proj's, v_proj's,
  // gate_proj's, down_proj's), and its backward recomputes only the rest (decoder_layer_op_selective_saved_bytes).
  bool checkpoint_ops = false;
  bool checkpoint_offload = false;      // the checkpointed hidden_states go to the host
  // Megatron-Core's TE activation offloading (cpu_offloading, --cpu-offloading-num-layers; reference-
  // megatron-core M5.3): without recompute, the saved activations of the first `n` layers copied to
  // pinned host memory in forward and back in backward, so the GPU holds L - n layers' (0: none).
  int64_t offload_activation_layers = 0;
  bool tiled_mlp = false;
  int64_t mlp_tiles = 0;                // 0: DeepSpeed's rule ceil(S_l / hidden)
  bool tiled_loss = false;
  int64_t loss_tiles = 0;               // 0: the runtime profile's rule
  // FPDT (REFERENCE §3.6): attention over sequence chunks of `fpdt_chunk_tokens` global tokens
  // with q/k/v/output chunks held in pinned host memory, k/v fetched chunk by chunk (double
  // buffered); MLP and loss chunked too. S must be a multiple of the chunk.
  bool fpdt = false;
  int64_t fpdt_chunk_tokens = 65536;    // DeepSpeed's default ds_sequence_parallel_fpdt_chunk_size
  // The ALST feature set (paper §5.2): ZeRO-3, optimizer offload, checkpointing, Ulysses,
  // tiled MLP, tiled logits+loss, checkpoint offload; on one GPU also parameter offload (every
  // one-GPU case of the paper ran with it).
  static PlanOptions alst(int64_t sp, int64_t gpus = 0);
};

// Data-parallel ranks: replicas of the sequence-parallel group (world / (u x r)).
int64_t data_parallel_ranks(const ClusterSpec& cluster, const PlanOptions& plan);

// Micro-steps a data-parallel rank runs before the optimizer steps: global batch / (micro batch x dp),
// 1 without a global batch. plan_problems refuses a global batch it does not divide into.
int64_t gradient_accumulation_steps(const ClusterSpec& cluster, const PlanOptions& plan);

// Reasons the plan cannot run on this cluster at all (independent of the sequence length), e.g.
// "sp=3 does not divide 32 query heads". Empty when the plan is valid.
std::vector<std::string> plan_problems(const ModelSpec& model, const ClusterSpec& cluster, const PlanOptions& plan);

// Reasons this sequence length cannot be used with the plan (S % sp), empty when it can.
std::vector<std::string> seqlen_problems(const PlanOptions& plan, int64_t seqlen);

// Largest sp <= gpus that divides gpus and satisfies Ulysses' head rules (at least 1).
int64_t sp_largest_valid(const ModelSpec& model, int64_t gpus);

// Ulysses' kv-head rule (DS ulysses_sp.py, REFERENCE §3.1): kv heads per rank after the
// all-to-all, and the replication factor applied before it (1 when none).
int64_t kv_replication_factor(const ModelSpec& model, int64_t sp);

// The length granule of a plan: S must be a multiple of it (u; 2 u r with ring attention's
// zigzag split; an FPDT plan's chunk).
int64_t seqlen_granule(const PlanOptions& plan);

// Megatron's layouts of a plan, "tp=8 pp=2 vpp=2 ep=8" ("" without any): plan_describe's head.
std::string model_parallel_describe(const PlanOptions& plan);
std::string plan_describe(const PlanOptions& plan);
// Megatron's recompute_modules names ("layernorm", "moe_act", "mla_up_proj"), joined by `separator`;
// and read back from a comma-separated list (ConfigError(source, key) naming an unknown one).
std::string megatron_recompute_modules_describe(const MegatronRecomputeModules& modules, const char* separator = ",");
MegatronRecomputeModules megatron_recompute_modules_parse(const std::string& text, const std::string& source, const std::string& key);

// The bytes a LoRA adapter parameter is trained in where the stack keeps no master copy (its
// gradient and AdamW moments take its dtype): fp32 (PEFT), or the profile's under QLoRA (TRL: bf16).
double lora_adapter_bytes(const RuntimeProfile& profile, const PlanOptions& plan);

// The attention kernel a stack runs on this card (an id of attention_kernels_all): the profile's
// (its "sdpa": SDPA's default backend on the card), or where the profile leaves it open, the card's
// default.
std::string stack_attention_kernel(const RuntimeProfile& profile, const HardwareCard& card);

// The attention kernel the plan runs: FPDT's chunks and USP's ring blocks call FlashAttention-2's
// internal forward and backward (DeepSpeed fpdt_layer.py; zhuzilin's ring-flash-attention,
// REFERENCE §3.6, §10), whatever the stack picks elsewhere; PyTorch's context parallelism calls
// SDPA's (Reference §11 F2.1): the stack's kernel where SDPA runs it, else SDPA's default backend
// on the card; otherwise the stack's kernel.
std::string attention_kernel_for(const RuntimeProfile& profile, const HardwareCard& card, const PlanOptions& plan);

// The dense [1, 1, S, S] bool mask transformers builds under SDPA for a padded or packed sample
// (Reference §11 F3.5): S x S bytes.
double sdpa_dense_mask_bytes(int64_t seqlen);

// A ring degree run as PyTorch context parallelism with its all-gather rotation: the stack's ring
// is PyTorch's (RuntimeProfile::ring_implementation) and the plan keeps its default rotation.
bool context_parallel_all_gather(const RuntimeProfile& profile, const PlanOptions& plan);

// FSDP2 with CPUOffloadPolicy: parameters, gradients and optimizer on the host together (the plan
// offloads both; framework_unsupported refuses one without the other).
bool fsdp2_cpu_offload(const RuntimeProfile& profile, const PlanOptions& plan);

}  // namespace longseq
