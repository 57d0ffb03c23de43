// mlp.cpp: the dense MLP block (SwiGLU or GELU, fused projections, a frozen base) and its TiledMLP
// tiles, forward and backward, as HF LlamaMLP and DeepSpeed TiledMLP allocate them.
#include "models/inventory/internal.hpp"

namespace longseq::inventory {

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
    // PEFT's down_proj adapter (lora.Linear.forward): x.to(lora_A's dtype), an fp32 copy of the
    // product, and lora_B's output beside the base's, while the product is still held by the call.
    if (lora_adapts_down_proj_input_fp32(shape)) {
      trace.alloc(L, "lora.down_proj.input_fp32", tokens * static_cast<double>(shape.intermediate) * 4.0);
      trace.alloc(L, "lora.down_proj.output", out);
      trace.free("lora.down_proj.output");
      trace.free("lora.down_proj.input_fp32");
    }
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
    weight_gradient_alloc(trace, "grad.mlp.down_proj", impl.weight_gradients.mlp_down);
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
    weight_gradient_alloc(trace, "grad.mlp.down_proj", impl.weight_gradients.mlp_down);
    if (base_linears_save_input(shape)) trace.free("mlp.act");
    trace.alloc(L, "mlp.up_grad", f);
    trace.free("mlp.act_grad");
    trace.alloc(L, input_grad_name, out);
    trace.free("mlp.up_grad");
    trace.free("mlp.up");
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

}  // namespace longseq::inventory
