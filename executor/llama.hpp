// llama.hpp: a Llama-style decoder that trains with real kernels: on the CPU (kernels/cpu, fp32)
// or on a GPU (kernels/cuda, bf16 with fp32 accumulation), by one step written over both.
//
// Parameters live in one flat buffer (gradients and Adam moments in buffers of the same layout).
// Activations are allocated through the device arena under the tensor inventory's names, so the
// arena's peak can be diffed against the planner's `native` prediction. Each memory option
// (checkpointing with recompute, checkpoint offload to the host pool, tiled MLP, tiled loss)
// changes what is live, never the arithmetic: tests hold loss and gradients equal across them.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

#include "executor/arena.hpp"
#include "executor/communicator.hpp"
#include "executor/cpu_ops.hpp"
#include "models/model_spec.hpp"

namespace longseq {

// Offsets of every parameter tensor in the flat buffer.
struct LlamaLayout {
  // A mixture-of-experts layer (ModelSpec::is_moe) keeps, after mlp_norm, the router [E, C], the
  // experts (expert e's gate [F_e, C], up [F_e, C] and down [C, F_e] at experts + e x 3 F_e C),
  // its shared expert as gate_proj/up_proj/down_proj (width shared_expert_intermediate_size; none:
  // empty) and the shared expert's gate [1, C]; a dense layer has router = experts =
  // shared_expert_gate = -1.
  struct Layer {
    int64_t attention_norm, q_proj, k_proj, v_proj, o_proj, mlp_norm, gate_proj, up_proj, down_proj;
    int64_t router = -1, experts = -1, shared_expert_gate = -1;
  };
  int64_t embedding = 0;
  std::vector<Layer> layers;
  int64_t final_norm = 0;
  int64_t lm_head = 0;  // == embedding when tied
  int64_t total = 0;
};

LlamaLayout llama_layout(const ModelSpec& model);

// LoRA (PEFT's LoraConfig, Reference §12 items 1-10): the base frozen, and on each adapted linear
// y = x W^T + (alpha / r) (x A^T) B^T with lora_A [r, in] and lora_B [out, r] trained. PEFT's
// defaults: lora_alpha 8 (LoraConfig), targets q_proj and v_proj unless all linears are asked for.
struct LoraConfig {
  int64_t rank = 0;  // 0: no adapters (full training)
  float alpha = 8.0f;
  bool all_linear = true;
  float scale() const { return rank > 0 ? alpha / static_cast<float>(rank) : 0.0f; }
};

// The decoder layer's linears in the order the step runs them (an adapter's index).
enum class LayerLinearKind { q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj };
inline constexpr int kLayerLinears = 7;
inline constexpr std::array<std::string_view, kLayerLinears> kLayerLinearNames = {"q_proj", "k_proj",  "v_proj",   "o_proj",
                                                                                   "gate_proj", "up_proj", "down_proj"};

// Offsets of every adapter in the adapters' flat buffer (its own: the base keeps its layout).
struct LoraLayout {
  struct Adapter {
    int64_t a = -1, b = -1;  // lora_A [rank, in], lora_B [out, rank]; -1: this linear is not adapted
    int64_t in = 0, out = 0;
    bool present() const { return a >= 0; }
  };
  std::vector<std::array<Adapter, kLayerLinears>> layers;
  int64_t rank = 0;
  float scale = 0;
  int64_t total = 0;
};
// The linears models/adapters.hpp's lora_adapted_linears names (the planner's count is the same).
LoraLayout lora_layout(const ModelSpec& model, const LoraConfig& lora);
// PEFT's initialisation (init_lora_weights=True): lora_A Kaiming-uniform (bound 1/sqrt(in)), here
// from a fixed sine sequence rather than a random generator so every rank agrees; lora_B zero, so
// the adapted model starts as the base.
std::vector<float> lora_initial_adapters(const LoraLayout& layout);

// Throws ConfigError naming what the executor cannot train (GELU, LayerNorm, biases, q/k norms).
void executor_model_check(const ModelSpec& model);

struct TrainingOptions {
  bool activation_checkpointing = false;
  bool checkpoint_offload = false;  // needs checkpointing
  int64_t mlp_tiles = 0;            // 0: untiled
  int64_t loss_tiles = 0;           // 0: untiled
  int64_t loss_tile_tokens = 0;     // >0: tokens per loss tile, instead of loss_tiles (FPDT's rule)
  // FPDT (0: off): this rank's tokens per attention chunk (the plan's global chunk / sp). The
  // sample must be in FPDT's layout (fpdt_layout_rank_tokens): chunk i of every rank together is
  // the i-th global chunk. Needs activation checkpointing (FPDT's recipe).
  int64_t fpdt_chunk_tokens = 0;
  int64_t attention_block = 64;     // tokens per attention block
  // With ring attention: PyTorch context parallelism's default all-gather rotation (Reference §11
  // F2.3, F2.5) instead of passing key/value blocks: each attention pass all-gathers every ring
  // rank's K and V at once (forward, and again in backward); the fp32 dK/dV accumulators still
  // pass from rank to rank (its dkv rotater is always all-to-all).
  bool context_parallel_all_gather = false;
  double rope_theta = 500000.0;     // Llama-3's
  float rmsnorm_eps = 1e-5f;
  // Called after each layer's forward ("forward") and backward ("backward") with the layers done
  // and their count, for progress inside long steps (longseq run prints it); empty: none.
  std::function<void(const char* phase, int64_t done, int64_t layers)> progress;
};

// Ulysses sequence parallelism: this rank holds T = S / sp consecutive tokens of the sample;
// attention all-to-alls over `group` (DeepSpeed's layout, REFERENCE §3.1). Empty: one rank.
struct SequenceParallel {
  Communicator* group = nullptr;              // Ulysses: the ranks that exchange heads
  const int32_t* global_positions = nullptr;  // [S] position ids of the whole sample (attention masks with them)
  // Ring attention (none when null or of one rank): the ranks with this rank's heads in each of the
  // sequence's Ulysses groups; this rank's tokens are laid out by ring_layout_rank_tokens.
  Communicator* ring_group = nullptr;
};

// Where the model's states live and how they are split over the ZeRO group (DeepSpeed's stages):
// 1 shards the optimizer states (and fp32 master weights), 2 also the gradients, 3 also the
// weights. Offloading the optimizer keeps the shard's master weights, gradients and Adam moments
// in the host pool (ZeRO-Offload; with stage 1 the gradients are then reduced into that host shard
// as stage 2 does); offloading the parameters (stage 3) keeps the weight shards there too, each
// brought to the device when its module is gathered (ZeRO-3 offload_param).
//
// With LoRA adapters (lora.rank > 0) only the adapters train: the base weights stay frozen in the
// kernels' dtype with no gradient, master copy or moments; the adapters carry those instead (fp32
// master and moments, and a bf16 copy on the GPU). The executor runs LoRA without ZeRO or offload
// (executor_plan_problems says so); gradients are summed over the sequence's ranks as any.
//
// The precision regime says what the GPU's bf16 schedule keeps (on the CPU, fp32 throughout, they
// coincide): DeepSpeed's mixed precision keeps bf16 weights (sharded by ZeRO-3) beside fp32 master
// weights (sharded with the optimizer); FSDP2 (Accelerate's upcast, torchtitan; Reference §11 F1.1,
// F1.14, F6.4) keeps only the fp32 sharded parameters, the optimizer's own, and casts each module's
// shard to bf16 as it is all-gathered (a one-chunk "fsdp.cast_shard"), reducing in fp32 (torchtitan's
// reduce_dtype; Accelerate's default bf16 reduction is not run here). FSDP2 needs ZeRO stage 3 (it
// always shards) without offload or adapters. The pure-bf16 regime is the plain HF Trainer's with a
// bf16-loaded model (no DeepSpeed, no FSDP; Reference §11 F1.5): bf16 weights, gradients and AdamW
// moments, no master copy, 8 bytes a parameter; here each module's gradient is produced in fp32
// (a module-sized "module_gradient_fp32" transient, the executor's kernels accumulate in fp32) and
// added into the bf16 gradients. It runs on one rank without ZeRO, offload or adapters.
enum class PrecisionRegime { mixed_master, fsdp2, pure_bf16 };
struct ModelStates {
  int zero_stage = 0;
  bool offload_optimizer = false;
  bool offload_params = false;
  LoraConfig lora;
  PrecisionRegime precision = PrecisionRegime::mixed_master;
};

struct StepResult {
  double loss = 0;               // mean over counted tokens
  int64_t counted_tokens = 0;    // labels that are not -100
};

// A whole model: fp32 master weights, their gradients and Adam moments, allocated in `device`,
// trained by one step written once for every device (executor/llama_step.hpp) over `Ops`: the
// CPU's kernels in fp32 (CpuOps, below as LlamaModel) or the GPU's in bf16 (CudaOps).
template <class Ops>
class BasicLlamaModel {
 public:
  using Act = typename Ops::Act;
  // Weights, gradients and both Adam moments are allocated in `device` here (with a separate
  // Act copy of the weights where Act is not float). Throws ConfigError for a model that is not
  // Llama-style (see executor_model_check).
  BasicLlamaModel(const ModelSpec& model, Arena& device);
  // ZeRO-3 over `zero_group`, from the start (DeepSpeed's zero.Init): this rank allocates only
  // its shard of every module's weights, gradients and Adam moments (modules: the embedding,
  // each decoder layer, the final norm with the LM head, each split into equal padded chunks);
  // fill them with load_parameters. A module's weights are all-gathered before it runs and
  // released after; its gradients are reduce-scattered into the shards.
  BasicLlamaModel(const ModelSpec& model, Arena& device, Communicator& zero_group);
  // ZeRO-3 with the optimizer offloaded (ZeRO-Offload, as ALST runs it): this rank's fp32 master
  // weights, gradients and Adam moments live in `optimizer_host`; the device keeps only the weight
  // shard the kernels read. Each module's reduced gradient goes to the host as it is produced;
  // AdamW runs on the host and the updated weights are copied back to the device.
  BasicLlamaModel(const ModelSpec& model, Arena& device, Communicator& zero_group, Arena& optimizer_host);
  // Any ZeRO stage and offload (ModelStates) over `zero_group` (null: one rank); `host` receives
  // what is offloaded. Throws std::invalid_argument for a combination DeepSpeed has no stage for.
  BasicLlamaModel(const ModelSpec& model, Arena& device, Communicator* zero_group, const ModelStates& states, Arena* host);
  // Sets the weights from a full flat vector of parameter_count() values in host memory, held by
  // every rank (a checkpoint); a partitioned model keeps its shard of it. With LoRA: the frozen
  // base, whose adapters start as lora_initial_adapters (load_adapters sets others).
  void load_parameters(const float* full);
  // LoRA: the adapters from a flat vector of lora_layout().total values in host memory.
  void load_adapters(const float* full);
  bool lora() const { return states_.lora.rank > 0; }
  const LoraLayout& lora_layout() const { return lora_layout_; }
  const ModelSpec& spec() const { return spec_; }
  const LlamaLayout& layout() const { return layout_; }
  // This rank's fp32 master weights and gradients (device memory on a GPU, host memory with the
  // optimizer offloaded): all of them, or with ZeRO-3 its shard.
  // (Below ZeRO-3 with the kernels' weights as master: the whole weights, modules padded to the
  // group's chunks; parameters_full() is the plain vector.)
  float* parameters() { return master_data(); }
  const float* parameters() const { return const_cast<BasicLlamaModel*>(this)->master_data(); }
  float* gradients() { return gradients_.data(); }
  const float* gradients() const { return gradients_.data(); }
  int64_t parameter_count() const { return layout_.total; }
  // Values in gradients() (the padded whole, or this rank's shard).
  int64_t local_parameter_count() const { return gradients_.size(); }
  Ops& ops() { return ops_; }

