// llama.hpp: a Llama-style decoder that trains with real kernels: on the CPU (kernels/cpu, fp32)
// or on a GPU (kernels/cuda, bf16 with fp32 accumulation), by one step written over both.
//
// Parameters live in one flat buffer (gradients and Adam moments in buffers of the same layout).
// Activations are allocated through the device arena under the tensor inventory's names, so the
// arena's peak can be diffed against the planner's `native` prediction. Each memory option
// (checkpointing with recompute, checkpoint offload to the host pool, tiled MLP, tiled loss)
// changes what is live, never the arithmetic: tests hold loss and gradients equal across them.
#pragma once

#include <cstdint>
#include <vector>

#include "executor/arena.hpp"
#include "executor/communicator.hpp"
#include "executor/cpu_ops.hpp"
#include "models/model_spec.hpp"

namespace longseq {

// Offsets of every parameter tensor in the flat buffer.
struct LlamaLayout {
  struct Layer {
    int64_t attention_norm, q_proj, k_proj, v_proj, o_proj, mlp_norm, gate_proj, up_proj, down_proj;
  };
  int64_t embedding = 0;
  std::vector<Layer> layers;
  int64_t final_norm = 0;
  int64_t lm_head = 0;  // == embedding when tied
  int64_t total = 0;
};

LlamaLayout llama_layout(const ModelSpec& model);

// Throws ConfigError naming what the executor cannot train (GELU, LayerNorm, biases, q/k norms).
void executor_model_check(const ModelSpec& model);

struct TrainingOptions {
  bool activation_checkpointing = false;
  bool checkpoint_offload = false;  // needs checkpointing
  int64_t mlp_tiles = 0;            // 0: untiled
  int64_t loss_tiles = 0;           // 0: untiled
  int64_t attention_block = 64;     // tokens per attention block
  double rope_theta = 500000.0;     // Llama-3's
  float rmsnorm_eps = 1e-5f;
};

// Ulysses sequence parallelism: this rank holds T = S / sp consecutive tokens of the sample;
// attention all-to-alls over `group` (DeepSpeed's layout, REFERENCE §3.1). Empty: one rank.
struct SequenceParallel {
  Communicator* group = nullptr;
  const int32_t* global_positions = nullptr;  // [S] position ids of the whole sample (attention masks with them)
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
  // Sets the weights from a full flat vector of parameter_count() values in host memory, held by
  // every rank (a checkpoint); a partitioned model keeps its shard of it.
  void load_parameters(const float* full);
  const ModelSpec& spec() const { return spec_; }
  const LlamaLayout& layout() const { return layout_; }
  // This rank's fp32 master weights and gradients (device memory on a GPU, host memory with the
  // optimizer offloaded): all of them, or with ZeRO-3 its shard.
  float* parameters() { return master_.data(); }
  const float* parameters() const { return master_.data(); }
  float* gradients() { return gradients_.data(); }
  const float* gradients() const { return gradients_.data(); }
  int64_t parameter_count() const { return layout_.total; }
  int64_t local_parameter_count() const { return master_.size(); }
  Ops& ops() { return ops_; }

  bool partitioned() const { return zero_group_ != nullptr; }
  bool optimizer_offloaded() const { return optimizer_offloaded_; }
  // The full flat vector, in host memory, from this rank's shards (e.g. gradients() or
  // parameters()), for tests and checkpoints; a collective: every rank of the group must call it.
  std::vector<float> gather_full(const float* shard);

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
  struct Module {
    int64_t start = 0, size = 0, chunk = 0, shard_offset = 0;
  };
  // Splits the model into modules_ for `ranks` shards; returns the shard length.
  int64_t plan_modules(int64_t ranks);
  // Weights, gradients and both Adam moments of `elements` values each (all, or a shard).
  // With `optimizer_host`, all but the kernels' weights go there.
  void states_allocate(Arena& device, int64_t elements, Arena* optimizer_host = nullptr);
  // The weights the kernels read: the master weights themselves, or their Act copy.
  Act* weights();
  ModelSpec spec_;
  LlamaLayout layout_;
  Communicator* zero_group_ = nullptr;
  std::vector<Module> modules_;  // embedding, layers..., final norm + LM head (ZeRO-3 only)
  Ops ops_;
  Buffer master_, gradients_, adam_m_, adam_v_;
  BufferOf<Act> weights_copy_;  // where Act is not float (Ops::kSeparateMasterWeights), or offloaded
  bool optimizer_offloaded_ = false;
  int64_t step_ = 0;
};

// The CPU executor: fp32 kernels of kernels/cpu (instantiated in llama.cpp).
using LlamaModel = BasicLlamaModel<CpuOps>;
extern template class BasicLlamaModel<CpuOps>;

}  // namespace longseq
