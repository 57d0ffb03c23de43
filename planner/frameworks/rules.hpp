// rules.hpp: what several framework descriptions (planner/frameworks/*.cpp) check alike: the model
// shapes a framework's own model code builds, and FSDP2's layout. Not a public header.
#pragma once

#include <fmt/format.h>
#include <string>

#include "planner/frameworks.hpp"

namespace longseq::framework_rules {

// Megatron-DeepSpeed's FPDT layer computes gelu(x W1 + b1) W2 whatever --swiglu says and adds the
// q/k/v bias unconditionally (DeepSpeed fpdt_layer.py L1043-1087, L203, L337; FRAMEWORKS §3.2):
// only a GPT-shaped model (GeLU MLP with biases, biased attention) runs through it.
inline bool gpt_shaped(const ModelSpec& model) { return model.mlp_kind == MlpKind::mlp_kind_gelu && model.mlp_bias && model.qkv_bias; }

// ArcticMoE remaps Qwen3-MoE's parameters fully (and gpt-oss's partly, which longseq does not
// read): AT arctic_training/model/moe/utils.py remap_orig_moe_mlp_params_to_arctic_moe (Reference
// §12 item 79). Among the MoE shapes longseq reads, Qwen3-MoE is the one with q/k norms and no
// shared expert (Mixtral has neither norm; Qwen2-MoE has a shared expert).
inline bool qwen3_moe_shaped(const ModelSpec& model) { return model.is_moe() && model.qk_norm && model.shared_expert_intermediate_size == 0; }

// What neither FSDP2 stack (Accelerate's, torchtitan's) runs: FPDT, a layout other than full
// sharding, and offloading the optimizer without the parameters or the reverse (CPUOffloadPolicy
// moves parameters, gradients and optimizer together, F1.12; `offload_switch` names its switch).
inline std::string fsdp2_layout_unsupported(const char* name, const PlanOptions& plan, const char* offload_switch) {
  if (plan.fpdt) return fmt::format("{}: no FPDT (it exists only in Megatron-DeepSpeed)", name);
  if (plan.zero_stage != 3) return fmt::format("{}: planned with FSDP2's full sharding (the ZeRO-3 layout) only", name);
  if (plan.offload_optimizer != plan.offload_params)
    return fmt::format("{}: FSDP2 offloads parameters, gradients and optimizer together ({}), not one without the other", name,
                       offload_switch);
  return "";
}

// A plain DeepSpeed loop over a Hugging Face model (with or without USP's attention) has no FPDT:
// it is Megatron-DeepSpeed's layer (REFERENCE §3.6).
inline std::string deepspeed_loop_unsupported(const char* name, const PlanOptions& plan) {
  if (plan.fpdt) return fmt::format("{}: no FPDT outside Megatron-DeepSpeed's model code", name);
  return "";
}

}  // namespace longseq::framework_rules
