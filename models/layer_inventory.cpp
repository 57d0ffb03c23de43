// layer_inventory.cpp: the schedules. Each step cites the code whose allocations it mirrors;
// REFERENCE means ../shared/REFERENCE.md, which names the files and versions.
#include "models/layer_inventory.hpp"

#include "kernels/blocked_attention.hpp"
#include "models/adapters.hpp"
#include "models/config_error.hpp"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace longseq {
namespace {

constexpr const char* L = kCategoryLayer;

struct Bytes {
  double x, q, kv, kv_replicated, lse;
  Bytes(const LayerShape& shape, const LayerImplementation& impl) {
    const double tokens = static_cast<double>(shape.tokens);
    const double a = static_cast<double>(impl.activation_bytes);
    x = tokens * static_cast<double>(shape.hidden) * a;
    q = tokens * static_cast<double>(shape.q_width) * a;
    kv = tokens * static_cast<double>(shape.kv_width) * a;
    kv_replicated = kv * static_cast<double>(shape.kv_replication);
    lse = tokens * static_cast<double>(shape.num_q_heads) * 4.0;  // fp32 [b, n_q/sp, S]
  }
};

// Eager RMSNorm's saved tensors beside its output (REFERENCE §7.2): the fp32 upcast of its input
// (read by pow's backward) and the normalized value in the activation dtype (read by the weight
// multiply's backward). Trace names must outlive the trace, hence one literal pair per norm.
// The fp32 rsqrt(variance + eps) [T, 1] (saved by the multiply that applies it) is the layer norms'
// third saved tensor; a q/k norm's per-head one is its own ("attention.q_norm_rstd", sized by heads).
// Held to PyTorch's saved-tensor hooks on transformers' Llama, Qwen and Mistral layers
// (tests/frameworks: each eager RMSNorm saves exactly these three).
struct EagerNormNames {
  const char* input_fp32;
  const char* normalized;
  const char* rstd;  // nullptr: the caller allocates it (a q/k norm's)
};
constexpr EagerNormNames kAttentionNormSaved{"attention_norm.input_fp32", "attention_norm.normalized", "attention_norm.rstd_fp32"};
constexpr EagerNormNames kMlpNormSaved{"mlp_norm.input_fp32", "mlp_norm.normalized", "mlp_norm.rstd_fp32"};
constexpr EagerNormNames kFinalNormSaved{"final_norm.input_fp32", "final_norm.normalized", "final_norm.rstd_fp32"};
constexpr EagerNormNames kQNormSaved{"attention.q_norm.input_fp32", "attention.q_norm.normalized", nullptr};
constexpr EagerNormNames kKNormSaved{"attention.k_norm.input_fp32", "attention.k_norm.normalized", nullptr};

// What a frozen base does not save (LoRA and QLoRA freeze every base parameter, Reference §12 items
// 11-12): a linear saves its input for its weight's gradient alone, so a frozen nn.Linear (LoRA's
// bf16 base) saves none, while bitsandbytes' 4-bit matmul saves it whenever the input needs a
// gradient (QLoRA); a norm's weight multiply saves the normalized value for the weight's gradient
// alone. Held to PyTorch's hooks on PEFT's adapters (tests/frameworks).
bool base_linears_save_input(const LayerShape& shape) { return shape.lora_rank == 0 || shape.qlora; }
bool norm_weights_trained(const LayerShape& shape) { return shape.lora_rank == 0; }

// `normalized_bytes`: the norm's output size in the activation dtype; its rows are shape.tokens.
void eager_norm_saved_alloc(TensorTrace& trace, const char* category, const EagerNormNames& names, double normalized_bytes,
                            const LayerShape& shape, const LayerImplementation& impl) {
  if (!impl.eager_rms_norm) return;
  trace.alloc(category, names.input_fp32, normalized_bytes / static_cast<double>(impl.activation_bytes) * 4.0);
  if (names.rstd) trace.alloc(category, names.rstd, static_cast<double>(shape.tokens) * 4.0);
  if (norm_weights_trained(shape)) trace.alloc(category, names.normalized, normalized_bytes);
}
void eager_norm_saved_free(TensorTrace& trace, const EagerNormNames& names, const LayerShape& shape, const LayerImplementation& impl) {
  if (!impl.eager_rms_norm) return;
  if (norm_weights_trained(shape)) trace.free(names.normalized);
  if (names.rstd) trace.free(names.rstd);
  trace.free(names.input_fp32);
}

// Rows the attention kernel's backward pads its fp32 dq accumulator and softmax_d by: FA2 varlen
// per sequence (the profile's rows), FA3 round_up(total_q + b * 64, 64) (hopper/flash_api.cpp).
double attention_backward_pad_rows(const LayerShape& shape, const LayerImplementation& impl) {
  const int64_t sequences = std::max<int64_t>(shape.sequences, 1);
  if (impl.flash_attention_3) {
    const int64_t rows = shape.tokens * shape.sp;  // the kernel's total_q: b * S / ring after the all-to-all
    return static_cast<double>((rows + 64 * sequences + 63) / 64 * 64 - rows);
  }
  return static_cast<double>(impl.flash_attention_varlen_pad_rows * sequences);
}

// Qwen3's q_norm/k_norm (RMSNorm over head_dim before RoPE) keep for backward: fp32 rstd per head
// and, under Liger, their inputs (the q/k projections); eager, the fp32 upcast and the normalized
// value instead (REFERENCE §7.2, modeling_qwen3.py Qwen3Attention.forward).
void qk_norm_saved_free(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl) {
  if (!shape.qk_norm) return;
  trace.free("attention.q_norm_rstd");
  trace.free("attention.k_norm_rstd");
  if (impl.eager_rms_norm) {
    eager_norm_saved_free(trace, kQNormSaved, shape, impl);
    eager_norm_saved_free(trace, kKNormSaved, shape, impl);
  } else {
    trace.free("attention.q_proj");
    trace.free("attention.k_proj");
  }
}

// One Ulysses all-to-all of `input` into a new tensor `output` of the same size (DS
// ulysses_sp.py _DimZeroAllToAll, REFERENCE §3.1): the send side is a rearranged .contiguous()
// copy, the receive side torch.empty_like; the result is laid out by one more .contiguous()
// while the receive buffer is still referenced. Without sequence parallelism there is no
// all-to-all and the output is a view of the input.
void ulysses_all_to_all(TensorTrace& trace, const char* input, const char* output, double bytes,
                        const LayerShape& shape, const LayerImplementation& impl) {
  if (shape.sp == 1) {
    trace.alias(input, L, output);
    return;
  }
  for (int64_t copy = 0; copy < impl.ulysses_staging_copies; ++copy) trace.alloc(L, "ulysses.staging", bytes);
  // The send copy dies when the collective returns; the last staging buffer lives until the
  // output layout copy exists.
  for (int64_t copy = 1; copy < impl.ulysses_staging_copies; ++copy) trace.free("ulysses.staging");
  trace.alloc(L, output, bytes);
  if (impl.ulysses_staging_copies > 0) trace.free("ulysses.staging");
}

// The outputs of projections that read the same input: one tensor each, or (Phi-3's fused
// projections) slices of one output named `fused`, whose storage lives while any slice does.
void projections_alloc(TensorTrace& trace, const LayerShape& shape, const char* fused,
                       std::initializer_list<std::pair<const char*, double>> outputs) {
  if (!shape.fused_projections) {
    for (const auto& [name, bytes] : outputs) trace.alloc(L, name, bytes);
    return;
  }
  double total = 0;
  for (const auto& output : outputs) total += output.second;
  trace.alloc(L, fused, total);
  for (const auto& output : outputs) trace.alias(fused, L, output.first);
  trace.free(fused);
}

// MLP over `tokens` tokens (the whole shard, or one TiledMLP tile). Leaves "mlp.output" live and,
// with keep_for_backward, the tensors its backward reads.
void mlp_forward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl, double tokens,
                 bool keep) {
  const double a = static_cast<double>(impl.activation_bytes);
  const double f = tokens * static_cast<double>(shape.intermediate) * a;
  const double out = tokens * static_cast<double>(shape.hidden) * a;
  if (shape.mlp_kind == MlpKind::mlp_kind_swiglu) {
    // HF LlamaMLP: down(act(gate(x)) * up(x)). Eager SiLU saves its input (gate) and the
    // multiply saves both operands (SiLU(gate) and up); Liger's fused SiLU*mul saves gate and up
    // only and recomputes SiLU in backward (Liger ops/swiglu.py). down_proj saves the product.
    projections_alloc(trace, shape, "mlp.gate_up", {{"mlp.gate", f}, {"mlp.up", f}});
    if (!impl.fused_swiglu) trace.alloc(L, "mlp.act", f);
    trace.alloc(L, "mlp.product", f);
    if (!impl.fused_swiglu && !keep) trace.free("mlp.act");
    if (!keep) {
      trace.free("mlp.gate");
      trace.free("mlp.up");
    }
    trace.alloc(L, "mlp.output", out);
    if (!keep || !base_linears_save_input(shape)) trace.free("mlp.product");  // down_proj's input
  } else {
    // GELU MLP: down(gelu(up(x))); GELU saves its input, down_proj saves GELU's output.
    trace.alloc(L, "mlp.up", f);
    trace.alloc(L, "mlp.act", f);
    if (!keep) trace.free("mlp.up");
    trace.alloc(L, "mlp.output", out);
    if (!keep || !base_linears_save_input(shape)) trace.free("mlp.act");  // down_proj's input alone
  }
}

