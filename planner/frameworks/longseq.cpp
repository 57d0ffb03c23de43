// longseq.cpp: longseq's own executor (`longseq run`): ring attention unchunked, adapters, MoE blocks.
// One framework's description: its facts, what it runs (read by the rules every framework shares,
// planner/frameworks.cpp) and its own refusals. Listed once in planner/frameworks/registry.cpp.
#include <fmt/format.h>

#include "planner/frameworks.hpp"

namespace longseq {

namespace {

std::string plan_refused(const char* name, const ModelSpec& model, const PlanOptions& plan, int64_t /*gpus*/) {
  // Ring attention runs in the executor unchunked (no FPDT beside it).
  if (plan.ring > 1 && plan.fpdt) return "longseq: ring attention runs unchunked (no FPDT beside it)";
  // Its MoE block (executor/llama_step.hpp moe_forward) keeps no router logits for a loss.
  if (model.is_moe() && (plan.moe_aux_loss || model.output_router_logits))
    return fmt::format("{}: the executor's MoE block trains without the auxiliary load-balancing loss", name);
  return "";
}

}  // namespace

extern const FrameworkDescription kLongseq = {
    {Framework::framework_longseq, "longseq", "native-cuda", "", 1, nullptr},
    /*ring_attention=*/true,
    /*pytorch_context_parallelism=*/false,
    /*lora=*/true,
    /*trl_activation_offload=*/false,
    /*adam_8bit=*/false,
    /*tiles_moe_blocks=*/false,
    /*selective_checkpointing=*/false,
    /*model_parallelism=*/false,
    /*attention_sinks=*/false,
    /*te_activation_offload=*/false,
    /*deepseek_v3_layers=*/false,
    /*megatron_recompute=*/false,
    /*te_fp8=*/false,
    /*megatron_cp_all_gather=*/false,
    nullptr,
    plan_refused,
};

}  // namespace longseq