  // Gradients are this rank's shard, already summed over every rank (ZeRO-2/3, or an offloaded
  // optimizer), rather than the whole vector to all-reduce.
  bool partitioned() const { return gradients_partitioned(); }
  bool optimizer_offloaded() const { return states_.offload_optimizer; }
  const ModelStates& states() const { return states_; }
  // The full flat vector, in host memory, from this rank's shards in the sharded layout (every
  // module's chunk in turn: parameters() under ZeRO-3, gradients() under partitioned()), for tests
  // and checkpoints; a collective: every rank of the group must call it.
  std::vector<float> gather_full(const float* shard);
  // The whole fp32 master weights and gradients in host memory, wherever and however they are
  // kept (collectives when sharded: every rank must call them). With LoRA: the adapters' (what
  // trains), in lora_layout()'s order.
  std::vector<float> parameters_full();
  std::vector<float> gradients_full();

  // Forward and backward for one sequence of T tokens: labels pre-shifted (label t is the
  // target of token t, -100 to ignore), position_ids restarting at 0 for every packed document;
  // all three in host memory. Gradients are overwritten. Activations come from `device`;
  // offloaded checkpoints from `host`. With a sequence group of sp ranks, tokens/labels/
  // position_ids are this rank's T tokens; the loss is the token-weighted mean over all ranks
  // and the gradients are summed across them.
  StepResult forward_backward(const int32_t* tokens, const int32_t* labels, const int32_t* position_ids, int64_t T,
                              const TrainingOptions& options, Arena& device, Arena& host, const SequenceParallel& parallel = {});