// Backward of mlp_forward(keep=true); the incoming gradient is the caller's. Frees what the
// forward kept and leaves `input_grad_name` ([tokens, h]) live.
void mlp_backward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl, double tokens,
                  const char* input_grad_name) {
  const double a = static_cast<double>(impl.activation_bytes);
  const double f = tokens * static_cast<double>(shape.intermediate) * a;
  const double out = tokens * static_cast<double>(shape.hidden) * a;
  if (shape.mlp_kind == MlpKind::mlp_kind_swiglu) {
    trace.alloc(L, "mlp.product_grad", f);  // down_proj input gradient
    if (base_linears_save_input(shape)) trace.free("mlp.product");  // after down_proj's weight gradient
    if (impl.fused_swiglu) {
      // Liger writes d(gate) and d(up) in place into the saved gate and up buffers.
      trace.free("mlp.product_grad");
    } else {
      trace.alloc(L, "mlp.act_grad", f);    // mul backward: d(act) = d(prod) * up
      trace.alloc(L, "mlp.up_grad", f);     //               d(up)  = d(prod) * act
      trace.free("mlp.product_grad");
      trace.free("mlp.act");
      trace.alloc(L, "mlp.gate_grad", f);   // SiLU backward
      trace.free("mlp.act_grad");
    }
    trace.alloc(L, input_grad_name, out);          // gate_proj input gradient
    trace.alloc(L, "mlp.input_grad_partial", out); // up_proj input gradient, then summed in
    trace.free("mlp.input_grad_partial");
    if (!impl.fused_swiglu) {
      trace.free("mlp.gate_grad");
      trace.free("mlp.up_grad");
    }
    trace.free("mlp.gate");
    trace.free("mlp.up");
  } else {
    trace.alloc(L, "mlp.act_grad", f);
    if (base_linears_save_input(shape)) trace.free("mlp.act");
    trace.alloc(L, "mlp.up_grad", f);
    trace.free("mlp.act_grad");
    trace.alloc(L, input_grad_name, out);
    trace.free("mlp.up_grad");
    trace.free("mlp.up");
  }
}

// A mixture-of-experts block's tensors (Reference §12 item 4.9; bytes of one rank's T tokens).
struct MoeBytes {
  double x, router_bf16, router_fp32, routing_weights_fp32, routing_indices, routing_weights, expert_mask;
  double pairs_x, pairs_f;      // all T*k token-expert pairs: [T*k, h] and [T*k, I_e]
  double expert_x, expert_f;    // one expert's share (T*k/E pairs), the expert loop's unit of work
  double shared_f, shared_gate; // [T, I_s], [T, 1]
  MoeBytes(const LayerShape& shape, const LayerImplementation& impl) {
    const double tokens = static_cast<double>(shape.tokens), a = static_cast<double>(impl.activation_bytes);
    const double experts = static_cast<double>(shape.experts), k = static_cast<double>(shape.experts_per_token);
    const double h = static_cast<double>(shape.hidden), f = static_cast<double>(shape.expert_intermediate);
    x = tokens * h * a;
    router_bf16 = tokens * experts * a;                  // gate(x): [T, E] in the model dtype
    router_fp32 = tokens * experts * 4.0;                // softmax(router_logits, dtype=torch.float), saved
    routing_weights_fp32 = tokens * k * 4.0;             // topk values (renormalized)
    routing_indices = tokens * k * 8.0;                  // topk indices, int64
    routing_weights = tokens * k * a;                    // .to(hidden_states.dtype)
    expert_mask = tokens * k * experts * 8.0;            // one_hot(selected_experts, E): int64
    pairs_x = tokens * k * h * a;
    pairs_f = tokens * k * f * a;
    expert_x = pairs_x / experts;
    expert_f = pairs_f / experts;
    shared_f = tokens * static_cast<double>(shape.shared_expert_intermediate) * a;
    shared_gate = tokens * a;
  }
};

// The experts' tensors as one expert's (or, grouped, all experts') SwiGLU MLP runs on its
// gathered tokens: the gathered input (saved by gate/up_proj), gate, up, SiLU(gate), the product
// (saved by down_proj), the expert output (saved by the routing-weight multiply); the weighted
// output (one expert's at a time in the loop: `weighted_x_bytes`) is index_add_'ed into the
// block's output and dies.
constexpr const char* kExpertTensors[] = {"moe.expert_inputs", "moe.expert_gate", "moe.expert_up", "moe.expert_act",
                                          "moe.expert_product", "moe.expert_outputs"};
void experts_forward(TensorTrace& trace, double x_bytes, double f_bytes, double weighted_x_bytes, bool keep) {
  trace.alloc(L, kExpertTensors[0], x_bytes);
  for (int i = 1; i <= 4; ++i) trace.alloc(L, kExpertTensors[i], f_bytes);
  trace.alloc(L, kExpertTensors[5], x_bytes);
  trace.alloc(L, "moe.weighted_output", weighted_x_bytes);
  trace.free("moe.weighted_output");
  if (!keep)
    for (const char* name : kExpertTensors) trace.free(name);
}

