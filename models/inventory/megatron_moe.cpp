// megatron_moe.cpp: Megatron-Core's MoE layer in place of the GPT layer's MLP (MoELayer with the
// all-to-all token dispatcher and TE's grouped experts, as the TE spec builds it for a MoE model:
// gpt_layer_specs.py L157, pre_mlp_layernorm a TENorm; moe_module_specs.py, TEGroupedMLP), forward
// and backward, under expert parallelism with expert_tensor_parallel_size 1. Facts and citations:
// docs/reference-megatron-core.md M6 (megatron-core 0.19.2, megatron/core/transformer/moe/).
//
// Sizes a rank holds (T_s = T/t: the tokens of this rank's sequence-parallel shard, which its router
// routes, M6.4; P = T_s k token-expert pairs, as many arriving as leaving under balanced routing):
//   the pre-MLP norm's output, the block's output        [T_s, h]
//   permuted, dispatched, sorted and combined tokens      [P, h]
//   the grouped fc1's output, the weighted SwiGLU's       [P, 2 f_e], [P, f_e]
//   the router's logits and probabilities                 [T_s, E]
// What each layer's dispatcher keeps between steps (its probabilities, routing map and permutation
// map, M6.5) is not a layer's working set: megatron_moe_dispatcher_held_bytes prices it per layer.
// In FP8 (M10.4) the experts' inputs are padded per expert for TE's grouped GEMMs and saved quantized,
// as fc2's are; the router and the dispatcher stay in their dtypes.
#include "models/inventory/internal.hpp"

