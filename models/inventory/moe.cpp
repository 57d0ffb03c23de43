// moe.cpp: the mixture-of-experts block (router, routing, experts by the loop or one grouped GEMM,
// shared expert), forward and backward (Reference §12 part B).
#include "models/inventory/internal.hpp"

#include "io/config_error.hpp"

namespace longseq::inventory {

// A mixture-of-experts block's tensors (Reference §12 item 4.9; bytes of one rank's T tokens).
struct MoeBytes {
  double x, router_bf16, router_fp32, routing_weights_fp32, routing_indices, routing_weights, expert_mask;
  double pairs_x, pairs_f;      // all T*k token-expert pairs: [T*k, h] and [T*k, I_e]
  double expert_x, expert_f;    // one expert's share (T*k/E pairs), the expert loop's unit of work
  double shared_f, shared_gate; // [T, I_s], [T, 1]
  // transformers 5's grouped experts: an int64 per pair (sort order, gather index, inverse order),
  // the int32 group offsets [E], the routing sum [T, 1] fp32, the pairs' weights in the router's dtype.
  double pair_index, expert_offsets, routing_sum, pair_weights, weighted_pairs_x, weighted_x;
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
    const double weight_bytes = shape.moe_routing_weights_fp32 ? 4.0 : a;  // bf16 x fp32 promotes to fp32
    pair_index = tokens * k * 8.0;
    expert_offsets = experts * 4.0;
    routing_sum = tokens * 4.0;
    pair_weights = tokens * k * weight_bytes;
    weighted_pairs_x = tokens * k * h * weight_bytes;
    weighted_x = tokens * h * weight_bytes;
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

// The router's backward, either experts implementation: top-k's backward (zeros [T, E] with the k
// put back) and softmax's in fp32, cast to the logits' dtype, the router's input gradient summed in.
void router_backward(TensorTrace& trace, const MoeBytes& b) {
  trace.alloc(L, "moe.router_probs_grad", b.router_fp32);
  trace.alloc(L, "moe.router_softmax_grad", b.router_fp32);
  trace.free("moe.router_probs_grad");
  trace.free("moe.router_probs");
  trace.alloc(L, "moe.router_logits_grad", b.router_bf16);
  trace.free("moe.router_softmax_grad");
  trace.alloc(L, "moe.router_input_grad", b.x);
  trace.free("moe.router_logits_grad");
  trace.free("moe.router_input_grad");
}

// transformers 5's router and grouped experts (MixtralTopKRouter / Qwen3MoeTopKRouter.forward, then
// integrations/moe.py grouped_mm_experts_forward), step by step; every tensor named "saved" is one
// PyTorch's saved-tensor hooks record (tests/frameworks). Leaves "mlp.output" live.
constexpr const char* kHfGroupedSaved[] = {"moe.pair_order", "moe.pair_token_index", "moe.expert_inputs", "moe.pair_weights",
                                           "moe.expert_offsets", "moe.expert_gate_up", "moe.expert_act", "moe.expert_product",
                                           "moe.expert_outputs", "moe.pair_inverse_order"};
void hf_grouped_mm_forward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl, bool keep) {
  const MoeBytes b(shape, impl);
  trace.set_moment("moe router");
  trace.alloc(L, "moe.router_logits", b.router_bf16);
  trace.alloc(L, "moe.router_probs", b.router_fp32);  // softmax(logits, dtype=float): saved
  trace.free("moe.router_logits");                    // returned, dropped by the block
  trace.alloc(L, "moe.routing_weights_fp32", b.routing_weights_fp32);  // topk's values
  trace.alloc(L, "moe.routing_indices", b.routing_indices);            // topk's indices: saved
  if (shape.moe_normalize_topk) {
    // router_top_value /= sum(...): the in-place division saves the divisor and the values before it.
    trace.alloc(L, "moe.routing_sum_fp32", b.routing_sum);
    trace.alloc(L, "moe.routing_values_before_division", b.routing_weights_fp32);
  }
  const char* routing_weights = "moe.routing_weights_fp32";
  if (!shape.moe_routing_weights_fp32) {  // the Qwen routers' .to(router_logits.dtype)
    trace.alloc(L, "moe.routing_weights", b.routing_weights);
    trace.free("moe.routing_weights_fp32");
    routing_weights = "moe.routing_weights";
  }
  trace.set_moment("moe experts");
  trace.alloc(L, "moe.pair_order", b.pair_index);        // torch.sort(expert_ids): the sorted ids and perm
  trace.alloc(L, "moe.pair_expert_ids", b.pair_index);
  trace.alloc(L, "moe.pair_token_index", b.pair_index);  // perm // top_k, the gather's index: saved
  trace.alloc(L, "moe.expert_inputs", b.pairs_x);        // hidden_states[perm // top_k]: saved by grouped_mm
  trace.alloc(L, "moe.pair_weights", b.pair_weights);    // sample_weights[perm] (perm saved): saved by the weighting
  trace.alloc(L, "moe.expert_offsets", b.expert_offsets);  // cumsum(histc(...)), int32: saved by both grouped_mm
  trace.free("moe.pair_expert_ids");
  trace.alloc(L, "moe.expert_gate_up", 2.0 * b.pairs_f);  // one [T*k, 2 I] output; gate and up its halves
  trace.alloc(L, "moe.expert_act", b.pairs_f);             // act_fn(gate): saved by the product
  trace.alloc(L, "moe.expert_product", b.pairs_f);         // act * up: saved by the down grouped_mm
  trace.alloc(L, "moe.expert_outputs", b.pairs_x);         // saved by the weighting
  trace.alloc(L, "moe.weighted_output", b.weighted_pairs_x);
  trace.alloc(L, "moe.pair_inverse_order", b.pair_index);  // inv_perm: saved by the reordering index
  trace.alloc(L, "moe.weighted_output_reordered", b.weighted_pairs_x);
  trace.free("moe.weighted_output");
  // .view(T, k, h).sum(dim=1), then .to(hidden_states.dtype): a new tensor only from fp32 weights.
  if (shape.moe_routing_weights_fp32) {
    trace.alloc(L, "moe.output_fp32", b.weighted_x);
    trace.free("moe.weighted_output_reordered");
    trace.alloc(L, "mlp.output", b.x);
    trace.free("moe.output_fp32");
  } else {
    trace.alloc(L, "mlp.output", b.x);
    trace.free("moe.weighted_output_reordered");
  }
  trace.free(routing_weights);  // the block's local, dropped when it returns
  if (!keep) {
    for (const char* name : kHfGroupedSaved) trace.free(name);
    if (shape.moe_normalize_topk) {
      trace.free("moe.routing_values_before_division");
      trace.free("moe.routing_sum_fp32");
    }
    trace.free("moe.routing_indices");
    trace.free("moe.router_probs");
  }
}

// Backward of shared_expert_mlp_forward(keep=true), from "moe.shared_output_grad".
void shared_expert_mlp_backward(TensorTrace& trace, const MoeBytes& b) {
  trace.set_moment("moe shared expert");
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

// Backward of hf_grouped_mm_forward(keep=true), PyTorch's derivatives (derivatives.yaml,
// FunctionsManual.cpp) of each op in turn. The gathered pairs' gradient is the first to reach the
// block's input, so it becomes `input_grad_name` unless that is already live (a shared expert's
// gate sends its part first); the router's is summed in.
void hf_grouped_mm_backward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl,
                            const char* input_grad_name) {
  const MoeBytes b(shape, impl);
  trace.set_moment("moe experts");
  // .to(hidden_states.dtype) from fp32 routing weights: the gradient cast back to fp32.
  if (shape.moe_routing_weights_fp32) trace.alloc(L, "moe.output_fp32_grad", b.weighted_x);
  // .sum(dim=1) expands the gradient over k; the .view(T, k, h)'s backward reshapes that expanded
  // tensor into [T*k, h], a copy.
  trace.alloc(L, "moe.weighted_output_reordered_grad", b.weighted_pairs_x);
  if (shape.moe_routing_weights_fp32) trace.free("moe.output_fp32_grad");
  // weighted_out[inv_perm]: zeros [T*k, h] with the rows put back in place (index_backward's
  // _index_put_impl_; under a dispatch mode PyTorch takes its out-of-place branch, one more).
  trace.alloc(L, "moe.weighted_output_grad", b.weighted_pairs_x);
  trace.free("moe.weighted_output_reordered_grad");
  trace.free("moe.pair_inverse_order");
  // proj_out * sample_weights_g[:, None] (MulBackward0, mul_tensor_backward): both products in the
  // gradient's dtype while the incoming gradient is held, the weights' (grad * proj_out) first;
  // once the node returns, the engine casts the outputs' gradient to proj_out's dtype and sums the
  // weights' over h (validate_outputs), in that order.
  trace.alloc(L, "moe.pair_weights_grad_product", b.weighted_pairs_x);
  trace.alloc(L, "moe.expert_output_grad_product", b.weighted_pairs_x);
  trace.free("moe.weighted_output_grad");
  trace.free("moe.pair_weights");
  if (shape.moe_routing_weights_fp32) {
    trace.alloc(L, "moe.expert_output_grad", b.pairs_x);
    trace.free("moe.expert_output_grad_product");
  } else {
    trace.alias("moe.expert_output_grad_product", L, "moe.expert_output_grad");
    trace.free("moe.expert_output_grad_product");
  }
  trace.alloc(L, "moe.pair_weights_grad", b.pair_weights);
  trace.free("moe.pair_weights_grad_product");
  trace.alloc(L, "moe.expert_product_grad", b.pairs_f);  // down grouped_mm's input gradient
  trace.free("moe.expert_output_grad");
  trace.free("moe.expert_outputs");
  trace.free("moe.expert_product");
  trace.alloc(L, "moe.expert_act_grad", b.pairs_f);
  trace.alloc(L, "moe.expert_up_grad", b.pairs_f);
  trace.free("moe.expert_product_grad");
  trace.free("moe.expert_act");
  trace.alloc(L, "moe.expert_gate_grad", b.pairs_f);
  trace.free("moe.expert_act_grad");
  trace.alloc(L, "moe.expert_gate_up_grad", 2.0 * b.pairs_f);  // the halves' gradients put together
  trace.free("moe.expert_gate_grad");
  trace.free("moe.expert_up_grad");
  trace.free("moe.expert_gate_up");
  trace.alloc(L, "moe.expert_input_grad", b.pairs_x);  // gate_up grouped_mm's input gradient
  trace.free("moe.expert_gate_up_grad");
  trace.free("moe.expert_offsets");
  trace.free("moe.expert_inputs");
  trace.alloc(L, "moe.gather_grad", b.x);  // index backward: zeros [T, h] with the pairs added in
  trace.free("moe.expert_input_grad");
  trace.free("moe.pair_token_index");
  if (!trace.is_live(input_grad_name)) trace.alias("moe.gather_grad", L, input_grad_name);
  trace.free("moe.gather_grad");  // otherwise summed into the block's input gradient
  trace.free("moe.pair_order");
  trace.free("moe.pair_weights_grad");  // through the sort's gather to the router's weights
  trace.set_moment("moe router");
  if (shape.moe_normalize_topk) {
    trace.free("moe.routing_values_before_division");
    trace.free("moe.routing_sum_fp32");
  }
  router_backward(trace, b);
  trace.free("moe.routing_indices");
}

// transformers 4's router and expert loop, or ArcticMoE's grouped GEMM. Leaves "mlp.output" live.
void routed_experts_forward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl, bool keep) {
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
}