// MoE block forward (HF SparseMoeBlock, Mixtral modeling L112-142; ArcticMoE moe.py L233-462).
// Leaves "mlp.output" live and, with keep, what backward reads.
void moe_forward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl, bool keep) {
  const MoeBytes b(shape, impl);
  trace.set_moment("moe router");
  trace.alloc(L, "moe.router_logits", b.router_bf16);
  trace.alloc(L, "moe.router_probs", b.router_fp32);
  // The logits are returned to the model and dropped unless output_router_logits collects them
  // for the auxiliary loss (false by default; Reference §12 item 67: not modelled, said in plans).
  trace.free("moe.router_logits");
  trace.alloc(L, "moe.routing_weights_fp32", b.routing_weights_fp32);
  trace.alloc(L, "moe.routing_indices", b.routing_indices);
  trace.alloc(L, "moe.routing_weights", b.routing_weights);
  trace.alloc(L, "mlp.output", b.x);  // final_hidden_states = zeros(T, h), filled by index_add_
  trace.set_moment("moe experts");
  trace.alloc(L, "moe.expert_mask", b.expert_mask);  // transient: the loop's torch.where reads it
  if (impl.moe_experts == MoeExperts::moe_grouped_gemm) {
    experts_forward(trace, b.pairs_x, b.pairs_f, b.pairs_x, keep);
  } else if (keep) {
    // Every expert's saved tensors stay: together they are the T*k pairs' (balanced or not).
    experts_forward(trace, b.pairs_x, b.pairs_f, b.expert_x, true);
  } else {
    experts_forward(trace, b.expert_x, b.expert_f, b.expert_x, false);  // one expert at a time under no_grad
  }
  trace.free("moe.expert_mask");
  if (!keep) {
    trace.free("moe.routing_weights");
    trace.free("moe.routing_indices");
    trace.free("moe.routing_weights_fp32");
    trace.free("moe.router_probs");
  }
  if (shape.shared_expert_intermediate > 0) {
    // Qwen2-MoE's shared expert: a SwiGLU MLP of width I_s on every token, times
    // sigmoid(shared_expert_gate(x)), added to the routed output.
    trace.set_moment("moe shared expert");
    trace.alloc(L, "moe.shared_gate", b.shared_f);
    trace.alloc(L, "moe.shared_up", b.shared_f);
    trace.alloc(L, "moe.shared_act", b.shared_f);
    trace.alloc(L, "moe.shared_product", b.shared_f);
    trace.alloc(L, "moe.shared_output", b.x);
    if (shape.shared_expert_gate) trace.alloc(L, "moe.shared_gate_sigmoid", b.shared_gate);
    trace.alloc(L, "moe.shared_weighted", b.x);
    if (!keep) {
      for (const char* name : {"moe.shared_gate", "moe.shared_up", "moe.shared_act", "moe.shared_product", "moe.shared_output"})
        trace.free(name);
      if (shape.shared_expert_gate) trace.free("moe.shared_gate_sigmoid");
    }
    trace.alloc(L, "moe.output_sum", b.x);  // routed + shared: a new tensor
    trace.free("moe.shared_weighted");
    trace.free("mlp.output");
    trace.alias("moe.output_sum", L, "mlp.output");
    trace.free("moe.output_sum");
  }
}

// Backward of moe_forward(keep=true); the incoming gradient is the caller's. Leaves
// `input_grad_name` ([T, h]) live: the sum of the router's, the shared expert's and every
// expert's gathered-token gradients.
void moe_backward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl, const char* input_grad_name) {
  const MoeBytes b(shape, impl);
  trace.alloc(L, input_grad_name, b.x);
  if (shape.shared_expert_intermediate > 0) {
    trace.set_moment("moe shared expert");
    trace.alloc(L, "moe.shared_output_grad", b.x);
    trace.free("moe.shared_output");
    if (shape.shared_expert_gate) trace.free("moe.shared_gate_sigmoid");
    trace.alloc(L, "moe.shared_product_grad", b.shared_f);
    trace.free("moe.shared_output_grad");
    trace.alloc(L, "moe.shared_act_grad", b.shared_f);
    trace.alloc(L, "moe.shared_up_grad", b.shared_f);
    trace.free("moe.shared_product_grad");
    trace.free("moe.shared_product");
    trace.free("moe.shared_act");
    trace.alloc(L, "moe.shared_gate_grad", b.shared_f);
    trace.free("moe.shared_act_grad");
    trace.alloc(L, "moe.shared_input_grad", b.x);  // summed into the input gradient
    trace.free("moe.shared_input_grad");
    for (const char* name : {"moe.shared_gate_grad", "moe.shared_up_grad", "moe.shared_gate", "moe.shared_up"}) trace.free(name);
  }
  // The expert loop differentiates one expert at a time while every other expert's saved tensors
  // wait (the first one is the peak); the grouped GEMM all pairs at once.
  trace.set_moment("moe experts");
  const bool grouped = impl.moe_experts == MoeExperts::moe_grouped_gemm;
  const double x_bytes = grouped ? b.pairs_x : b.expert_x, f_bytes = grouped ? b.pairs_f : b.expert_f;
  trace.alloc(L, "moe.expert_output_grad", x_bytes);   // weighted multiply's backward
  trace.alloc(L, "moe.expert_product_grad", f_bytes);  // down_proj's input gradient
  trace.free("moe.expert_output_grad");
  trace.alloc(L, "moe.expert_act_grad", f_bytes);
  trace.alloc(L, "moe.expert_up_grad", f_bytes);
  trace.free("moe.expert_product_grad");
  trace.alloc(L, "moe.expert_gate_grad", f_bytes);     // SiLU backward
  trace.free("moe.expert_act_grad");
  trace.alloc(L, "moe.expert_input_grad", x_bytes);    // gate_proj's, then up_proj's summed in
  trace.alloc(L, "moe.expert_input_grad_partial", x_bytes);
  trace.free("moe.expert_input_grad_partial");
  trace.free("moe.expert_gate_grad");
  trace.free("moe.expert_up_grad");
  // The gather hidden_states[top_x] differentiates into a zero [T, h] tensor with the rows put
  // back (index backward), then summed into the input gradient.
  trace.alloc(L, "moe.gather_grad", b.x);
  trace.free("moe.expert_input_grad");
  trace.free("moe.gather_grad");
  for (const char* name : kExpertTensors) trace.free(name);
  trace.set_moment("moe router");
  // top-k and softmax backward in fp32 ([T, E] each), cast to the logits' dtype, the router's
  // input gradient summed in.
  trace.alloc(L, "moe.router_probs_grad", b.router_fp32);
  trace.alloc(L, "moe.router_softmax_grad", b.router_fp32);
  trace.free("moe.router_probs_grad");
  trace.free("moe.router_probs");
  trace.alloc(L, "moe.router_logits_grad", b.router_bf16);
  trace.free("moe.router_softmax_grad");
  trace.alloc(L, "moe.router_input_grad", b.x);
  trace.free("moe.router_logits_grad");
  trace.free("moe.router_input_grad");
  trace.free("moe.routing_weights");
  trace.free("moe.routing_indices");
  trace.free("moe.routing_weights_fp32");
}

// LoRA's tensors beside a frozen linear group's (Reference §12 items 9-10, 20-22), under bf16
// autocast. Per adapted linear of input width `in`: lora_A saves its input in bf16, made from an
// fp32 copy (the cast to the adapter's fp32 dtype, then autocast's cast back; the fp32 copy is
// transient), and lora_B saves the r-wide intermediate. On a 4-bit base (QLoRA) the input is not
// cast (autocast on: no conversion), each 4-bit linear clones its result (transient) and
// dequantizes its weight into a [out, in] compute-dtype buffer for the matmul, one at a time.
// One adapted linear's saved tensors, by the trace names of its base linear (literals: trace names
// must outlive the trace).
struct LoraNames {
  const char* input;   // lora_A's input (bf16)
  const char* rank;    // lora_B's input, the r-wide intermediate
  const char* a_cast;  // autocast's bf16 copy of A, saved for lora_A's input gradient
  const char* b_cast;  // and of B, for lora_B's
};
constexpr LoraNames kLoraQ{"lora.q_proj.input", "lora.q_proj.rank", "lora.q_proj.A_bf16", "lora.q_proj.B_bf16"};
constexpr LoraNames kLoraK{"lora.k_proj.input", "lora.k_proj.rank", "lora.k_proj.A_bf16", "lora.k_proj.B_bf16"};
constexpr LoraNames kLoraV{"lora.v_proj.input", "lora.v_proj.rank", "lora.v_proj.A_bf16", "lora.v_proj.B_bf16"};
constexpr LoraNames kLoraO{"lora.o_proj.input", "lora.o_proj.rank", "lora.o_proj.A_bf16", "lora.o_proj.B_bf16"};
constexpr LoraNames kLoraGate{"lora.gate_proj.input", "lora.gate_proj.rank", "lora.gate_proj.A_bf16", "lora.gate_proj.B_bf16"};
constexpr LoraNames kLoraUp{"lora.up_proj.input", "lora.up_proj.rank", "lora.up_proj.A_bf16", "lora.up_proj.B_bf16"};
constexpr LoraNames kLoraDown{"lora.down_proj.input", "lora.down_proj.rank", "lora.down_proj.A_bf16", "lora.down_proj.B_bf16"};

