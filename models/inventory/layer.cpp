// layer.cpp: one decoder layer from its blocks (attention.cpp, mlp.cpp, moe.cpp, lora.cpp), and the
// sizes derived from it (the saved set, FPDT's host chunks, pinned allocations).
#include "models/inventory/internal.hpp"


namespace longseq {

using namespace inventory;

namespace {

// Gemma 2/3's post-attention and post-feedforward norms run over a block's output before the
// residual add, whose output they feed (the add saves nothing). Eager, they save what every eager
// norm saves; a fused norm (Liger's) saves its input, the block's output, instead.
bool post_norm_saves_input(const LayerShape& shape, const LayerImplementation& impl, bool keep) {
  return shape.post_norms && keep && !impl.eager_rms_norm;
}

void post_norm_forward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl, bool keep,
                       const EagerNormNames& names, const char* output) {
  if (!shape.post_norms) return;
  const Bytes bytes(shape, impl);
  eager_norm_saved_alloc(trace, L, names, bytes.x, shape.hidden, shape, impl);
  if (!keep) eager_norm_saved_free(trace, names, shape, impl);
  trace.alloc(L, output, bytes.x);
}

// The norm's input gradient `input_grad` (a new [T, h]) from the output's; what it saved dies.
void post_norm_backward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl, const EagerNormNames& names,
                        const char* input, const char* input_grad) {
  if (!shape.post_norms) return;
  const Bytes bytes(shape, impl);
  eager_norm_backward_transients(trace, L, names, bytes.x_fp32, impl);
  trace.alloc(L, input_grad, bytes.x);
  if (impl.eager_rms_norm) eager_norm_saved_free(trace, names, shape, impl);
  else trace.free(input);
}

}  // namespace

void decoder_layer_forward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl, bool keep) {
  if (impl.megatron_te_layer) return megatron_layer_forward(trace, shape, impl, keep);
  const Bytes bytes(shape, impl);
  if (shape.fpdt_chunk_tokens > 0) fpdt_attention_forward(trace, shape, impl, keep);
  else ulysses_attention_forward(trace, shape, impl, keep);

  trace.set_moment("o_proj and residual");
  lora_forward(trace, shape, lora_output_projection(shape, impl), keep);
  trace.alloc(L, "attention.o_proj_output", bytes.x);
  if (!keep) trace.free("attention.output_local");
  if (!keep) trace.free("attention_norm.output");
  post_norm_forward(trace, shape, impl, keep, kPostAttentionNormSaved, "attention.post_norm_output");
  trace.alloc(L, "residual.attention", bytes.x);
  if (shape.post_norms) trace.free("attention.post_norm_output");
  if (!post_norm_saves_input(shape, impl, keep)) trace.free("attention.o_proj_output");

  trace.set_moment("mlp");
  trace.alloc(L, "mlp_norm.output", bytes.x);
  eager_norm_saved_alloc(trace, L, kMlpNormSaved, bytes.x, shape.hidden, shape, impl);
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
  post_norm_forward(trace, shape, impl, keep, kPostMlpNormSaved, "mlp.post_norm_output");
  trace.alloc(L, "layer.output", bytes.x);
  if (shape.post_norms) trace.free("mlp.post_norm_output");
  if (!post_norm_saves_input(shape, impl, keep)) trace.free("mlp.output");
  // The residual is read by the MLP's norm and the last add, neither of which saves it when the norm
  // is eager (it saves its fp32 copy); a fused norm (Liger's, the executor's) saves its input.
  if (!keep || impl.eager_rms_norm) trace.free("residual.attention");
}


void decoder_layer_backward(TensorTrace& trace, const LayerShape& shape, const LayerImplementation& impl) {
  if (impl.megatron_te_layer) return megatron_layer_backward(trace, shape, impl);
  const Bytes bytes(shape, impl);

  trace.set_moment("mlp");
  // Gemma's post-feedforward norm first: its input gradient is the MLP output's (read by down_proj's
  // backward, and held here through the MLP's: an upper bound by one [T, h] after down_proj).
  post_norm_backward(trace, shape, impl, kPostMlpNormSaved, "mlp.output", "mlp.post_norm_input_grad");
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
  if (shape.post_norms) trace.free("mlp.post_norm_input_grad");
  lora_backward(trace, shape, lora_mlp(shape, impl));
  weight_gradient_alloc(trace, "grad.mlp", impl.weight_gradients.mlp_rest);

  trace.set_moment("mlp norm");
  // RMSNorm backward, with the residual branch's gradient summed in.
  eager_norm_backward_transients(trace, L, kMlpNormSaved, bytes.x_fp32, impl);
  trace.alloc(L, "residual.attention_grad", bytes.x);
  eager_norm_saved_free(trace, kMlpNormSaved, shape, impl);
  trace.free("mlp.input_grad");
  if (!impl.eager_rms_norm) trace.free("residual.attention");

  // Gemma's post-attention norm: its input gradient is o_proj's output gradient, freed by the
  // attention backward once o_proj's has run.
  post_norm_backward(trace, shape, impl, kPostAttentionNormSaved, "attention.o_proj_output", "attention.post_norm_input_grad");
  weight_gradient_alloc(trace, "grad.attention.o_proj", impl.weight_gradients.attention_output);
  if (shape.fpdt_chunk_tokens > 0) fpdt_attention_backward(trace, shape, impl);
  else ulysses_attention_backward(trace, shape, impl);

  lora_backward(trace, shape, lora_output_projection(shape, impl));
  lora_backward(trace, shape, lora_attention_projections(shape, impl));
  weight_gradient_alloc(trace, "grad.attention_and_norms", impl.weight_gradients.attention_rest);
  trace.set_moment("attention norm");
  if (shape.input_requires_grad) {
    eager_norm_backward_transients(trace, L, kAttentionNormSaved, bytes.x_fp32, impl);
    trace.alloc(L, "layer.input_grad", bytes.x);
    eager_norm_saved_free(trace, kAttentionNormSaved, shape, impl);
    trace.free("attention_norm.output_grad");
  }
  trace.free("residual.attention_grad");
  trace.free("layer.output_grad");
  if (trace.is_live("layer.output")) trace.free("layer.output");
  // The layer's input: its checkpoint, or (no checkpointing) a fused norm's saved input; with an
  // eager norm and no checkpoint nothing holds it, and the caller has freed it after forward.
  if (trace.is_live("layer.input")) trace.free("layer.input");
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
  if (impl.megatron_te_layer) return megatron_layer_saved_bytes(shape, impl);
  TensorTrace trace;
  const Bytes bytes(shape, impl);
  trace.alloc(L, "layer.input", bytes.x);
  decoder_layer_forward(trace, shape, impl, /*keep=*/true);
  // Everything but layer.output; an eager norm saves its fp32 copy, not the layer's input.
  return trace.current_bytes() - bytes.x - (impl.eager_rms_norm ? bytes.x : 0.0);
}

double decoder_layer_op_selective_saved_bytes(const LayerShape& shape, const LayerImplementation& impl) {
  const Bytes bytes(shape, impl);
  const double gate = static_cast<double>(shape.tokens) * static_cast<double>(shape.intermediate) * static_cast<double>(impl.activation_bytes);
  const double input = bytes.x, q_proj = bytes.q, v_proj = bytes.kv, attention_output = bytes.q, logsumexp = bytes.lse, down_proj = bytes.x;
  return input + q_proj + v_proj + attention_output + logsumexp + gate + down_proj;
}

}  // namespace longseq
