// adapters.hpp: what parameter-efficient fine-tuning keeps: LoRA adapters on a decoder layer's
// linears and a base stored as bitsandbytes NF4 (QLoRA). Sources: ../shared/REFERENCE-PEFT-MOE.md
// (Reference §12 part A), which cites PEFT v0.20.0 and bitsandbytes 0.50.1.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "models/model_spec.hpp"

namespace longseq {

// One linear of a decoder layer, as nn.Linear(in, out) (a gated MLP: q, k, v, o, gate, up, down).
struct LayerLinear {
  const char* name;
  int64_t in, out;
  bool adapted_by_default;  // among PEFT's default targets for Llama/Qwen/Mistral/Gemma: q_proj, v_proj (item 1)
};
std::vector<LayerLinear> decoder_layer_linears(const ModelSpec& model);

// The linears that get adapters: every one, or PEFT's defaults (q_proj, v_proj).
std::vector<LayerLinear> lora_adapted_linears(const ModelSpec& model, bool all_linear);
// Whether the decoder linear `name` gets an adapter under that choice.
bool lora_adapts(std::string_view name, bool all_linear);

// Parameters of the LoRA adapters of the whole model: r x (in + out) per adapted linear (lora_A is
// r x in, lora_B out x r; item 6), on every linear or on q_proj and v_proj only.
int64_t lora_parameter_count(const ModelSpec& model, int64_t rank, bool all_linear);

// Parameters in the decoder layers' linears (what QLoRA stores in 4 bits; the embedding, LM head
// and norms stay in floating point, item 16).
int64_t layer_linear_parameter_count(const ModelSpec& model);

// Bytes of one weight of `elements` values in NF4 (bitsandbytes quantize_4bit, blocks of 64; items
// 17-19): the packed values (n + 1) // 2, one fp32 absmax per block, and a 16-entry fp32 code; with
// double quantization the absmax in uint8 with an fp32 absmax per 256 of them, their 256-entry
// fp32 code and an fp32 offset.
double nf4_weight_bytes(int64_t elements, bool double_quant);

// The whole model's decoder-layer linears in NF4, weight by weight.
double nf4_layer_linears_bytes(const ModelSpec& model, bool double_quant);

// One decoder layer's NF4 linears split as ZeRO-3 sees them with bnb_4bit_quant_storage=bfloat16
// (Reference §12 item 14): the packed values, (n + 1) // 2 bytes a weight, stored as a bf16
// parameter that ZeRO partitions and gathers like any; and the quantization state (absmax, codes,
// offset), which lives on the Params4bit object beside the parameter rather than in it.
struct Nf4LayerBytes {
  double packed = 0;
  double quant_state = 0;
};
Nf4LayerBytes nf4_layer_bytes(const ModelSpec& model, bool double_quant);

// bitsandbytes' 8-bit AdamW state of one parameter tensor (Optimizer2State.init_state, item 23):
// two uint8 moments with an fp32 absmax per block of 256 values each; a tensor of fewer than 4,096
// values (min_8bit_size) keeps two fp32 moments, 8 bytes a value.
double adam_8bit_state_bytes(int64_t elements);
// Every parameter tensor of the model, by its values: the embedding, each layer's norms, linears,
// biases, q/k norms (MoE: router, experts, shared expert), the final norm, an untied LM head.
std::vector<int64_t> parameter_tensor_elements(const ModelSpec& model);
// 8-bit AdamW's state over every parameter tensor of the model (full fine-tuning), tensor by
// tensor: the norms, q/k norms and biases under 4,096 values stay fp32.
double adam_8bit_model_state_bytes(const ModelSpec& model);
// Its state over the LoRA adapters (lora_A r x in and lora_B out x r of each adapted linear).
double adam_8bit_lora_state_bytes(const ModelSpec& model, int64_t rank, bool all_linear);

}  // namespace longseq