struct LoraLinear {
  LoraNames names;
  double input_bytes = 0, rank_bytes = 0, a_cast_bytes = 0, b_cast_bytes = 0;  // saved (0: not saved)
};

struct LoraGroup {
  std::vector<LoraLinear> adapted;
  double largest_input_fp32 = 0;              // transient cast copy
  double largest_output = 0, largest_weight = 0;  // QLoRA's clone and dequantized weight
};

struct LoraSite {
  LoraNames names;
  int64_t in, out;
  bool default_target;  // adapted by PEFT's default targets (q_proj, v_proj)
};

// sites: the group's linears.
LoraGroup lora_group(const LayerShape& shape, const LayerImplementation& impl, std::initializer_list<LoraSite> sites) {
  LoraGroup group;
  const double tokens = static_cast<double>(shape.tokens), a = static_cast<double>(impl.activation_bytes);
  const double r = static_cast<double>(shape.lora_rank);
  for (const LoraSite& site : sites) {
    const double in = static_cast<double>(site.in), out = static_cast<double>(site.out);
    group.largest_output = std::max(group.largest_output, tokens * out * a);
    group.largest_weight = std::max(group.largest_weight, in * out * a);
    if (!shape.lora_all_linear && !site.default_target) continue;
    LoraLinear linear{site.names};
    linear.rank_bytes = tokens * r * a;
    if (shape.lora_adapter_casts) {
      linear.a_cast_bytes = r * in * a;
      linear.b_cast_bytes = out * r * a;
    }
    if (!shape.qlora) {
      linear.input_bytes = tokens * in * a;
      group.largest_input_fp32 = std::max(group.largest_input_fp32, tokens * in * 4.0);
    }
    group.adapted.push_back(linear);
  }
  return group;
}

LoraGroup lora_attention_projections(const LayerShape& shape, const LayerImplementation& impl) {
  return lora_group(shape, impl, {{kLoraQ, shape.hidden, shape.q_width, true}, {kLoraK, shape.hidden, shape.kv_width, false},
                                  {kLoraV, shape.hidden, shape.kv_width, true}});
}
LoraGroup lora_output_projection(const LayerShape& shape, const LayerImplementation& impl) {
  return lora_group(shape, impl, {{kLoraO, shape.q_width, shape.hidden, false}});
}
LoraGroup lora_mlp(const LayerShape& shape, const LayerImplementation& impl) {
  return lora_group(shape, impl, {{kLoraGate, shape.hidden, shape.intermediate, false}, {kLoraUp, shape.hidden, shape.intermediate, false},
                                  {kLoraDown, shape.intermediate, shape.hidden, false}});
}

// The group's forward: transients, then what it saves (kept only with keep: under no_grad nothing).
void lora_forward(TensorTrace& trace, const LayerShape& shape, const LoraGroup& group, bool keep) {
  if (shape.lora_rank == 0) return;
  if (shape.qlora) {
    trace.alloc(L, "qlora.dequantized_weight", group.largest_weight);
    trace.alloc(L, "qlora.result_clone", group.largest_output);
    trace.free("qlora.result_clone");
    trace.free("qlora.dequantized_weight");
  }
  if (group.largest_input_fp32 > 0) {
    trace.alloc(L, "lora.input_fp32_cast", group.largest_input_fp32);
    trace.free("lora.input_fp32_cast");
  }
  if (!keep) return;
  for (const LoraLinear& linear : group.adapted) {
    if (linear.a_cast_bytes > 0) trace.alloc(L, linear.names.a_cast, linear.a_cast_bytes);
    if (linear.input_bytes > 0) trace.alloc(L, linear.names.input, linear.input_bytes);
    if (linear.b_cast_bytes > 0) trace.alloc(L, linear.names.b_cast, linear.b_cast_bytes);
    trace.alloc(L, linear.names.rank, linear.rank_bytes);
  }
}

// Its backward: the 4-bit weight dequantized again for the input gradient (item 22), then what
// the forward saved is released.
void lora_backward(TensorTrace& trace, const LayerShape& shape, const LoraGroup& group) {
  if (shape.lora_rank == 0) return;
  if (shape.qlora) {
    trace.alloc(L, "qlora.dequantized_weight", group.largest_weight);
    trace.free("qlora.dequantized_weight");
  }
  for (auto linear = group.adapted.rbegin(); linear != group.adapted.rend(); ++linear) {
    trace.free(linear->names.rank);
    if (linear->b_cast_bytes > 0) trace.free(linear->names.b_cast);
    if (linear->input_bytes > 0) trace.free(linear->names.input);
    if (linear->a_cast_bytes > 0) trace.free(linear->names.a_cast);
  }
}

double mlp_tile_tokens(const LayerShape& shape) {
  const double tiles = static_cast<double>(std::max<int64_t>(shape.mlp_tiles, 1));
  return std::ceil(static_cast<double>(shape.tokens) / tiles);
}

// A MoE block run over one tile of the layer's tokens (every tensor of the block scales with them).
LayerShape moe_tile_shape(const LayerShape& shape) {
  LayerShape tile = shape;
  tile.tokens = static_cast<int64_t>(mlp_tile_tokens(shape));
  return tile;
}

// One TiledMLP tile's forward: the dense MLP's, or a whole MoE block's (Unsloth's tiling).
void mlp_tile_forward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl, bool keep) {
  if (shape.experts > 0) moe_forward(trace, moe_tile_shape(shape), impl, keep);
  else mlp_forward(trace, shape, impl, mlp_tile_tokens(shape), keep);
}

}  // namespace

