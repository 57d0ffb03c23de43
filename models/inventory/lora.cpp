// lora.cpp: LoRA's adapters beside a frozen linear group, per adapted linear (Reference §12 items
// 9-10, 20-22; held to PEFT by tests/frameworks).
#include "models/inventory/internal.hpp"

#include <tuple>

namespace longseq::inventory {

// sites: the group's linears.
LoraGroup lora_group(const LayerShape& shape, const LayerImplementation& impl, std::initializer_list<LoraSite> sites) {
  LoraGroup group;
  const double tokens = static_cast<double>(shape.tokens), a = static_cast<double>(impl.activation_bytes);
  const double r = static_cast<double>(shape.lora_rank);
  for (const LoraSite& site : sites) {
    const double in = static_cast<double>(site.in), out = static_cast<double>(site.out);
    group.largest_output = std::max(group.largest_output, tokens * out * a);
    group.largest_weight = std::max(group.largest_weight, in * out * a);
    if (!shape.lora_all_linear && !site.default_target) continue;
    LoraLinear linear{site.names};
    linear.rank_bytes = tokens * r * a;
    if (shape.lora_adapter_casts) {
      linear.a_cast_bytes = r * in * a;
      linear.b_cast_bytes = out * r * a;
    }
    if (!shape.qlora) {
      linear.input_bytes = tokens * in * a;
      group.largest_input_fp32 = std::max(group.largest_input_fp32, tokens * in * 4.0);
    }
    group.adapted.push_back(linear);
  }
  return group;
}

LoraGroup lora_attention_projections(const LayerShape& shape, const LayerImplementation& impl) {
  return lora_group(shape, impl, {{kLoraQ, shape.hidden, shape.q_width, true}, {kLoraK, shape.hidden, shape.kv_width, false},
                                  {kLoraV, shape.hidden, shape.kv_width, true}});
}
LoraGroup lora_output_projection(const LayerShape& shape, const LayerImplementation& impl) {
  return lora_group(shape, impl, {{kLoraO, shape.q_width, shape.hidden, false}});
}
LoraGroup lora_mlp(const LayerShape& shape, const LayerImplementation& impl) {
  LoraGroup group = lora_group(shape, impl, {{kLoraGate, shape.hidden, shape.intermediate, false},
                                             {kLoraUp, shape.hidden, shape.intermediate, false},
                                             {kLoraDown, shape.intermediate, shape.hidden, false}});
  // down_proj's fp32 input copy is mlp_forward's, at the product; the group's is gate/up's [T, h].
  if (lora_adapts_down_proj_input_fp32(shape)) group.largest_input_fp32 = static_cast<double>(shape.tokens) * static_cast<double>(shape.hidden) * 4.0;
  return group;
}

// The group's forward: transients, then what it saves (kept only with keep: under no_grad nothing).
void lora_forward(TensorTrace& trace, const LayerShape& shape, const LoraGroup& group, bool keep) {
  if (shape.lora_rank == 0) return;
  if (shape.qlora) {
    trace.alloc(L, "qlora.dequantized_weight", group.largest_weight);
    trace.alloc(L, "qlora.result_clone", group.largest_output);
    trace.free("qlora.result_clone");
    trace.free("qlora.dequantized_weight");
  }
  if (group.largest_input_fp32 > 0) {
    trace.alloc(L, "lora.input_fp32_cast", group.largest_input_fp32);
    trace.free("lora.input_fp32_cast");
  }
  if (!keep) return;
  for (const LoraLinear& linear : group.adapted) {
    if (linear.a_cast_bytes > 0) trace.alloc(L, linear.names.a_cast, linear.a_cast_bytes);
    if (linear.input_bytes > 0) trace.alloc(L, linear.names.input, linear.input_bytes);
    if (linear.b_cast_bytes > 0) trace.alloc(L, linear.names.b_cast, linear.b_cast_bytes);
    trace.alloc(L, linear.names.rank, linear.rank_bytes);
  }
}

// Its backward: the 4-bit weight dequantized again for the input gradient (item 22), then what
// the forward saved is released.
void lora_backward(TensorTrace& trace, const LayerShape& shape, const LoraGroup& group) {
  if (shape.lora_rank == 0) return;
  if (shape.qlora) {
    trace.alloc(L, "qlora.dequantized_weight", group.largest_weight);
    trace.free("qlora.dequantized_weight");
  }
  for (auto linear = group.adapted.rbegin(); linear != group.adapted.rend(); ++linear) {
    trace.free(linear->names.rank);
    if (linear->b_cast_bytes > 0) trace.free(linear->names.b_cast);
    if (linear->input_bytes > 0) trace.free(linear->names.input);
    if (linear->a_cast_bytes > 0) trace.free(linear->names.a_cast);
  }
}

}  // namespace longseq::inventory
