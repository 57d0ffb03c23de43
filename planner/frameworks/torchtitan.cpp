// torchtitan.cpp: PyTorch's torchtitan: FSDP2 with context parallelism, its own model code (a TOML job, v0.2.2).
// parallelize_llama asserts seq_len % (tp x 2 x cp) == 0 even at cp = 1 (Reference §11, 2026-11-26): lengths of 2.
// One framework's description: its facts, what it runs (read by the rules every framework shares,
// planner/frameworks.cpp) and its own refusals. Listed once in planner/frameworks/registry.cpp.
#include <fmt/format.h>

#include "models/model_loader.hpp"
#include "planner/frameworks.hpp"
#include "planner/frameworks/rules.hpp"

namespace longseq {

namespace {

// Whether two specs build the same network: every dimension and structural switch (names, RoPE
// and the sliding window aside, which no torchtitan flavor's tensors depend on).
bool same_network(const ModelSpec& a, const ModelSpec& b) {
  return a.num_layers == b.num_layers && a.hidden_size == b.hidden_size && a.num_q_heads == b.num_q_heads &&
         a.num_kv_heads == b.num_kv_heads && a.head_dim == b.head_dim && a.intermediate_size == b.intermediate_size &&
         a.vocab_size == b.vocab_size && a.mlp_kind == b.mlp_kind && a.norm_kind == b.norm_kind && a.tied_embeddings == b.tied_embeddings &&
         a.qkv_bias == b.qkv_bias && a.o_proj_bias == b.o_proj_bias && a.mlp_bias == b.mlp_bias && a.qk_norm == b.qk_norm &&
         a.norms_per_layer == b.norms_per_layer && a.experts == b.experts && a.experts_per_token == b.experts_per_token &&
         a.expert_intermediate_size == b.expert_intermediate_size && a.shared_expert_intermediate_size == b.shared_expert_intermediate_size;
}

}  // namespace

TorchtitanFlavor torchtitan_flavor(const ModelSpec& model) {
  // torchtitan v0.2.2's model registry: llama3's flavors (torchtitan/models/llama3/__init__.py,
  // whose TransformerModelArgs give Llama 3/3.1/3.3's dimensions) and qwen3's (Reference §11, added
  // 2026-11-26), each matched by the shape of the built-in card of the same model.
  struct Entry {
    const char* model_name;
    const char* flavor;
    const char* card;
  };
  static const Entry entries[] = {{"llama3", "8B", "llama-3.1-8b"}, {"llama3", "70B", "llama-3.1-70b"}, {"llama3", "405B", "llama-3.1-405b"},
                                  {"qwen3", "8B", "qwen3-8b"},       {"qwen3", "14B", "qwen3-14b"},      {"qwen3", "32B", "qwen3-32b"},
                                  {"qwen3", "30B-A3B", "qwen3-30b-a3b"}};
  static const std::vector<ModelSpec> cards = [] {
    std::vector<ModelSpec> loaded;
    for (const Entry& entry : entries) loaded.push_back(model_load(entry.card));
    return loaded;
  }();
  for (size_t i = 0; i < cards.size(); ++i)
    if (same_network(model, cards[i])) return {entries[i].model_name, entries[i].flavor};
  return {};
}

namespace {

using namespace framework_rules;

std::string model_refused(const char* name, const ModelSpec& model) {
  if (torchtitan_flavor(model).flavor.empty())
    return fmt::format("{}: trains its own model code; longseq plans its llama3 flavors 8B, 70B and 405B (Llama 3/3.1/3.3 shapes) "
                       "and qwen3 flavors 8B, 14B, 32B and 30B-A3B, which {} is not", name, model.name);
  // Its MoE block is its own (not transformers'): no source here describes its tensors.
  if (model.is_moe())
    return fmt::format("{}: its own MoE block (qwen3 30B-A3B) has no tensor inventory in the sources yet; not priced", name);
  return "";
}

std::string plan_refused(const char* name, const ModelSpec& /*model*/, const PlanOptions& plan, int64_t gpus) {
  if (plan.sp > 1) return fmt::format("{}: no Ulysses (its sequence parallelism is PyTorch's context parallelism: --ring)", name);
  // training.enable_cpu_offload is CPUOffloadPolicy (F6.4).
  if (std::string refusal = fsdp2_layout_unsupported(name, plan, "training.enable_cpu_offload"); !refusal.empty()) return refusal;
  // Its job config has activation checkpointing modes and float8, no activation offload, tiled
  // MLP or chunked loss (Reference §11 F6.1-F6.5).
  if (plan.checkpoint_offload) return fmt::format("{}: no activation offload to the host in its job config (F6.3 lists its AC modes)", name);
  if (plan.tiled_mlp) return fmt::format("{}: no TiledMLP", name);
  // Under context parallelism the op policy meets the ring's per-block attention calls and its
  // K/V collectives, none of which the sources here trace: not priced.
  if (plan.activation_checkpointing && plan.checkpoint_ops && plan.ring > 1)
    return fmt::format("{}: op-level selective checkpointing under context parallelism (the ring's per-block attention outputs "
                       "the op policy would save) is not priced yet: one layer in every N (--checkpoint-every) or full", name);
  if (plan.tiled_loss) return fmt::format("{}: no chunked or tiled loss in its job config", name);
  // At world size 1 FSDP is not applied (parallel_dims.py L334-335), so CPUOffloadPolicy has no
  // module to act on (Reference §11, added 2026-11-26).
  if (gpus == 1 && plan.offload_params)
    return fmt::format("{}: on one GPU FSDP wraps nothing, so training.enable_cpu_offload offloads nothing (2 GPUs or more)", name);
  return "";
}

}  // namespace

extern const FrameworkDescription kTorchtitan = {
    {Framework::framework_torchtitan, "torchtitan", "fsdp2-torchtitan", "torchtitan", 2, nullptr},
    /*ring_attention=*/false,
    /*pytorch_context_parallelism=*/true,
    /*lora=*/false,
    /*trl_activation_offload=*/false,
    /*adam_8bit=*/false,
    /*tiles_moe_blocks=*/false,
    /*selective_checkpointing=*/true,
    /*model_parallelism=*/false,
    /*attention_sinks=*/false,
    /*te_activation_offload=*/false,
    /*deepseek_v3_layers=*/false,
    /*megatron_recompute=*/false,
    /*te_fp8=*/false,
    /*megatron_cp_all_gather=*/false,
    model_refused,
    plan_refused,
};

}  // namespace longseq
