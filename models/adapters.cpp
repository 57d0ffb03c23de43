#include "models/adapters.hpp"

#include <string_view>

namespace longseq {

std::vector<LayerLinear> decoder_layer_linears(const ModelSpec& model) {
  const int64_t h = model.hidden_size, f = model.intermediate_size;
  std::vector<LayerLinear> linears = {{"q_proj", h, model.q_width(), lora_adapts("q_proj", false)},
                                      {"k_proj", h, model.kv_width(), lora_adapts("k_proj", false)},
                                      {"v_proj", h, model.kv_width(), lora_adapts("v_proj", false)},
                                      {"o_proj", model.q_width(), h, lora_adapts("o_proj", false)}};
  if (model.mlp_kind == MlpKind::mlp_kind_swiglu) linears.push_back({"gate_proj", h, f, lora_adapts("gate_proj", false)});
  linears.push_back({"up_proj", h, f, lora_adapts("up_proj", false)});
  linears.push_back({"down_proj", f, h, lora_adapts("down_proj", false)});
  return linears;
}

bool lora_adapts(std::string_view name, bool all_linear) {
  // PEFT's default target_modules for Llama, Qwen, Mistral and Gemma (item 1).
  return all_linear || name == "q_proj" || name == "v_proj";
}

std::vector<LayerLinear> lora_adapted_linears(const ModelSpec& model, bool all_linear) {
  std::vector<LayerLinear> adapted;
  for (const LayerLinear& linear : decoder_layer_linears(model))
    if (all_linear || linear.adapted_by_default) adapted.push_back(linear);
  return adapted;
}

int64_t lora_parameter_count(const ModelSpec& model, int64_t rank, bool all_linear) {
  int64_t per_layer = 0;
  for (const LayerLinear& linear : lora_adapted_linears(model, all_linear)) per_layer += rank * (linear.in + linear.out);
  return model.num_layers * per_layer;
}

int64_t layer_linear_parameter_count(const ModelSpec& model) {
  int64_t per_layer = 0;
  for (const LayerLinear& linear : decoder_layer_linears(model)) per_layer += linear.in * linear.out;
  return model.num_layers * per_layer;
}

double nf4_weight_bytes(int64_t elements, bool double_quant) {
  const int64_t blocks = (elements + 63) / 64;
  const double packed = static_cast<double>((elements + 1) / 2);
  const double code = 16 * 4.0;
  if (!double_quant) return packed + static_cast<double>(blocks) * 4.0 + code;
  const int64_t nested_blocks = (blocks + 255) / 256;
  return packed + static_cast<double>(blocks) + static_cast<double>(nested_blocks) * 4.0 + code + 256 * 4.0 + 4.0;
}

Nf4LayerBytes nf4_layer_bytes(const ModelSpec& model, bool double_quant) {
  Nf4LayerBytes bytes;
  for (const LayerLinear& linear : decoder_layer_linears(model)) {
    const int64_t elements = linear.in * linear.out;
    const double packed = static_cast<double>((elements + 1) / 2);
    bytes.packed += packed;
    bytes.quant_state += nf4_weight_bytes(elements, double_quant) - packed;
  }
  return bytes;
}

double nf4_layer_linears_bytes(const ModelSpec& model, bool double_quant) {
  const Nf4LayerBytes per_layer = nf4_layer_bytes(model, double_quant);
  return static_cast<double>(model.num_layers) * (per_layer.packed + per_layer.quant_state);
}

double adam_8bit_state_bytes(int64_t elements) {
  if (elements < 4096) return 8.0 * static_cast<double>(elements);
  const int64_t blocks = (elements + 255) / 256;
  return 2.0 * (static_cast<double>(elements) + 4.0 * static_cast<double>(blocks));
}

std::vector<int64_t> parameter_tensor_elements(const ModelSpec& model) {
  const int64_t h = model.hidden_size;
  // Every parameter tensor of a decoder layer, as the model code allocates them.
  std::vector<int64_t> layer;
  const int64_t norm_tensors = model.norm_kind == NormKind::norm_kind_layernorm ? 2 : 1;  // weight (+ bias)
  for (int64_t i = 0; i < model.norms_per_layer * norm_tensors; ++i) layer.push_back(h);
  for (const LayerLinear& linear : decoder_layer_linears(model)) {
    const std::string_view name(linear.name);
    const bool mlp = name == "gate_proj" || name == "up_proj" || name == "down_proj";
    if (!(mlp && model.is_moe())) layer.push_back(linear.in * linear.out);
  }
  if (model.qkv_bias)
    for (int64_t width : {model.q_width(), model.kv_width(), model.kv_width()}) layer.push_back(width);
  if (model.o_proj_bias) layer.push_back(h);
  if (model.mlp_bias) {
    if (model.mlp_kind == MlpKind::mlp_kind_swiglu) layer.push_back(model.intermediate_size);
    layer.push_back(model.intermediate_size);
    layer.push_back(h);
  }
  if (model.qk_norm) layer.insert(layer.end(), {model.head_dim, model.head_dim});
  if (model.is_moe()) {
    // The router and each expert's gate, up and down (an expert loop's nn.Linear each), the shared
    // expert and its gate.
    layer.push_back(h * model.experts);
    for (int64_t e = 0; e < 3 * model.experts; ++e) layer.push_back(h * model.expert_intermediate_size);
    if (model.shared_expert_intermediate_size > 0)
      for (int i = 0; i < 3; ++i) layer.push_back(h * model.shared_expert_intermediate_size);
    if (model.shared_expert_gate) layer.push_back(h);
  }
  std::vector<int64_t> tensors = {model.vocab_size * h};  // the embedding
  for (int64_t i = 0; i < model.num_layers; ++i) tensors.insert(tensors.end(), layer.begin(), layer.end());
  for (int64_t i = 0; i < norm_tensors; ++i) tensors.push_back(h);  // the final norm
  if (!model.tied_embeddings) tensors.push_back(model.vocab_size * h);
  return tensors;
}

double adam_8bit_model_state_bytes(const ModelSpec& model) {
  double bytes = 0;
  for (int64_t elements : parameter_tensor_elements(model)) bytes += adam_8bit_state_bytes(elements);
  return bytes;
}

double adam_8bit_lora_state_bytes(const ModelSpec& model, int64_t rank, bool all_linear) {
  double per_layer = 0;
  for (const LayerLinear& linear : lora_adapted_linears(model, all_linear))
    per_layer += adam_8bit_state_bytes(rank * linear.in) + adam_8bit_state_bytes(linear.out * rank);
  return static_cast<double>(model.num_layers) * per_layer;
}

}  // namespace longseq
