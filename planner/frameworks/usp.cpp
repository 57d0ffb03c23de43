// usp.cpp: A DeepSpeed loop with USP's LongContextAttention: Ulysses x ring attention (yunchang).
// One framework's description: its facts, what it runs (read by the rules every framework shares,
// planner/frameworks.cpp) and its own refusals. Listed once in planner/frameworks/registry.cpp.
#include <fmt/format.h>

#include "planner/frameworks.hpp"
#include "planner/frameworks/rules.hpp"

namespace longseq {

namespace {

std::string plan_refused(const char* name, const ModelSpec& /*model*/, const PlanOptions& plan, int64_t /*gpus*/) {
  return framework_rules::deepspeed_loop_unsupported(name, plan);
}

}  // namespace

extern const FrameworkDescription kUsp = {
    {Framework::framework_usp, "usp", "deepspeed-hf", "usp", 1, nullptr},
    /*ring_attention=*/true,
    /*pytorch_context_parallelism=*/false,
    /*lora=*/false,
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
