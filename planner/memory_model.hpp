// memory_model.hpp: predicted per-GPU peak memory and per-node host memory for one plan at one
// sequence length, as a named breakdown.
//
// How: the static tensors (model states, ZeRO buffers, runtime overheads) are placed, then three
// phases of one training step are replayed through the decoder-layer inventory — the forward of
// the last layer (most checkpoints resident), the logits and loss, and the recompute+backward of
// the last layer — and the GPU peak is the largest moment of the three, reported with every
// tensor live at that moment. Later layers in backward hold fewer checkpoints, so they cannot be
// higher. Everything is per rank (one GPU) except host memory, which is per node.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models/layer_inventory.hpp"
#include "models/model_spec.hpp"
#include "planner/cards.hpp"
#include "planner/plan.hpp"

namespace longseq {


struct MemoryItem {
  std::string category;
  std::string name;
  double bytes = 0;  // total for the item (count copies included)
  double count = 1;  // e.g. 31 checkpoints folded into one item
};

struct PhasePeak {
  std::string phase;   // "forward of the last decoder layer", "logits and loss", "backward of ...", "optimizer step"
  std::string moment;  // where inside the phase the peak falls
  double bytes = 0;
  std::vector<MemoryItem> items;  // live at the phase's peak (with the breakdown only; no calibrated reserve)
};

struct MemoryPrediction {
  int64_t seqlen = 0;
  int64_t local_tokens = 0;      // b * S / sp
  int64_t mlp_tiles = 0;         // 0 when untiled
  int64_t loss_tile_tokens = 0;  // tokens per loss chunk/shard; 0 when untiled
  int64_t kv_replication = 1;

  std::vector<MemoryItem> gpu_items;  // live at the GPU peak; bytes sum to gpu_peak_bytes
  std::string gpu_peak_phase;
  std::string gpu_peak_moment;
  double gpu_peak_bytes = 0;
  double gpu_calibrated_bytes = 0;  // of gpu_peak_bytes, the profile's calibrated reserve
  double gpu_capacity_bytes = 0;   // usable: the card's memory less the profile's headroom
  double gpu_headroom_bytes = 0;   // what the profile keeps free below the card's memory
  std::vector<PhasePeak> phases;

  std::vector<MemoryItem> host_items;  // per node
  double host_bytes_per_node = 0;
  double host_capacity_bytes = 0;

  bool fits_gpu() const { return gpu_peak_bytes <= gpu_capacity_bytes; }
  bool fits_host() const { return host_bytes_per_node <= host_capacity_bytes; }
  bool fits() const { return fits_gpu() && fits_host(); }
};

// Precondition: plan_problems(...) and seqlen_problems(...) are empty (the CLI checks them and
// reports reasons); violating it throws std::invalid_argument.
// With `with_breakdown` false, gpu_items stays empty (totals, phases and host items are still
// exact): the cheap form the searches use.
// NCCL communicators a rank holds: the world's when there is more than one rank, and the
// runtime's sequence-parallel group's when a sequence spans ranks (`sequence_ranks` = sp x ring).
int64_t nccl_communicators(const RuntimeProfile& profile, int64_t gpus, int64_t sequence_ranks);

// GPU memory the runtime holds outside its tensors: CUDA context, cuBLAS workspace, NCCL buffers
// per communicator, and the caching allocator's fragmentation (the runtime_overheads items), at
// the profile's bound.
double runtime_overhead_bytes(const RuntimeProfile& profile, int64_t gpus, int64_t sequence_ranks = 1);

MemoryPrediction memory_predict(const ModelSpec& model, const ClusterSpec& cluster, const PlanOptions& plan,
                                const RuntimeProfile& profile, int64_t seqlen, bool with_breakdown = true);

// The same answer to fits() for less work where it is "no": the phases go heaviest first and the
// first over the usable GPU memory ends it; that prediction then holds only the GPU peak of that
// phase (no breakdown, phases or host memory). Where everything fits it is memory_predict's.
MemoryPrediction memory_predict_until_over(const ModelSpec& model, const ClusterSpec& cluster, const PlanOptions& plan,
                                           const RuntimeProfile& profile, int64_t seqlen);

// What one decoder layer keeps for backward when it runs without checkpointing, as this plan's
// runtime runs it (the inventory memory_predict replays): every tensor autograd would save, in the
// order the forward creates them, with the layer's input (saved by its first norm's checkpoint when
// checkpointing is on; not by the layer itself otherwise). The frameworks check
// (tests/frameworks) holds this list to PyTorch's own saved-tensor hooks; `plan --tensors` prints it.
std::vector<MemoryItem> layer_saved_tensors(const ModelSpec& model, const ClusterSpec& cluster, const PlanOptions& plan,
                                            const RuntimeProfile& profile, int64_t seqlen);

// DeepSpeed TiledMLP's shard count: ceil(S_l / hidden) (REFERENCE §3.2), at least 1.
int64_t mlp_tiles_deepspeed_rule(int64_t local_tokens, int64_t hidden);

// Liger fused linear cross entropy chunk: next_pow2(ceil(T / ceil(V / h))) (REFERENCE §3.3a).
int64_t loss_chunk_tokens_liger(int64_t tokens, int64_t vocab, int64_t hidden);

// Unsloth's fused cross entropy's chunk count (unsloth_zoo fused_losses/cross_entropy_loss.py
// get_chunk_size, Reference §12 item 32): each chunk's fp32 logits within target_gb, min(half the
// free memory, 4 GiB) (taken as 4: a GPU with 8 GiB free), a multiple of 4; 1 when all fit.
int64_t loss_chunks_unsloth_rule(int64_t tokens, int64_t vocab);

// ArcticTraining's shard count: ceil(T * V * 4 / 2^30), about 1 GiB of fp32 logits per shard.
int64_t loss_shards_arctic_rule(int64_t tokens, int64_t vocab);

}  // namespace longseq
