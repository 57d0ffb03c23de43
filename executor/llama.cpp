#include "executor/llama.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string_view>

#include "executor/llama_step.hpp"
#include "models/adapters.hpp"
#include "io/config_error.hpp"

namespace longseq {

LlamaLayout llama_layout(const ModelSpec& model) {
  LlamaLayout layout;
  const int64_t C = model.hidden_size, Q = model.q_width(), KV = model.kv_width(), F = model.intermediate_size;
  int64_t offset = 0;
  auto take = [&](int64_t elements) {
    const int64_t start = offset;
    offset += elements;
    return start;
  };
  layout.embedding = take(model.vocab_size * C);
  for (int64_t i = 0; i < model.num_layers; ++i) {
    LlamaLayout::Layer layer{};
    layer.attention_norm = take(C);
    layer.q_proj = take(Q * C);
    layer.k_proj = take(KV * C);
    layer.v_proj = take(KV * C);
    layer.o_proj = take(C * Q);
    layer.mlp_norm = take(C);
    if (model.is_moe()) {
      layer.router = take(model.experts * C);
      layer.experts = take(model.experts * 3 * model.expert_intermediate_size * C);
      const int64_t S = model.shared_expert_intermediate_size;
      layer.gate_proj = take(S * C);
      layer.up_proj = take(S * C);
      layer.down_proj = take(C * S);
      layer.shared_expert_gate = model.shared_expert_gate ? take(C) : -1;
    } else {
      layer.gate_proj = take(F * C);
      layer.up_proj = take(F * C);
      layer.down_proj = take(C * F);
    }
    layout.layers.push_back(layer);
  }
  layout.final_norm = take(C);
  layout.lm_head = model.tied_embeddings ? layout.embedding : take(model.vocab_size * C);
  layout.total = offset;
  return layout;
}

LoraLayout lora_layout(const ModelSpec& model, const LoraConfig& lora) {
  LoraLayout layout;
  layout.rank = lora.rank;
  layout.scale = lora.scale();
  if (lora.rank <= 0) return layout;
  const auto& names = kLayerLinearNames;
  const std::vector<LayerLinear> adapted = lora_adapted_linears(model, lora.all_linear);
  int64_t offset = 0;
  for (int64_t i = 0; i < model.num_layers; ++i) {
    std::array<LoraLayout::Adapter, kLayerLinears> layer{};
    for (const LayerLinear& linear : adapted) {
      const auto kind = static_cast<size_t>(std::find(names.begin(), names.end(), linear.name) - names.begin());
      if (kind >= names.size()) throw std::logic_error(std::string("lora_layout: no executor linear named ") + linear.name);
      LoraLayout::Adapter& adapter = layer[kind];
      adapter.in = linear.in;
      adapter.out = linear.out;
      adapter.a = offset;
      offset += lora.rank * linear.in;
      adapter.b = offset;
      offset += linear.out * lora.rank;
    }
    layout.layers.push_back(layer);
  }
  layout.total = offset;
  return layout;
}

std::vector<float> lora_initial_adapters(const LoraLayout& layout) {
  std::vector<float> values(static_cast<size_t>(layout.total), 0.0f);
  for (const auto& layer : layout.layers)
    for (const LoraLayout::Adapter& adapter : layer) {
      if (!adapter.present()) continue;
      const double bound = 1.0 / std::sqrt(static_cast<double>(adapter.in));
      for (int64_t i = 0; i < layout.rank * adapter.in; ++i)
        values[static_cast<size_t>(adapter.a + i)] = static_cast<float>(bound * std::sin(0.7 * static_cast<double>(adapter.a + i) + 0.3));
    }
  return values;
}

void executor_model_check(const ModelSpec& model) {
  // The executor implements Llama-style blocks; anything else would train a different model.
  std::string unsupported;
  if (model.mlp_kind != MlpKind::mlp_kind_swiglu) unsupported += " a GELU MLP";
  if (model.norm_kind != NormKind::norm_kind_rmsnorm) unsupported += " LayerNorm";
  if (model.qkv_bias || model.o_proj_bias || model.mlp_bias) unsupported += " biases";
  if (model.qk_norm) unsupported += " q/k norms";
  if (model.norms_per_layer != 2) unsupported += " post-attention and post-feedforward norms";
  if (model.norm_scale_fp32) unsupported += " Gemma's (1 + w) norm scale";
  if (model.output_router_logits) unsupported += " the auxiliary router loss (output_router_logits)";
  if (!unsupported.empty())
    throw ConfigError(model.name, "", "the executor trains Llama-style models (SwiGLU, RMSNorm, two norms a layer, no biases, no q/k norms; dense or "
                                      "with routed and shared experts); this one has" + unsupported);
}

template class BasicLlamaModel<CpuOps>;

}  // namespace longseq