// Ulysses attention forward: from the layer input to "attention.output_local" ([T, n_q*d]),
// leaving "attention_norm.output" live.
void ulysses_attention_forward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl, bool keep) {
  const Bytes bytes(shape, impl);
  const bool replicated = shape.kv_replication > 1;

  trace.set_moment("q/k/v projections and all-to-all");
  trace.alloc(L, "attention_norm.output", bytes.x);
  eager_norm_saved_alloc(trace, L, kAttentionNormSaved, bytes.x, shape, impl);
  if (!keep) eager_norm_saved_free(trace, kAttentionNormSaved, shape, impl);  // under no_grad: transient
  lora_forward(trace, shape, lora_attention_projections(shape, impl), keep);
  projections_alloc(trace, shape, "attention.qkv_proj", {{"attention.q_proj", bytes.q}, {"attention.k_proj", bytes.kv},
                                                          {"attention.v_proj", bytes.kv}});
  if (keep && !base_linears_save_input(shape)) trace.free("attention_norm.output");  // read by frozen linears alone
  const char* q_before_rope = "attention.q_proj";
  const char* k_before_rope = "attention.k_proj";
  if (shape.qk_norm) {
    const double kv_rstd = static_cast<double>(shape.tokens) * static_cast<double>(shape.num_kv_heads) * 4.0;
    trace.alloc(L, "attention.q_norm_rstd", bytes.lse);
    eager_norm_saved_alloc(trace, L, kQNormSaved, bytes.q, shape, impl);
    trace.alloc(L, "attention.q_normed", bytes.q);
    trace.alloc(L, "attention.k_norm_rstd", kv_rstd);
    eager_norm_saved_alloc(trace, L, kKNormSaved, bytes.kv, shape, impl);
    trace.alloc(L, "attention.k_normed", bytes.kv);
    if (impl.eager_rms_norm) {  // eager saves the upcast, not the projection itself
      trace.free("attention.q_proj");
      trace.free("attention.k_proj");
    }
    q_before_rope = "attention.q_normed";
    k_before_rope = "attention.k_normed";
  }
  // HF apply_rotary_pos_emb builds new q and k (q*cos + rotate_half(q)*sin); the pre-RoPE
  // tensors are not saved by autograd.
  trace.alloc(L, "attention.q_rope", bytes.q);
  trace.free(q_before_rope);
  trace.alloc(L, "attention.k_rope", bytes.kv);
  trace.free(k_before_rope);
  if (!keep) qk_norm_saved_free(trace, shape, impl);
  ulysses_all_to_all(trace, "attention.q_rope", "attention.q", bytes.q, shape, impl);
  // GQA/MQA with sp > n_kv: k and v are repeat_interleave'd before their all-to-all.
  if (replicated) {
    trace.alloc(L, "attention.k_repeated", bytes.kv_replicated);
    ulysses_all_to_all(trace, "attention.k_repeated", "attention.k", bytes.kv_replicated, shape, impl);
    trace.free("attention.k_repeated");
    trace.alloc(L, "attention.v_repeated", bytes.kv_replicated);
    ulysses_all_to_all(trace, "attention.v_repeated", "attention.v", bytes.kv_replicated, shape, impl);
    trace.free("attention.v_repeated");
  } else {
    ulysses_all_to_all(trace, "attention.k_rope", "attention.k", bytes.kv, shape, impl);
    ulysses_all_to_all(trace, "attention.v_proj", "attention.v", bytes.kv, shape, impl);
  }

  trace.set_moment("attention");
  // Ring attention (USP's ring over r Ulysses groups; ring-flash-attention's forward): the key/
  // value block being used and the next one arriving (double buffered: 2 x (k + v)), and the fp32
  // output and softmax-statistics accumulators that each block's partial result merges into.
  const double q_fp32 = bytes.q / static_cast<double>(impl.activation_bytes) * 4.0;
  const double ring = static_cast<double>(shape.ring);
  const bool torch_cp = shape.ring > 1 && impl.context_parallel_allgather;
  if (torch_cp) {
    // PyTorch context parallelism, all-gather rotation (_context_parallel/_attention.py; Reference
    // §11 F2.3-F2.4): next_kv = cat(k, v) copies the local blocks, all_gather_tensor gathers the
    // whole sequence's K and V (kept until the call returns, not saved), and the blocks' outputs
    // merge into a running fp32 output with two fp32 temporaries of its size and fp32 lse.
    // The all-to-all rotation keeps one received block beside the cat copy instead (F2.3).
    trace.alloc(L, "cp.kv_local_copy", 2.0 * bytes.kv_replicated);
    if (impl.context_parallel_all_to_all) trace.alloc(L, "cp.kv_block_received", 2.0 * bytes.kv_replicated);
    else trace.alloc(L, "cp.kv_gathered", 2.0 * ring * bytes.kv_replicated);
    trace.alloc(L, "cp.output_fp32", q_fp32);
    trace.alloc(L, "cp.merge_temporaries", 2.0 * q_fp32);
    trace.alloc(L, "cp.lse_fp32", bytes.lse);
  } else if (shape.ring > 1) {
    trace.alloc(L, "ring.kv_blocks_in_flight", 4.0 * bytes.kv_replicated);
    trace.alloc(L, "ring.output_accumulator", q_fp32);
    trace.alloc(L, "ring.lse_accumulator", bytes.lse);
  }
  // flash_attn forward: output in the activation dtype, softmax statistics (lse) in fp32.
  trace.alloc(L, "attention.output", bytes.q);
  trace.alloc(L, "attention.lse", bytes.lse);
  if (torch_cp)
    for (const char* name : {"cp.lse_fp32", "cp.merge_temporaries", "cp.output_fp32",
                             impl.context_parallel_all_to_all ? "cp.kv_block_received" : "cp.kv_gathered", "cp.kv_local_copy"})
      trace.free(name);
  else if (shape.ring > 1)
    for (const char* name : {"ring.lse_accumulator", "ring.output_accumulator", "ring.kv_blocks_in_flight"}) trace.free(name);
  // Output path back to sequence shards: [S, n_q/sp*d] -> [S_l, n_q*d] (REFERENCE §3.1).
  ulysses_all_to_all(trace, "attention.output", "attention.output_local", bytes.q, shape, impl);
  // The attention inputs are locals of the Ulysses forward, live until it returns; HF
  // LlamaAttention holds query/key/value_states until the attention call returns.
  if (!keep) {
    trace.free("attention.q");
    trace.free("attention.k");
    trace.free("attention.v");
    trace.free("attention.output");
    trace.free("attention.lse");
  }
  trace.free("attention.q_rope");
  trace.free("attention.k_rope");
  trace.free("attention.v_proj");
}

// FPDT attention forward (DS fpdt_layer.py _FPDTGPUOffloadingAttentionImpl_, REFERENCE §3.6):
// per chunk, q/k/v projections of the local chunk, their all-to-alls, flash attention against the
// k/v chunks fetched from the host one ahead (double buffer) into an fp32 accumulator, and the
// output chunk's all-to-all back into the full local output. The chunk's q/k/v/output/lse go to
// pinned host memory; nothing chunk-sized stays on the GPU for backward. Every chunk repeats the
// same allocations, so one chunk stands for all.
void fpdt_attention_forward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl, bool keep) {
  const Bytes bytes(shape, impl);
  const double fraction = static_cast<double>(shape.fpdt_chunk_tokens) / static_cast<double>(shape.tokens);
  const double q_chunk = bytes.q * fraction, kv_chunk = bytes.kv_replicated * fraction, lse_chunk = bytes.lse * fraction;
  trace.set_moment("fpdt attention chunk");
  trace.alloc(L, "attention_norm.output", bytes.x);
  eager_norm_saved_alloc(trace, L, kAttentionNormSaved, bytes.x, shape, impl);
  if (!keep) eager_norm_saved_free(trace, kAttentionNormSaved, shape, impl);
  trace.alloc(L, "attention.output_local", bytes.q);  // final_output, filled chunk by chunk
  trace.alloc(L, "fpdt.q_proj_chunk", q_chunk);
  trace.alloc(L, "fpdt.k_proj_chunk", kv_chunk);
  trace.alloc(L, "fpdt.v_proj_chunk", kv_chunk);
  ulysses_all_to_all(trace, "fpdt.q_proj_chunk", "fpdt.q_chunk", q_chunk, shape, impl);
  trace.free("fpdt.q_proj_chunk");
  ulysses_all_to_all(trace, "fpdt.k_proj_chunk", "fpdt.k_chunk", kv_chunk, shape, impl);
  trace.free("fpdt.k_proj_chunk");
  ulysses_all_to_all(trace, "fpdt.v_proj_chunk", "fpdt.v_chunk", kv_chunk, shape, impl);
  trace.free("fpdt.v_proj_chunk");
  trace.alloc(L, "fpdt.kv_prefetch", 2.0 * kv_chunk);
  trace.alloc(L, "fpdt.output_accumulator", q_chunk / static_cast<double>(impl.activation_bytes) * 4.0);
  trace.alloc(L, "fpdt.lse_chunk", lse_chunk);
  trace.alloc(L, "fpdt.output_chunk", q_chunk);
  ulysses_all_to_all(trace, "fpdt.output_chunk", "fpdt.output_chunk_local", q_chunk, shape, impl);
  for (const char* name : {"fpdt.output_chunk_local", "fpdt.output_chunk", "fpdt.lse_chunk", "fpdt.output_accumulator",
                           "fpdt.kv_prefetch", "fpdt.v_chunk", "fpdt.k_chunk", "fpdt.q_chunk"})
    trace.free(name);
}

