#include "planner/frameworks.hpp"

#include <fmt/format.h>

#include <stdexcept>

#include "models/config_error.hpp"
#include "models/model_loader.hpp"

namespace longseq {

namespace {

constexpr MoeExperts kArcticMoe = MoeExperts::moe_grouped_gemm;

const std::vector<FrameworkFacts>& framework_table() {
  static const std::vector<FrameworkFacts> table = {
      {Framework::framework_arctic_training, "arctic-training", "deepspeed-hf", "arctic-training", 256, &kArcticMoe},
      {Framework::framework_hf_accelerate, "hf-accelerate", "deepspeed-hf", "accelerate", 1, nullptr},
      {Framework::framework_megatron_deepspeed, "megatron-deepspeed", "megatron-deepspeed", "megatron-deepspeed", 1, nullptr},
      {Framework::framework_deepspeed, "deepspeed", "deepspeed-hf", "deepspeed", 1, nullptr},
      {Framework::framework_usp, "usp", "deepspeed-hf", "usp", 1, nullptr},
      {Framework::framework_accelerate_fsdp2, "accelerate-fsdp2", "fsdp2-accelerate", "accelerate-fsdp2", 1, nullptr},
      {Framework::framework_hf_trainer, "hf-trainer", "hf-trainer", "hf-trainer", 1, nullptr},
      // parallelize_llama asserts seq_len % (tp x 2 x cp) == 0 even at cp = 1 (Reference §11, 2026-11-26).
      {Framework::framework_torchtitan, "torchtitan", "fsdp2-torchtitan", "torchtitan", 2, nullptr},
      {Framework::framework_unsloth, "unsloth", "unsloth", "unsloth", 1, nullptr},
      {Framework::framework_longseq, "longseq", "native-cuda", "", 1, nullptr},
  };
  return table;
}

}  // namespace

const FrameworkFacts& framework_facts(Framework framework) {
  for (const FrameworkFacts& facts : framework_table())
    if (facts.framework == framework) return facts;
  throw std::logic_error("framework_facts: a framework without an entry");
}

const char* framework_name(Framework framework) { return framework_facts(framework).name; }

RuntimeProfile framework_profile(Framework framework, RuntimeProfile profile) {
  if (const MoeExperts* experts = framework_facts(framework).moe_experts) profile.moe_experts = *experts;
  return profile;
}

std::vector<Framework> frameworks_all() {
  std::vector<Framework> all;
  for (const FrameworkFacts& facts : framework_table()) all.push_back(facts.framework);
  return all;
}

Framework framework_of_export_target(const std::string& target) {
  std::string known;
  for (const FrameworkFacts& facts : framework_table()) {
    if (*facts.export_target == '\0') continue;
    if (target == facts.export_target) return facts.framework;
    known += (known.empty() ? "" : ", ") + std::string(facts.export_target);
  }
  if (target == "hf-accelerate") return Framework::framework_hf_accelerate;
  throw ConfigError("--emit", "", fmt::format("unknown target '{}' (known: {})", target, known));
}

Framework framework_parse(const std::string& name, const std::string& flag) {
  std::string names;
  for (Framework framework : frameworks_all()) {
    if (name == framework_name(framework)) return framework;
    names += (names.empty() ? "" : ", ") + std::string(framework_name(framework));
  }
  throw ConfigError(flag, "", fmt::format("unknown framework '{}' (known: {})", name, names));
}

namespace {

// Megatron-DeepSpeed's FPDT layer computes gelu(x W1 + b1) W2 whatever --swiglu says and adds the
// q/k/v bias unconditionally (DeepSpeed fpdt_layer.py L1043-1087, L203, L337; FRAMEWORKS §3.2):
// only a GPT-shaped model (GeLU MLP with biases, biased attention) runs through it.
bool gpt_shaped(const ModelSpec& model) { return model.mlp_kind == MlpKind::mlp_kind_gelu && model.mlp_bias && model.qkv_bias; }

// ArcticMoE remaps Qwen3-MoE's parameters fully (and gpt-oss's partly, which longseq does not
// read): AT arctic_training/model/moe/utils.py remap_orig_moe_mlp_params_to_arctic_moe (Reference
// §12 item 79). Among the MoE shapes longseq reads, Qwen3-MoE is the one with q/k norms and no
// shared expert (Mixtral has neither norm; Qwen2-MoE has a shared expert).
bool qwen3_moe_shaped(const ModelSpec& model) { return model.is_moe() && model.qk_norm && model.shared_expert_intermediate_size == 0; }

// What neither FSDP2 stack (Accelerate's, torchtitan's) runs: FPDT, a layout other than full
// sharding, and offloading the optimizer without the parameters or the reverse (CPUOffloadPolicy
// moves parameters, gradients and optimizer together, F1.12; `offload_switch` names its switch).
std::string fsdp2_layout_unsupported(const char* name, const PlanOptions& plan, const char* offload_switch) {
  if (plan.fpdt) return fmt::format("{}: no FPDT (it exists only in Megatron-DeepSpeed)", name);
  if (plan.zero_stage != 3) return fmt::format("{}: planned with FSDP2's full sharding (the ZeRO-3 layout) only", name);
  if (plan.offload_optimizer != plan.offload_params)
    return fmt::format("{}: FSDP2 offloads parameters, gradients and optimizer together ({}), not one without the other", name,
                       offload_switch);
  return "";
}

}  // namespace

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

// Why `framework` cannot build `model` at all, whatever the plan: checked before any plan option, so
// that a refusal of every plan names the model, not an option the framework also lacks.
std::string model_unsupported(Framework framework, const ModelSpec& model) {
  const char* name = framework_name(framework);
  switch (framework) {
    case Framework::framework_arctic_training:
      if (model.is_moe() && !qwen3_moe_shaped(model))
        return fmt::format("{}: its MoE path (ArcticMoE, turned on for any model with experts) remaps Qwen3-MoE only; {} is not one "
                           "(Reference §12 item 79)", name, model.name);
      return "";
    case Framework::framework_megatron_deepspeed:
      // Megatron's MoE is its own model code (deepspeed.moe layers), not a Hugging Face checkpoint's block.
      if (model.is_moe()) return fmt::format("{}: trains its own MoE model code, not {}'s Hugging Face experts", name, model.name);
      // Megatron's ParallelAttention has no per-head q/k RMSNorm: a Qwen3 model would train without it.
      if (model.qk_norm) return fmt::format("{}: no q/k norm (Qwen3's per-head RMSNorm); {} would train without it", name, model.name);
      return "";
    case Framework::framework_torchtitan:
      if (torchtitan_flavor(model).flavor.empty())
        return fmt::format("{}: trains its own model code; longseq plans its llama3 flavors 8B, 70B and 405B (Llama 3/3.1/3.3 shapes) "
                           "and qwen3 flavors 8B, 14B, 32B and 30B-A3B, which {} is not", name, model.name);
      // Its MoE block is its own (not transformers'): no source here describes its tensors.
      if (model.is_moe())
        return fmt::format("{}: its own MoE block (qwen3 30B-A3B) has no tensor inventory in the sources yet; not priced", name);
      return "";
    default:
      return "";
  }
}

}  // namespace

