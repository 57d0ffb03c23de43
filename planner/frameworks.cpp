#include "planner/frameworks.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "io/config_error.hpp"
#include "io/embedded_files.hpp"
#include "io/nearest_names.hpp"

namespace longseq {

const FrameworkDescription& framework_description(Framework framework) {
  for (const FrameworkDescription* description : framework_descriptions())
    if (description->facts.framework == framework) return *description;
  throw std::logic_error("framework_description: a framework without a description in registry.cpp");
}

const FrameworkFacts& framework_facts(Framework framework) { return framework_description(framework).facts; }

const char* framework_name(Framework framework) { return framework_facts(framework).name; }

RuntimeProfile framework_profile(Framework framework, RuntimeProfile profile) {
  if (const MoeExperts* experts = framework_facts(framework).moe_experts) profile.moe_experts = *experts;
  return profile;
}

std::vector<Framework> frameworks_all() {
  std::vector<Framework> all;
  for (const FrameworkDescription* description : framework_descriptions()) all.push_back(description->facts.framework);
  return all;
}

Framework framework_of_export_target(const std::string& target) {
  std::string known;
  for (const FrameworkDescription* description : framework_descriptions()) {
    const FrameworkFacts& facts = description->facts;
    if (*facts.export_target == '\0') continue;
    if (target == facts.export_target) return facts.framework;
    known += (known.empty() ? "" : ", ") + std::string(facts.export_target);
  }
  if (target == "hf-accelerate") return Framework::framework_hf_accelerate;
  throw ConfigError("--emit", "", fmt::format("unknown target '{}' (known: {})", target, known));
}

Framework framework_parse(const std::string& name, const std::string& flag) {
  std::string names;
  std::vector<std::string> known;
  for (Framework framework : frameworks_all()) {
    if (name == framework_name(framework)) return framework;
    names += (names.empty() ? "" : ", ") + std::string(framework_name(framework));
    known.emplace_back(framework_name(framework));
  }
  // The names users say for a stack longseq plans under another: each points at the stacks it
  // can mean, not one chosen for them (TRL runs alone, on DeepSpeed or on FSDP2).
  static const std::pair<const char*, const char*> kSpoken[] = {
      {"trl", "TRL's SFTTrainer is hf-trainer (alone), hf-accelerate (on DeepSpeed) or accelerate-fsdp2 (on FSDP2)"},
      {"transformers", "the Trainer is hf-trainer (alone), hf-accelerate (on DeepSpeed) or accelerate-fsdp2 (on FSDP2)"},
      {"accelerate", "Accelerate is hf-accelerate (on DeepSpeed) or accelerate-fsdp2 (on FSDP2)"},
      {"fsdp", "FSDP2 is accelerate-fsdp2 (Accelerate, the Trainer, TRL) or torchtitan"},
      {"fsdp2", "FSDP2 is accelerate-fsdp2 (Accelerate, the Trainer, TRL) or torchtitan"},
      {"alst", "ALST is arctic-training (ArcticTraining's recipe) or hf-accelerate (the Trainer's Ulysses)"},
      {"arctic", "arctic-training"},
      {"megatron", "megatron-core (Megatron-LM, Megatron-Bridge, NeMo) or megatron-deepspeed (Ulysses, FPDT)"},
      {"megatron-lm", "megatron-core (Megatron-LM's pretrain_gpt on Megatron-Core)"},
      {"nemo", "megatron-core (NeMo and Megatron-Bridge train on Megatron-Core)"},
      {"peft", "PEFT's adapters are planned under hf-trainer, hf-accelerate, accelerate-fsdp2 and unsloth (--lora)"},
  };
  const std::string lower = text_to_lower(name);
  for (const auto& [spoken, meaning] : kSpoken)
    if (lower == spoken) throw ConfigError(flag, "", fmt::format("unknown framework '{}': {}", name, meaning));
  const std::vector<std::string> nearest = nearest_names(lower, known, 2, std::max<size_t>(2, lower.size() / 3));
  throw ConfigError(flag, "", fmt::format("unknown framework '{}'{} (known: {})", name,
                                          nearest.empty() ? "" : "; did you mean " + names_listed(nearest) + "?", names));
}

std::string framework_unsupported(Framework framework, const ModelSpec& model, const PlanOptions& plan, int64_t gpus) {
  const FrameworkDescription& description = framework_description(framework);
  const char* name = description.facts.name;
  // What it cannot build comes first: a refusal of every plan names the model, not an option the
  // framework also lacks.
  if (description.model_refused)
    if (std::string refusal = description.model_refused(name, model); !refusal.empty()) return refusal;
  // Attention sinks (gpt-oss): planned where the attention kernel's sinks are in the sources read,
  // TE's fused attention under Megatron-Core (reference-megatron-core M7.2).
  if (model.attention_sinks && !description.attention_sinks)
    return fmt::format("{}: {}'s attention sinks (a learnable logit per head) are planned under Megatron-Core only "
                       "(--framework megatron-core)", name, model.name);
  if ((model.is_latent_attention() || model.moe_router_sigmoid || model.dense_layers > 0) && !description.deepseek_v3_layers)
    return fmt::format("{}: {}'s {} planned under Megatron-Core only (--framework megatron-core): longseq models Megatron's MLA and "
                       "MoE layers, not the Hugging Face DeepSeek layer {} runs", name, model.name,
                       model.is_latent_attention() ? "multi-head latent attention is" : "sigmoid router and dense first layers are", name);
  // Ring attention: neither DeepSpeed nor the trainers on it have one (REFERENCE §8); USP's
  // LongContextAttention composes it with Ulysses, and so does longseq's executor.
  const bool pytorch_cp = description.pytorch_context_parallelism;
  if (plan.ring > 1 && !description.ring_attention && !pytorch_cp)
    return fmt::format("{}: no ring attention (USP's LongContextAttention runs Ulysses x ring: --framework usp; PyTorch's context "
                       "parallelism under FSDP2: --framework accelerate-fsdp2 or torchtitan)", name);
  if (plan.ring > 1 && plan.cp_all_to_all && !pytorch_cp)
    return fmt::format("{}: --cp-rotate chooses PyTorch context parallelism's rotation (accelerate-fsdp2, torchtitan); its ring has none",
                       name);
  // PyTorch's context parallelism expresses full causal attention only: Accelerate drops each
  // layer's mask for is_causal=True and so refuses models with sliding-window or chunked layers
  // (accelerate 1.15 big_modeling.py _attach_context_parallel_hooks, "Context parallelism does not
  // support attention layers of type ..."). Ulysses gathers whole sequences and keeps the mask.
  if (plan.ring > 1 && pytorch_cp && model.sliding_window > 0)
    return fmt::format("{}: {} attends over a sliding window of {} tokens, and PyTorch's context parallelism runs full causal "
                       "attention only (Accelerate refuses such models under cp); Ulysses keeps the model's attention: "
                       "--framework hf-accelerate or arctic-training", name, model.name, model.sliding_window);
  // Tensor parallelism is Megatron's (its sequence parallelism beside it): Megatron-Core.
  if (plan.tp > 1 && !description.model_parallelism)
    return fmt::format("{}: no tensor parallelism (tp={}): Megatron-Core's (--framework megatron-core)", name, plan.tp);
  if (plan.pp > 1 && !description.model_parallelism)
    return fmt::format("{}: no pipeline parallelism (pp={}) planned here: Megatron-Core's (--framework megatron-core)", name, plan.pp);
  if (plan.offload_activation_layers > 0 && !description.te_activation_offload)
    return fmt::format("{}: no layer-wise activation offloading (--offload-activations is Transformer Engine's under Megatron-Core: "
                       "--framework megatron-core; checkpoint offload is --checkpoint-offload)", name);
  if (plan.recompute_block_layers > 0 && !description.megatron_recompute)
    return fmt::format("{}: no block recompute (--recompute-block-layers is Megatron-Core's recompute_method block: --framework "
                       "megatron-core; torchtitan checkpoints one layer in every N: --checkpoint-every)", name);
  if (plan.recompute_modules.any() && !description.megatron_recompute)
    return fmt::format("{}: no selective recompute of modules (--recompute-modules is Megatron-Core's recompute_granularity selective: "
                       "--framework megatron-core)", name);
  if (plan.cp_all_gather && !description.megatron_cp_all_gather)
    return fmt::format("{}: --cp-all-gather is Megatron-Core's cp_comm_type all_gather (--framework megatron-core)", name);
  if (plan.fp8 && !description.te_fp8)
    return fmt::format("{}: its FP8 training is not modelled (--fp8 is Transformer Engine's under Megatron-Core: --framework megatron-core)",
                       name);
  if (plan.ep > 1 && !description.model_parallelism)
    return fmt::format("{}: no expert parallelism (ep={}) planned here: Megatron-Core's (--framework megatron-core)", name, plan.ep);
  // HSDP's 2-D mesh is FSDP2's (Reference §11 F1.10, F1.17, F6.2).
  if (plan.dp_replicate > 1 && !pytorch_cp)
    return fmt::format("{}: no replicate x shard mesh (HSDP is FSDP2's: --framework accelerate-fsdp2 or torchtitan)", name);
  // TiledMLP over a MoE block: Unsloth patches the whole block, router and experts (Reference §12
  // items 34, 78); ALST's patch targets dense {Prefix}MLP classes only (AT model/tiled_compute.py
  // L97-100, item 77); longseq's executor runs the block untiled.
  if (model.is_moe() && plan.tiled_mlp && !description.tiles_moe_blocks)
    return fmt::format("{}: {} is a mixture-of-experts model and its TiledMLP tiles dense MLP classes only, not the experts (Reference "
                       "§12 item 77; Unsloth tiles the whole block: --framework unsloth)", name, model.name);
  // LoRA is planned for PEFT through the HF Trainer / TRL (alone, on DeepSpeed, on FSDP2), Unsloth
  // and longseq's executor (executor_plan_problems says on what).
  if (plan.lora() && !description.lora)
    return fmt::format("{}: LoRA is planned for PEFT through the HF Trainer / TRL (--framework hf-trainer, hf-accelerate, "
                       "accelerate-fsdp2), Unsloth and longseq's executor only so far", name);
  // TRL's SFTConfig(activation_offloading=True): the HF Trainer / TRL path, alone or on Accelerate.
  if (plan.trl_activation_offload && !description.trl_activation_offload)
    return fmt::format("{}: TRL's activation offloading is TRL's (--framework hf-trainer, hf-accelerate, accelerate-fsdp2)", name);
  // bitsandbytes' 8-bit AdamW through the Trainer's optim argument; DeepSpeed builds its own
  // optimizer (CPU Adam when offloading) and FSDP2's DTensor shards are not planned with it.
  if (plan.adam_8bit && !description.adam_8bit)
    return fmt::format("{}: 8-bit AdamW is planned through the HF Trainer / TRL (optim=\"adamw_8bit\") only: --framework hf-trainer", name);
  if (plan.activation_checkpointing && plan.checkpoint_every > 1 && !description.selective_checkpointing)
    return fmt::format("{}: checkpoints every decoder layer; one layer in every N is torchtitan's layer-selective AC "
                       "(activation_checkpoint.selective_ac_option, --framework torchtitan)", name);
  if (plan.activation_checkpointing && plan.checkpoint_ops && !description.selective_checkpointing)
    return fmt::format("{}: checkpoints whole decoder layers; op-level selective checkpointing is torchtitan's "
                       "(activation_checkpoint.selective_ac_option = \"op\", --framework torchtitan)", name);
  return description.plan_refused(name, model, plan, gpus);
}

void search_options_for_framework(SearchOptions& options, Framework framework, const ModelSpec& model, const ClusterSpec& cluster) {
  options.unsupported = [framework, &model, &cluster](const PlanOptions& plan) {
    return framework_unsupported(framework, model, plan, cluster.gpus);
  };
  options.length_multiple = framework_facts(framework).length_multiple;
  // torchtitan's selective_ac_option takes any N; its default is 2 (job_config.py ActivationCheckpoint).
  const bool selective = framework_description(framework).selective_checkpointing;
  options.checkpoint_every = selective ? std::vector<int64_t>{1, 2, 3, 4} : std::vector<int64_t>{1};
  options.checkpoint_ops = selective;
  // TE's activation offloading without recompute: half and three quarters of the layers (Megatron
  // takes any count below the model's; the search tries two).
  options.offload_activation_layers = {0};
  if (framework_description(framework).te_activation_offload)
    for (const int64_t offloaded : {model.num_layers / 2, 3 * model.num_layers / 4})
      if (offloaded > 0) options.offload_activation_layers.push_back(offloaded);
  // Block recompute: the first half or three quarters of a model chunk's layers (PlanOptions holds
  // the count; the search takes these shares of each layout's chunk).
  options.recompute_block_shares = {};
  if (framework_description(framework).megatron_recompute) options.recompute_block_shares = {0.5, 0.75};
  // Selective recompute: every module the model has (its separate norms under MLA or MoE, the
  // experts' activation, MLA's up-projections, a dense model's MLP).
  options.recompute_modules = {};
  if (framework_description(framework).megatron_recompute)
    options.recompute_modules = {model.is_latent_attention() || model.is_moe(), model.is_moe(), model.is_latent_attention(), !model.is_moe()};
  // Tensor parallelism inside a node (its collectives run every layer, on NVLink): the powers of two
  // up to the node's GPUs, as Megatron's recipes choose them.
  options.tensor_parallel = {1};
  options.pipeline_parallel = {1};
  options.virtual_pipeline = {1};
  options.expert_parallel = {1};
  if (framework_description(framework).model_parallelism) {
    for (int64_t tp = 2; tp <= std::min(cluster.gpus_per_node, cluster.gpus); tp *= 2)
      if (cluster.gpus % tp == 0) options.tensor_parallel.push_back(tp);
    // Pipeline stages: powers of two that divide the GPUs, the layers split evenly or as Megatron's
    // uneven split does (pipeline_split), up to 16 and to a stage of two layers at least.
    for (int64_t pp = 2; pp <= std::min<int64_t>(cluster.gpus, 16) && 2 * pp <= model.num_layers; pp *= 2)
      if (cluster.gpus % pp == 0) options.pipeline_parallel.push_back(pp);
    // The interleaved schedule at two chunks a rank (it pays only with micro-batches in groups of pp).
    options.virtual_pipeline = {1, 2};
    // Expert parallelism for a MoE model: the powers of two that divide its experts and the GPUs.
    // Which ep divides a stage's ranks is plan_problems' to say.
    if (model.is_moe())
      for (int64_t ep = 2; ep <= std::min(cluster.gpus, model.experts); ep *= 2)
        if (model.experts % ep == 0 && cluster.gpus % ep == 0) options.expert_parallel.push_back(ep);
  }
}

std::vector<Framework> frameworks_running(const ModelSpec& model, const PlanOptions& plan) {
  std::vector<Framework> running;
  for (Framework framework : frameworks_all())
    if (framework_unsupported(framework, model, plan).empty()) running.push_back(framework);
  return running;
}

}  // namespace longseq