  // Multiplies this rank's gradients by `factor` (the mean over data-parallel groups).
  void gradients_scale(float factor);

  // PyTorch-style AdamW on every parameter (its moments are allocated with the model).
  void adamw_step(float lr, float beta1, float beta2, float eps, float weight_decay);

 private:
  // A module (the embedding, one decoder layer, the final norm with the LM head) split into
  // `ranks` equal chunks, the last padded: rank r owns [start + r*chunk, start + (r+1)*chunk) of
  // it. Whole buffers (weights below ZeRO-3, gradients below ZeRO-2) hold every module padded to
  // ranks*chunk, so a rank's chunk is contiguous in them: the module begins at padded_start.
  struct Module {
    int64_t start = 0, size = 0, chunk = 0, shard_offset = 0, padded_start = 0;
  };
  // Splits the model into modules_ for `ranks` shards; returns the shard length.
  int64_t plan_modules(int64_t ranks);
  int64_t padded_total() const { return modules_.back().padded_start + modules_.back().chunk * zero_ranks(); }
  int64_t zero_ranks() const { return zero_group_ ? zero_group_->size() : 1; }
  // Where this rank's chunk of `module` starts in a whole (padded) buffer.
  int64_t own_chunk_start(const Module& module) const { return module.padded_start + (zero_group_ ? zero_group_->rank() : 0) * module.chunk; }
  bool weights_partitioned() const { return states_.zero_stage == 3; }
  bool gradients_partitioned() const { return zero_group_ && (states_.zero_stage >= 2 || states_.offload_optimizer); }
  // The master weights are the kernels' weights themselves (fp32 on the device, or both offloaded).
  bool master_is_weights() const;
  // This rank's fp32 master weights, gradient and Adam moments of module m (chunk values each).
  float* module_master(const Module& module);
  float* module_gradient(const Module& module);
  float* master_data();
  // Copies n values to the weights' storage (the device, or the host pool when offloaded).
  void weights_store(Act* destination, const Act* host_values, int64_t n);
  // The weights the kernels read: the master weights themselves, or their Act copy.
  Act* weights();
  ModelSpec spec_;
  LlamaLayout layout_;
  LoraLayout lora_layout_;
  BufferOf<Act> adapters_;  // LoRA: the adapters the kernels read (their fp32 master on the CPU)
  ModelStates states_;
  Communicator* zero_group_ = nullptr;
  SingleRankCommunicator own_group_;  // the ZeRO group when a stage is asked for without one
  std::vector<Module> modules_;  // embedding, layers..., final norm + LM head
  Ops ops_;
  Buffer master_, gradients_, adam_m_, adam_v_;
  BufferOf<Act> weights_copy_;  // where Act is not float (Ops::kSeparateMasterWeights), or offloaded
  bool master_on_host_ = false;     // master_ is in the host pool
  bool cast_at_gather_ = false;     // FSDP2's regime with bf16 kernels: no bf16 shard, master_ cast per gather
  bool act_states_ = false;         // the pure-bf16 regime with bf16 kernels: gradients and moments below
  BufferOf<Act> gradients_act_, adam_m_act_, adam_v_act_;
  // A device buffer as a host vector: fp32 as it is, the kernels' dtype widened on the device.
  std::vector<float> fp32_to_host(const float* values, int64_t n);
  std::vector<float> act_to_host(const Act* values, int64_t n);
  bool gradients_on_host_ = false;  // gradients_ is in the host pool
  int64_t step_ = 0;
};

// The CPU executor: fp32 kernels of kernels/cpu (instantiated in llama.cpp).
using LlamaModel = BasicLlamaModel<CpuOps>;
extern template class BasicLlamaModel<CpuOps>;

}  // namespace longseq
