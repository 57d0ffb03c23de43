// replay.cpp: longseq's own executor step (executor/step/), tensor for tensor and in its order: the
// replay schedules of its attention (FPDT, ring), MoE and LoRA blocks, its layer and the whole step.
#include "models/inventory/internal.hpp"

#include <stdexcept>
#include <string>

#include "kernels/blocked_attention.hpp"
#include "models/adapters.hpp"

namespace longseq {

using namespace inventory;

namespace {

// Sizes in bytes for the executor's fp32 buffers.
struct ExecutorBytes {
  double activation_bytes;
  double x, q, kv, kv_global, lse, rstd, f_tile, last_f_tile;
  double attention_forward_workspace = 0, attention_backward_workspace = 0;  // the blocked kernel's
  // act: bytes per activation element (fp32 on the CPU, bf16 on the GPU); rstd and lse are fp32.
  ExecutorBytes(const LayerShape& shape, const ExecutorStepOptions& options) {
    const int64_t act = options.activation_bytes;
    const double t = static_cast<double>(shape.tokens), a = static_cast<double>(act);
    activation_bytes = a;
    if (options.attention_block_tokens > 0) {
      // Attention runs over all sp x T tokens for this rank's heads (executor/llama_step.hpp); ring
      // attention over one chunk (half of them) against one chunk at a time.
      const int64_t head_dim = shape.q_width / shape.num_q_heads;
      const int64_t attention_tokens = shape.tokens * shape.sp / (shape.ring > 1 ? 2 : 1);
      const BlockedAttentionLayout layout(attention_tokens, shape.num_q_heads / shape.sp,
                                          shape.kv_width * shape.kv_replication / head_dim / shape.sp, head_dim,
                                          options.attention_block_tokens);
      attention_forward_workspace = 4.0 * static_cast<double>(layout.workspace_elements(act, false));
      attention_backward_workspace = 4.0 * static_cast<double>(layout.workspace_elements(act, true));
    }
    x = t * static_cast<double>(shape.hidden) * a;
    q = t * static_cast<double>(shape.q_width) * a;
    kv = t * static_cast<double>(shape.kv_width) * a;
    // After Ulysses' all-to-all: all sp x T tokens for this rank's kv heads (n_kv/sp, or one
    // replicated head), i.e. T x (n_kv x d x replication) elements.
    kv_global = kv * static_cast<double>(shape.kv_replication);
    lse = t * static_cast<double>(shape.num_q_heads) * 4;
    rstd = t * 4;
    const int64_t tile = shape.mlp_tiles > 0 ? (shape.tokens + shape.mlp_tiles - 1) / shape.mlp_tiles : shape.tokens;
    f_tile = static_cast<double>(tile) * static_cast<double>(shape.intermediate) * a;
    last_f_tile = static_cast<double>(shape.tokens - (shape.tokens - 1) / tile * tile) * static_cast<double>(shape.intermediate) * a;
  }
};

namespace {

// The tiles a replay walks out of `tiles`. Each tile allocates and frees the same buffers, so a
// full tile leaves the trace as it found it and reaches the same peak as every other full tile:
// the first and the last (which may be shorter) give the whole loop's peak in O(1) steps, however
// many tiles a long sequence has (a length search replays the step dozens of times).
std::vector<int64_t> replayed_tiles(int64_t tiles) {
  if (tiles <= 0) return {};
  if (tiles == 1) return {0};
  return {0, tiles - 1};
}

}  // namespace

int64_t executor_tile_count(const LayerShape& shape) {
  if (shape.mlp_tiles == 0) return 1;
  const int64_t tile = (shape.tokens + shape.mlp_tiles - 1) / shape.mlp_tiles;
  return (shape.tokens + tile - 1) / tile;
}

// FPDT in the executor (executor/llama_step.hpp fpdt_attention_forward/backward), chunk by chunk:
// device buffers in `trace`, the host pool's chunks in `host`.
struct ExecutorFpdtBytes {
  int64_t chunks = 0;
  double q_act, kv_act, q_fp32, kv_fp32, lse, kv_local_act;
  double forward_workspace = 0, backward_workspace = 0;  // the blocked kernel's, per chunk pair
  ExecutorFpdtBytes(const LayerShape& shape, const ExecutorStepOptions& options) {
    if (options.attention_block_tokens > 0) {
      const int64_t head_dim = shape.q_width / shape.num_q_heads;
      const BlockedAttentionLayout layout(shape.fpdt_chunk_tokens * shape.sp, shape.num_q_heads / shape.sp,
                                          shape.kv_width * shape.kv_replication / head_dim / shape.sp, head_dim,
                                          options.attention_block_tokens);
      forward_workspace = 4.0 * static_cast<double>(layout.workspace_elements(options.activation_bytes, false));
      backward_workspace = 4.0 * static_cast<double>(layout.workspace_elements(options.activation_bytes, true));
    }
    const double a = static_cast<double>(options.activation_bytes);
    const double c = static_cast<double>(shape.fpdt_chunk_tokens);
    chunks = shape.tokens / shape.fpdt_chunk_tokens;
    // A chunk over the whole sequence for this rank's heads holds as many elements as the local
    // chunk for every head: c x sp tokens x n/sp heads.
    q_act = c * static_cast<double>(shape.q_width) * a;
    kv_act = c * static_cast<double>(shape.kv_width * shape.kv_replication) * a;
    q_fp32 = q_act / a * 4.0;
    kv_fp32 = kv_act / a * 4.0;
    lse = c * static_cast<double>(shape.num_q_heads) * 4.0;
    kv_local_act = c * static_cast<double>(shape.kv_width) * a;
  }
};

// The replay is O(1) per layer, whatever the chunk count (the plan search probes millions of
// chunks): on the device every chunk from the third on repeats the third's allocations exactly
// (chunk 0 fetches nothing, chunk 1 one pair, later ones a pair and the next), so three chunks
// give the device's peak; the host pool only grows during the forward and the first pass of the
// backward and only shrinks after, so all chunks of a kind enter and leave it as one folded item.
// The host pool's side of the replay (none without `host`): every chunk of a kind as one item.
struct FpdtHostPool {
  TensorTrace* host;
  double chunks;
  void alloc(const char* name, double bytes_per_chunk) const {
    if (host) host->alloc(kCategoryHost, name, bytes_per_chunk * chunks, chunks);
  }
  void free(const char* name) const {
    if (host) host->free(name);
  }
};

void executor_fpdt_forward(TensorTrace& trace, TensorTrace* host, const LayerShape& shape, const ExecutorStepOptions& options, bool keep) {
  const ExecutorFpdtBytes b(shape, options);
  const FpdtHostPool pool{host, static_cast<double>(b.chunks)};
  pool.alloc("fpdt.k_chunks", b.kv_act);
  pool.alloc("fpdt.v_chunks", b.kv_act);
  if (keep) {
    pool.alloc("fpdt.q_chunks", b.q_act);
    pool.alloc("fpdt.output_chunks", b.q_act);
    pool.alloc("fpdt.lse_chunks", b.lse);
  }
  const bool ulysses = shape.sp > 1;
  auto attend = [&] {
    if (b.forward_workspace <= 0) return;
    trace.alloc(L, "attention.workspace", b.forward_workspace);
    trace.free("attention.workspace");
  };
  for (int64_t i = 0; i < std::min<int64_t>(b.chunks, 3); ++i) {
    if (ulysses) {
      trace.alloc(L, "fpdt.q_proj_chunk", b.q_act);  // as large as the exchanged chunk: every head, c tokens
      trace.alloc(L, "fpdt.k_proj_chunk", b.kv_local_act);
      trace.alloc(L, "fpdt.v_proj_chunk", b.kv_local_act);
      for (auto [local, global, bytes] : {std::tuple{"fpdt.q_proj_chunk", "fpdt.q_chunk", b.q_act},
                                          std::tuple{"fpdt.k_proj_chunk", "fpdt.k_chunk", b.kv_act},
                                          std::tuple{"fpdt.v_proj_chunk", "fpdt.v_chunk", b.kv_act}}) {
        trace.alloc(L, "ulysses.staging", bytes);
        trace.free(local);
        trace.alloc(L, global, bytes);
        trace.free("ulysses.staging");
      }
    } else {
      trace.alloc(L, "fpdt.q_chunk", b.q_act);
      trace.alloc(L, "fpdt.k_chunk", b.kv_act);
      trace.alloc(L, "fpdt.v_chunk", b.kv_act);
    }
    trace.alloc(L, "fpdt.output_accumulator", b.q_fp32);
    trace.alloc(L, "fpdt.lse_accumulator", b.lse);
    trace.alloc(L, "fpdt.output_part", b.q_act);
    trace.alloc(L, "fpdt.lse_part", b.lse);
    // Earlier chunks' keys and values, one pair in use and the next one arriving.
    if (i > 0) {
      trace.alloc(L, "fpdt.kv_fetched", b.kv_act);
      trace.alloc(L, "fpdt.kv_fetched", b.kv_act);
    }
    for (int64_t j = 0; j < i; ++j) {
      if (j + 1 < i) {
        trace.alloc(L, "fpdt.kv_prefetched", b.kv_act);
        trace.alloc(L, "fpdt.kv_prefetched", b.kv_act);
      }
      attend();
      trace.free("fpdt.kv_fetched");
      trace.free("fpdt.kv_fetched");
      if (j + 1 < i)
        for (int pair = 0; pair < 2; ++pair) {
          trace.alias("fpdt.kv_prefetched", L, "fpdt.kv_fetched");
          trace.free("fpdt.kv_prefetched");
        }
    }
    attend();  // the chunk's own keys
    trace.free("fpdt.output_part");
    trace.free("fpdt.lse_part");
    trace.alloc(L, "fpdt.output_chunk", b.q_act);
    trace.free("fpdt.output_accumulator");
    trace.free("fpdt.lse_accumulator");
    for (const char* name : {"fpdt.q_chunk", "fpdt.k_chunk", "fpdt.v_chunk"}) trace.free(name);
    if (ulysses) {  // the output chunk back to the tokens' ranks
      trace.alloc(L, "ulysses.staging", b.q_act);
      trace.free("ulysses.staging");
    }
    trace.free("fpdt.output_chunk");
  }
  if (!keep) {
    pool.free("fpdt.v_chunks");
    pool.free("fpdt.k_chunks");
  }
}

void executor_fpdt_backward(TensorTrace& trace, TensorTrace* host, const LayerShape& shape, const ExecutorStepOptions& options) {
  const ExecutorFpdtBytes b(shape, options);
  const FpdtHostPool pool{host, static_cast<double>(b.chunks)};
  const bool ulysses = shape.sp > 1;
  auto chunk_return = [&](double bytes) {
    if (!ulysses) return;
    trace.alloc(L, "ulysses.staging", bytes);
    trace.free("ulysses.staging");
  };
  // First pass, every chunk alike: the output gradient to this rank's heads and the softmax delta.
  if (ulysses) trace.alloc(L, "ulysses.staging", b.q_act);
  trace.alloc(L, "fpdt.output_grad_chunk", b.q_act);
  if (ulysses) trace.free("ulysses.staging");
  trace.alloc(L, "fpdt.output_chunk", b.q_act);
  trace.alloc(L, "fpdt.delta_chunk", b.lse);
  trace.free("fpdt.output_chunk");
  trace.free("fpdt.delta_chunk");
  trace.free("fpdt.output_grad_chunk");
  pool.free("fpdt.output_chunks");
  pool.alloc("fpdt.output_grad_chunks", b.q_act);
  pool.alloc("fpdt.delta_chunks", b.lse);
  pool.alloc("fpdt.q_grad_accumulators", b.q_fp32);
  // Second pass: every key chunk (and each query chunk inside it) alike on the device.
  if (b.chunks > 0) {
    trace.alloc(L, "fpdt.k_chunk", b.kv_act);
    trace.alloc(L, "fpdt.v_chunk", b.kv_act);
    trace.alloc(L, "fpdt.kv_grad_accumulators", b.kv_fp32);
    trace.alloc(L, "fpdt.kv_grad_accumulators", b.kv_fp32);
    {
      trace.alloc(L, "fpdt.q_chunk", b.q_act);
      trace.alloc(L, "fpdt.output_grad_chunk", b.q_act);
      trace.alloc(L, "fpdt.lse_chunk", b.lse);
      trace.alloc(L, "fpdt.delta_chunk", b.lse);
      trace.alloc(L, "fpdt.q_grad_accumulator", b.q_fp32);
      trace.alloc(L, "fpdt.q_grad_part", b.q_act);
      trace.alloc(L, "fpdt.kv_grad_parts", b.kv_act);
      trace.alloc(L, "fpdt.kv_grad_parts", b.kv_act);
      if (b.backward_workspace > 0) {
        trace.alloc(L, "attention.workspace", b.backward_workspace);
        trace.free("attention.workspace");
      }
      for (const char* name : {"fpdt.kv_grad_parts", "fpdt.kv_grad_parts", "fpdt.q_grad_part", "fpdt.q_grad_accumulator", "fpdt.delta_chunk",
                               "fpdt.lse_chunk", "fpdt.output_grad_chunk", "fpdt.q_chunk"})
        trace.free(name);
    }
    trace.free("fpdt.k_chunk");
    trace.free("fpdt.v_chunk");
    for (int pair = 0; pair < 2; ++pair) {  // dk, then dv, back to the tokens' ranks
      trace.alloc(L, "fpdt.kv_grad_chunk", b.kv_act);
      trace.free("fpdt.kv_grad_accumulators");
      chunk_return(b.kv_act);
      trace.free("fpdt.kv_grad_chunk");
    }
    trace.alloc(L, "fpdt.q_grad_accumulator", b.q_fp32);
    trace.alloc(L, "fpdt.q_grad_chunk", b.q_act);
    trace.free("fpdt.q_grad_accumulator");
    chunk_return(b.q_act);
    trace.free("fpdt.q_grad_chunk");
  }
  for (const char* name : {"fpdt.v_chunks", "fpdt.k_chunks", "fpdt.q_grad_accumulators", "fpdt.output_grad_chunks", "fpdt.delta_chunks",
                           "fpdt.lse_chunks", "fpdt.q_chunks"})
    pool.free(name);
}

// Ring attention in the executor (executor/llama_step.hpp ring_attention_forward/backward), after
// its caller's output and lse (forward) or softmax delta (backward). Every step from the second to
// the last but one repeats the second's allocations (a received block held, the next arriving), so
// the first two steps and the last give the peak for any ring degree: O(1) per layer.
std::vector<int64_t> ring_replayed_steps(int64_t ring) {
  if (ring <= 3) {
    std::vector<int64_t> steps(static_cast<size_t>(ring));
    for (int64_t step = 0; step < ring; ++step) steps[static_cast<size_t>(step)] = step;
    return steps;
  }
  return {0, 1, ring - 1};
}

// The received block (and its gradient accumulators) become the held ones.
void ring_arrivals_held(TensorTrace& trace, const char* arriving, const char* held) {
  for (int pair = 0; pair < 2; ++pair) {
    trace.alias(arriving, L, held);
    trace.free(arriving);
  }
}

void executor_ring_forward(TensorTrace& trace, const LayerShape& shape, const ExecutorBytes& b, bool all_gather) {
  const double kv_block = b.kv_global, q_fp32 = b.q / b.activation_bytes * 4.0;
  trace.alloc(L, "ring.output_accumulator", q_fp32);
  trace.alloc(L, "ring.output_part", b.q / 2);
  trace.alloc(L, "ring.lse_part", b.lse / 2);
  if (all_gather) {
    // PyTorch CP's all-gather rotation: every ring rank's K and V held for the whole pass.
    for (int pair = 0; pair < 2; ++pair) trace.alloc(L, "cp.kv_gathered", static_cast<double>(shape.ring) * kv_block);
    if (b.attention_forward_workspace > 0) {
      trace.alloc(L, "attention.workspace", b.attention_forward_workspace);
      trace.free("attention.workspace");
    }
    for (const char* name : {"cp.kv_gathered", "cp.kv_gathered", "ring.output_part", "ring.lse_part", "ring.output_accumulator"})
      trace.free(name);
    return;
  }
  for (int64_t step : ring_replayed_steps(shape.ring)) {
    const bool more = step + 1 < shape.ring;
    if (more)
      for (int pair = 0; pair < 2; ++pair) trace.alloc(L, "ring.kv_arriving", kv_block);
    if (b.attention_forward_workspace > 0) {  // per chunk pair; every step computes at least one
      trace.alloc(L, "attention.workspace", b.attention_forward_workspace);
      trace.free("attention.workspace");
    }
    if (step > 0)
      for (int pair = 0; pair < 2; ++pair) trace.free("ring.kv_block");
    if (more) ring_arrivals_held(trace, "ring.kv_arriving", "ring.kv_block");
  }
  for (const char* name : {"ring.output_part", "ring.lse_part", "ring.output_accumulator"}) trace.free(name);
}

void executor_ring_backward(TensorTrace& trace, const LayerShape& shape, const ExecutorBytes& b, bool all_gather) {
  const double kv_block = b.kv_global, kv_fp32 = b.kv_global / b.activation_bytes * 4.0, q_fp32 = b.q / b.activation_bytes * 4.0;
  if (all_gather) {
    // The whole sequence's K/V gathered again; only the fp32 dK/dV accumulators pass.
    for (int pair = 0; pair < 2; ++pair) trace.alloc(L, "cp.kv_gathered", static_cast<double>(shape.ring) * kv_block);
    trace.alloc(L, "ring.q_grad_accumulator", q_fp32);
    for (int pair = 0; pair < 2; ++pair) trace.alloc(L, "ring.kv_grad_accumulators", kv_fp32);
    for (int64_t step : ring_replayed_steps(shape.ring)) {
      trace.alloc(L, "ring.q_grad_part", b.q);
      for (int pair = 0; pair < 2; ++pair) trace.alloc(L, "ring.kv_grad_parts", kv_block);
      if (b.attention_backward_workspace > 0) {
        trace.alloc(L, "attention.workspace", b.attention_backward_workspace);
        trace.free("attention.workspace");
      }
      for (const char* name : {"ring.kv_grad_parts", "ring.kv_grad_parts", "ring.q_grad_part"}) trace.free(name);
      if (step + 1 == shape.ring) break;
      for (int pair = 0; pair < 2; ++pair) trace.alloc(L, "ring.kv_grad_arriving", kv_fp32);
      for (int pair = 0; pair < 2; ++pair) trace.free("ring.kv_grad_accumulators");
      ring_arrivals_held(trace, "ring.kv_grad_arriving", "ring.kv_grad_accumulators");
    }
    for (int pair = 0; pair < 2; ++pair) trace.free("cp.kv_gathered");
    trace.free("ring.q_grad_accumulator");
    for (int pair = 0; pair < 2; ++pair) {  // dk, then dv: the accumulators go home
      trace.alloc(L, "ring.kv_grad_arriving", kv_fp32);
      trace.free("ring.kv_grad_accumulators");
      trace.free("ring.kv_grad_arriving");
    }
    return;
  }
  trace.alloc(L, "ring.q_grad_accumulator", q_fp32);
  trace.alloc(L, "ring.kv_grad_accumulators", kv_fp32);
  trace.alloc(L, "ring.kv_grad_accumulators", kv_fp32);
  for (int64_t step : ring_replayed_steps(shape.ring)) {
    trace.alloc(L, "ring.q_grad_part", b.q);
    trace.alloc(L, "ring.kv_grad_parts", kv_block);
    trace.alloc(L, "ring.kv_grad_parts", kv_block);
    if (b.attention_backward_workspace > 0) {
      trace.alloc(L, "attention.workspace", b.attention_backward_workspace);
      trace.free("attention.workspace");
    }
    for (const char* name : {"ring.kv_grad_parts", "ring.kv_grad_parts", "ring.q_grad_part"}) trace.free(name);
    if (step + 1 == shape.ring) break;
    for (int pair = 0; pair < 2; ++pair) trace.alloc(L, "ring.kv_arriving", kv_block);
    for (int pair = 0; pair < 2; ++pair) trace.alloc(L, "ring.kv_grad_arriving", kv_fp32);
    if (step > 0)
      for (int pair = 0; pair < 2; ++pair) trace.free("ring.kv_block");
    for (int pair = 0; pair < 2; ++pair) trace.free("ring.kv_grad_accumulators");
    ring_arrivals_held(trace, "ring.kv_arriving", "ring.kv_block");
    ring_arrivals_held(trace, "ring.kv_grad_arriving", "ring.kv_grad_accumulators");
  }
  for (int pair = 0; pair < 2; ++pair) trace.free("ring.kv_block");
  trace.free("ring.q_grad_accumulator");
  for (int pair = 0; pair < 2; ++pair) {  // dk, then dv: the accumulators go home
    trace.alloc(L, "ring.kv_grad_arriving", kv_fp32);
    trace.free("ring.kv_grad_accumulators");
    trace.free("ring.kv_grad_arriving");
  }
}

// executor/llama_step.hpp layer_forward. Leaves "layer.output" and, with keep, the saved tensors.
// LoRA in executor/llama_step.hpp (lora_forward, lora_backward): an adapted linear keeps its
// r-wide x A^T ("lora.<linear>_rank") for lora_B's gradient, or frees it at once without keep;
// its backward holds the r-wide gradient ("lora.rank_grad") while lora_A's runs.
}  // namespace

// The name of each linear's kept x A^T (literals: the trace keeps names as views).
const char* executor_lora_rank_name(std::string_view linear) {
  static constexpr std::pair<std::string_view, const char*> names[] = {
      {"q_proj", "lora.q_proj_rank"},       {"k_proj", "lora.k_proj_rank"}, {"v_proj", "lora.v_proj_rank"},
      {"o_proj", "lora.o_proj_rank"},       {"gate_proj", "lora.gate_proj_rank"}, {"up_proj", "lora.up_proj_rank"},
      {"down_proj", "lora.down_proj_rank"}};
  for (const auto& [name, rank_name] : names)
    if (name == linear) return rank_name;
  throw std::logic_error("executor_lora_rank_name: no linear " + std::string(linear));
}

namespace {

void executor_lora_forward(TensorTrace& trace, const LayerShape& shape, const ExecutorStepOptions& options, const char* linear, bool keep) {
  if (shape.lora_rank <= 0 || !lora_adapts(linear, shape.lora_all_linear)) return;
  const char* name = executor_lora_rank_name(linear);
  trace.alloc(L, name, static_cast<double>(shape.tokens * shape.lora_rank * options.activation_bytes));
  if (!keep) trace.free(name);
}
void executor_lora_backward(TensorTrace& trace, const LayerShape& shape, const ExecutorStepOptions& options, const char* linear) {
  if (shape.lora_rank <= 0 || !lora_adapts(linear, shape.lora_all_linear)) return;
  trace.alloc(L, "lora.rank_grad", static_cast<double>(shape.tokens * shape.lora_rank * options.activation_bytes));
  trace.free("lora.rank_grad");
  trace.free(executor_lora_rank_name(linear));
}

// executor/llama_step.hpp's moe_forward and moe_backward: the router's fp32 probabilities and
// int32 choices, the dispatch's int32 order and positions, the experts over one [T k, ...] buffer
// each (a size the routing does not change), the shared expert and its gate.
struct ExecutorMoeBytes {
  double logits, probs, choices, rows, expert, shared, shared_output, shared_logit;
  ExecutorMoeBytes(const LayerShape& shape, const ExecutorStepOptions& options) {
    const double a = static_cast<double>(options.activation_bytes), t = static_cast<double>(shape.tokens);
    const double r = t * static_cast<double>(shape.experts_per_token);
    logits = t * static_cast<double>(shape.experts) * a;
    probs = t * static_cast<double>(shape.experts) * 4;
    choices = r * 4;  // fp32 weights, int32 indices, order, positions
    rows = r * static_cast<double>(shape.hidden) * a;
    expert = r * static_cast<double>(shape.expert_intermediate) * a;
    shared = t * static_cast<double>(shape.shared_expert_intermediate) * a;
    shared_output = t * static_cast<double>(shape.hidden) * a;
    shared_logit = t * a;
  }
};

void executor_moe_forward(TensorTrace& trace, const LayerShape& shape, const ExecutorStepOptions& options, bool keep) {
  const ExecutorMoeBytes b(shape, options);
  trace.set_moment("forward: moe router");
  trace.alloc(L, "moe.router_logits", b.logits);
  trace.alloc(L, "moe.router_probs", b.probs);
  trace.alloc(L, "moe.routing_weights", b.choices);
  trace.alloc(L, "moe.routing_indices", b.choices);
  trace.free("moe.router_logits");
  trace.alloc(L, "moe.dispatch_order", b.choices);
  trace.alloc(L, "moe.dispatch_positions", b.choices);
  trace.set_moment("forward: moe experts");
  trace.alloc(L, "moe.expert_inputs", b.rows);
  trace.alloc(L, "moe.expert_gate", b.expert);
  trace.alloc(L, "moe.expert_up", b.expert);
  trace.alloc(L, "moe.expert_product", b.expert);
  trace.alloc(L, "moe.expert_outputs", b.rows);
  if (!keep)
    for (const char* name : {"moe.expert_outputs", "moe.expert_product", "moe.expert_up", "moe.expert_gate", "moe.expert_inputs",
                             "moe.dispatch_positions", "moe.dispatch_order", "moe.routing_indices", "moe.routing_weights", "moe.router_probs"})
      trace.free(name);
  if (shape.shared_expert_intermediate == 0) return;
  trace.set_moment("forward: moe shared expert");
  trace.alloc(L, "moe.shared_gate", b.shared);
  trace.alloc(L, "moe.shared_up", b.shared);
  trace.alloc(L, "moe.shared_product", b.shared);
  if (shape.shared_expert_gate) {
    trace.alloc(L, "moe.shared_output", b.shared_output);
    trace.alloc(L, "moe.shared_gate_logit", b.shared_logit);
  }
  if (keep) return;
  if (shape.shared_expert_gate) {
    trace.free("moe.shared_gate_logit");
    trace.free("moe.shared_output");
  }
  for (const char* name : {"moe.shared_product", "moe.shared_up", "moe.shared_gate"}) trace.free(name);
}

void executor_moe_backward(TensorTrace& trace, const LayerShape& shape, const ExecutorStepOptions& options) {
  const ExecutorMoeBytes b(shape, options);
  if (shape.shared_expert_intermediate > 0) {
    trace.set_moment("backward: moe shared expert");
    trace.alloc(L, "moe.shared_product_grad", b.shared);
    if (shape.shared_expert_gate) {
      trace.alloc(L, "moe.shared_output_grad", b.shared_output);
      trace.alloc(L, "moe.shared_gate_logit_grad", b.shared_logit);
      for (const char* name : {"moe.shared_gate_logit_grad", "moe.shared_gate_logit", "moe.shared_output", "moe.shared_output_grad"})
        trace.free(name);
    }
    trace.free("moe.shared_product");
    trace.alloc(L, "moe.shared_gate_grad", b.shared);
    trace.alloc(L, "moe.shared_up_grad", b.shared);
    trace.free("moe.shared_product_grad");
    for (const char* name : {"moe.shared_up_grad", "moe.shared_gate_grad", "moe.shared_up", "moe.shared_gate"}) trace.free(name);
  }
  trace.set_moment("backward: moe experts");
  trace.alloc(L, "moe.expert_outputs_grad", b.rows);
  trace.alloc(L, "moe.routing_weights_grad", b.choices);
  trace.free("moe.expert_outputs");
  trace.alloc(L, "moe.expert_product_grad", b.expert);
  trace.free("moe.expert_outputs_grad");
  trace.free("moe.expert_product");
  trace.alloc(L, "moe.expert_gate_grad", b.expert);
  trace.alloc(L, "moe.expert_up_grad", b.expert);
  trace.free("moe.expert_product_grad");
  trace.alloc(L, "moe.expert_inputs_grad", b.rows);
  for (const char* name : {"moe.expert_up_grad", "moe.expert_gate_grad", "moe.expert_up", "moe.expert_gate", "moe.expert_inputs_grad",
                           "moe.expert_inputs", "moe.dispatch_positions", "moe.dispatch_order"})
    trace.free(name);
  trace.set_moment("backward: moe router");
  trace.alloc(L, "moe.router_logits_grad", b.logits);
  for (const char* name : {"moe.routing_weights_grad", "moe.routing_indices", "moe.routing_weights", "moe.router_probs", "moe.router_logits_grad"})
    trace.free(name);
}

void executor_layer_forward(TensorTrace& trace, TensorTrace* host, const LayerShape& shape, const ExecutorStepOptions& options, bool keep) {
  const ExecutorBytes b(shape, options);
  // The attention kernel's workspace, if it takes one, lives only while it runs.
  auto attend = [&] {
    if (shape.ring > 1) return executor_ring_forward(trace, shape, b, options.context_parallel_all_gather);
    if (b.attention_forward_workspace <= 0) return;
    trace.alloc(L, "attention.workspace", b.attention_forward_workspace);
    trace.free("attention.workspace");
  };
  trace.set_moment("forward: attention");
  trace.alloc(L, "attention_norm.output", b.x);
  trace.alloc(L, "attention_norm.rstd", b.rstd);
  if (shape.fpdt_chunk_tokens > 0) {
    trace.set_moment("forward: fpdt attention");
    trace.alloc(L, "attention.output", b.q);
    executor_fpdt_forward(trace, host, shape, options, keep);
    if (!keep) trace.free("attention_norm.output");
  } else {
  trace.alloc(L, "attention.q", b.q);
  trace.alloc(L, "attention.k", b.kv);
  trace.alloc(L, "attention.v", b.kv);
  for (const char* linear : {"q_proj", "k_proj", "v_proj"}) executor_lora_forward(trace, shape, options, linear, keep);
  if (!keep) trace.free("attention_norm.output");
  if (shape.sp == 1) {
    trace.alloc(L, "attention.output", b.q);
    trace.alloc(L, "attention.lse", b.lse);
    attend();
    if (!keep)
      for (const char* name : {"attention.q", "attention.k", "attention.v", "attention.lse"}) trace.free(name);
  } else {
    // Ulysses (executor/llama_step.hpp): each tensor is packed into a staging buffer and exchanged
    // into a global one; the output comes back through another staging buffer.
    for (auto [name, bytes] : {std::pair{"attention.q_global", b.q}, std::pair{"attention.k_global", b.kv_global},
                               std::pair{"attention.v_global", b.kv_global}}) {
      trace.alloc(L, "ulysses.staging", bytes);
      trace.alloc(L, name, bytes);
      trace.free("ulysses.staging");
    }
    for (const char* name : {"attention.q", "attention.k", "attention.v"}) trace.free(name);
    trace.alloc(L, "attention.output_global", b.q);
    trace.alloc(L, "attention.lse", b.lse);
    attend();
    trace.alloc(L, "ulysses.staging", b.q);
    trace.alloc(L, "attention.output", b.q);
    if (!keep)
      for (const char* name : {"attention.q_global", "attention.k_global", "attention.v_global", "attention.output_global",
                               "attention.lse"})
        trace.free(name);
    trace.free("ulysses.staging");
  }
  }
  trace.set_moment("forward: o_proj and residual");
  trace.alloc(L, "residual.attention", b.x);
  executor_lora_forward(trace, shape, options, "o_proj", keep);
  if (!keep) trace.free("attention.output");
  trace.set_moment("forward: mlp");
  trace.alloc(L, "mlp_norm.output", b.x);
  trace.alloc(L, "mlp_norm.rstd", b.rstd);
  trace.alloc(L, "layer.output", b.x);
  if (shape.experts > 0) {
    executor_moe_forward(trace, shape, options, keep);
  } else {
    const int64_t tiles = executor_tile_count(shape);
    const bool keep_intermediates = keep && shape.mlp_tiles == 0;
    for (int64_t tile : replayed_tiles(tiles)) {
      const double f = tile + 1 == tiles ? b.last_f_tile : b.f_tile;
      trace.alloc(L, "mlp.gate", f);
      trace.alloc(L, "mlp.up", f);
      executor_lora_forward(trace, shape, options, "gate_proj", keep_intermediates);
      executor_lora_forward(trace, shape, options, "up_proj", keep_intermediates);
      trace.alloc(L, "mlp.product", f);
      executor_lora_forward(trace, shape, options, "down_proj", keep_intermediates);
      if (!keep_intermediates)
        for (const char* name : {"mlp.product", "mlp.up", "mlp.gate"}) trace.free(name);
    }
  }
  if (!keep) {
    for (const char* name : {"mlp_norm.output", "mlp_norm.rstd", "residual.attention", "attention_norm.rstd"}) trace.free(name);
  }
}

// executor/llama_step.hpp layer_backward after executor_layer_forward(keep). Expects "layer.input"
// and "layer.output_grad" live; leaves "layer.input_grad".
void executor_layer_backward(TensorTrace& trace, TensorTrace* host, const LayerShape& shape, const ExecutorStepOptions& options) {
  const ExecutorBytes b(shape, options);
  // FlashAttention-2's softmax delta (rowsum(dO * O), fp32 [NQ, T]), then the kernel's workspace or the ring's buffers.
  auto delta_and_attention = [&] {
    trace.alloc(L, "attention.softmax_delta", b.lse);
    if (shape.ring > 1) {
      executor_ring_backward(trace, shape, b, options.context_parallel_all_gather);
    } else if (b.attention_backward_workspace > 0) {
      trace.alloc(L, "attention.workspace", b.attention_backward_workspace);
      trace.free("attention.workspace");
    }
    trace.free("attention.softmax_delta");
  };
  trace.set_moment("backward: mlp");
  trace.alloc(L, "mlp.input_grad", b.x);
  if (shape.experts > 0) {
    executor_moe_backward(trace, shape, options);
  } else {
    const int64_t tiles = executor_tile_count(shape);
    for (int64_t tile : replayed_tiles(tiles)) {
      const double f = tile + 1 == tiles ? b.last_f_tile : b.f_tile;
      if (shape.mlp_tiles > 0) {
        trace.alloc(L, "mlp.gate", f);
        trace.alloc(L, "mlp.up", f);
        trace.alloc(L, "mlp.product", f);
      }
      trace.alloc(L, "mlp.product_grad", f);
      executor_lora_backward(trace, shape, options, "down_proj");
      trace.free("mlp.product");
      trace.alloc(L, "mlp.gate_grad", f);
      trace.alloc(L, "mlp.up_grad", f);
      trace.free("mlp.product_grad");
      executor_lora_backward(trace, shape, options, "gate_proj");
      executor_lora_backward(trace, shape, options, "up_proj");
      for (const char* name : {"mlp.up_grad", "mlp.gate_grad", "mlp.up", "mlp.gate"}) trace.free(name);
    }
  }
  trace.free("mlp_norm.output");
  trace.set_moment("backward: mlp norm");
  trace.alloc(L, "residual.attention_grad", b.x);
  for (const char* name : {"mlp.input_grad", "residual.attention", "mlp_norm.rstd"}) trace.free(name);
  trace.set_moment("backward: attention");
  trace.alloc(L, "attention.output_grad", b.q);
  executor_lora_backward(trace, shape, options, "o_proj");
  trace.alloc(L, "attention.q_grad", b.q);
  trace.alloc(L, "attention.k_grad", b.kv);
  trace.alloc(L, "attention.v_grad", b.kv);
  if (shape.fpdt_chunk_tokens > 0) {
    trace.set_moment("backward: fpdt attention");
    executor_fpdt_backward(trace, host, shape, options);
    trace.free("attention.output_grad");
    trace.free("attention.output");
  } else if (shape.sp == 1) {
    delta_and_attention();
    for (const char* name : {"attention.output_grad", "attention.output", "attention.lse", "attention.q", "attention.k", "attention.v"})
      trace.free(name);
  } else {
    trace.alloc(L, "ulysses.staging", b.q);
    trace.free("attention.output_grad");
    trace.alloc(L, "attention.output_grad_global", b.q);
    trace.free("ulysses.staging");
    trace.alloc(L, "attention.q_grad_global", b.q);
    trace.alloc(L, "attention.k_grad_global", b.kv_global);
    trace.alloc(L, "attention.v_grad_global", b.kv_global);
    delta_and_attention();
    for (const char* name : {"attention.output_grad_global", "attention.output_global", "attention.lse", "attention.q_global",
                             "attention.k_global", "attention.v_global", "attention.output"})
      trace.free(name);
    for (auto [name, bytes] : {std::pair{"attention.q_grad_global", b.q}, std::pair{"attention.k_grad_global", b.kv_global},
                               std::pair{"attention.v_grad_global", b.kv_global}}) {
      trace.alloc(L, "ulysses.staging", bytes);
      trace.free(name);
      trace.free("ulysses.staging");
    }
  }
  trace.alloc(L, "attention.q_proj_grad", b.q);
  trace.free("attention.q_grad");
  trace.alloc(L, "attention.k_proj_grad", b.kv);
  trace.free("attention.k_grad");
  trace.alloc(L, "attention_norm.output_grad", b.x);
  for (const char* linear : {"q_proj", "k_proj", "v_proj"}) executor_lora_backward(trace, shape, options, linear);
  for (const char* name : {"attention.q_proj_grad", "attention.k_proj_grad", "attention.v_grad", "attention_norm.output"}) trace.free(name);
  trace.set_moment("backward: attention norm");
  // The input gradient is the residual gradient's buffer, renamed.
  trace.alias("residual.attention_grad", L, "layer.input_grad");
  trace.free("residual.attention_grad");
  trace.free("attention_norm.rstd");
  trace.free("attention_norm.output_grad");
}

}  // namespace

void executor_step_replay(TensorTrace& trace, const LayerShape& shape, const ExecutorStepOptions& options, TensorTrace* host) {
  const int64_t act = options.activation_bytes;
  const ExecutorBytes b(shape, options);
  const bool keep = !options.checkpointing;
  const bool gather_weights = options.zero_ranks > 0 && options.gather_weights;
  const bool scatter_gradients = options.zero_ranks > 0 && options.scatter_gradients;
  // ZeRO (executor/llama_step.hpp): a module gathered whole (padded to equal chunks), its gradient
  // produced whole, reduce-scattered through a one-chunk buffer.
  auto module_bytes = [&](int64_t parameters) {
    const int64_t chunk = (parameters + options.zero_ranks - 1) / options.zero_ranks;
    return std::pair{static_cast<double>(chunk * options.zero_ranks), static_cast<double>(chunk)};
  };
  // Weights are gathered in the activation type, gradients reduced in fp32.
  auto gather = [&](int64_t parameters, const char* name = "gathered_layer_weights") {
    if (!gather_weights) return;
    trace.alloc(kCategoryZero, name, module_bytes(parameters).first * static_cast<double>(act));
    if (options.cast_shards) {
      trace.alloc(kCategoryZero, "fsdp.cast_shard", module_bytes(parameters).second * static_cast<double>(act));
      trace.free("fsdp.cast_shard");
      return;
    }
    if (!options.offload_params) return;
    trace.alloc(kCategoryZero, "offloaded_weights_in_flight", module_bytes(parameters).second * static_cast<double>(act));
    trace.free("offloaded_weights_in_flight");
  };
  auto release = [&](const char* name = "gathered_layer_weights") {
    if (gather_weights) trace.free(name);
  };
  auto gradient = [&](int64_t parameters, const char* name = "weight_gradient") {
    if (options.module_gradients_fp32) trace.alloc(L, "module_gradient_fp32", static_cast<double>(parameters) * 4);
    else if (scatter_gradients) trace.alloc(kCategoryZero, name, module_bytes(parameters).first * 4);
  };
  auto scatter = [&](int64_t parameters, const char* name = "weight_gradient") {
    if (options.module_gradients_fp32) {
      trace.free("module_gradient_fp32");
      return;
    }
    if (!scatter_gradients) return;
    trace.alloc(kCategoryZero, "gradient_shard_in_flight", module_bytes(parameters).second * 4);
    trace.free(name);
    trace.free("gradient_shard_in_flight");
  };
  // Forward: each layer's input survives as a checkpoint (on the device unless offloaded); the
  // executor names the stored input "layer.input" and each output "layer.output" in turn.
  trace.set_moment("forward: embedding");
  trace.alloc(L, "layer.input", b.x);
  gather(options.embedding_parameters);
  release();
  for (int64_t i = 0; i < options.layers; ++i) {
    gather(options.layer_parameters);
    executor_layer_forward(trace, host, shape, options, keep);
    if (options.checkpoint_offload && host) host->alloc(kCategoryCheckpoints, "hidden_states_checkpoints", b.x);
    release();
    if (options.checkpoint_offload) {
      // The input's copy to the host pool runs while the next layer computes; the previous
      // layer's, done by now, gives its device buffer back.
      if (i > 0) trace.free("checkpoint.offload_in_flight");
      trace.alias("layer.input", L, "checkpoint.offload_in_flight");
      trace.free("layer.input");
    }
    // The output becomes the next layer's input.
    trace.alias("layer.output", L, "layer.input");
    trace.free("layer.output");
  }
  if (options.checkpoint_offload && options.layers > 0) trace.free("checkpoint.offload_in_flight");
  trace.set_moment("loss: logits and cross entropy");
  gather(options.final_parameters);
  gradient(options.final_parameters);
  if (options.tied_embeddings) {
    gather(options.embedding_parameters, "gathered_embedding_weights");
    gradient(options.embedding_parameters, "embedding_weight_gradient");
  }
  trace.alloc(kCategoryLoss, "final_norm.output", b.x);
  trace.alloc(kCategoryLoss, "final_norm.rstd", b.rstd);
  trace.alloc(kCategoryLoss, "final_norm.output_grad", b.x);
  const int64_t tile = options.loss_tile_tokens > 0 ? options.loss_tile_tokens : shape.tokens;
  for (int64_t loss_tile : replayed_tiles((shape.tokens + tile - 1) / tile)) {
    const int64_t t0 = loss_tile * tile;
    const double rows = static_cast<double>(std::min(tile, shape.tokens - t0));
    trace.alloc(kCategoryLoss, "loss.logits", rows * static_cast<double>(shape.vocab) * static_cast<double>(act));
    trace.alloc(kCategoryLoss, "loss.per_token", rows * 4);
    trace.alloc(kCategoryLoss, "loss.logits_grad", rows * static_cast<double>(shape.vocab) * static_cast<double>(act));
    for (const char* name : {"loss.logits", "loss.logits_grad", "loss.per_token"}) trace.free(name);
  }
  trace.free("final_norm.output");
  trace.alloc(L, "layer.output_grad", b.x);
  // The final module's gradient first, then (tied) the embedding's; both gathers released after.
  scatter(options.final_parameters);
  if (options.tied_embeddings) scatter(options.embedding_parameters, "embedding_weight_gradient");
  release();
  if (options.tied_embeddings) release("gathered_embedding_weights");
  for (const char* name : {"final_norm.output_grad", "final_norm.rstd", "layer.input"}) trace.free(name);  // the last output
  // Backward, last layer first. Offloaded inputs are fetched one layer ahead: the fetch of layer
  // i - 1's input runs while layer i computes.
  if (options.checkpoint_offload && options.layers > 0) trace.alloc(L, "checkpoint.prefetched", b.x);
  for (int64_t i = options.layers - 1; i >= 0; --i) {
    gather(options.layer_parameters);
    gradient(options.layer_parameters);
    if (options.checkpoint_offload) {
      if (host) host->free("hidden_states_checkpoints");  // its copy is on the device again
      trace.alias("checkpoint.prefetched", L, "layer.input");
      trace.free("checkpoint.prefetched");
      if (i > 0) trace.alloc(L, "checkpoint.prefetched", b.x);
    }
    if (options.checkpointing) {
      executor_layer_forward(trace, host, shape, options, /*keep=*/true);
      trace.free("layer.output");
    }
    executor_layer_backward(trace, host, shape, options);
    trace.free("layer.output_grad");
    trace.alias("layer.input_grad", L, "layer.output_grad");
    trace.free("layer.input_grad");
    scatter(options.layer_parameters);
    trace.free("layer.input");
    release();
  }
  gradient(options.embedding_parameters);
  scatter(options.embedding_parameters);
  trace.free("layer.output_grad");
}

}  // namespace longseq