namespace longseq::inventory {

namespace {

struct MegatronMoeBytes {
  double shard;        // [T_s, h]
  double rsigma;       // fp32 [T_s] x 2: a TE norm's saved statistics (as megatron.cpp's)
  double logits;       // [T_s, E] in the router's dtype (the input's, or fp32: moe_router_dtype)
  double scores_fp32;  // [T_s, E] fp32: the aux loss's softmax over every expert
  double topk_fp32;    // fp32: what the router's scoring saves (a softmax's, or the sigmoid's)
  double pairs_x;      // [P, h]
  double pairs_f;      // [P, f_e]
  double pair_probs;   // [P] in the router's dtype: the permuted probabilities
  double gathered;     // [T, h]: the shared experts' input gathered over the TP ranks
  double shared_fc1, shared_activation;  // [T, 2 I_s / t], [T, I_s / t]: the shared experts' (a TP rank's share)
  double shared_gate;  // [T_s, 1]: the shared experts' sigmoid gate
  TeFp8 fp8;  // FP8 (M10.4): what the grouped and the shared experts' linears quantize
  MegatronMoeBytes(const LayerShape& shape, const LayerImplementation& impl) : fp8(impl) {
    const double a = static_cast<double>(impl.activation_bytes);
    const double tokens = static_cast<double>(shape.hidden_state_tokens());
    const double experts = static_cast<double>(shape.experts), k = static_cast<double>(shape.experts_per_token);
    const double pairs = tokens * k;
    shard = tokens * static_cast<double>(shape.hidden) * a;
    rsigma = tokens * 4.0 * 2.0;
    const double router_bytes = shape.moe_router_fp32 ? 4.0 : a;
    logits = tokens * experts * router_bytes;
    scores_fp32 = tokens * experts * 4.0;
    // A router that renormalizes its k (norm_topk_prob) is Megatron's top-k then softmax over the k;
    // one that does not, its pre-softmax over every expert, then the top-k (moe_utils.py L840-853).
    // A sigmoid router (DeepSeek-V3's; L854-875, M9.2) instead: the sigmoid saves its fp32 output over
    // every expert, the gather of the chosen k its int64 indices, the renormalizing division the k
    // scores and their sum (the group limit and the expert bias only choose: their tensors are transient).
    topk_fp32 = shape.moe_router_sigmoid ? tokens * experts * 4.0 + tokens * k * (4.0 + 8.0) + tokens * 4.0
                                         : tokens * (shape.moe_normalize_topk ? k : experts) * 4.0;
    pairs_x = pairs * static_cast<double>(shape.hidden) * a;
    pairs_f = pairs * static_cast<double>(shape.expert_intermediate) * a;
    pair_probs = pairs * router_bytes;  // probs.type_as(logits)
    const double all_tokens = static_cast<double>(shape.tokens), t = static_cast<double>(std::max<int64_t>(1, shape.tp));
    gathered = all_tokens * static_cast<double>(shape.hidden) * a;
    shared_activation = all_tokens * static_cast<double>(shape.shared_expert_intermediate) / t * a;
    shared_fc1 = 2.0 * shared_activation;
    shared_gate = tokens * a;
  }
};

// The all-to-all over the expert-parallel ranks writes a new tensor; over one rank it hands back its
// input (tensor_parallel/mappings.py _AllToAll.forward: world_size 1 returns the input).
bool exchanges(const LayerShape& shape) { return shape.ep > 1; }
// Sorting the arrived tokens by local expert (sort_chunks_by_idxs) copies them when a rank holds
// more than one expert (token_dispatcher.py dispatch_postprocess L747-775).
bool sorts(const LayerShape& shape) { return shape.experts / std::max<int64_t>(1, shape.ep) > 1; }

// A step that writes `name` anew (an all-to-all, a sort): the copy and the original both live until
// the original goes, then the copy carries the name.
void copy_over(TensorTrace& trace, const char* name, double bytes) {
  const int64_t copy = trace.alloc(L, "moe.copy_in_flight", bytes);
  trace.free(name);
  trace.rename_storage(copy, name);
}

// Megatron's SharedExpertMLP (shared_experts.py L102-202), computed before the router where not
// overlapped with the dispatch (moe_layer.py shared_experts_compute): Megatron's MLP with TE's
// column- and row-parallel linears on the pre-MLP norm's output. fc1 saves that shard (already saved
// for the router) and multiplies on it gathered over the TP ranks; the fused SwiGLU saves fc1's
// output, fc2 the activation's; fc2's output is reduce-scattered back to the shard (M1.1-M1.2). With
// moe_shared_expert_gate a sigmoid gate [T_s, 1] scales it: the multiply saves both.
//
// In FP8 (M10.1, as the dense layer's linears) fc1 quantizes its input, the norm's output, and saves
// that copy a byte an element (gathered in FP8 under TP; without TP both usages until its GEMM), and
// fc2 saves its quantized input in place of the activation's bf16 output.
void shared_experts_forward(TensorTrace& trace, const LayerShape& shape, const MegatronMoeBytes& bytes) {
  trace.set_moment("shared experts");
  const bool gathered = shape.tp > 1;
  bytes.fp8.input_quantize(trace, "shared_experts.fc1_input_fp8", bytes.shard, gathered);
  column_parallel_gather(trace, shape, bytes.fp8.on ? bytes.fp8.one(bytes.gathered) : bytes.gathered);
  trace.alloc(L, "shared_experts.fc1_output", bytes.shared_fc1);
  column_parallel_gather_free(trace, shape);
  bytes.fp8.rowwise_copy_free(trace, gathered);
  trace.alloc(L, "shared_experts.activation_output", bytes.shared_activation);
  bytes.fp8.input_quantize(trace, "shared_experts.activation_output_fp8", bytes.shared_activation, /*gathered=*/false);
  const int64_t mlp_output = row_parallel_reduce_scatter(trace, shape, bytes.gathered, bytes.shard, "shared_experts.mlp_output");
  bytes.fp8.rowwise_copy_free(trace, /*gathered=*/false);
  if (bytes.fp8.on) trace.free("shared_experts.activation_output");
  if (shape.shared_expert_gate) {
    trace.alloc(L, "shared_experts.gate_logits", bytes.shared_gate);
    trace.alloc(L, "shared_experts.gate_score", bytes.shared_gate);
    trace.free("shared_experts.gate_logits");
    trace.alloc(L, "shared_experts.output", bytes.shard);
  } else {
    trace.rename_storage(mlp_output, "shared_experts.output");  // the MLP's output is the shared experts'
  }
}

// Its backward, after the router's (the autograd engine reaches the shared experts' branch of the
// output's sum once the routed branch's gradient has passed): the gate's, fc2's (its output gradient
// gathered), the SwiGLU's, and fc1's input gradient, produced whole and reduce-scattered, summed
// into the norm output's.
void shared_experts_backward(TensorTrace& trace, const LayerShape& shape, const MegatronMoeBytes& bytes) {
  trace.set_moment("shared experts backward");
  if (shape.shared_expert_gate) {
    trace.alloc(L, "shared_experts.mlp_output_grad", bytes.shard);
    trace.free("shared_experts.gate_score");
  }
  row_parallel_output_grad(trace, shape, bytes.fp8, bytes.gathered);  // fc2's output gradient
  trace.alloc(L, "shared_experts.activation_output_grad", bytes.shared_activation);
  row_parallel_output_grad_free(trace, shape, bytes.fp8);
  if (shape.shared_expert_gate) {
    trace.free("shared_experts.mlp_output_grad");
    trace.free("shared_experts.mlp_output");
  }
  trace.free(bytes.fp8.on ? "shared_experts.activation_output_fp8" : "shared_experts.activation_output");
  trace.alloc(L, "shared_experts.fc1_output_grad", bytes.shared_fc1);
  trace.free("shared_experts.activation_output_grad");
  trace.free("shared_experts.fc1_output");
  // fc1's: its input gathered again for its weight gradient (in FP8 the saved copy, transposed where
  // the card keeps transposed copies), its output gradient quantized, its input gradient reduce-scattered.
  bytes.fp8.output_grad_quantize(trace, bytes.shared_fc1);
  column_parallel_backward(trace, shape, bytes.fp8.on ? bytes.fp8.both(bytes.gathered) : bytes.gathered, bytes.shard,
                           "shared_experts.fc1_output_grad", "shared_experts.input_grad_partial", "shared_experts.input_grad");
  bytes.fp8.output_grad_free(trace);
  if (bytes.fp8.on) trace.free("shared_experts.fc1_input_fp8");
  trace.free("shared_experts.input_grad");
}

}  // namespace

void megatron_moe_forward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl, bool keep) {
  const MegatronMoeBytes bytes(shape, impl);
  // The pre-MLP TENorm (gpt_layer_specs.py L157) saves its input, the residual, and its statistics;
  // its output is saved by the router's linear (router.py gating: router_gating_linear saves its input).
  trace.set_moment("pre-MLP norm and router");
  trace.alloc(L, "mlp_norm.output", bytes.shard);
  trace.alloc(L, "mlp_norm.rsigma_fp32", bytes.rsigma);
  if (shape.shared_expert_intermediate > 0) shared_experts_forward(trace, shape, bytes);
  // Router (router.py L87-125, moe_utils.py topk_routing_with_score_function L835-895; the sigmoid's
  // saved tensors are MegatronMoeBytes::topk_fp32's, under the same name): the logits
  // [T_s, E]; top-k on them, a softmax over the k chosen in fp32 (saved) cast back (or, pre-softmax,
  // the softmax over every expert first, saved, then the top-k); the dense
  // probabilities and routing map scattered to [T_s, E]. The load-balancing loss (aux_loss, as the
  // Bridge's Qwen3-MoE sets) takes a softmax over every expert in fp32, which it saves.
  trace.alloc(L, "moe.router_logits", bytes.logits);
  trace.alloc(L, "moe.topk_softmax_fp32", bytes.topk_fp32);
  trace.alloc(L, "moe.aux_loss_scores_fp32", bytes.scores_fp32);
  trace.free("moe.router_logits");
  // Permutation 1 (TE's fused permute with probabilities, moe_permute_fusion as the Bridge's recipes
  // set): the tokens gathered into [P, h] by expert rank; what it saves (the row-id map) the
  // dispatcher holds, priced per layer (M6.5).
  trace.set_moment("moe dispatch");
  trace.alloc(L, "moe.permuted_tokens", bytes.pairs_x);
  trace.alloc(L, "moe.permuted_probs", bytes.pair_probs);  // saved by the weighted SwiGLU
  // The all-to-all to the expert ranks (token_dispatcher.py token_dispatch L675-719). MoELayer's
  // forward keeps its Python names for the permuted and the dispatched tokens until it returns
  // (moe_layer.py custom_forward L660-690), so both stay live through the experts.
  if (exchanges(shape)) trace.alloc(L, "moe.dispatched_tokens", bytes.pairs_x);
  // Permutation 2: sorted by local expert; the grouped fc1 saves this copy. A rank of one expert
  // hands the experts the tokens as they arrived (dispatch_postprocess L750: no sort), and fc1 saves
  // those: the all-to-all's output (or, without one, the permuted tokens) under a second name.
  if (sorts(shape)) trace.alloc(L, "moe.expert_inputs", bytes.pairs_x);
  else trace.alias(exchanges(shape) ? "moe.dispatched_tokens" : "moe.permuted_tokens", L, "moe.expert_inputs");
  // TEGroupedMLP (experts.py L728-905): fc1's [P, 2 f_e] output saved by the fused weighted SwiGLU
  // (weighted_bias_swiglu_impl: its input and the probabilities), whose [P, f_e] output fc2 saves.
  trace.set_moment("moe experts");
  if (bytes.fp8.on) {
    // FP8 (M10.4): each expert's tokens padded to a multiple of 16 rows (experts.py L767-780, TE
    // Fp8Padding: a new [P', h] tensor and padded probabilities, P' ~ P), the weighted SwiGLU saving the
    // padded probabilities; fc1 quantizes its input for both GEMMs and saves the column-wise copy.
    trace.alloc(L, "moe.padded_inputs", bytes.pairs_x);
    trace.alloc(L, "moe.padded_probs", bytes.pair_probs);
    bytes.fp8.input_quantize(trace, "moe.expert_inputs_fp8", bytes.pairs_x, /*gathered=*/false);
  }
  trace.alloc(L, "moe.fc1_output", 2.0 * bytes.pairs_f);
  if (bytes.fp8.on) {
    bytes.fp8.rowwise_copy_free(trace, /*gathered=*/false);
    trace.free("moe.padded_inputs");
  }
  trace.alloc(L, "moe.activation_output", bytes.pairs_f);
  // fc2 likewise saves its quantized input; the activation's bf16 output goes with the forward.
  bytes.fp8.input_quantize(trace, "moe.activation_output_fp8", bytes.pairs_f, /*gathered=*/false);
  trace.alloc(L, "moe.fc2_output", bytes.pairs_x);
  if (bytes.fp8.on) {
    bytes.fp8.rowwise_copy_free(trace, /*gathered=*/false);
    trace.free("moe.activation_output");
    copy_over(trace, "moe.fc2_output", bytes.pairs_x);  // Fp8Unpadding: the output without the padded rows
  }
  // Selective recompute of the activation ("moe_act", experts.py L882-893): discarded once fc2 has
  // run, recomputed as backward reaches fc2.
  if (keep && shape.recompute.moe_act) trace.free("moe.activation_output");
  // Unsorting (combine_preprocess) and the all-to-all back (token_combine) each write a copy.
  trace.set_moment("moe combine");
  if (sorts(shape)) trace.alloc(L, "moe.unsorted_output", bytes.pairs_x);
  if (exchanges(shape)) trace.alloc(L, "moe.combined_output", bytes.pairs_x);
  // Unpermute (fused, no merging probabilities: they were applied in the experts) sums each token's
  // k outputs into [T_s, h]; the residual add writes the layer's output.
  trace.alloc(L, "moe.output", bytes.shard);
  for (const char* name : {"moe.fc2_output", "moe.unsorted_output", "moe.combined_output", "moe.dispatched_tokens", "moe.permuted_tokens"})
    if (trace.is_live(name)) trace.free(name);
  // In FP8 nothing saves the bf16 expert inputs (fc1 saved its quantized copy) or the unpadded
  // probabilities (the SwiGLU saved the padded ones): they go with the forward.
  if (bytes.fp8.on) {
    if (trace.is_live("moe.expert_inputs")) trace.free("moe.expert_inputs");
    trace.free("moe.permuted_probs");
  }
  // postprocess: the shared experts' output added (moe_layer.py L575-590).
  if (shape.shared_expert_intermediate > 0) {
    copy_over(trace, "moe.output", bytes.shard);
    trace.free("shared_experts.output");  // saved by nothing (gated, the multiply saved its inputs)
  }
  trace.alloc(L, "layer.output", bytes.shard);
  trace.free("moe.output");
  // Selective recompute of the pre-MLP norm ("layernorm", transformer_layer.py L977-982): its output
  // discarded after the MoE layer, recomputed when backward reaches it.
  if (keep && shape.recompute.layernorm) trace.free("mlp_norm.output");
  if (!keep) {
    for (const char* name : {"mlp_norm.output", "mlp_norm.rsigma_fp32", "moe.topk_softmax_fp32", "moe.aux_loss_scores_fp32", "moe.permuted_probs",
                             "moe.expert_inputs", "moe.fc1_output", "moe.activation_output", "moe.padded_probs", "moe.expert_inputs_fp8",
                             "moe.activation_output_fp8", "shared_experts.fc1_input_fp8", "shared_experts.activation_output_fp8",
                             "shared_experts.fc1_output",
                             "shared_experts.activation_output", "shared_experts.mlp_output", "shared_experts.gate_score"})
      if (trace.is_live(name)) trace.free(name);
    trace.free("residual.attention");
  }
}