// Qwen2-MoE's shared expert: a SwiGLU MLP of width I_s on every token (its saved tensors; the
// output "moe.shared_output" stays for the gate's multiply)...
constexpr const char* kSharedExpertSaved[] = {"moe.shared_gate", "moe.shared_up", "moe.shared_act", "moe.shared_product"};
void shared_expert_mlp_forward(TensorTrace& trace, const MoeBytes& b, bool keep) {
  trace.set_moment("moe shared expert");
  for (const char* name : kSharedExpertSaved) trace.alloc(L, name, b.shared_f);
  trace.alloc(L, "moe.shared_output", b.x);
  if (!keep)
    for (const char* name : kSharedExpertSaved) trace.free(name);
}

// ...times sigmoid(shared_expert_gate(x)), added to the routed output "mlp.output" (a new tensor,
// which becomes "mlp.output").
void shared_expert_gate_and_sum(TensorTrace& trace, const LayerShape& shape, const MoeBytes& b, bool keep) {
  trace.set_moment("moe shared expert");
  if (shape.shared_expert_gate) trace.alloc(L, "moe.shared_gate_sigmoid", b.shared_gate);
  trace.alloc(L, "moe.shared_weighted", b.x);
  if (!keep) {
    trace.free("moe.shared_output");
    if (shape.shared_expert_gate) trace.free("moe.shared_gate_sigmoid");
  }
  trace.alloc(L, "moe.output_sum", b.x);
  trace.free("moe.shared_weighted");
  trace.free("mlp.output");
  trace.alias("moe.output_sum", L, "mlp.output");
  trace.free("moe.output_sum");
}

