// frameworks.hpp: the frameworks a plan can be run in, and which plan options each can run (for
// which models). The search explores only what the target framework runs; an option another
// framework runs is named in the plan's "why not" lines. Sources: ../shared/FRAMEWORKS.md and
// ../shared/REFERENCE.md §8, cited per rule in frameworks.cpp.
#pragma once

#include <string>
#include <vector>

#include "models/model_spec.hpp"
#include "planner/plan.hpp"
#include "planner/search.hpp"

namespace longseq {

enum class Framework {
  framework_arctic_training,     // ArcticTraining: ALST's own trainer (recipe YAML)
  framework_hf_accelerate,       // Accelerate / HF Trainer / TRL (Accelerate YAML + DeepSpeed JSON)
  framework_megatron_deepspeed,  // Megatron-DeepSpeed: Ulysses and FPDT (launch arguments + DeepSpeed JSON)
  framework_deepspeed,           // a plain deepspeed.initialize loop (DeepSpeed JSON)
  framework_usp,                 // a DeepSpeed loop with USP's LongContextAttention: Ulysses x ring attention
  framework_accelerate_fsdp2,    // Accelerate / HF Trainer / TRL on PyTorch FSDP2 with PyTorch context parallelism
  framework_hf_trainer,          // the plain HF Trainer / TRL SFTTrainer: no DeepSpeed, no FSDP (DDP across GPUs)
  framework_torchtitan,          // PyTorch's torchtitan: FSDP2 with context parallelism, its own Llama 3 model code (TOML job)
  framework_unsloth,             // Unsloth on one GPU: its offloaded checkpointing, fused chunked loss, LoRA/QLoRA (Python script)
  framework_longseq,             // longseq's own executor (`longseq run`); ring attention planned, not yet executed
  framework_megatron_core,       // Megatron-Core with Transformer Engine: tensor x context parallelism, the distributed optimizer
};

// ArcticTraining: the framework the ALST techniques ship in, and the only one with a switch for
// each of them (tiled MLP, checkpoint offload, Ulysses, tiled loss); see the README.
inline constexpr Framework kDefaultFramework = Framework::framework_arctic_training;

// What longseq knows of a framework beyond which options it runs (framework_unsupported): the
// runtime profile its runs are priced with, the --emit target that writes its files, and the
// lengths its data path feeds the model. One entry per framework (frameworks.cpp).
struct FrameworkFacts {
  Framework framework;
  const char* name;             // as --framework takes it
  const char* runtime_profile;  // planner/profiles/NAME.yaml
  const char* export_target;    // --emit NAME writes its files; "" when none
  // Every length it trains is a multiple of this (beside the plan's own granule): ArcticTraining's
  // SFT collator pads each batch to the next multiple of data.div_length, 256 by default
  // (FRAMEWORKS §1.5, AT-main data/sft_factory.py L163-174), so a length off that grid would run
  // longer than planned.
  int64_t length_multiple;
  // How it runs a mixture-of-experts block when that is its own code rather than the model's:
  // ArcticTraining swaps Qwen3-MoE's block for ArcticMoE, one grouped GEMM over the experts
  // (Reference §12 items 79-80). Null: the runtime profile's (the model code's own block).
  const MoeExperts* moe_experts;
};
const FrameworkFacts& framework_facts(Framework framework);

// A framework as one description, after torchtitan's registered TrainSpec: its facts, what it runs
// (the rules every framework shares read these: framework_unsupported), and its own refusals. One
// file a framework, planner/frameworks/NAME.cpp, listed once in planner/frameworks/registry.cpp;
// its --emit writer is reports/exporters/TARGET.cpp. Nothing else names a framework by a switch.
struct FrameworkDescription {
  FrameworkFacts facts;
  bool ring_attention;               // runs a ring of key/value blocks itself (USP's LongContextAttention, longseq's executor)
  bool pytorch_context_parallelism;  // PyTorch's CP under FSDP2: its rotation (--cp-rotate) and HSDP's replicate x shard mesh
  bool lora;                         // plans LoRA adapters (PEFT through the Trainer / TRL, Unsloth, longseq's executor)
  bool trl_activation_offload;       // TRL's SFTConfig(activation_offloading=True)
  bool adam_8bit;                    // bitsandbytes' 8-bit AdamW through the Trainer's optim argument
  bool tiles_moe_blocks;             // TiledMLP over a whole mixture-of-experts block (Unsloth's)
  // Selective activation checkpointing, torchtitan's (activation_checkpoint.mode "selective"): one
  // decoder layer in every N checkpointed, the others keeping what they save (selective_ac_option
  // "N"), or every layer under the op-level policy (selective_ac_option "op": PlanOptions::checkpoint_ops).
  bool selective_checkpointing;
  // Megatron's model parallelism: tensor parallelism with its sequence parallelism (PlanOptions::tp:
  // the linears split over TP ranks inside a node, the residual stream split along the sequence)
  // and pipeline parallelism (PlanOptions::pp: the layers split into stages, 1F1B).
  bool model_parallelism;
  // Attention with a learnable sink logit per head (gpt-oss): Megatron-Core's softmax_type
  // "learnable" in TE's fused attention.
  bool attention_sinks;
  // Transformer Engine's activation offloading of the first n layers (Megatron-Core's cpu_offloading:
  // PlanOptions::offload_activation_layers).
  bool te_activation_offload;
  // DeepSeek-V3's layers (ModelSpec::is_latent_attention, moe_router_sigmoid, dense_layers): multi-head
  // latent attention, the sigmoid router over groups, the dense first layers, as Megatron-Core builds
  // them (reference-megatron-core M9); the Hugging Face layers' under the other stacks are not modelled.
  bool deepseek_v3_layers;
  // Megatron-Core's recompute beyond every layer's: block recompute, the first n layers of a stage
  // (PlanOptions::recompute_block_layers, M5.2), and selective recompute of modules' outputs
  // (PlanOptions::recompute_modules, M5.1).
  bool megatron_recompute;
  // Transformer Engine's FP8 linears (PlanOptions::fp8): Megatron-Core's --fp8-format (M10); the
  // other stacks' FP8 (torchtitan's torchao Float8Linear, Accelerate's TE/MS-AMP) is not modelled.
  bool te_fp8;
  // Megatron-Core's cp_comm_type all_gather (PlanOptions::cp_all_gather, M2.2): the ring degree's
  // K/V gathered whole before attention, not passed in a ring.
  bool megatron_cp_all_gather;
  // Why it cannot build `model` whatever the plan (nullptr: it builds what longseq reads), then why
  // it cannot run `plan` on `gpus` GPUs (0: not known); "" when it can.
  std::string (*model_refused)(const char* name, const ModelSpec& model);
  std::string (*plan_refused)(const char* name, const ModelSpec& model, const PlanOptions& plan, int64_t gpus);
};
// Every framework, in the order `plan` lists them (registry.cpp).
const std::vector<const FrameworkDescription*>& framework_descriptions();
const FrameworkDescription& framework_description(Framework framework);

// `profile` as `framework` runs it: with the framework's own MoE implementation where it has one.
RuntimeProfile framework_profile(Framework framework, RuntimeProfile profile);

// The framework whose files `--emit target` writes (hf-accelerate is accepted for accelerate).
// Throws ConfigError(--emit) for an unknown target, naming the known ones.
Framework framework_of_export_target(const std::string& target);

const char* framework_name(Framework framework);  // "arctic-training", ...
std::vector<Framework> frameworks_all();
// Throws ConfigError(flag, "", reason listing the names) for an unknown name.
Framework framework_parse(const std::string& name, const std::string& flag = "--framework");

// Why `framework` cannot run `plan` for `model` on `gpus` GPUs (0: not known, and the rules that
// need the count are not applied), naming the option and the source; empty when it can.
std::string framework_unsupported(Framework framework, const ModelSpec& model, const PlanOptions& plan, int64_t gpus = 0);
// torchtitan's model and flavor with `model`'s network ({"llama3", "8B"}, {"qwen3", "14B"}, ...;
// torchtitan v0.2.2's registry, each matched by a built-in card's shape); empty for any other model,
// which torchtitan's own model code does not build.
struct TorchtitanFlavor {
  std::string model_name, flavor;
};
TorchtitanFlavor torchtitan_flavor(const ModelSpec& model);

// A search for `framework`: what it refuses (framework_unsupported, with the cluster's GPU count),
// the lengths it feeds (FrameworkFacts::length_multiple) and the checkpointing it offers. `model`
// and `cluster` are held by reference: they outlive the search.
void search_options_for_framework(SearchOptions& options, Framework framework, const ModelSpec& model, const ClusterSpec& cluster);

// The frameworks that run `plan` for `model` (longseq's executor always among them).
std::vector<Framework> frameworks_running(const ModelSpec& model, const PlanOptions& plan);

}  // namespace longseq
