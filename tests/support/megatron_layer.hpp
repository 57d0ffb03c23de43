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

}  // namespace longseq::testing