// MoE block forward (HF SparseMoeBlock, Mixtral modeling L112-142; ArcticMoE moe.py L233-462).
// Leaves "mlp.output" live and, with keep, what backward reads. transformers 5's Qwen2-MoE block
// runs its shared expert's MLP first, then the router and the experts, then the shared expert's
// gate (Qwen2MoeSparseMoeBlock.forward); transformers 4's ran the shared expert after the experts.
void moe_forward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl, bool keep) {
  const MoeBytes b(shape, impl);
  const bool shared = shape.shared_expert_intermediate > 0;
  const bool transformers5 = impl.moe_experts == MoeExperts::moe_hf_grouped_mm;
  if (shared && transformers5) shared_expert_mlp_forward(trace, b, keep);
  if (transformers5) hf_grouped_mm_forward(trace, shape, impl, keep);
  else routed_experts_forward(trace, shape, impl, keep);
  if (shared && !transformers5) shared_expert_mlp_forward(trace, b, keep);
  if (shared) shared_expert_gate_and_sum(trace, shape, b, keep);
}

// Backward of moe_forward(keep=true); the incoming gradient is the caller's. Leaves
// `input_grad_name` ([T, h]) live: the sum of the router's, the shared expert's and every
// expert's gathered-token gradients.
void moe_backward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl, const char* input_grad_name) {
  const MoeBytes b(shape, impl);
  const bool shared = shape.shared_expert_intermediate > 0;
  const bool transformers5 = impl.moe_experts == MoeExperts::moe_hf_grouped_mm;
  // transformers 5's experts start the input gradient at their gather's backward (below); the
  // others are priced with it from the block's start.
  if (shared || !transformers5) trace.alloc(L, input_grad_name, b.x);
  if (shared) {
    // The gate's multiply first (the last op of the block): the shared output's gradient, which
    // then waits for the shared MLP's backward, and the gate's (grad * shared output, [T, h],
    // summed over h), whose linear's input gradient starts the block's.
    trace.set_moment("moe shared expert");
    trace.alloc(L, "moe.shared_output_grad", b.x);
    trace.alloc(L, "moe.shared_gate_grad_product", b.x);
    trace.free("moe.shared_gate_grad_product");
    trace.free("moe.shared_output");
    if (shape.shared_expert_gate) trace.free("moe.shared_gate_sigmoid");
  }
  // Autograd runs the nodes made last first: transformers 5's shared MLP (made before the router)
  // is differentiated after the experts and the router, its saved tensors waiting under them.
  if (transformers5) {
    hf_grouped_mm_backward(trace, shape, impl, input_grad_name);
    if (shared) shared_expert_mlp_backward(trace, b);
    return;
  }
  if (shared) shared_expert_mlp_backward(trace, b);
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
  router_backward(trace, b);
  trace.free("moe.routing_weights");
  trace.free("moe.routing_indices");
  trace.free("moe.routing_weights_fp32");
}

}  // namespace longseq::inventory

namespace longseq {

using namespace inventory;

const char* moe_experts_name(MoeExperts experts) {
  switch (experts) {
    case MoeExperts::moe_grouped_gemm: return "grouped_gemm";
    case MoeExperts::moe_hf_grouped_mm: return "hf_grouped_mm";
    case MoeExperts::moe_hf_expert_loop: break;
  }
  return "hf_expert_loop";
}

MoeExperts moe_experts_parse(const std::string& text, const std::string& source, const std::string& key) {
  for (MoeExperts experts : {MoeExperts::moe_hf_expert_loop, MoeExperts::moe_grouped_gemm, MoeExperts::moe_hf_grouped_mm})
    if (text == moe_experts_name(experts)) return experts;
  throw ConfigError(source, key, "expected hf_expert_loop, grouped_gemm or hf_grouped_mm, got '" + text + "'");
}

}  // namespace longseq