void decoder_layer_forward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl, bool keep) {
  const Bytes bytes(shape, impl);
  if (shape.fpdt_chunk_tokens > 0) fpdt_attention_forward(trace, shape, impl, keep);
  else ulysses_attention_forward(trace, shape, impl, keep);

  trace.set_moment("o_proj and residual");
  lora_forward(trace, shape, lora_output_projection(shape, impl), keep);
  trace.alloc(L, "attention.o_proj_output", bytes.x);
  if (!keep) trace.free("attention.output_local");
  if (!keep) trace.free("attention_norm.output");
  trace.alloc(L, "residual.attention", bytes.x);
  trace.free("attention.o_proj_output");

  trace.set_moment("mlp");
  trace.alloc(L, "mlp_norm.output", bytes.x);
  eager_norm_saved_alloc(trace, L, kMlpNormSaved, bytes.x, shape, impl);
  if (!keep) eager_norm_saved_free(trace, kMlpNormSaved, shape, impl);
  lora_forward(trace, shape, lora_mlp(shape, impl), keep);  // LoRA plans run untiled MLPs (plan_problems)
  if (shape.mlp_tiles == 0) {
    if (shape.experts > 0) moe_forward(trace, shape, impl, keep);
    else mlp_forward(trace, shape, impl, static_cast<double>(shape.tokens), keep);
  } else if (shape.fpdt_chunk_tokens > 0) {  // (a MoE block runs outside FPDT: plan_problems)
    // FPDT_FFN: each chunk's output is written into one preallocated output; only x is saved.
    trace.alloc(L, "mlp.output_full", bytes.x);
    mlp_forward(trace, shape, impl, mlp_tile_tokens(shape), /*keep=*/false);
    trace.free("mlp.output");  // this chunk's output, copied into mlp.output_full
    trace.alias("mlp.output_full", L, "mlp.output");
    trace.free("mlp.output_full");
  } else {
    // DeepSpeed TiledMLP forward (REFERENCE §3.2): each tile runs under no_grad, outputs are
    // collected in a list and torch.cat'ed; only the MLP input is saved. Over a MoE block it is
    // Unsloth's, which tiles the whole block, router and experts (Reference §12 items 34, 78,
    // p. 279; ALST's patches dense MLP classes only, item 77: framework_unsupported says where).
    trace.alloc(L, "mlp.tile_outputs", bytes.x);
    mlp_tile_forward(trace, shape, impl, /*keep=*/false);
    trace.set_moment("mlp");  // the tiles' outputs concatenated
    trace.free("mlp.output");  // this tile's output is part of mlp.tile_outputs
    trace.alloc(L, "mlp.output", bytes.x);
    trace.free("mlp.tile_outputs");
  }
  if (!keep || !base_linears_save_input(shape)) trace.free("mlp_norm.output");  // frozen gate/up save no input
  trace.alloc(L, "layer.output", bytes.x);
  trace.free("mlp.output");
  // The residual is read by the MLP's norm and the last add, neither of which saves it when the norm
  // is eager (it saves its fp32 copy); a fused norm (Liger's, the executor's) saves its input.
  if (!keep || impl.eager_rms_norm) trace.free("residual.attention");
}

// Ulysses attention backward: from "attention.output_local" (o_proj's input) to
// "attention_norm.output_grad", freeing what the forward kept.
void ulysses_attention_backward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl) {
  const Bytes bytes(shape, impl);
  const bool replicated = shape.kv_replication > 1;
  trace.set_moment("o_proj and all-to-all");
  trace.alloc(L, "attention.output_local_grad", bytes.q);
  trace.free("attention.output_local");  // after o_proj's weight gradient
  ulysses_all_to_all(trace, "attention.output_local_grad", "attention.output_grad", bytes.q, shape, impl);
  trace.free("attention.output_local_grad");

  trace.set_moment("attention");
  // flash_attn backward (csrc mha_bwd): dq, dk, dv; dk/dv at q-head width when the rank has
  // fewer kv heads than q heads (then summed per group); dq accumulated in fp32; softmax_d fp32.
  const bool grouped = shape.q_width > shape.kv_width * shape.kv_replication;
  // The kernel's padded rows, each [n_q/sp, d] of fp32 dq and [n_q/sp] of fp32 statistics.
  const double pad_rows = attention_backward_pad_rows(shape, impl);
  const double q_pad_bytes = pad_rows * static_cast<double>(shape.q_width / shape.sp) * 4.0;
  const double lse_pad_bytes = pad_rows * static_cast<double>(shape.num_q_heads / shape.sp) * 4.0;
  trace.alloc(L, "attention.q_grad", bytes.q);
  trace.alloc(L, "attention.k_grad", bytes.kv_replicated);
  trace.alloc(L, "attention.v_grad", bytes.kv_replicated);
  // Ring attention backward: the key/value block in use and the next (2 x (k + v)), and the fp32
  // dk/dv accumulators that travel the ring with them (the pair being added to and the pair in
  // flight: 2 x (dk + dv)).
  const double fp32_per_element = 4.0 / static_cast<double>(impl.activation_bytes);
  const bool torch_cp = shape.ring > 1 && impl.context_parallel_allgather;
  if (torch_cp) {
    // PyTorch CP backward (F2.5): the whole sequence's K/V gathered again (all-to-all rotation:
    // a block in flight beside the cat copy), fp32 accumulators for dq, dk, dv, and dk/dv passed by
    // all-to-all in fp32 (send and receive).
    if (impl.context_parallel_all_to_all) trace.alloc(L, "cp.kv_blocks_in_flight", 4.0 * bytes.kv_replicated);
    else trace.alloc(L, "cp.kv_gathered", 2.0 * static_cast<double>(shape.ring) * bytes.kv_replicated);
    trace.alloc(L, "cp.grad_accumulators_fp32", (bytes.q + 2.0 * bytes.kv_replicated) * fp32_per_element);
    trace.alloc(L, "cp.kv_grad_all_to_all_fp32", 2.0 * 2.0 * bytes.kv_replicated * fp32_per_element);
  } else if (shape.ring > 1) {
    trace.alloc(L, "ring.kv_blocks_in_flight", 4.0 * bytes.kv_replicated);
    trace.alloc(L, "ring.kv_grad_accumulators_in_flight", 4.0 * bytes.kv_replicated * fp32_per_element);
  }
  if (impl.flash_attention_3) {
    // FA3 (hopper/flash_api.cpp L1475-1546): fp32 dk/dv accumulators at kv width under GQA, the
    // fp32 dq accumulator, softmax_d and softmax_lse_log2.
    const double fp32 = 4.0 / static_cast<double>(impl.activation_bytes);
    if (grouped) {
      trace.alloc(L, "attention.k_grad_accumulator", bytes.kv_replicated * fp32);
      trace.alloc(L, "attention.v_grad_accumulator", bytes.kv_replicated * fp32);
    }
    trace.alloc(L, "attention.q_grad_accumulator", bytes.q * fp32 + q_pad_bytes);
    trace.alloc(L, "attention.softmax_d", bytes.lse + lse_pad_bytes);
    trace.alloc(L, "attention.softmax_lse_log2", bytes.lse + lse_pad_bytes);
    for (const char* name : {"attention.softmax_lse_log2", "attention.softmax_d", "attention.q_grad_accumulator"}) trace.free(name);
    if (grouped)
      for (const char* name : {"attention.v_grad_accumulator", "attention.k_grad_accumulator"}) trace.free(name);
  } else {
    if (impl.flash_attention_expands_gqa_grads && grouped) {
      trace.alloc(L, "attention.k_grad_expanded", bytes.q);
      trace.alloc(L, "attention.v_grad_expanded", bytes.q);
    }
    if (impl.flash_attention_dq_accumulator) {
      trace.alloc(L, "attention.q_grad_accumulator", bytes.q / static_cast<double>(impl.activation_bytes) * 4.0 + q_pad_bytes);
      trace.alloc(L, "attention.softmax_d", bytes.lse + lse_pad_bytes);
      trace.free("attention.q_grad_accumulator");
      trace.free("attention.softmax_d");
    }
    if (impl.flash_attention_expands_gqa_grads && grouped) {
      trace.free("attention.k_grad_expanded");
      trace.free("attention.v_grad_expanded");
    }
  }
  if (torch_cp)
    for (const char* name : {"cp.kv_grad_all_to_all_fp32", "cp.grad_accumulators_fp32",
                             impl.context_parallel_all_to_all ? "cp.kv_blocks_in_flight" : "cp.kv_gathered"})
      trace.free(name);
  else if (shape.ring > 1)
    for (const char* name : {"ring.kv_grad_accumulators_in_flight", "ring.kv_blocks_in_flight"}) trace.free(name);
  trace.free("attention.output_grad");
  trace.free("attention.q");
  trace.free("attention.k");
  trace.free("attention.v");
  trace.free("attention.output");
  trace.free("attention.lse");

  trace.set_moment("all-to-all and q/k/v projections");
  ulysses_all_to_all(trace, "attention.q_grad", "attention.q_rope_grad", bytes.q, shape, impl);
  trace.free("attention.q_grad");
  if (replicated) {
    // The gradient of repeat_interleave sums the copies back to n_kv heads.
    ulysses_all_to_all(trace, "attention.k_grad", "attention.k_repeated_grad", bytes.kv_replicated, shape, impl);
    trace.free("attention.k_grad");
    trace.alloc(L, "attention.k_rope_grad", bytes.kv);
    trace.free("attention.k_repeated_grad");
    ulysses_all_to_all(trace, "attention.v_grad", "attention.v_repeated_grad", bytes.kv_replicated, shape, impl);
    trace.free("attention.v_grad");
    trace.alloc(L, "attention.v_proj_grad", bytes.kv);
    trace.free("attention.v_repeated_grad");
  } else {
    ulysses_all_to_all(trace, "attention.k_grad", "attention.k_rope_grad", bytes.kv, shape, impl);
    trace.free("attention.k_grad");
    ulysses_all_to_all(trace, "attention.v_grad", "attention.v_proj_grad", bytes.kv, shape, impl);
    trace.free("attention.v_grad");
  }
  // RoPE backward makes new tensors, as its forward did.
  // (With q/k norms their backward maps these to the projections' gradients, same sizes.)
  trace.alloc(L, "attention.q_proj_grad", bytes.q);
  trace.free("attention.q_rope_grad");
  trace.alloc(L, "attention.k_proj_grad", bytes.kv);
  trace.free("attention.k_rope_grad");
  qk_norm_saved_free(trace, shape, impl);
  // The three projections' input gradients are summed into one.
  trace.alloc(L, "attention_norm.output_grad", bytes.x);
  trace.alloc(L, "attention_norm.output_grad_partial", bytes.x);
  trace.free("attention_norm.output_grad_partial");
  trace.free("attention.q_proj_grad");
  trace.free("attention.k_proj_grad");
  trace.free("attention.v_proj_grad");
  if (base_linears_save_input(shape)) trace.free("attention_norm.output");
}