void megatron_moe_backward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl) {
  const MegatronMoeBytes bytes(shape, impl);
  if (trace.is_live("layer.output")) trace.free("layer.output");
  if (shape.recompute.layernorm) trace.alloc(L, "mlp_norm.output", bytes.shard);  // recomputed (its hook: the layer's output gradient)
  // Unpermute's backward gathers each token's gradient to its k pairs; the all-to-all carries them to
  // the expert ranks and the sort orders them by local expert, each a new [P, h].
  trace.set_moment("moe combine backward");
  trace.alloc(L, "moe.pairs_grad", bytes.pairs_x);
  if (exchanges(shape)) copy_over(trace, "moe.pairs_grad", bytes.pairs_x);
  if (sorts(shape)) copy_over(trace, "moe.pairs_grad", bytes.pairs_x);
  // fc2's data gradient [P, f_e]; the weighted SwiGLU's [P, 2 f_e] and the probabilities' [P];
  // fc1's data gradient [P, h]. The weight gradients go to the DDP's buffer (model states).
  trace.set_moment("moe experts backward");
  if (shape.recompute.moe_act) trace.alloc(L, "moe.activation_output", bytes.pairs_f);  // recomputed from fc1's output
  // In FP8 the gradient padded again (Fp8Unpadding's backward) and quantized for fc2's two GEMMs.
  if (bytes.fp8.on) copy_over(trace, "moe.pairs_grad", bytes.pairs_x);
  bytes.fp8.output_grad_quantize(trace, bytes.pairs_x);
  trace.alloc(L, "moe.activation_output_grad", bytes.pairs_f);
  bytes.fp8.output_grad_free(trace);
  trace.free("moe.pairs_grad");
  trace.free(bytes.fp8.on ? "moe.activation_output_fp8" : "moe.activation_output");
  trace.alloc(L, "moe.fc1_output_grad", 2.0 * bytes.pairs_f);
  trace.alloc(L, "moe.permuted_probs_grad", bytes.pair_probs);
  trace.free("moe.activation_output_grad");
  trace.free("moe.fc1_output");
  bytes.fp8.output_grad_quantize(trace, 2.0 * bytes.pairs_f);
  trace.alloc(L, "moe.expert_inputs_grad", bytes.pairs_x);
  bytes.fp8.output_grad_free(trace);
  if (bytes.fp8.on) {
    trace.free("moe.expert_inputs_fp8");
    trace.free("moe.padded_probs");
    copy_over(trace, "moe.expert_inputs_grad", bytes.pairs_x);  // Fp8Padding's backward: the padded rows dropped
  }
  trace.free("moe.fc1_output_grad");
  if (trace.is_live("moe.expert_inputs")) trace.free("moe.expert_inputs");
  // Back through the sort and the all-to-all, then permute's backward sums the k pairs of a token.
  trace.set_moment("moe dispatch backward");
  if (sorts(shape)) copy_over(trace, "moe.expert_inputs_grad", bytes.pairs_x);
  if (exchanges(shape)) copy_over(trace, "moe.expert_inputs_grad", bytes.pairs_x);
  trace.alloc(L, "moe.tokens_grad", bytes.shard);
  trace.free("moe.expert_inputs_grad");
  // The router's backward: the permuted probabilities' gradient scattered to [T_s, E], through the
  // chosen experts' softmax and top-k to the logits, the aux loss's softmax gradient added, and the
  // gating linear's input gradient summed into the tokens'.
  trace.set_moment("router backward");
  trace.alloc(L, "moe.probs_grad", bytes.logits);
  trace.free("moe.permuted_probs_grad");
  if (trace.is_live("moe.permuted_probs")) trace.free("moe.permuted_probs");
  trace.alloc(L, "moe.aux_loss_scores_grad_fp32", bytes.scores_fp32);
  trace.alloc(L, "moe.router_logits_grad", bytes.logits);
  trace.free("moe.aux_loss_scores_grad_fp32");
  trace.free("moe.aux_loss_scores_fp32");
  trace.free("moe.topk_softmax_fp32");
  trace.free("moe.probs_grad");
  trace.alloc(L, "moe.router_input_grad", bytes.shard);
  trace.free("moe.router_logits_grad");
  trace.free("moe.router_input_grad");
  if (shape.shared_expert_intermediate > 0) shared_experts_backward(trace, shape, bytes);
  // The pre-MLP norm's backward: its input's gradient, to which the residual branch's is added.
  trace.set_moment("pre-MLP norm backward");
  trace.alloc(L, "residual.attention_grad", bytes.shard);
  trace.free("moe.tokens_grad");
  trace.free("mlp_norm.output");
  trace.free("mlp_norm.rsigma_fp32");
  trace.free("residual.attention");
}

}  // namespace longseq::inventory

namespace longseq {

double megatron_moe_dispatcher_held_bytes(const LayerShape& shape, const LayerImplementation& impl) {
  if (shape.experts <= 0) return 0;
  // MoEAlltoAllTokenDispatcher.dispatch_preprocess (token_dispatcher.py L636-672) keeps the router's
  // dense probabilities [T_s, E] (the router's dtype), its bool routing map [T_s, E] and the fused
  // permute's int32 row-id map [T_s, 2E + 1] (TE triton/permutation.py make_row_id_map) as
  // attributes, and nothing clears them: each MoE layer holds its last micro-batch's until its next
  // forward overwrites them, through recompute and backward alike (M6.5).
  const double tokens = static_cast<double>(shape.hidden_state_tokens()), experts = static_cast<double>(shape.experts);
  const double probs_bytes = shape.moe_router_fp32 ? 4.0 : static_cast<double>(impl.activation_bytes);  // the logits' dtype
  return tokens * experts * probs_bytes + tokens * experts + tokens * (2.0 * experts + 1.0) * 4.0;
}

}  // namespace longseq
