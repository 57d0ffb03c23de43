// megatron_layer.hpp: Megatron-Core's TE layer in bf16 as the layer-inventory tests of its MoE layer
// and its multi-head latent attention price it (Megatron's native loss, the fused SwiGLU).
#pragma once

#include "models/layer_inventory.hpp"

namespace longseq::testing {

inline LayerImplementation megatron_te_layer_impl() {
  LayerImplementation impl;
  impl.activation_bytes = 2;
  impl.megatron_te_layer = true;
  return impl;
}

// One layer's step as a trace: its forward keeping what backward reads, from its sequence-parallel
// input of `hidden` features in bf16, then its backward; a schedule frees all it makes, leaving
// "layer.input_grad" alone.
inline TensorTrace megatron_layer_step(const LayerShape& shape, const LayerImplementation& impl = megatron_te_layer_impl()) {
  const double shard = static_cast<double>(shape.hidden_state_tokens()) * static_cast<double>(shape.hidden) * 2;
  TensorTrace trace;
  trace.alloc(kCategoryLayer, "layer.input", shard);
  decoder_layer_forward(trace, shape, impl, /*keep_for_backward=*/true);
  trace.alloc(kCategoryLayer, "layer.output_grad", shard);
  decoder_layer_backward(trace, shape, impl);
  return trace;
}

}  // namespace longseq::testing