// FPDT attention backward (REFERENCE §3.6): grad_layernorm_output is a full local buffer of zero
// chunks; per inner step the q, output, lse and output-gradient chunks are prefetched (current and
// next), with the k/v chunk, fp32 dk/dv accumulators and the current fp32 dq accumulator (the
// others wait in host memory), plus flash attention's own per-chunk backward buffers; the q/k/v
// weight gradient is accumulated in fp32 at full size.
void fpdt_attention_backward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl) {
  const Bytes bytes(shape, impl);
  const double a = static_cast<double>(impl.activation_bytes);
  const double fraction = static_cast<double>(shape.fpdt_chunk_tokens) / static_cast<double>(shape.tokens);
  const double q_chunk = bytes.q * fraction, kv_chunk = bytes.kv_replicated * fraction, lse_chunk = bytes.lse * fraction;
  trace.set_moment("fpdt attention backward chunk");
  trace.alloc(L, "attention.output_local_grad", bytes.q);
  trace.free("attention.output_local");
  trace.alloc(L, "attention_norm.output_grad", bytes.x);  // grad_layernorm_output
  const double qkv_weights = static_cast<double>(shape.hidden) * static_cast<double>(shape.q_width + 2 * shape.kv_width);
  trace.alloc(L, "fpdt.qkv_weight_grad_fp32", qkv_weights * 4.0);
  trace.alloc(L, "fpdt.q_output_grad_chunks", 2.0 * (3.0 * q_chunk + lse_chunk));
  trace.alloc(L, "fpdt.kv_chunk", 2.0 * kv_chunk);
  trace.alloc(L, "fpdt.kv_grad_accumulators", 2.0 * kv_chunk / a * 4.0);
  trace.alloc(L, "fpdt.q_grad_accumulator", q_chunk / a * 4.0);
  trace.alloc(L, "fpdt.flash_backward_chunk", q_chunk + 2.0 * kv_chunk + q_chunk / a * 4.0 + lse_chunk);
  for (const char* name : {"fpdt.flash_backward_chunk", "fpdt.q_grad_accumulator", "fpdt.kv_grad_accumulators",
                           "fpdt.kv_chunk", "fpdt.q_output_grad_chunks", "fpdt.qkv_weight_grad_fp32"})
    trace.free(name);
  trace.free("attention.output_local_grad");
  trace.free("attention_norm.output");
}

void decoder_layer_backward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl) {
  const Bytes bytes(shape, impl);

  trace.set_moment("mlp");
  if (shape.mlp_tiles == 0) {
    if (shape.experts > 0) moe_backward(trace, shape, impl, "mlp.input_grad");
    else mlp_backward(trace, shape, impl, static_cast<double>(shape.tokens), "mlp.input_grad");
  } else {
    // TiledMLP backward: x_grad = zeros_like(x); per tile, recompute with grad and backward; the
    // tile's input gradient lands in a view of x_grad (a MoE block's too, Unsloth's).
    // FPDT_FFN writes each chunk's input gradient into the input's own storage (x[st:ed].copy_).
    if (shape.fpdt_chunk_tokens > 0) trace.alias("mlp_norm.output", L, "mlp.input_grad");
    else trace.alloc(L, "mlp.input_grad", bytes.x);
    if (impl.mlp_tile_weight_grads_bytes > 0) trace.alloc(kCategoryZero, "mlp_tile_weight_grads", impl.mlp_tile_weight_grads_bytes);
    mlp_tile_forward(trace, shape, impl, /*keep=*/true);
    if (shape.experts > 0) moe_backward(trace, moe_tile_shape(shape), impl, "mlp.tile_input_grad");
    else mlp_backward(trace, shape, impl, mlp_tile_tokens(shape), "mlp.tile_input_grad");
    trace.free("mlp.tile_input_grad");
    trace.free("mlp.output");
    if (impl.mlp_tile_weight_grads_bytes > 0) trace.free("mlp_tile_weight_grads");
  }
  if (base_linears_save_input(shape)) trace.free("mlp_norm.output");  // after gate/up weight gradients
  lora_backward(trace, shape, lora_mlp(shape, impl));

  trace.set_moment("mlp norm");
  // RMSNorm backward, with the residual branch's gradient summed in.
  trace.alloc(L, "residual.attention_grad", bytes.x);
  eager_norm_saved_free(trace, kMlpNormSaved, shape, impl);
  trace.free("mlp.input_grad");
  if (!impl.eager_rms_norm) trace.free("residual.attention");

  if (shape.fpdt_chunk_tokens > 0) fpdt_attention_backward(trace, shape, impl);
  else ulysses_attention_backward(trace, shape, impl);

  lora_backward(trace, shape, lora_output_projection(shape, impl));
  lora_backward(trace, shape, lora_attention_projections(shape, impl));
  trace.set_moment("attention norm");
  trace.alloc(L, "layer.input_grad", bytes.x);
  eager_norm_saved_free(trace, kAttentionNormSaved, shape, impl);
  trace.free("attention_norm.output_grad");
  trace.free("residual.attention_grad");
  trace.free("layer.output_grad");
  trace.free("layer.output");
  // The layer's input: its checkpoint, or (no checkpointing) a fused norm's saved input; with an
  // eager norm and no checkpoint nothing holds it, and the caller has freed it after forward.
  if (trace.is_live("layer.input")) trace.free("layer.input");
}

