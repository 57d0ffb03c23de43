// test_models.hpp: the small Llama-shaped model the planner tests derive values for by hand:
// h=64, n_q=8, d=8 (so n_q*d = h), f=128, V=512, SwiGLU, RMSNorm, untied.
#pragma once

#include <cstdint>

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

}  // namespace longseq::testing