std::string framework_unsupported(Framework framework, const ModelSpec& model, const PlanOptions& plan, int64_t gpus) {
  const char* name = framework_name(framework);
  if (std::string refusal = model_unsupported(framework, model); !refusal.empty()) return refusal;
  // Ring attention: neither DeepSpeed nor the trainers on it have one (REFERENCE §8); USP's
  // LongContextAttention composes it with Ulysses, and so does longseq's executor (unchunked).
  if (plan.ring > 1 && framework == Framework::framework_longseq && plan.fpdt)
    return "longseq: ring attention runs unchunked (no FPDT beside it)";
  const bool pytorch_cp = framework == Framework::framework_accelerate_fsdp2 || framework == Framework::framework_torchtitan;
  if (plan.ring > 1 && framework != Framework::framework_usp && framework != Framework::framework_longseq && !pytorch_cp)
    return fmt::format("{}: no ring attention (USP's LongContextAttention runs Ulysses x ring: --framework usp; PyTorch's context "
                       "parallelism under FSDP2: --framework accelerate-fsdp2 or torchtitan)", name);
  if (plan.ring > 1 && plan.cp_all_to_all && !pytorch_cp)
    return fmt::format("{}: --cp-rotate chooses PyTorch context parallelism's rotation (accelerate-fsdp2, torchtitan); its ring has none",
                       name);
  // HSDP's 2-D mesh is FSDP2's (Reference §11 F1.10, F1.17, F6.2).
  if (plan.dp_replicate > 1 && !pytorch_cp)
    return fmt::format("{}: no replicate x shard mesh (HSDP is FSDP2's: --framework accelerate-fsdp2 or torchtitan)", name);
  // TiledMLP over a MoE block: Unsloth patches the whole block, router and experts (Reference §12
  // items 34, 78); ALST's patch targets dense {Prefix}MLP classes only (AT model/tiled_compute.py
  // L97-100, item 77); longseq's executor runs the block untiled.
  if (model.is_moe() && plan.tiled_mlp && framework != Framework::framework_unsloth)
    return fmt::format("{}: {} is a mixture-of-experts model and its TiledMLP tiles dense MLP classes only, not the experts (Reference "
                       "§12 item 77; Unsloth tiles the whole block: --framework unsloth)", name, model.name);
  // LoRA is planned for PEFT through the HF Trainer / TRL (alone, on DeepSpeed, on FSDP2) and Unsloth.
  const bool trainer_path = framework == Framework::framework_hf_trainer || framework == Framework::framework_unsloth;
  // longseq's executor trains adapters too (executor_plan_problems says on what).
  if (plan.lora() && !trainer_path && framework != Framework::framework_hf_accelerate && framework != Framework::framework_accelerate_fsdp2 &&
      framework != Framework::framework_longseq)
    return fmt::format("{}: LoRA is planned for PEFT through the HF Trainer / TRL (--framework hf-trainer, hf-accelerate, "
                       "accelerate-fsdp2), Unsloth and longseq's executor only so far", name);
  // TRL's SFTConfig(activation_offloading=True): the HF Trainer / TRL path, alone or on Accelerate.
  if (plan.trl_activation_offload && framework != Framework::framework_hf_trainer && framework != Framework::framework_hf_accelerate &&
      framework != Framework::framework_accelerate_fsdp2)
    return fmt::format("{}: TRL's activation offloading is TRL's (--framework hf-trainer, hf-accelerate, accelerate-fsdp2)", name);
  // bitsandbytes' 8-bit AdamW through the Trainer's optim argument; DeepSpeed builds its own
  // optimizer (CPU Adam when offloading) and FSDP2's DTensor shards are not planned with it.
  if (plan.adam_8bit && !trainer_path)
    return fmt::format("{}: 8-bit AdamW is planned through the HF Trainer / TRL (optim=\"adamw_8bit\") only: --framework hf-trainer", name);
  switch (framework) {
    case Framework::framework_arctic_training:
      // FPDT exists only in Megatron-DeepSpeed; the UlyssesSPAttentionHF path has none (REFERENCE §8).
      if (plan.fpdt) return fmt::format("{}: no FPDT (it exists only in Megatron-DeepSpeed)", name);
      // With sp > 1 ArcticTraining always tiles the logits+loss (Liger's fused CE, or DeepSpeed's
      // TiledFusedLogitsLoss) (AT trainer/sft_trainer.py L79-156; FRAMEWORKS §1.9).
      if (plan.sp > 1 && !plan.tiled_loss) return fmt::format("{}: with sp > 1 the logits+loss are always tiled", name);
      // DeepSpeed's MoE under ArcticMoE: "Deepspeed supports only ZeRO stage 2 with MoE" (AT
      // trainer/trainer.py L259-264).
      if (model.is_moe() && plan.zero_stage > 2) return fmt::format("{}: MoE trains with ZeRO stage 2 at most (trainer.py L259-264)", name);
      if (plan.moe_aux_loss || model.output_router_logits) return fmt::format("{}: ArcticMoE's auxiliary loss is not in Reference §12; planned for transformers' own MoE "
                                                "blocks (--framework deepspeed, hf-accelerate, accelerate-fsdp2, hf-trainer)", name);
      return "";
    case Framework::framework_hf_accelerate:
      if (plan.fpdt) return fmt::format("{}: no FPDT (it exists only in Megatron-DeepSpeed)", name);
      // No Trainer flag for TiledMLP or activation-checkpoint CPU offload (FRAMEWORKS §2.8).
      if (plan.tiled_mlp) return fmt::format("{}: no switch for TiledMLP (HF Trainer/TRL; a script change)", name);
      if (plan.checkpoint_offload) return fmt::format("{}: no switch for checkpoint offload to the host (HF Trainer/TRL)", name);
      return "";
    case Framework::framework_megatron_deepspeed:
      // TiledMLP and the tiled loss are ALST's (ArcticTraining/DeepSpeed HF path); Megatron chunks
      // the FFN and the loss only inside FPDT (FRAMEWORKS §3.1-3.2).
      if (plan.tiled_mlp) return fmt::format("{}: no TiledMLP (its FFN is chunked only by FPDT)", name);
      if (plan.tiled_loss) return fmt::format("{}: no tiled logits+loss (chunked only by FPDT)", name);
      // Its non-FPDT attention asserts projection_size == kv_projection_size whenever DeepSpeed
      // sequence parallelism is on (megatron/model/transformer.py L728-729 since the FPDT commit
      // 676a482c; FRAMEWORKS §3.2's correction, reproduced with 4 query / 2 kv heads at sp=2).
      if (plan.sp > 1 && !plan.fpdt && model.num_kv_heads != model.num_q_heads)
        return fmt::format("{}: its Ulysses attention asserts as many kv heads as query heads (transformer.py L728-729); {} has "
                           "{}/{} (grouped-query): sp=1 only, or FPDT for a GPT-shaped model",
                           name, model.name, model.num_q_heads, model.num_kv_heads);
      if (plan.fpdt && !gpt_shaped(model))
        return fmt::format("{}: FPDT's layer is GPT-shaped (GeLU MLP with bias, biased q/k/v); {} is not (FRAMEWORKS §3.2)", name,
                           model.name);
      return "";
    case Framework::framework_deepspeed:
    case Framework::framework_usp:
      if (plan.fpdt) return fmt::format("{}: no FPDT outside Megatron-DeepSpeed's model code", name);
      return "";
    case Framework::framework_accelerate_fsdp2:
      // Accelerate's ParallelismConfig: cp runs under FSDP2 only, sp (Ulysses) under DeepSpeed only,
      // never both (parallelism_config.py L328-334; TRL PR #7003; Reference §11 F4.2).
      if (plan.sp > 1) return fmt::format("{}: Ulysses (sp_size) runs only under DeepSpeed, and not beside cp (--framework hf-accelerate)", name);
      // fsdp_offload_params: true is CPUOffloadPolicy (F1.12, F1.19).
      if (std::string refusal = fsdp2_layout_unsupported(name, plan, "fsdp_offload_params, CPUOffloadPolicy"); !refusal.empty()) return refusal;
      if (plan.tiled_mlp) return fmt::format("{}: no switch for TiledMLP", name);
      // "TP/CP cannot be used with pure data parallelism (dp_replicate_size > 1 and dp_shard_size ==
      // 1)" (parallelism_config.py L336-341; Reference §11 F4.2): replicas need a shard group.
      if (gpus > 0 && plan.ring > 1 && plan.dp_replicate > 1 && gpus / (plan.ring * plan.dp_replicate) == 1)
        return fmt::format("{}: context parallelism over replicas of one GPU's shard (dp_replicate {} x cp {} = {} GPUs leaves "
                           "dp_shard 1), which Accelerate refuses (parallelism_config.py; Reference §11 F4.2)",
                           name, plan.dp_replicate, plan.ring, gpus);
      return "";
    case Framework::framework_torchtitan: {
      if (plan.sp > 1) return fmt::format("{}: no Ulysses (its sequence parallelism is PyTorch's context parallelism: --ring)", name);
      // training.enable_cpu_offload is CPUOffloadPolicy (F6.4).
      if (std::string refusal = fsdp2_layout_unsupported(name, plan, "training.enable_cpu_offload"); !refusal.empty()) return refusal;
      // Its job config has activation checkpointing modes and float8, no activation offload, tiled
      // MLP or chunked loss (Reference §11 F6.1-F6.5).
      if (plan.checkpoint_offload) return fmt::format("{}: no activation offload to the host in its job config (F6.3 lists its AC modes)", name);
      if (plan.tiled_mlp) return fmt::format("{}: no TiledMLP", name);
      if (plan.tiled_loss) return fmt::format("{}: no chunked or tiled loss in its job config", name);
      // At world size 1 FSDP is not applied (parallel_dims.py L334-335), so CPUOffloadPolicy has no
      // module to act on (Reference §11, added 2026-11-26).
      if (gpus == 1 && plan.offload_params)
        return fmt::format("{}: on one GPU FSDP wraps nothing, so training.enable_cpu_offload offloads nothing (2 GPUs or more)", name);
      return "";
    }
    case Framework::framework_hf_trainer:
      // A model on every GPU, trained by PyTorch alone: none of DeepSpeed's partitioning, offload,
      // sequence parallelism or tiling; Liger's kernels (use_liger_kernel=True) give the tiled loss.
      if (plan.sp > 1) return fmt::format("{}: no sequence parallelism (DeepSpeed's Ulysses: --framework hf-accelerate)", name);
      if (plan.fpdt) return fmt::format("{}: no FPDT (it exists only in Megatron-DeepSpeed)", name);
      if (plan.zero_stage > 0) return fmt::format("{}: no ZeRO (DeepSpeed: --framework hf-accelerate)", name);
      if (plan.offload_optimizer || plan.offload_params) return fmt::format("{}: no optimizer or parameter offload (DeepSpeed's)", name);
      if (plan.tiled_mlp) return fmt::format("{}: no switch for TiledMLP", name);
      // Checkpoint offload: transformers' gradient_checkpointing_kwargs={"offload": True} (>= 5.17;
      // Reference §11 F5.7), or Unsloth's offloaded checkpointing for adapters (§12 items 25-29).
      return "";
    case Framework::framework_unsloth:
      // One GPU (its open-source trainer), its own kernels: no DeepSpeed, FSDP or sequence
      // parallelism; its fused cross entropy runs whenever labels are given (item 31), its
      // checkpoint offload is use_gradient_checkpointing="unsloth" (items 25-29).
      if (plan.sequence_ranks() > 1) return fmt::format("{}: no sequence parallelism (one GPU)", name);
      if (gpus > 1) return fmt::format("{}: trains on one GPU (its open-source trainer; no data-parallel launch is planned)", name);
      if (plan.fpdt) return fmt::format("{}: no FPDT (it exists only in Megatron-DeepSpeed)", name);
      if (plan.zero_stage > 0 || plan.offload_optimizer || plan.offload_params)
        return fmt::format("{}: no ZeRO or optimizer/parameter offload (DeepSpeed's)", name);
      if (!plan.tiled_loss) return fmt::format("{}: its fused, chunked cross entropy always runs (Reference §12 item 31)", name);
      if (plan.checkpoint_offload && !plan.activation_checkpointing)
        return fmt::format("{}: its offload is of checkpoints (use_gradient_checkpointing=\"unsloth\")", name);
      return "";
    case Framework::framework_longseq:
      // Its MoE block (executor/llama_step.hpp moe_forward) keeps no router logits for a loss.
      if (model.is_moe() && (plan.moe_aux_loss || model.output_router_logits))
        return fmt::format("{}: the executor's MoE block trains without the auxiliary load-balancing loss", name);
      return "";
  }
  return "";
}

std::vector<Framework> frameworks_running(const ModelSpec& model, const PlanOptions& plan) {
  std::vector<Framework> running;
  for (Framework framework : frameworks_all())
    if (framework_unsupported(framework, model, plan).empty()) running.push_back(framework);
  return running;
}

}  // namespace longseq
