#include "models/adapters.hpp"

namespace longseq {

std::vector<LayerLinear> decoder_layer_linears(const ModelSpec& model) {
  const int64_t h = model.hidden_size, f = model.intermediate_size;
  std::vector<LayerLinear> linears = {{"q_proj", h, model.q_width(), true},
                                      {"k_proj", h, model.kv_width(), false},
                                      {"v_proj", h, model.kv_width(), true},
                                      {"o_proj", model.q_width(), h, false}};
  if (model.mlp_kind == MlpKind::mlp_kind_swiglu) linears.push_back({"gate_proj", h, f, false});
  linears.push_back({"up_proj", h, f, false});
  linears.push_back({"down_proj", f, h, false});
  return linears;
}

int64_t lora_parameter_count(const ModelSpec& model, int64_t rank, bool all_linear) {
  int64_t per_layer = 0;
  for (const LayerLinear& linear : decoder_layer_linears(model))
    if (all_linear || linear.adapted_by_default) per_layer += rank * (linear.in + linear.out);
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

double nf4_layer_linears_bytes(const ModelSpec& model, bool double_quant) {
  double per_layer = 0;
  for (const LayerLinear& linear : decoder_layer_linears(model)) per_layer += nf4_weight_bytes(linear.in * linear.out, double_quant);
  return static_cast<double>(model.num_layers) * per_layer;
}

}  // namespace longseq
