// test_models.hpp: the small Llama-shaped model the planner tests derive values for by hand:
// h=64, n_q=8, d=8 (so n_q*d = h), f=128, V=512, SwiGLU, RMSNorm, untied.
#pragma once

#include <cstdint>

#include "models/layer_inventory.hpp"
#include "models/model_spec.hpp"

namespace longseq::testing {

inline ModelSpec small_llama(int64_t layers, int64_t kv_heads) {
  ModelSpec model;
  model.name = "small";
  model.num_layers = layers;
  model.hidden_size = 64;
  model.num_q_heads = 8;
  model.num_kv_heads = kv_heads;
  model.head_dim = 8;
  model.intermediate_size = 128;
  model.vocab_size = 512;
  return model;
}

// One decoder layer of small_llama(_, kv_heads) over `tokens` tokens, as the planner shapes it.
inline LayerShape small_llama_layer_shape(int64_t tokens, int64_t kv_heads) {
  const ModelSpec model = small_llama(1, kv_heads);
  LayerShape shape;
  shape.tokens = tokens;
  shape.hidden = model.hidden_size;
  shape.q_width = model.q_width();
  shape.kv_width = model.kv_width();
  shape.num_q_heads = model.num_q_heads;
  shape.num_kv_heads = model.num_kv_heads;
  shape.head_dim = model.head_dim;
  shape.intermediate = model.intermediate_size;
  shape.vocab = model.vocab_size;
  return shape;
}

}  // namespace longseq::testing