const char* moe_experts_name(MoeExperts experts) {
  return experts == MoeExperts::moe_grouped_gemm ? "grouped_gemm" : "hf_expert_loop";
}

MoeExperts moe_experts_parse(const std::string& text, const std::string& source, const std::string& key) {
  for (MoeExperts experts : {MoeExperts::moe_hf_expert_loop, MoeExperts::moe_grouped_gemm})
    if (text == moe_experts_name(experts)) return experts;
  throw ConfigError(source, key, "expected hf_expert_loop or grouped_gemm, got '" + text + "'");
}

double pinned_host_allocation_bytes(double bytes, bool power_of_two) {
  return power_of_two && bytes > 0 ? std::exp2(std::ceil(std::log2(bytes))) : bytes;
}

double fpdt_host_bytes(const LayerShape& shape, const LayerImplementation& impl, bool pinned_power_of_two) {
  if (shape.fpdt_chunk_tokens == 0) return 0;
  const Bytes bytes(shape, impl);
  const double chunks = static_cast<double>(shape.tokens) / static_cast<double>(shape.fpdt_chunk_tokens);
  const double q_grad_fp32 = bytes.q / static_cast<double>(impl.activation_bytes) * 4.0;
  double total = 0;
  for (double layer_bytes : {bytes.q, bytes.kv_replicated, bytes.kv_replicated, /*output*/ bytes.q, bytes.lse, bytes.x, q_grad_fp32})
    total += chunks * pinned_host_allocation_bytes(layer_bytes / chunks, pinned_power_of_two);
  return total;
}

double decoder_layer_saved_bytes(const LayerShape& shape, const LayerImplementation& impl) {
  TensorTrace trace;
  const Bytes bytes(shape, impl);
  trace.alloc(L, "layer.input", bytes.x);
  decoder_layer_forward(trace, shape, impl, /*keep=*/true);
  // Everything but layer.output; an eager norm saves its fp32 copy, not the layer's input.
  return trace.current_bytes() - bytes.x - (impl.eager_rms_norm ? bytes.x : 0.0);
}

namespace {

// Logits and cross entropy over `tokens` tokens, forward then backward, as HF's ForCausalLMLoss
// runs it: logits in the activation dtype, `logits.float()`, then F.cross_entropy = log_softmax
// (saves its fp32 output) + nll_loss. The upcast copy dies when the loss function returns (log-
// softmax saves its output, not its input); the trainer keeps only the loss, so the logits die
// too. Backward: nll_loss makes a dense fp32 [T, V] gradient, log-softmax's backward a second one
// while its saved output is still live (three fp32 [T, V] at once), then the cast back to the
// activation dtype. Leaves `input_grad_name` ([tokens, h]).
void logits_and_cross_entropy(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl,
                              double tokens, const char* input_grad_name) {
  const double a = static_cast<double>(impl.activation_bytes);
  const double logits = tokens * static_cast<double>(shape.vocab);
  const bool upcast = impl.activation_bytes < 4;
  trace.alloc(kCategoryLoss, "loss.logits", logits * a);
  if (upcast) trace.alloc(kCategoryLoss, "loss.logits_fp32", logits * 4.0);
  trace.alloc(kCategoryLoss, "loss.log_softmax", logits * 4.0);
  trace.alloc(kCategoryLoss, "loss.per_token", tokens * 4.0);
  if (upcast) trace.free("loss.logits_fp32");
  trace.free("loss.logits");
  trace.set_moment("cross entropy backward");
  trace.alloc(kCategoryLoss, "loss.nll_grad", logits * 4.0);
  trace.alloc(kCategoryLoss, "loss.log_softmax_grad", logits * 4.0);
  trace.free("loss.nll_grad");
  trace.free("loss.log_softmax");
  trace.free("loss.per_token");
  if (upcast) {
    trace.alloc(kCategoryLoss, "loss.logits_grad", logits * a);
    trace.free("loss.log_softmax_grad");
  }
  trace.alloc(kCategoryLoss, input_grad_name, tokens * static_cast<double>(shape.hidden) * a);
  trace.free(upcast ? "loss.logits_grad" : "loss.log_softmax_grad");
}

}  // namespace

void lm_loss_forward_backward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl,
                              LossImplementation loss, int64_t tile_tokens, int64_t weight_bytes) {
  const Bytes bytes(shape, impl);
  const double a = static_cast<double>(impl.activation_bytes);
  const double tokens = static_cast<double>(shape.tokens);
  const double tile = static_cast<double>(std::min<int64_t>(std::max<int64_t>(tile_tokens, 1), shape.tokens));
  trace.set_moment("logits and cross entropy");
  trace.alloc(kCategoryLoss, "final_norm.output", bytes.x);
  eager_norm_saved_alloc(trace, kCategoryLoss, kFinalNormSaved, bytes.x, shape, impl);
  switch (loss) {
    case LossImplementation::loss_untiled:
      logits_and_cross_entropy(trace, shape, impl, tokens, "final_norm.output_grad");
      break;
    case LossImplementation::loss_liger_chunked: {
      // Liger fused_linear_cross_entropy (REFERENCE §3.3a): grad_input [T, h] and grad_weight
      // [V, h] (weight dtype) and loss_1d [T] fp32 up front; per chunk the logits [C, V] in the
      // input dtype, turned into their gradient in place, and the chunk's input gradient.
      trace.alloc(kCategoryLoss, "final_norm.output_grad", bytes.x);
      trace.alloc(kCategoryLoss, "loss.weight_grad",
                  static_cast<double>(shape.vocab) * static_cast<double>(shape.hidden) * static_cast<double>(weight_bytes));
      trace.alloc(kCategoryLoss, "loss.per_token", tokens * 4.0);
      trace.alloc(kCategoryLoss, "loss.logits_chunk", tile * static_cast<double>(shape.vocab) * a);
      trace.alloc(kCategoryLoss, "loss.input_grad_chunk", tile * static_cast<double>(shape.hidden) * a);
      trace.free("loss.input_grad_chunk");
      trace.free("loss.logits_chunk");
      trace.free("loss.per_token");
      trace.free("loss.weight_grad");  // handed to the optimizer side in backward
      break;
    }
    case LossImplementation::loss_unsloth_fused:
      // UnslothFusedLoss (Reference §12 item 31): grad_inputs = empty_like(hidden_states) in
      // forward, then per chunk grad_and_value of lm_head -> F.cross_entropy(logits.float()): the
      // chunk's logits in the model dtype, their fp32 copy and its fp32 gradient (item 32).
      trace.alloc(kCategoryLoss, "final_norm.output_grad", bytes.x);
      trace.alloc(kCategoryLoss, "loss.logits_chunk", tile * static_cast<double>(shape.vocab) * a);
      trace.alloc(kCategoryLoss, "loss.logits_chunk_fp32", tile * static_cast<double>(shape.vocab) * 4.0);
      trace.alloc(kCategoryLoss, "loss.logits_chunk_grad_fp32", tile * static_cast<double>(shape.vocab) * 4.0);
      for (const char* name : {"loss.logits_chunk_grad_fp32", "loss.logits_chunk_fp32", "loss.logits_chunk"}) trace.free(name);
      break;
    case LossImplementation::loss_token_shards:
      // ArcticTraining TiledFusedLogitsLoss (REFERENCE §3.3b): x_grad = zeros_like(x), then per
      // shard forward and backward of the untiled loss.
      trace.alloc(kCategoryLoss, "final_norm.output_grad", bytes.x);
      logits_and_cross_entropy(trace, shape, impl, tile, "loss.input_grad_shard");
      trace.free("loss.input_grad_shard");
      break;
  }
  trace.set_moment("final norm backward");
  trace.alloc(L, "layer.output_grad", bytes.x);
  eager_norm_saved_free(trace, kFinalNormSaved, shape, impl);
  trace.free("final_norm.output_grad");
  trace.free("final_norm.output");
  trace.free("final_norm.input");
}

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
