#include "cli/commands.hpp"

#include <fmt/format.h>
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>
#include <numeric>
#include <optional>

#include "io/text_escape.hpp"
#include "models/checked_input.hpp"
#include "models/config_error.hpp"
#include "executor/trainer.hpp"
#include "models/model_loader.hpp"
#include "models/output_files.hpp"
#include "models/process.hpp"
#include "executor/job_launch.hpp"
#include "planner/max_seqlen.hpp"
#include "planner/frameworks.hpp"
#include "planner/plan_file.hpp"
#include "planner/search.hpp"
#include "planner/time_model.hpp"
#include "planner/units.hpp"
#include "reports/export.hpp"
#include "reports/memory_report.hpp"

namespace longseq {

// Flags as typed; "not given" is kept apart from a value so that defaults come from the plan base
// (the ALST feature set, or --baseline).
struct PlanCommandArgs {
  std::string model;
  int64_t layers = 0;  // 0: the card's
  std::string gpu = "h100-sxm-80gb";
  std::string profile;  // empty: the target framework's (deepspeed-hf, megatron-deepspeed, native-cuda)
  std::string attention;  // empty: the profile's kernel, else the card's default
  std::optional<std::string> framework;
  // nullopt: not given (a given 0 or negative value is an error, never "not given").
  std::optional<int64_t> gpus, nodes, gpus_per_node;
  std::optional<double> host_memory_gib;
  std::optional<std::string> seqlen;
  std::optional<int64_t> sp, ring;
  std::optional<int> zero_stage;
  bool baseline = false;
  bool alst = false;
  bool search = false;
  std::string objective;
  // Each switch is a pair; the count of each side says whether it was given.
  int64_t offload_optimizer_on = 0, offload_optimizer_off = 0;
  int64_t offload_params_on = 0, offload_params_off = 0;
  int64_t checkpointing_on = 0, checkpointing_off = 0;
  int64_t checkpoint_offload_on = 0, checkpoint_offload_off = 0;
  int64_t tiled_mlp_on = 0, tiled_mlp_off = 0;
  int64_t tiled_loss_on = 0, tiled_loss_off = 0;
  std::optional<int64_t> mlp_tiles, loss_tiles;
  bool fpdt = false;
  std::optional<std::string> fpdt_chunk;
  int64_t micro_batch = 1;
  // LoRA / QLoRA: adapters of this rank on a frozen base, on these linears; held by a search.
  std::optional<int64_t> lora_rank;
  std::optional<std::string> lora_targets;  // absent: all-linear
  bool qlora = false;
  bool adam_8bit = false;
  bool moe_aux_loss = false;
  bool trl_activation_offload = false;
  std::string cp_rotate = "allgather";
  std::optional<int64_t> dp_replicate;
  bool json = false;
  bool tensors = false;
  std::string emit;      // "deepspeed" or "accelerate"
  std::optional<std::string> emit_out;  // file for the emitted config (not given: stdout)
  std::string emit_length = "safe";     // a searched maximum: the band's low end ("safe") or the point estimate
  bool overwrite = false;  // --emit-out / --plan-out may replace an existing regular file
  std::optional<std::string> max_step_time;  // the longest length whose step takes at most this
  std::optional<double> gpu_hour_cost;       // the price of one GPU-hour, for the cost of a billion tokens
  // This machine as the target (what `longseq run` executes): ranks, a device budget per rank.
  std::optional<int64_t> ranks;
  std::optional<double> budget_mib;
  std::string device = "cpu";
  std::optional<std::string> plan_out;  // the chosen plan as a plan file for `longseq run --plan`
};

namespace {

void switch_register(CLI::App& command, const std::string& name, int64_t& on, int64_t& off, const std::string& help) {
  command.add_flag("--" + name, on, help);
  command.add_flag("--no-" + name, off, "turn off --" + name);
}

// A count the user gave must be positive; one not given becomes 0, the library's "default".
int64_t positive_or_default(const std::optional<int64_t>& value, const char* flag) {
  if (!value) return 0;
  if (*value < 1) throw ConfigError(flag, "", fmt::format("must be positive, got {}", *value));
  return *value;
}

void switch_apply(bool& value, int64_t on, int64_t off, const std::string& name) {
  if (on > 0 && off > 0) throw ConfigError("--" + name, "", "given together with --no-" + name);
  if (on > 0) value = true;
  if (off > 0) value = false;
}

}  // namespace

std::shared_ptr<PlanCommandArgs> plan_command_register(CLI::App& app) {
  auto args = std::make_shared<PlanCommandArgs>();
  CLI::App* command = app.add_subcommand(
      "plan",
      "Predict per-GPU peak memory (named breakdown), host memory per node, step time and TFLOPS for a plan; without "
      "--seqlen, find the maximum sequence length. Without plan flags it searches the plan space for the best plan "
      "(the longest sequence, or with --seqlen the most tokens/s); plan flags (--alst, --baseline, --sp, --zero, the "
      "switches) fix the plan instead.");
  command->add_option("--model,-m", args->model, "built-in card name (see `longseq models`), a card .yaml, or a Hugging Face config.json")
      ->required();
  command->add_option("--layers", args->layers, "keep only the first N decoder layers (a stack of the model's shape, as `longseq run --layers`)")
      ->check(CLI::Range(1, 1 << 20));
  command->add_option("--gpu", args->gpu, "hardware card name or .yaml (default h100-sxm-80gb; see `longseq hardware`)");
  command->add_option("--gpus,-g", args->gpus, "number of GPUs (default: all GPUs of --nodes)");
  command->add_option("--nodes", args->nodes, "number of nodes (default: as many as --gpus needs)");
  command->add_option("--gpus-per-node", args->gpus_per_node, "GPUs per node (default: the hardware card's)");
  command->add_option("--host-mem-gib", args->host_memory_gib, "host memory per node in GiB (default: the hardware card's)");
  command->add_option("--seqlen,-s", args->seqlen, "sequence length to check, e.g. 32768, 32K, 1.5M (K/M = 10^3/10^6), 128Ki (2^10)");
  command->add_option("--sp", args->sp, "Ulysses sequence-parallel degree (default: largest valid; 1 with --baseline)");
  command->add_option("--ring", args->ring,
                      "ring attention degree r beside Ulysses' sp (u x r ranks on one sequence, key/value blocks passed around "
                      "the ring; default 1: none). Runs in USP's LongContextAttention (--framework usp)");
  command->add_option("--zero", args->zero_stage, "ZeRO stage 0..3 (default 3)");
  command->add_flag("--search", args->search,
                    "search the plan space (the default when no plan flag is given): sp, ZeRO stage, offloads, "
                    "checkpointing, tiling, FPDT and its chunk; with plan flags (--zero 2, --no-offload-params, --sp 4, "
                    "...) the search holds those options fixed");
  command->add_option("--objective", args->objective,
                      "search objective: max-seqlen (default without --seqlen) or throughput (tokens/s at --seqlen)");
  command->add_flag("--alst", args->alst,
                    "the ALST feature set instead of a search: ZeRO-3, optimizer offload, checkpointing with offload, "
                    "Ulysses over as many GPUs as the heads allow, tiled MLP, tiled loss");
  command->add_flag("--baseline", args->baseline,
                    "start from the ALST paper's baseline instead: ZeRO-3, optimizer offload, checkpointing, sp=1, no tiling or checkpoint offload");
  switch_register(*command, "offload-optimizer", args->offload_optimizer_on, args->offload_optimizer_off,
                  "fp32 master weights, Adam states and gradients in host memory");
  switch_register(*command, "offload-params", args->offload_params_on, args->offload_params_off,
                  "ZeRO-3 weight partitions in host memory (ALST on 1 GPU)");
  switch_register(*command, "checkpointing", args->checkpointing_on, args->checkpointing_off,
                  "activation checkpointing per decoder layer");
  switch_register(*command, "checkpoint-offload", args->checkpoint_offload_on, args->checkpoint_offload_off,
                  "offload checkpointed hidden_states to host memory");
  switch_register(*command, "tiled-mlp", args->tiled_mlp_on, args->tiled_mlp_off, "TiledMLP over the sequence");
  switch_register(*command, "tiled-loss", args->tiled_loss_on, args->tiled_loss_off, "fused, tiled logits and loss");
  command->add_option("--mlp-tiles", args->mlp_tiles, "MLP tile count (default: DeepSpeed's ceil(S/sp / hidden))");
  command->add_option("--loss-tiles", args->loss_tiles, "loss tile count (default: the runtime profile's rule)");
  command->add_option("--micro-batch", args->micro_batch, "samples per rank per step (default 1)");
  command->add_option("--lora", args->lora_rank,
                      "train LoRA adapters of this rank on a frozen base (PEFT: fp32 adapters, no base gradients or optimizer "
                      "states); plans for the HF Trainer / TRL (--framework hf-trainer) on one GPU a replica");
  command->add_option("--lora-targets", args->lora_targets,
                      "the linears that get adapters: all-linear (q, k, v, o, gate, up, down; the default, Unsloth's) or q,v "
                      "(PEFT's default for Llama, Qwen, Mistral, Gemma)");
  command->add_flag("--qlora", args->qlora, "the base's linears in 4-bit NF4 with double quantization and bf16 compute (QLoRA); needs --lora");
  command->add_flag("--adam-8bit", args->adam_8bit,
                    "bitsandbytes' 8-bit AdamW (optim=\"adamw_8bit\": uint8 moments, ~2.03 bytes a parameter); the HF Trainer / TRL");
  command->add_flag("--trl-activation-offload", args->trl_activation_offload,
                    "TRL's activation_offloading=True in place of transformers' checkpoint offload: the same layer inputs to "
                    "pinned host memory, and up to 5 recently offloaded GPU copies kept alive through the forward (Reference "
                    "§11 F5.2); needs --checkpointing --checkpoint-offload");
  command->add_flag("--moe-aux-loss", args->moe_aux_loss,
                    "a mixture-of-experts model trained with its auxiliary load-balancing loss (output_router_logits): every "
                    "layer's router logits kept, concatenated and one-hot encoded at the loss");
  command->add_option("--cp-rotate", args->cp_rotate,
                      "PyTorch context parallelism's K/V rotation (--framework accelerate-fsdp2 or torchtitan): allgather (the "
                      "default: the whole sequence's K/V per layer) or alltoall (one block passed per step)");
  command->add_option("--dp-replicate", args->dp_replicate,
                      "FSDP2's HSDP: replicate the model over this many groups, sharding it within each (default 1: shard over all)");
  command->add_flag("--fpdt", args->fpdt,
                    "FPDT chunked attention with host-resident chunks (turns tiled MLP/loss off: FPDT chunks them itself)");
  command->add_option("--fpdt-chunk", args->fpdt_chunk, "FPDT chunk of the global sequence (default 64Ki = 65536)");
  command->add_option("--profile", args->profile,
                      "runtime profile (default: the framework's own: deepspeed-hf for the DeepSpeed ones, megatron-deepspeed, "
                      "fsdp2-accelerate, fsdp2-torchtitan, hf-trainer, unsloth, native-cuda for longseq), native, or a .yaml");
  command->add_option("--attention", args->attention,
                      "attention kernel: fa2 (FlashAttention-2, also SDPA's flash backend), fa3 (FlashAttention-3 on Hopper: its "
                      "backward buffers and its published speed), sdpa-cudnn (SDPA's cuDNN backend) or sdpa (the backend PyTorch's "
                      "SDPA picks on the card: sdpa-cudnn on H100/H200/H800, fa2 elsewhere); default: the profile's (sdpa for the "
                      "FSDP2 stacks), else the hardware card's (fa3 on H100/H200/H800, fa2 on A100). FPDT and USP's ring run "
                      "FlashAttention-2's kernels, PyTorch's context parallelism SDPA's, whatever this says")
      ->check(CLI::IsMember(attention_kernel_ids(true)));
  command->add_option("--framework", args->framework,
                      "the framework the plan is for: arctic-training (default for the search: ALST's trainer, a switch for each "
                      "of its techniques), hf-accelerate (Accelerate / HF Trainer / TRL), megatron-deepspeed (where FPDT lives), "
                      "deepspeed (a plain deepspeed.initialize loop), usp (a DeepSpeed loop with USP's Ulysses x ring attention), "
                      "accelerate-fsdp2 (Accelerate / Trainer / TRL on FSDP2 with PyTorch context parallelism), hf-trainer (the plain "
                      "HF Trainer / TRL in bf16; where LoRA adapters are planned), unsloth (one GPU: its offloaded checkpointing "
                      "and fused loss, LoRA/QLoRA), torchtitan (PyTorch's trainer: FSDP2 with "
                      "context parallelism, its Llama 3 flavors), longseq (its own executor). The search explores "
                      "only what it runs and says what another framework would reach");
  command->add_flag("--json", args->json, "print JSON instead of tables");
  command->add_flag("--tensors", args->tensors,
                    "also list the tensors one decoder layer saves for backward, as the plan's runtime runs it (name, category, "
                    "bytes; JSON: the \"tensors\" object, README: The tensor inventory)");
  command->add_option("--emit", args->emit,
                      "write the (chosen) plan as a framework's files instead of the report: arctic-training (recipe YAML), "
                      "accelerate (Accelerate YAML + the DeepSpeed JSON it names), megatron-deepspeed (launch arguments + "
                      "DeepSpeed JSON), deepspeed or usp (DeepSpeed JSON for a plain loop), accelerate-fsdp2 (Accelerate's FSDP2 + "
                      "context-parallelism YAML), torchtitan (its TOML job), unsloth (a FastLanguageModel script) or hf-trainer (a TRL "
                      "SFTTrainer script, with PEFT's LoraConfig for adapters)");
  command->add_option("--emit-length", args->emit_length,
                      "the length --emit writes when longseq finds the maximum: safe (default: the band's low end, every "
                      "estimate at its high end) or point (the point estimate, at 100% of usable memory)")
      ->check(CLI::IsMember({"safe", "point"}));
  command->add_option("--emit-out", args->emit_out,
                      "file for --emit (default: standard output); a second file (the DeepSpeed JSON) goes beside it as "
                      "STEM.deepspeed.json. A FIFO or a device gets every file in one stream, and like a shell's `> fifo` the "
                      "write waits until something reads the FIFO");
  command->add_option("--ranks", args->ranks,
                      "plan for this machine's executor instead of a GPU cluster: this many ranks (mpirun -np), each with "
                      "--budget-mib of device memory; the search then covers what `longseq run` executes");
  command->add_option("--budget-mib", args->budget_mib, "with --ranks: device memory per rank in MiB");
  command->add_option("--device", args->device, "with --ranks: cpu (default; profile native) or cuda (profile native-cuda)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  command->add_option("--plan-out", args->plan_out,
                      "also write the chosen plan, with the model, length, ranks and budget it is for, to this file for "
                      "`longseq run --plan FILE` / `longseq launch --plan FILE`");
  command->add_option("--max-step-time", args->max_step_time,
                      "find the longest length whose predicted step takes at most this (3600, 90min, 1h, 2d): the memory's "
                      "maximum is cut where the step grows past it");
  command->add_option("--gpu-hour-cost", args->gpu_hour_cost,
                      "the price of one GPU-hour (any currency): the step report adds the cost of a billion tokens");
  command->add_flag("--overwrite", args->overwrite,
                    "let --emit-out / --plan-out replace an existing file (without it an existing file is refused before any "
                    "work; a device or FIFO is written, never replaced)");
  return args;
}

namespace {

// Where --emit-out, its DeepSpeed JSON and --plan-out go, decided before the search.
struct PlanOutputs {
  std::optional<OutputFileTarget> emit_main, emit_companion, plan_out;
};

// The choices the flags hold in every plan: adapters (none without --lora), 8-bit Adam, the CP
// rotation, HSDP.
void held_choices_apply(const PlanCommandArgs& args, HeldChoices& held) {
  if (args.qlora && !args.lora_rank) throw ConfigError("--qlora", "", "trains LoRA adapters on a 4-bit base: give --lora RANK too");
  if (args.lora_targets && !args.lora_rank) throw ConfigError("--lora-targets", "", "chooses the adapters' linears: give --lora RANK too");
  if (args.lora_rank) {
    if (*args.lora_rank < 1 || *args.lora_rank > 4096)
      throw ConfigError("--lora", "", fmt::format("the adapters' rank must be in [1, 4096], got {}", *args.lora_rank));
    held.lora_rank = *args.lora_rank;
    held.lora_all_linear = HeldChoices::lora_targets_parse(args.lora_targets.value_or("all-linear"), "--lora-targets", "");
    held.qlora = args.qlora;
  }
  held.adam_8bit = args.adam_8bit;
  held.moe_aux_loss = args.moe_aux_loss;
  held.trl_activation_offload = args.trl_activation_offload;
  if (args.cp_rotate != "allgather" && args.cp_rotate != "alltoall")
    throw ConfigError("--cp-rotate", "", fmt::format("expected allgather or alltoall, got '{}'", args.cp_rotate));
  held.cp_all_to_all = args.cp_rotate == "alltoall";
  if (args.dp_replicate) {
    if (*args.dp_replicate < 1) throw ConfigError("--dp-replicate", "", fmt::format("must be at least 1, got {}", *args.dp_replicate));
    held.dp_replicate = *args.dp_replicate;
  }
}

bool plan_flags_given(const PlanCommandArgs& args) {
  return args.alst || args.baseline || args.sp || args.ring || args.zero_stage || args.mlp_tiles || args.loss_tiles || args.fpdt ||
         args.fpdt_chunk ||
         args.offload_optimizer_on + args.offload_optimizer_off + args.offload_params_on + args.offload_params_off +
                 args.checkpointing_on + args.checkpointing_off + args.checkpoint_offload_on + args.checkpoint_offload_off +
                 args.tiled_mlp_on + args.tiled_mlp_off + args.tiled_loss_on + args.tiled_loss_off >
             0;
}

// The fixed plan the flags describe: the ALST feature set (or the paper's baseline), then each flag.
PlanOptions plan_from_flags(const PlanCommandArgs& args, const ModelSpec& model, const ClusterSpec& cluster) {
  const int64_t sp = positive_or_default(args.sp, "--sp");
  PlanOptions plan = PlanOptions::alst(sp_largest_valid(model, cluster.gpus), cluster.gpus);
  if (args.alst && args.baseline) throw ConfigError("--alst", "", "given together with --baseline");
  if (args.baseline) {
    plan.sp = 1;
    plan.tiled_mlp = plan.tiled_loss = plan.checkpoint_offload = false;
  }
  if (sp > 0) plan.sp = sp;
  if (args.ring) {
    plan.ring = positive_or_default(args.ring, "--ring");
    if (args.sp == std::nullopt) plan.sp = sp_largest_valid(model, cluster.gpus / plan.ring);
  }
  if (args.zero_stage) plan.zero_stage = *args.zero_stage;
  switch_apply(plan.offload_optimizer, args.offload_optimizer_on, args.offload_optimizer_off, "offload-optimizer");
  switch_apply(plan.offload_params, args.offload_params_on, args.offload_params_off, "offload-params");
  switch_apply(plan.activation_checkpointing, args.checkpointing_on, args.checkpointing_off, "checkpointing");
  switch_apply(plan.checkpoint_offload, args.checkpoint_offload_on, args.checkpoint_offload_off, "checkpoint-offload");
  switch_apply(plan.tiled_mlp, args.tiled_mlp_on, args.tiled_mlp_off, "tiled-mlp");
  switch_apply(plan.tiled_loss, args.tiled_loss_on, args.tiled_loss_off, "tiled-loss");
  // Checkpoint offload is part of the default set; turning checkpointing off turns it off too
  // unless the user asked for both, which plan_problems then reports.
  if (!plan.activation_checkpointing && args.checkpoint_offload_on == 0) plan.checkpoint_offload = false;
  // Likewise parameter offload (ALST's on one GPU) leaves with ZeRO-3 unless asked for.
  if (plan.zero_stage != 3 && args.offload_params_on == 0) plan.offload_params = false;
  plan.mlp_tiles = positive_or_default(args.mlp_tiles, "--mlp-tiles");
  plan.loss_tiles = positive_or_default(args.loss_tiles, "--loss-tiles");
  for (const auto& [tiles, flag] : {std::pair{plan.mlp_tiles, "--mlp-tiles"}, std::pair{plan.loss_tiles, "--loss-tiles"}})
    if (tiles > kTileCountLimit) throw ConfigError(flag, "", fmt::format("{} tiles is not a plausible count (at most {})", tiles, kTileCountLimit));
  plan.micro_batch = args.micro_batch;
  if (args.fpdt_chunk && !args.fpdt) throw ConfigError("--fpdt-chunk", "", "given without --fpdt");
  if (args.fpdt) {
    plan.fpdt = true;
    if (args.tiled_mlp_on == 0) plan.tiled_mlp = false;
    if (args.tiled_loss_on == 0) plan.tiled_loss = false;
    if (args.fpdt_chunk) plan.fpdt_chunk_tokens = seqlen_parse(*args.fpdt_chunk, "--fpdt-chunk");
  }
  held_choices_apply(args, plan);
  // ALST's set tiles dense MLPs only (Reference §12 item 77): a MoE model's plan leaves it unless asked.
  if (model.is_moe() && args.tiled_mlp_on == 0) plan.tiled_mlp = false;
  if (plan.lora()) {
    // An adapter run on one replica a GPU: the ALST set's ZeRO, offloads, Ulysses and TiledMLP
    // leave unless asked for (plan_problems then says why they cannot stay).
    if (!args.zero_stage) plan.zero_stage = 0;
    if (args.offload_optimizer_on == 0) plan.offload_optimizer = false;
    if (args.offload_params_on == 0) plan.offload_params = false;
    if (!args.sp) plan.sp = 1;
    if (args.tiled_mlp_on == 0) plan.tiled_mlp = false;
  }
  return plan;
}

// The fixed plan starts from the ALST set; a named framework keeps of it what it runs. An option
// the user did not give is turned off when it is what the framework refuses (turning it off
// changes the refusal), one at a time; what the user gave stays, and is refused by name.
void plan_defaults_fit(const PlanCommandArgs& args, PlanOptions& plan, Framework framework, const ModelSpec& model) {
  // Each turns one default off, and says whether it was on.
  auto turned_off = [](bool& option) {
    const bool was_on = option;
    option = false;
    return was_on;
  };
  std::vector<std::function<bool(PlanOptions&)>> defaults;
  if (!args.sp)
    defaults.push_back([](PlanOptions& p) {
      const bool was_on = p.sp > 1;
      p.sp = 1;
      return was_on;
    });
  if (args.checkpoint_offload_on == 0) defaults.push_back([=](PlanOptions& p) { return turned_off(p.checkpoint_offload); });
  if (args.tiled_mlp_on == 0) defaults.push_back([=](PlanOptions& p) { return turned_off(p.tiled_mlp); });
  if (args.tiled_loss_on == 0) defaults.push_back([=](PlanOptions& p) { return turned_off(p.tiled_loss); });
  if (args.offload_optimizer_on == 0 && args.offload_params_on == 0)
    defaults.push_back([=](PlanOptions& p) {
      const bool optimizer = turned_off(p.offload_optimizer), params = turned_off(p.offload_params);  // both, together
      return optimizer || params;
    });
  // First, the layout the rest sits on: the ALST set's ZeRO-3 lowered to the highest stage whose
  // refusal, once the other defaults are off too, no longer names ZeRO (every stage rule does:
  // ArcticMoE's ZeRO-2 at most, no ZeRO in Unsloth or the plain Trainer, FSDP2's ZeRO-3 layout).
  // DeepSpeed's offloads need ZeRO (parameters ZeRO-3), so those not asked for leave with it, as
  // plan_from_flags does.
  if (!args.zero_stage) {
    const std::vector<std::function<bool(PlanOptions&)>> others = defaults;
    auto staged = [&args](PlanOptions plan_at, int stage) {
      plan_at.zero_stage = stage;
      if (stage != 3 && args.offload_params_on == 0) plan_at.offload_params = false;
      if (stage == 0 && args.offload_optimizer_on == 0) plan_at.offload_optimizer = false;
      return plan_at;
    };
    defaults.insert(defaults.begin(), [&, others, staged](PlanOptions& p) {
      const auto refuses_stage = [&](int stage) {
        PlanOptions bare = staged(p, stage);
        for (const auto& turn_off : others) turn_off(bare);
        return framework_unsupported(framework, model, bare).find("ZeRO") != std::string::npos;
      };
      if (!refuses_stage(p.zero_stage)) return false;
      for (int stage = p.zero_stage - 1; stage >= 0; --stage)
        if (!refuses_stage(stage)) {
          p = staged(p, stage);
          return true;
        }
      return false;
    });
  }
  // Passes until nothing changes: a refusal names only the first option its checks meet.
  for (bool changed = true; changed;) {
    changed = false;
    for (const auto& turn_off : defaults) {
      const std::string refusal = framework_unsupported(framework, model, plan);
      if (refusal.empty()) return;
      PlanOptions without = plan;
      if (turn_off(without) && framework_unsupported(framework, model, without) != refusal) {
        plan = without;
        changed = true;
      }
    }
  }
}

// --search with plan flags: each flag given holds that option fixed in every plan searched.
std::function<bool(const PlanOptions&)> search_constraints(const PlanCommandArgs& args) {
  auto held = [](int64_t on, int64_t off) -> std::optional<bool> {
    if (on > 0 && off > 0) return std::nullopt;
    if (on > 0) return true;
    if (off > 0) return false;
    return std::nullopt;
  };
  const std::optional<bool> offload_optimizer = held(args.offload_optimizer_on, args.offload_optimizer_off),
                            offload_params = held(args.offload_params_on, args.offload_params_off),
                            checkpointing = held(args.checkpointing_on, args.checkpointing_off),
                            checkpoint_offload = held(args.checkpoint_offload_on, args.checkpoint_offload_off),
                            tiled_mlp = held(args.tiled_mlp_on, args.tiled_mlp_off), tiled_loss = held(args.tiled_loss_on, args.tiled_loss_off);
  const std::optional<int64_t> sp = args.sp, ring = args.ring;
  const std::optional<int> zero = args.zero_stage;
  const bool fpdt = args.fpdt;
  const std::optional<int64_t> chunk = args.fpdt_chunk ? std::optional<int64_t>(seqlen_parse(*args.fpdt_chunk, "--fpdt-chunk")) : std::nullopt;
  return [=](const PlanOptions& plan) {
    auto holds = [](const std::optional<bool>& wanted, bool value) { return !wanted || *wanted == value; };
    return (!sp || plan.sp == *sp) && (!ring || plan.ring == *ring) && (!zero || plan.zero_stage == *zero) &&
           holds(offload_optimizer, plan.offload_optimizer) && holds(offload_params, plan.offload_params) &&
           holds(checkpointing, plan.activation_checkpointing) && holds(checkpoint_offload, plan.checkpoint_offload) &&
           holds(tiled_mlp, plan.tiled_mlp) && holds(tiled_loss, plan.tiled_loss) && (!fpdt || plan.fpdt) &&
           (!chunk || (plan.fpdt && plan.fpdt_chunk_tokens == *chunk));
  };
}

std::string problems_join(const std::vector<std::string>& problems) {
  std::string joined;
  for (const auto& problem : problems) joined += (joined.empty() ? "" : "; ") + problem;
  return joined;
}

nlohmann::json plan_to_json(const PlanOptions& plan, const ClusterSpec& cluster) {
  nlohmann::json json = {{"sp", plan.sp}, {"ring", plan.ring}, {"dp", cluster.gpus / plan.sequence_ranks()}, {"zero_stage", plan.zero_stage},
                         {"offload_optimizer", plan.offload_optimizer}, {"offload_params", plan.offload_params},
                         {"activation_checkpointing", plan.activation_checkpointing},
                         {"checkpoint_offload", plan.checkpoint_offload}, {"tiled_mlp", plan.tiled_mlp},
                         {"tiled_loss", plan.tiled_loss}, {"fpdt", plan.fpdt}, {"micro_batch", plan.micro_batch}};
  if (plan.fpdt) json["fpdt_chunk_tokens"] = plan.fpdt_chunk_tokens;
  if (plan.lora()) json["lora"] = {{"rank", plan.lora_rank}, {"targets", plan.lora_all_linear ? "all-linear" : "q,v"}, {"qlora", plan.qlora}};
  json["summary"] = plan_describe(plan);
  return json;
}

// What runs out when `plan` fails at `seqlen`: the largest term that grows with the length (the
// reserve or the model states, constant in S, explain nothing about the length), e.g.
// "largest growing with the length: layer_working_set/attention.q 4.3 GiB"; or, where nothing
// grows (a plan that fails at its first tokens), the largest term, said to be constant.
std::string largest_component_describe(const ModelSpec& model, const ClusterSpec& cluster, const PlanOptions& plan,
                                       const RuntimeProfile& profile, int64_t seqlen) {
  const MemoryPrediction prediction = memory_predict(model, cluster, plan, profile, seqlen);
  const int64_t shorter_seqlen = seqlen / 2 - (seqlen / 2) % seqlen_granule(plan);
  const MemoryPrediction shorter = shorter_seqlen > 0 ? memory_predict(model, cluster, plan, profile, shorter_seqlen) : MemoryPrediction{};
  auto bytes_of = [](const std::vector<MemoryItem>& items, const MemoryItem& like) {
    for (const auto& item : items)
      if (item.name == like.name && item.category == like.category) return item.bytes;
    return 0.0;
  };
  const bool gpu = !prediction.fits_gpu();
  const std::vector<MemoryItem>& items = gpu ? prediction.gpu_items : prediction.host_items;
  const MemoryItem *largest = nullptr, *largest_growing = nullptr;
  for (const auto& item : items) {
    if (!largest || item.bytes > largest->bytes) largest = &item;
    const bool grows = shorter_seqlen > 0 && item.bytes > 1.01 * bytes_of(gpu ? shorter.gpu_items : shorter.host_items, item);
    if (grows && (!largest_growing || item.bytes > largest_growing->bytes)) largest_growing = &item;
  }
  const std::string where = gpu ? "" : fmt::format("host {:.0f} of {:.0f} GiB per node; ", bytes_to_gib(prediction.host_bytes_per_node),
                                                   bytes_to_gib(prediction.host_capacity_bytes));
  if (largest_growing)
    return fmt::format("{}largest growing with the length: {}/{} {:.1f} GiB", where, largest_growing->category, largest_growing->name,
                       bytes_to_gib(largest_growing->bytes));
  if (largest)
    return fmt::format("{}largest: {}/{} {:.1f} GiB, constant in the length", where, largest->category, largest->name,
                       bytes_to_gib(largest->bytes));
  return where.empty() ? "GPU memory" : where.substr(0, where.size() - 2);
}

// "1 token", "32.768K tokens": a length in a sentence.
std::string tokens_text(int64_t tokens) { return tokens == 1 ? "1 token" : seqlen_format(tokens) + " tokens"; }

// How a plan spreads one sequence, named as the frameworks name it.
std::string sequence_parallelism_describe(const PlanOptions& plan, const RuntimeProfile& profile) {
  if (plan.fpdt) return fmt::format("FPDT, sp={}", plan.sp);
  if (plan.ring > 1 && profile.ring_implementation == RingImplementation::ring_torch_allgather)
    return fmt::format("PyTorch CP, cp={} ({})", plan.ring, context_parallel_all_gather(profile, plan) ? "all-gather" : "all-to-all");
  if (plan.ring > 1) return plan.sp > 1 ? fmt::format("Ulysses x ring, u={} r={}", plan.sp, plan.ring) : fmt::format("ring, r={}", plan.ring);
  if (plan.sp > 1) return fmt::format("Ulysses, sp={}", plan.sp);
  return "none (data parallel)";
}

struct FrameworkWinner {
  Framework framework;
  RuntimeProfile profile;
  const SearchCandidate* winner = nullptr;  // null: no plan of it fits
  std::string why_none;                     // then why, when no plan was valid
};

// Every framework's best plan on this cluster, best first, each from its own search and runtime
// profile: the side-by-side answer to "Ulysses, USP's ring or PyTorch CP?".
std::string frameworks_compared_render(std::vector<FrameworkWinner> winners, Framework searched, bool by_length, nlohmann::json& report) {
  const auto score = [&](const FrameworkWinner& w) {
    if (!w.winner || !w.winner->fits) return -1.0;
    return by_length ? static_cast<double>(w.winner->max_seqlen) : w.winner->time.tokens_per_s;
  };
  std::stable_sort(winners.begin(), winners.end(), [&](const FrameworkWinner& a, const FrameworkWinner& b) { return score(a) > score(b); });
  std::string out = "\neach framework's best here (its own search, runtime profile and precision; PREDICTIONS):\n";
  nlohmann::json compared = nlohmann::json::array();
  for (const FrameworkWinner& w : winners) {
    const std::string name = std::string(framework_name(w.framework)) + (w.framework == searched ? " *" : "");
    if (score(w) < 0) {
      out += fmt::format("  {:<20} {}{}\n", name, by_length ? "fits no length" : "does not fit",
                         w.why_none.empty() ? "" : fmt::format(" ({})", w.why_none));
      compared.push_back({{"framework", framework_name(w.framework)}, {"fits", false}, {"why", w.why_none}});
      continue;
    }
    const SearchCandidate& c = *w.winner;
    const std::string spread = sequence_parallelism_describe(c.plan, w.profile);
    if (by_length)
      out += fmt::format("  {:<20} {:<32} max {:>13} tokens, {:.1f} s/step there (limited by {})\n", name, spread,
                         integer_with_commas(c.max_seqlen), c.time.time.total_s(), c.binding_constraint);
    else
      out += fmt::format("  {:<20} {:<32} {:>9.0f} tokens/s, peak {:.1f} GiB\n", name, spread, c.time.tokens_per_s,
                         bytes_to_gib(c.memory.gpu_peak_bytes));
    compared.push_back({{"framework", framework_name(w.framework)}, {"fits", true}, {"sequence_parallelism", spread},
                        {"plan", plan_describe(c.plan)}, {"max_seqlen", c.max_seqlen}, {"step_s", c.time.time.total_s()},
                        {"tokens_per_s", c.time.tokens_per_s}, {"binding_constraint", c.binding_constraint}});
  }
  out += "  (* this search; --framework NAME for one of the others' full report)\n";
  report["frameworks_compared"] = compared;
  return out;
}

// Other GPU counts than the one asked about, where they change the answer: the fewest GPUs that
// reach the same length (the rest only add data parallelism), a count of these GPUs that reaches
// further, and the first larger one that does. The length is set by the ranks on one sequence,
// which the heads bound (a Ulysses degree divides them): the counts tried are each valid degree
// on whole nodes (the degree itself inside one node, else its least common multiple with a node).
std::string gpu_count_advice(const ModelSpec& model, const ClusterSpec& cluster, const RuntimeProfile& profile,
                             const SearchOptions& options, const SearchCandidate& winner, nlohmann::json& report) {
  std::set<int64_t> counts;
  for (int64_t degree = 1; degree <= 2 * cluster.gpus && degree <= model.num_q_heads; ++degree) {
    if (model.num_q_heads % degree != 0 || !(model.num_kv_heads % degree == 0 || degree % model.num_kv_heads == 0)) continue;
    const int64_t count = degree <= cluster.gpus_per_node ? degree : std::lcm(degree, cluster.gpus_per_node);
    if (count != cluster.gpus && count <= 2 * cluster.gpus) counts.insert(count);
  }
  counts.insert(winner.plan.sequence_ranks() <= cluster.gpus_per_node ? winner.plan.sequence_ranks()
                                                                       : std::lcm(winner.plan.sequence_ranks(), cluster.gpus_per_node));
  counts.erase(cluster.gpus);
  struct Reach {
    int64_t gpus = 0, max_seqlen = 0;
    std::string plan;
  };
  std::optional<Reach> fewest_same, further_within, further_beyond;
  const double resolution = 1 + kSearchLengthResolution;
  for (const int64_t gpus : counts) {
    ClusterSpec other;
    try {
      other = cluster_make(cluster.hardware, gpus, 0, gpus <= cluster.gpus_per_node ? 0 : cluster.gpus_per_node, cluster.host_memory_gib);
    } catch (const ConfigError&) {
      continue;  // not whole nodes
    }
    const SearchResult result = plan_search(model, other, profile, options);
    const SearchCandidate* best = result.winner();
    if (!best) continue;
    const Reach reach{gpus, best->max_seqlen, plan_describe(best->plan)};
    const double length = static_cast<double>(best->max_seqlen), asked = static_cast<double>(winner.max_seqlen);
    if (gpus < cluster.gpus && length * resolution >= asked && length <= asked * resolution && (!fewest_same || gpus < fewest_same->gpus))
      fewest_same = reach;
    if (gpus < cluster.gpus && length > asked * resolution && (!further_within || length > static_cast<double>(further_within->max_seqlen)))
      further_within = reach;
    if (gpus > cluster.gpus && length > 1.5 * asked && (!further_beyond || gpus < further_beyond->gpus)) further_beyond = reach;
  }
  nlohmann::json advice = nlohmann::json::array();
  std::string out;
  auto line = [&](const Reach& reach, const std::string& what) {
    out += fmt::format("  {} GPUs: {} tokens ({}) — {}\n", reach.gpus, integer_with_commas(reach.max_seqlen), reach.plan, what);
    advice.push_back({{"gpus", reach.gpus}, {"max_seqlen", reach.max_seqlen}, {"plan", reach.plan}, {"why", what}});
  };
  if (further_within)
    line(*further_within, fmt::format("{} of your {} GPUs reach further than all of them (the heads allow a larger degree there)",
                                      further_within->gpus, cluster.gpus));
  if (fewest_same)
    line(*fewest_same, fmt::format("the same length on fewer GPUs: the other {} add data parallelism (throughput), not length",
                                   cluster.gpus - fewest_same->gpus));
  if (further_beyond) line(*further_beyond, "the fewest more GPUs that reach at least 1.5 times as far");
  report["gpu_count_advice"] = advice;
  return out.empty() ? out : "\nother GPU counts (PREDICTIONS, the same search):\n" + out;
}

// What a plan's report needs beside the plan: the lengths the target framework feeds
// (FrameworkFacts, the grid of the maximum), the step-time limit, the price of a GPU-hour.
struct ReportContext {
  int64_t length_multiple = 1;
  double max_step_s = 0;  // 0: no limit
  TimeContext time;
  bool tensors = false;  // --tensors: the tensor inventory beside the breakdown
};

// --tensors: what one decoder layer saves for backward (as the plan's runtime runs it, without
// checkpointing), tensor by tensor; the JSON's "tensors" object (README: "The tensor inventory").
std::string tensor_inventory_render(const ModelSpec& model, const ClusterSpec& cluster, const PlanOptions& plan,
                                    const RuntimeProfile& profile, int64_t seqlen, nlohmann::json& report) {
  const std::vector<MemoryItem> saved = layer_saved_tensors(model, cluster, plan, profile, seqlen);
  std::string out = fmt::format("\ntensors one decoder layer saves for backward (PREDICTED; runtime profile {}, {} tokens a rank, no "
                                "checkpointing; with it only layer.input is kept and the rest is recomputed)\n",
                                profile.name, integer_with_commas(plan.micro_batch * (seqlen / plan.sequence_ranks())));
  out += fmt::format("  {:<40} {:<20} {:>14} {:>10}\n", "tensor", "category", "bytes", "MiB");
  nlohmann::json rows = nlohmann::json::array();
  double total = 0;
  for (const MemoryItem& item : saved) {
    out += fmt::format("  {:<40} {:<20} {:>14} {:>10.2f}\n", item.name, item.category, integer_with_commas(static_cast<int64_t>(item.bytes)),
                       item.bytes / (1024.0 * 1024.0));
    rows.push_back({{"name", item.name}, {"category", item.category}, {"bytes", item.bytes}, {"count", item.count}});
    total += item.bytes;
  }
  out += fmt::format("  {:<40} {:<20} {:>14} {:>10.2f}\n", "total", "", integer_with_commas(static_cast<int64_t>(total)), total / (1024.0 * 1024.0));
  report["tensors"] = {{"schema", "longseq.tensors/1"},
                       {"tokens_per_rank", plan.micro_batch * (seqlen / plan.sequence_ranks())},
                       {"layer_saved", rows},
                       {"layer_saved_bytes", total}};
  return out;
}

// What an answer rests on where no published run supports it: said beside the answer, so that no
// unvalidated figure passes for a validated one (reports/validation.md holds the record).
std::vector<std::string> plan_caveats(const ModelSpec& model, const ClusterSpec& cluster, const PlanOptions& plan,
                                      const RuntimeProfile& profile, int64_t seqlen) {
  std::vector<std::string> caveats;
  if (profile.step_schedule == "executor") return caveats;  // longseq's own executor: measured by `longseq run`
  const std::string kernel = attention_kernel_for(profile, cluster.hardware, plan);
  if (kernel == "fa3")
    caveats.push_back("FlashAttention-3: no published long-sequence run in the record used it (all ran FlashAttention-2); its memory "
                      "and speed here come from its code and README figures, unvalidated (--attention fa2 for the validated kernel)");
  if (kernel == "sdpa-cudnn")
    caveats.push_back(fmt::format(
        "SDPA's cuDNN backend (PyTorch's default on Hopper, the hardware card's sdpa_default_backend): priced at FlashAttention-3's "
        "measured rate, with the flash backend's buffers (no cuDNN benchmark or workspace figure is in the sources); one published "
        "run (TRL's Qwen3-8B at 1M tokens) is in the record. --attention fa2 prices SDPA's flash backend (FlashAttention-2's code, "
        "{:.0f} against {:.0f} TFLOPS here)",
        attention_tflops(cluster.hardware, model.head_dim, "fa2"), attention_tflops(cluster.hardware, model.head_dim, "sdpa-cudnn")));
  if (plan.offload_optimizer && seqlen > 0 && seqlen <= 65536)
    caveats.push_back("step time at short lengths: validate finds the ALST paper's 32K steps 43-66% longer than predicted (the "
                      "offloaded optimizer step costs more than its modelled passes; reports/validation.md)");
  if (model.norms_per_layer > 2)
    caveats.push_back(fmt::format("{}'s {} norms a layer are in its parameters, but its layer's activations are priced as a Llama "
                                  "layer's two (the post-attention and post-feedforward norms' saved inputs are not counted)",
                                  model.name, model.norms_per_layer));
  if (model.final_logit_softcapping > 0)
    caveats.push_back(fmt::format("{} soft-caps its final logits at {:g}: the loss holds further logits-sized tensors the inventory "
                                  "does not price (tiled loss keeps them per tile)", model.name, model.final_logit_softcapping));
  if (model.sliding_window > 0 && seqlen > model.sliding_window)
    caveats.push_back(fmt::format("{} attends over a sliding window of {} tokens; planned as full causal attention (a kernel that "
                                  "honours the window does less work; the saved tensors are the same)",
                                  model.name, integer_with_commas(model.sliding_window)));
  if (profile.published_runs == 0)
    caveats.push_back(fmt::format("runtime profile '{}': no published run of this stack is in the record, so it carries no calibrated "
                                  "reserve (the DeepSpeed stack's published maxima leave 8-23 GiB its sourced terms do not explain, "
                                  "REFERENCE §7.4): this length may be optimistic by that much memory", profile.name));
  else if (profile.published_runs == 1 && profile.calibrated_reserve_gib == 0)
    caveats.push_back(fmt::format("runtime profile '{}': one published run of this stack is in the record (its peak predicted within "
                                  "10%, reports/validation.md); no reserve is calibrated on one run, so lengths far from it may be "
                                  "optimistic by memory the sourced terms do not explain", profile.name));
  // The PyTorch-native stacks attend through SDPA (Reference §11 F3.5, F4.5, F5.4, F5.7).
  const bool sdpa_stack = profile.parameter_sharding == ParameterSharding::sharding_fsdp2;
  if (sdpa_stack && plan.ring > 1 && profile.ring_implementation == RingImplementation::ring_torch_allgather)
    caveats.push_back(fmt::format("PyTorch context parallelism attends causally over the whole sequence with no mask (its SDPA ring "
                                  "takes none, Reference §11 F2.1; Accelerate's hook drops it): packed documents attend across each "
                                  "other (TRL >= 1.13 refuses packing under CP). Planned as one sample, padded to a multiple of 2 x "
                                  "cp = {} (the head-tail split)", 2 * plan.ring));
  else if (sdpa_stack && seqlen > 0)
    caveats.push_back(fmt::format("SDPA: padding or packed samples make transformers build a dense [B, 1, S, S] bool mask ({:.1f} GiB a "
                                  "sample at this length) and leave the flash backend; planned without either (one unpadded sample)",
                                  sdpa_dense_mask_bytes(seqlen) / kBytesPerGib));
  // SDPA's flash backend takes head_dim a multiple of 8 up to 256 (aten flash_api.cpp, Reference §11
  // F3.1); past that SDPA falls to another backend, whose speed and buffers no source sizes.
  if (attention_kernel_facts(kernel).sdpa_backend && (profile.attention_kernel == "sdpa" || sdpa_stack) &&
      (model.head_dim > 256 || model.head_dim % 8 != 0))
    caveats.push_back(fmt::format("head_dim {}: SDPA's flash backend takes a multiple of 8 up to 256 (Reference §11 F3.1), so SDPA runs "
                                  "another backend here (the memory-efficient one, or cuDNN's where it takes the size); priced as {}, "
                                  "whose speed and buffers may differ",
                                  model.head_dim, attention_kernel_facts(kernel).label));
  if (model.is_moe())
    caveats.push_back(fmt::format(
        "mixture of experts: no published long-sequence MoE run in the record; its block is priced from code reading ({}, Reference "
        "§12 4.9) with routing taken as balanced (a skewed router gives its busiest expert more tokens), {} and without expert "
        "parallelism (every rank holds every expert)",
        profile.moe_experts == MoeExperts::moe_grouped_gemm ? "one grouped GEMM over the experts: ArcticMoE"
                                                            : "transformers' loop over the experts",
        plan.moe_aux_loss || model.output_router_logits ? "with the auxiliary loss's kept, concatenated and one-hot router logits (--moe-aux-loss)"
                          : "without the auxiliary loss's router logits (output_router_logits must stay false; --moe-aux-loss prices them)"));
  return caveats;
}

// One plan's full report: headline, memory breakdown, time. Fills `report` for --json.
std::string plan_report(const ModelSpec& model, const ClusterSpec& cluster, const PlanOptions& plan,
                        const RuntimeProfile& profile, std::optional<int64_t> seqlen, const ReportContext& context, nlohmann::json& report) {
  MemoryPrediction prediction;
  std::string out;
  if (seqlen) {
    prediction = memory_predict(model, cluster, plan, profile, *seqlen);
    out += fmt::format("sequence length {} ({}): {}\n", integer_with_commas(*seqlen), seqlen_format(*seqlen),
                       prediction.fits() ? "FITS"
                       : !prediction.fits_gpu() && !prediction.fits_host() ? "does NOT fit (GPU and host memory)"
                       : !prediction.fits_gpu() ? "does NOT fit (GPU memory)" : "does NOT fit (host memory)");
    report["seqlen"] = *seqlen;
  } else {
    const int64_t grid = seqlen_grid(plan, context.length_multiple);
    MaxSeqlenResult result = max_seqlen_find(model, cluster, plan, profile, grid);
    const SeqlenBand band = max_seqlen_band(model, cluster, plan, profile, grid);
    // A step-time limit cuts the memory's maximum where the step grows past it.
    const int64_t memory_max = result.max_seqlen;
    if (context.max_step_s > 0 && memory_max > 0 && time_predict(model, cluster, plan, profile, memory_max).time.total_s() > context.max_step_s) {
      result.max_seqlen = max_seqlen_within_step_time(model, cluster, plan, profile, grid, memory_max, context.max_step_s);
      result.binding_constraint = fmt::format("{} of {} (memory allows {} tokens)", kStepTimeLimit, duration_text(context.max_step_s),
                                              integer_with_commas(memory_max));
      result.binding_host_term.clear();
      result.at_max = memory_predict(model, cluster, plan, profile, std::max(result.max_seqlen, grid));
    }
    prediction = result.at_max;
    if (result.max_seqlen == 0)
      out += fmt::format("maximum sequence length: none — even {} tokens exceed {}\n", grid, result.binding_constraint);
    else
      out += fmt::format("maximum sequence length: {} tokens ({}), limited by {}{}\n", integer_with_commas(result.max_seqlen),
                         seqlen_format(result.max_seqlen), result.binding_constraint,
                         result.binding_host_term.empty() ? "" : " (largest host term: " + result.binding_host_term + ")");
    if (band.longest > 0) {
      out += fmt::format("  band: {} to {} ({} with every estimate at its high end and the calibrated reserve; {} with the "
                         "sourced terms alone at their low ends)\n",
                         seqlen_format(band.shortest), seqlen_format(band.longest), seqlen_format(band.shortest),
                         seqlen_format(band.longest));
      // The point estimate sits at 100% of usable memory: what to rent and train for is the band's
      // low end, which is what --emit writes unless told otherwise.
      if (band.shortest > 0 && band.shortest < result.max_seqlen)
        out += fmt::format("  to act on: {} tokens ({}), the band's low end, {:.0f}% below the point estimate, which has no margin; "
                           "--emit writes this length (--emit-length point for the other)\n",
                           integer_with_commas(band.shortest), seqlen_format(band.shortest),
                           100.0 * (1.0 - static_cast<double>(band.shortest) / static_cast<double>(result.max_seqlen)));
    }
    report["max_seqlen"] = {{"tokens", result.max_seqlen}, {"granularity", result.granularity},
                            {"band", {{"shortest_tokens", band.shortest}, {"longest_tokens", band.longest}}},
                            {"to_act_on_tokens", band.shortest > 0 ? std::min(band.shortest, result.max_seqlen) : result.max_seqlen},
                            {"binding_constraint", result.binding_constraint}, {"binding_host_term", result.binding_host_term}};
  }
  report["prediction"] = memory_prediction_to_json(prediction);
  out += fmt::format("  at {} tokens: {} tokens per rank", integer_with_commas(prediction.seqlen),
                     integer_with_commas(prediction.local_tokens));
  if (prediction.mlp_tiles > 0) out += fmt::format("; MLP tiles {}", prediction.mlp_tiles);
  if (prediction.loss_tile_tokens > 0) out += fmt::format("; loss tiles of {} tokens", integer_with_commas(prediction.loss_tile_tokens));
  if (prediction.kv_replication > 1) out += fmt::format("; kv heads replicated x{}", prediction.kv_replication);
  out += "\n\n" + memory_table_render(prediction, cluster.ranks_per_node());
  if (context.tensors && prediction.seqlen > 0) out += tensor_inventory_render(model, cluster, plan, profile, prediction.seqlen, report);
  if (prediction.seqlen > 0 && prediction.fits()) {
    const TimePrediction timing = time_predict(model, cluster, plan, profile, prediction.seqlen);
    report["time"] = time_prediction_to_json(timing, context.time);
    out += "\n" + time_table_render(timing, context.time);
  }
  const std::vector<std::string> caveats = plan_caveats(model, cluster, plan, profile, prediction.seqlen);
  report["caveats"] = caveats;
  if (!caveats.empty()) {
    out += "\nwithout published evidence:\n";
    for (const auto& caveat : caveats) out += "  - " + caveat + "\n";
  }
  return out;
}

// --emit: the plan as the target framework's files, written whole (the DeepSpeed JSON beside the
// main file as STEM.deepspeed.json), or to stdout; what they cannot express goes to stderr.
// `seqlen_given`: the user's length (written as given); otherwise `seqlen` is the point maximum on
// `grid` and the band's low end is written unless --emit-length point.
int plan_emit(const PlanCommandArgs& args, const PlanOutputs& outputs, const ModelSpec& model, const PlanOptions& plan,
              const ClusterSpec& cluster, const RuntimeProfile& profile, int64_t seqlen, bool seqlen_given, int64_t grid) {
  if (seqlen <= 0) throw ConfigError("--emit", "", "no sequence length fits this plan, so there is nothing to emit");
  std::string seqlen_basis = seqlen_given ? "as given" : "the point estimate of the maximum, at 100% of usable memory (--emit-length point)";
  if (!seqlen_given && args.emit_length == "safe") {
    const int64_t shortest = max_seqlen_band(model, cluster, plan, profile, grid).shortest;
    if (shortest > 0 && shortest < seqlen) {
      seqlen_basis = fmt::format("the band's low end (every estimate at its high end and the calibrated reserve); the point estimate {} "
                                 "has no margin", integer_with_commas(seqlen));
      seqlen = shortest;
    }
  }
  ExportRequest request;
  request.model = model;
  request.model_source = args.model;
  request.plan = plan;
  request.cluster = cluster;
  request.profile = profile;
  request.seqlen = seqlen;
  request.seqlen_basis = seqlen_basis;
  request.predicted_peak_bytes = memory_predict(model, cluster, plan, profile, seqlen, /*with_breakdown=*/false).gpu_peak_bytes;
  // Files name each other by absolute path, so a launch from any folder finds them (a bare name
  // resolves against the launching folder, not the file's).
  if (outputs.emit_companion)
    request.deepspeed_json_name = std::filesystem::absolute(outputs.emit_companion->path).lexically_normal().string();
  if (outputs.emit_main && !outputs.emit_main->streams_to_terminal_or_pipe())
    request.main_file_name = std::filesystem::absolute(outputs.emit_main->path).lexically_normal().string();
  const ExportedConfig exported = config_emit(args.emit, request);
  for (const auto& note : exported.notes) std::cerr << "longseq: note: " << one_line_text(note) << "\n";
  if (!outputs.emit_main || outputs.emit_main->streams_to_terminal_or_pipe()) {
    // Standard output, a device or a FIFO: the files one after the other, the second headed by its name.
    std::string text;
    for (const auto& file : exported.files) {
      if (!file.suffix.empty()) text += "\n# ---- " + one_line_text(request.deepspeed_json_name) + " (named by the file above) ----\n";
      text += file.text;
    }
    if (outputs.emit_main) output_file_write(*outputs.emit_main, text);
    else standard_output_write(text);
    return 0;
  }
  // Every file was checked before the work; each is written whole.
  for (const auto& file : exported.files) {
    const OutputFileTarget& target = file.suffix.empty() ? *outputs.emit_main : *outputs.emit_companion;
    output_file_write(target, file.text);
    std::cerr << "longseq: wrote " << target.path << " (" << plan_describe(plan) << ")\n";
  }
  return 0;
}

// --emit-out (and the DeepSpeed JSON beside it) and --plan-out, checked before any work: an
// existing file is refused without --overwrite, the model file read is never written over.
PlanOutputs plan_outputs_check(const PlanCommandArgs& args) {
  PlanOutputs outputs;
  const std::vector<std::string> inputs = {args.model};
  if (args.emit_out) {
    if (args.emit.empty()) throw ConfigError("--emit-out", "", "goes with --emit TARGET (the file the export is written to)");
    // The files name each other (and the model's folder) inside YAML, JSON, Python and TOML
    // strings, which hold UTF-8 text only: a path of other bytes could not be named there.
    for (const auto& [path, flag] : {std::pair{*args.emit_out, "--emit-out"}, std::pair{args.model, "--model"}})
      if (!utf8_valid(path))
        throw ConfigError(flag, "", fmt::format("the path '{}' is not UTF-8 text, and the exported files name it in strings that hold UTF-8 "
                                                "only: rename it", one_line_text(path)));
    outputs.emit_main = output_file_check(*args.emit_out, "--emit-out", args.overwrite, inputs);
    if (export_writes_deepspeed_json(args.emit) && !outputs.emit_main->streams_to_terminal_or_pipe()) {
      const std::filesystem::path main_file(*args.emit_out);
      const std::filesystem::path companion = main_file.parent_path() / (main_file.stem().string() + ".deepspeed.json");
      outputs.emit_companion = output_file_check(companion.string(), "--emit-out (the DeepSpeed JSON beside it)", args.overwrite, inputs);
    }
  }
  if (args.plan_out) {
    // The plan file records the model's path for `run` to read back: in JSON, UTF-8 text only.
    if (!utf8_valid(args.model))
      throw ConfigError("--model", "", fmt::format("the path '{}' is not UTF-8 text, and the plan file (JSON) that records it holds UTF-8 "
                                                   "only: rename it", one_line_text(args.model)));
    outputs.plan_out = output_file_check(*args.plan_out, "--plan-out", args.overwrite, inputs);
  }
  return outputs;
}

// The sequence length a plan is for: the given one, or the longest that fits.
int64_t plan_seqlen(const ModelSpec& model, const ClusterSpec& cluster, const PlanOptions& plan, const RuntimeProfile& profile,
                    std::optional<int64_t> seqlen, const ReportContext& context) {
  if (seqlen) return *seqlen;
  const int64_t grid = seqlen_grid(plan, context.length_multiple);
  const int64_t longest = max_seqlen_find(model, cluster, plan, profile, grid, /*with_breakdown=*/false).max_seqlen;
  if (context.max_step_s > 0 && longest > 0 && time_predict(model, cluster, plan, profile, longest).time.total_s() > context.max_step_s)
    return max_seqlen_within_step_time(model, cluster, plan, profile, grid, longest, context.max_step_s);
  return longest;
}

// A duration as --max-step-time takes it: a number of seconds, or with a unit (s, min, h, d).
double duration_parse(const std::string& text, const std::string& flag) {
  static const std::vector<std::pair<std::string, double>> units = {{"min", 60}, {"s", 1}, {"h", 3600}, {"d", 86400}};
  for (const auto& [unit, seconds] : units)
    if (text.size() > unit.size() && text.ends_with(unit))
      if (const std::optional<double> value = decimal_parse(text.substr(0, text.size() - unit.size())); value && *value > 0)
        return *value * seconds;
  if (const std::optional<double> value = decimal_parse(text); value && *value > 0) return *value;
  throw ConfigError(flag, "", fmt::format("expected a positive duration such as 3600, 90min, 1h or 2d, got '{}'", text));
}

// --plan-out: the plan with what it was made for, written whole.
void plan_out_write(const PlanCommandArgs& args, const OutputFileTarget& target, const ModelSpec& model, const ClusterSpec& cluster,
                    const RuntimeProfile& profile, const PlanOptions& plan, int64_t seqlen, bool machine) {
  if (seqlen <= 0) throw ConfigError("--plan-out", "", "no sequence length fits this plan, so there is nothing to run");
  PlanFile file;
  file.model = args.model;
  file.model_name = model.name;
  file.layers = args.layers;
  file.parameters = parameter_count(model).total;
  file.seqlen = seqlen;
  file.ranks = cluster.gpus;
  file.device = machine ? args.device : "cuda";
  // The budget the executor's arena gets: the device's memory less what its runtime holds beside it.
  file.device_budget_bytes = machine && args.budget_mib ? *args.budget_mib * 1024 * 1024
                                                        : cluster.hardware.gpu_memory_gib * kBytesPerGib - runtime_overhead_bytes(profile, cluster.gpus, plan.sequence_ranks());
  file.hardware = cluster.hardware.name;
  file.profile = profile.name;
  file.plan = plan;
  const MemoryPrediction prediction = memory_predict(model, cluster, plan, profile, seqlen, /*with_breakdown=*/false);
  file.predicted_peak_bytes = prediction.gpu_peak_bytes;
  file.predicted_host_bytes = prediction.host_bytes_per_node;
  output_file_write(target, plan_file_to_json(file));
  std::cerr << fmt::format("longseq: wrote {} ({} at {} tokens on {} rank(s); run it with: {}longseq run --plan {})\n", target.path,
                           plan_describe(plan), integer_with_commas(seqlen), cluster.gpus,
                           cluster.gpus > 1 ? fmt::format("mpirun -np {} ", cluster.gpus) : "", shell_quote(target.path));
}

}  // namespace

int plan_command_run(const PlanCommandArgs& args) {
  const ModelSpec model = model_with_layers(model_load(args.model), args.layers);
  // This machine (--ranks, --budget-mib) or a GPU cluster (--gpu, --gpus, --nodes, ...).
  const bool machine = args.ranks || args.budget_mib;
  MachineTarget target;
  if (machine) {
    if (!args.ranks || !args.budget_mib) throw ConfigError(args.ranks ? "--ranks" : "--budget-mib", "", "--ranks and --budget-mib go together");
    if (*args.ranks < 1 || *args.ranks > 1024) throw ConfigError("--ranks", "", fmt::format("must be in [1, 1024], got {}", *args.ranks));
    if (!(*args.budget_mib > 0)) throw ConfigError("--budget-mib", "", fmt::format("must be positive, got {}", *args.budget_mib));
    if (*args.budget_mib > kMostBudgetMib)
      throw ConfigError("--budget-mib", "", fmt::format("{:g} MiB per rank is not a plausible device (at most {:.0f} MiB, 1 TiB)",
                                                        *args.budget_mib, kMostBudgetMib));
    if (args.gpus || args.nodes || args.gpus_per_node || args.host_memory_gib || !args.profile.empty() || args.gpu != "h100-sxm-80gb")
      throw ConfigError("--ranks", "", "plans for this machine's executor; drop --gpu, --gpus, --nodes, --gpus-per-node, --host-mem-gib and --profile");
    target = MachineTarget{args.device, *args.ranks, *args.budget_mib * 1024 * 1024};
    // On the CPU the arenas are this machine's memory: a budget it cannot hold plans a run that cannot start.
    if (args.device == "cpu" && static_cast<double>(*args.ranks) * target.budget_bytes > machine_memory_total_bytes())
      throw ConfigError("--budget-mib", "", fmt::format("{} rank(s) x {:g} MiB is more than this machine's {:.1f} GiB (--device cpu runs "
                                                        "here; --device cuda plans for a GPU machine)", *args.ranks, *args.budget_mib,
                                                        machine_memory_total_bytes() / kBytesPerGib));
  } else if (args.device != "cpu") {
    throw ConfigError("--device", "", "goes with --ranks and --budget-mib (planning for this machine)");
  }
  // The target framework: given, or the one whose files --emit writes (a file must hold a plan its
  // framework runs, at a length planned for it), or longseq's executor for this machine, or the default.
  const bool framework_given = args.framework.has_value(), emitting = !args.emit.empty();
  const Framework given_framework = framework_given ? framework_parse(*args.framework) : kDefaultFramework;
  const Framework emit_framework = emitting ? framework_of_export_target(args.emit) : kDefaultFramework;
  if (machine && framework_given && given_framework != Framework::framework_longseq)
    throw ConfigError("--framework", "", "planning for this machine (--ranks) plans for longseq's executor; drop --framework");
  if (machine && emitting) throw ConfigError("--emit", "", "writes a framework's files; planning for this machine (--ranks) plans "
                                                           "for longseq's executor (--plan-out writes its plan file)");
  if (framework_given && emitting && given_framework != emit_framework)
    throw ConfigError("--emit", "", fmt::format("{} writes a {} run, but the plan is made for --framework {} (what it runs, its memory, "
                                                "its lengths): drop --framework, or give --framework {}",
                                                args.emit, framework_name(emit_framework), framework_name(given_framework),
                                                framework_name(emit_framework)));
  // A held choice only one stack runs picks it when no framework is named: adapters and 8-bit Adam
  // the HF Trainer / TRL path (PEFT, bitsandbytes), CP's rotation and HSDP Accelerate's FSDP2.
  const bool trainer_choice = args.lora_rank.has_value() || args.adam_8bit || args.trl_activation_offload;
  const bool fsdp2_choice = args.cp_rotate != "allgather" || args.dp_replicate.value_or(1) > 1;
  const Framework default_framework = emitting        ? emit_framework
                                      : trainer_choice ? Framework::framework_hf_trainer
                                      : fsdp2_choice   ? Framework::framework_accelerate_fsdp2
                                                       : kDefaultFramework;
  const Framework framework = machine ? Framework::framework_longseq : framework_given ? given_framework : default_framework;
  if (args.lora_rank && emitting && !export_writes_adapters(args.emit))
    throw ConfigError("--lora", "", "adapters are planned for the HF Trainer / TRL and Unsloth: --emit hf-trainer or unsloth writes their script");
  if (args.lora_rank && args.plan_out && !machine)
    throw ConfigError("--lora", "", "a plan file with adapters is for longseq's executor: plan it for this machine (--ranks, --budget-mib)");
  // PyTorch CP's rotation exists only where PyTorch's context parallelism runs.
  if (args.cp_rotate == "alltoall" && !framework_description(framework).pytorch_context_parallelism)
    throw ConfigError("--cp-rotate", "", fmt::format("chooses PyTorch context parallelism's rotation, which {} does not run "
                                                     "(accelerate-fsdp2 and torchtitan do)", machine ? "longseq's executor" : framework_name(framework)));
  const bool framework_checked = framework_given || emitting || trainer_choice || fsdp2_choice;
  const FrameworkFacts& facts = framework_facts(framework);
  const std::string profile_name = !args.profile.empty() ? args.profile : facts.runtime_profile;
  if (machine) executor_model_check(model);  // what the executor cannot train has no plan for this machine
  RuntimeProfile profile = machine ? machine_profile(target) : framework_profile(framework, runtime_profile_load(profile_name));
  if (!args.attention.empty()) {
    if (machine) throw ConfigError("--attention", "", "planning for this machine (--ranks) plans for longseq's own attention kernel");
    profile.attention_kernel = args.attention;
  }
  if (args.host_memory_gib && !(*args.host_memory_gib > 0))
    throw ConfigError("--host-mem-gib", "", fmt::format("must be positive, got {}", *args.host_memory_gib));
  const ClusterSpec cluster =
      machine ? machine_cluster(target)
              : cluster_make(hardware_card_load(args.gpu), positive_or_default(args.gpus, "--gpus"), positive_or_default(args.nodes, "--nodes"),
                             positive_or_default(args.gpus_per_node, "--gpus-per-node"), args.host_memory_gib.value_or(0.0));
  const HardwareCard& hardware = cluster.hardware;
  if (const std::string problem = attention_kernel_problem(profile, hardware); !problem.empty()) throw ConfigError("--attention", "", problem);
  // HSDP's replicas split the world: a count that does not divide it is a typo, not a plan to search.
  if (args.dp_replicate && *args.dp_replicate < 1)  // before the division below (a 0 was SIGFPE)
    throw ConfigError("--dp-replicate", "", fmt::format("must be at least 1, got {}", *args.dp_replicate));
  if (args.dp_replicate && cluster.gpus % *args.dp_replicate != 0)
    throw ConfigError("--dp-replicate", "", fmt::format("{} replicas do not divide {} GPUs", *args.dp_replicate, cluster.gpus));
  if (args.plan_out && !args.emit.empty()) throw ConfigError("--plan-out", "", "given with --emit; write one at a time");
  if (args.json && !args.emit.empty())
    throw ConfigError("--json", "", "given with --emit: the framework's files are the output (each DeepSpeed JSON records the plan in "
                                    "its longseq_plan key); drop one of them");
  const PlanOutputs outputs = plan_outputs_check(args);  // before any work: a refusal costs nothing
  ReportContext context;
  // A search is always for a framework (the default one at least), a fixed plan only when one is named.
  context.length_multiple = framework_checked || !plan_flags_given(args) || args.search ? facts.length_multiple : 1;
  if (machine) context.length_multiple = 1;
  if (args.max_step_time) context.max_step_s = duration_parse(*args.max_step_time, "--max-step-time");
  if (args.gpu_hour_cost && !(*args.gpu_hour_cost > 0 && *args.gpu_hour_cost < 1e6))
    throw ConfigError("--gpu-hour-cost", "", fmt::format("must be a positive price below 1e6, got {}", *args.gpu_hour_cost));
  context.time = {cluster.gpus, args.gpu_hour_cost.value_or(0)};
  context.tensors = args.tensors;
  if (args.micro_batch < 1 || args.micro_batch > 1'000'000)
    throw ConfigError("--micro-batch", "", fmt::format("must be in [1, 1000000], got {}", args.micro_batch));
  std::optional<int64_t> seqlen;
  if (args.seqlen) seqlen = seqlen_parse(*args.seqlen, "--seqlen");

  const ParameterCount params = parameter_count(model);
  nlohmann::json report = {
      {"model", {{"name", model.name}, {"parameters", params.total}}},
      {"cluster",
       {{"gpu", hardware.name}, {"gpus", cluster.gpus}, {"nodes", cluster.nodes}, {"gpus_per_node", cluster.gpus_per_node},
        {"gpu_memory_gib", hardware.gpu_memory_gib}, {"host_memory_gib_per_node", cluster.host_memory_gib}}},
      {"runtime_profile", profile.name},
      // The stack's kernel on this card (an FPDT or ring plan runs FlashAttention-2's: time.attention_kernel).
      {"attention_kernel", stack_attention_kernel(profile, hardware)},
      {"framework", framework_name(framework)},
  };
  std::string header = fmt::format("longseq plan: PREDICTIONS of the cost model (runtime profile '{}'), not measurements\n", profile.name);
  header += fmt::format("  model    {}: {} parameters (L={} h={} heads q/kv={}/{} d={} f={} V={}{})\n", model.name,
                        integer_with_commas(params.total), model.num_layers, model.hidden_size, model.num_q_heads,
                        model.num_kv_heads, model.head_dim, model.intermediate_size, model.vocab_size,
                        model.tied_embeddings ? ", tied" : "");
  if (plan_flags_given(args) && !args.search && !framework_checked && !machine)
    header += "  framework not checked (a fixed plan; --framework NAME checks that it runs there)\n";
  else {
    std::string others;  // every other framework, from the one table that lists them
    for (Framework other : frameworks_all())
      if (other != kDefaultFramework) others += fmt::format("{}{}", others.empty() ? "" : ", ", framework_name(other));
    header += fmt::format("  framework {}{}\n", framework_name(framework),
                          framework_given || machine ? "" : emitting ? " (the --emit target's)"
                          : args.lora_rank ? " (where adapters are planned: PEFT through the HF Trainer / TRL)"
                          : args.adam_8bit ? " (where 8-bit AdamW is planned: the HF Trainer / TRL)"
                          : fsdp2_choice   ? " (PyTorch FSDP2's: --cp-rotate / --dp-replicate)"
                                           : fmt::format(" (the default; --framework {})", others));
  }
  header += fmt::format("  cluster  {} x {} ({:.2f} GiB each), {} node(s) of {} GPUs, {:.0f} GiB host memory per node\n",
                        cluster.gpus, hardware.name, hardware.gpu_memory_gib, cluster.nodes, cluster.gpus_per_node,
                        cluster.host_memory_gib);
  if (!machine) {
    const std::string kernel = stack_attention_kernel(profile, hardware);
    header += fmt::format("  attention {} ({}{}; FPDT and USP's ring run FlashAttention-2{})\n", attention_kernel_facts(kernel).label,
                          !args.attention.empty()          ? "--attention"
                          : profile.attention_kernel.empty() ? "the card's default"
                                                             : "the runtime profile's",
                          profile.attention_kernel == "sdpa" ? ", SDPA's default on this GPU" : "",
                          profile.ring_implementation == RingImplementation::ring_torch_allgather && !attention_kernel_facts(kernel).sdpa_backend
                              ? ", PyTorch's context parallelism SDPA's default"
                              : "");
  }

  const bool fixed_plan = plan_flags_given(args);
  // --search with plan flags: the flags constrain the search instead of fixing the plan.
  if (args.search && (args.alst || args.baseline))
    throw ConfigError(args.alst ? "--alst" : "--baseline", "", "is a whole plan; with --search give the options to hold (--zero 2, --no-offload-params, ...)");
  if (args.search && (args.mlp_tiles || args.loss_tiles))
    throw ConfigError(args.mlp_tiles ? "--mlp-tiles" : "--loss-tiles", "", "the search takes each framework's tile rule; drop it or fix the plan");
  if (!args.objective.empty() && fixed_plan) throw ConfigError("--objective", "", "applies to the search; drop the plan flags");

  if (fixed_plan && !args.search) {
    PlanOptions plan = plan_from_flags(args, model, cluster);
    // --alst (or --baseline) asks for its whole set: refused by name where the framework lacks a part.
    if (framework_checked && !machine && !args.alst && !args.baseline) plan_defaults_fit(args, plan, framework, model);
    std::vector<std::string> problems = plan_problems(model, cluster, plan);
    if (framework_checked) {  // a plan for a named framework (or its files) must be one it runs
      const std::string unsupported = framework_unsupported(framework, model, plan, cluster.gpus);
      if (!unsupported.empty()) problems.push_back(unsupported);
    }
    const int64_t length_multiple = context.length_multiple;
    if (seqlen) {
      for (auto& problem : seqlen_problems(plan, *seqlen)) problems.push_back(problem);
      if (*seqlen % length_multiple != 0)
        problems.push_back(fmt::format("sequence length {} is not a multiple of {}: {} pads every batch to one", *seqlen, length_multiple,
                                       framework_name(framework)));
    }
    if (!problems.empty()) throw ConfigError("plan", "", problems_join(problems));
    if (!args.emit.empty())
      return plan_emit(args, outputs, model, plan, cluster, profile, plan_seqlen(model, cluster, plan, profile, seqlen, context),
                       seqlen.has_value(), seqlen_grid(plan, length_multiple));
    report["plan"] = plan_to_json(plan, cluster);
    const std::string body = plan_report(model, cluster, plan, profile, seqlen, context, report);
    if (machine && !executor_plan_problems(plan, args.device).empty())
      throw ConfigError("plan", "", executor_plan_problems(plan, args.device).front());
    if (outputs.plan_out)
      plan_out_write(args, *outputs.plan_out, model, cluster, profile, plan,
                     seqlen ? *seqlen : report["max_seqlen"]["tokens"].get<int64_t>(), machine);
    if (args.json) {
      std::cout << json_text(report) << "\n";
      return 0;
    }
    std::cout << header << fmt::format("  plan     {} (dp={})\n\n", plan_describe(plan), cluster.gpus / plan.sequence_ranks()) << body;
    return 0;
  }

  SearchOptions options;
  if (args.objective.empty()) options.objective = seqlen ? SearchObjective::objective_throughput : SearchObjective::objective_max_seqlen;
  else if (args.objective == "max-seqlen") options.objective = SearchObjective::objective_max_seqlen;
  else if (args.objective == "throughput") options.objective = SearchObjective::objective_throughput;
  else throw ConfigError("--objective", "", fmt::format("expected max-seqlen or throughput, got '{}'", args.objective));
  if (options.objective == SearchObjective::objective_throughput && !seqlen)
    throw ConfigError("--objective", "", "throughput needs --seqlen (the length to maximize tokens/s at)");
  if (options.objective == SearchObjective::objective_max_seqlen && seqlen)
    throw ConfigError("--seqlen", "", "the max-seqlen objective finds the length itself; drop --seqlen or use --objective throughput");
  if (seqlen) options.seqlen = *seqlen;
  if (args.micro_batch != 1) throw ConfigError("--micro-batch", "", "the search plans for micro batch 1 (as the papers do)");
  // For this machine, the search `longseq run --auto` runs: what the executor runs, FPDT chunks
  // at its scale.
  if (machine && options.objective != SearchObjective::objective_max_seqlen)
    throw ConfigError("--objective", "", "for this machine (--ranks) the search finds the longest sequence, as run --auto does");
  if (!machine) {
    options.unsupported = [&](const PlanOptions& plan) { return framework_unsupported(framework, model, plan, cluster.gpus); };
    options.length_multiple = facts.length_multiple;
  }
  if (context.max_step_s > 0 && options.objective != SearchObjective::objective_max_seqlen)
    throw ConfigError("--max-step-time", "", "limits the longest-sequence search; with --seqlen the step time is an answer, not a limit");
  options.max_step_s = context.max_step_s;
  held_choices_apply(args, options.held);
  if (args.search && fixed_plan) options.admits = search_constraints(args);
  const SearchResult result = machine ? machine_plan_search(model, target, options.held) : plan_search(model, cluster, profile, options);
  const bool by_length = options.objective == SearchObjective::objective_max_seqlen;

  int64_t invalid = 0;
  std::vector<std::pair<std::string, int64_t>> reasons;
  for (const auto& candidate : result.candidates) {
    if (candidate.problems.empty()) continue;
    ++invalid;
    auto found = std::find_if(reasons.begin(), reasons.end(), [&](const auto& r) { return r.first == candidate.problems.front(); });
    if (found == reasons.end()) reasons.emplace_back(candidate.problems.front(), 1);
    else ++found->second;
  }
  std::string out = header + fmt::format("\nsearched {} plans ({} predicted, {}{} invalid) in {:.1f} ms; objective: {}\n\n",
                                         result.candidates.size(), result.evaluated,
                                         result.pruned > 0 ? fmt::format("{} shorter than the best six at one probe, ", result.pruned) : "",
                                         invalid, result.elapsed_ms,
                                         by_length ? "the longest sequence (lengths within 0.1% tie: the faster plan, then Ulysses inside a node)" : fmt::format("tokens/s at {} tokens", integer_with_commas(options.seqlen)));
  report["search"] = {{"objective", by_length ? "max-seqlen" : "throughput"}, {"plans", result.candidates.size()},
                      {"predicted", result.evaluated}, {"pruned", result.pruned}, {"invalid", invalid}, {"elapsed_ms", result.elapsed_ms}};
  const SearchCandidate* winner = result.winner();
  // Why nothing fits, for a refusal that says what to change: the closest valid plan's limit, or
  // (every plan invalid) the commonest reason, e.g. a length no chunk or degree divides.
  // With --max-step-time, a plan whose memory fits but whose step is over the limit at every
  // length: the fastest of them (at its shortest length) is the closest, and the limit the reason.
  const SearchCandidate* step_limited = nullptr;
  double step_limited_s = 0;
  for (const SearchCandidate& candidate : result.candidates)
    if (candidate.problems.empty() && candidate.binding_constraint == std::string(kStepTimeLimit)) {
      const int64_t shortest = seqlen_grid(candidate.plan, options.length_multiple);
      const double step_s = time_predict(model, cluster, candidate.plan, profile, shortest).time.total_s();
      if (!step_limited || step_s < step_limited_s) step_limited = &candidate, step_limited_s = step_s;
    }
  auto no_plan_reason = [&] {
    if (step_limited)
      return fmt::format("no plan fits: every plan whose memory fits takes longer than --max-step-time ({:.3g} s) a step at any length; "
                         "the fastest, {}, takes {} at its shortest length ({})", options.max_step_s,
                         plan_describe(step_limited->plan), duration_text(step_limited_s),
                         tokens_text(seqlen_grid(step_limited->plan, options.length_multiple)));
    const bool any_valid = !result.candidates.empty() && result.candidates.front().problems.empty();
    if (any_valid)
      return fmt::format("no plan fits{}: the closest, {}, runs out of {}", seqlen ? " at " + integer_with_commas(*seqlen) + " tokens" : "",
                         plan_describe(result.candidates.front().plan), result.candidates.front().binding_constraint);
    // Every plan invalid: a reason that only excludes a degree the framework lacks (its ring, its
    // Ulysses, FPDT) is not why nothing fits. The reasons that remain once a plan's sequence-parallel
    // degrees are off are the nearest plans' (a length off the framework's grid, a model it cannot
    // build); the commonest of those is named, else the commonest of all.
    std::vector<std::pair<std::string, int64_t>> remaining;
    if (!machine)
      for (const SearchCandidate& candidate : result.candidates) {
        PlanOptions nearest = candidate.plan;
        nearest.sp = nearest.ring = 1;
        nearest.fpdt = false;
        const std::vector<std::string> problems = plan_search_problems(model, cluster, nearest, options);
        if (problems.empty()) continue;
        auto found = std::find_if(remaining.begin(), remaining.end(), [&](const auto& r) { return r.first == problems.front(); });
        if (found == remaining.end()) remaining.emplace_back(problems.front(), 1);
        else ++found->second;
      }
    auto by_count = [](const auto& a, const auto& b) { return a.second < b.second; };
    if (const auto decisive = std::max_element(remaining.begin(), remaining.end(), by_count); decisive != remaining.end())
      return decisive->second == static_cast<int64_t>(result.candidates.size())
                 ? fmt::format("no plan fits: every plan is invalid because {}", decisive->first)
                 : fmt::format("no plan fits: every plan is invalid; {} of {} are still invalid without Ulysses, ring or FPDT, because {}",
                               decisive->second, result.candidates.size(), decisive->first);
    const auto commonest = std::max_element(reasons.begin(), reasons.end(), by_count);
    return commonest == reasons.end() ? std::string("no plan fits")
                                      : fmt::format("no plan fits: every plan is invalid, {} of {} because {}", commonest->second,
                                                    result.candidates.size(), commonest->first);
  };
  if (!winner && !args.emit.empty()) throw ConfigError("--emit", "", no_plan_reason() + "; there is nothing to emit");
  if (!winner && args.plan_out) throw ConfigError("--plan-out", "", no_plan_reason() + "; there is nothing to write");
  if (!winner) {
    const SearchCandidate* best = result.candidates.empty() || !result.candidates.front().problems.empty() ? nullptr : &result.candidates.front();
    if (step_limited) out += no_plan_reason();
    else out += "no plan fits";
    if (best && !step_limited) out += fmt::format(" (closest: {}, {})", plan_describe(best->plan), best->binding_constraint);
    out += "\n";
    report["winner"] = nullptr;
  } else {
    if (!args.emit.empty())
      return plan_emit(args, outputs, model, winner->plan, cluster, profile, by_length ? winner->max_seqlen : options.seqlen, !by_length,
                       seqlen_grid(winner->plan, options.length_multiple));
    if (outputs.plan_out)
      plan_out_write(args, *outputs.plan_out, model, cluster, profile, winner->plan, by_length ? winner->max_seqlen : options.seqlen,
                     machine);
    report["plan"] = plan_to_json(winner->plan, cluster);
    out += fmt::format("best plan: {} (dp={})\n", plan_describe(winner->plan), cluster.gpus / winner->plan.sequence_ranks());
    out += plan_report(model, cluster, winner->plan, profile, by_length ? std::nullopt : seqlen, context, report);

    auto candidate_line = [&](const SearchCandidate& c) {
      if (!c.fits)
        return fmt::format("{} ({})", by_length ? "fits no length" : "does not fit", c.binding_constraint);
      if (by_length)
        return fmt::format("max {:>11} tokens, {:.1f} s/step there", integer_with_commas(c.max_seqlen), c.time.time.total_s());
      return fmt::format("{:>9.0f} tokens/s, peak {:.1f} GiB", c.time.tokens_per_s, bytes_to_gib(c.memory.gpu_peak_bytes));
    };
    out += "\nrunner-ups:\n";
    nlohmann::json runner_ups = nlohmann::json::array();
    for (size_t i = 1; i < result.candidates.size() && i <= 5; ++i) {
      const SearchCandidate& c = result.candidates[i];
      if (!c.problems.empty() || !c.fits) break;
      out += fmt::format("  {}. {:<78} {}\n", i + 1, plan_describe(c.plan), candidate_line(c));
      runner_ups.push_back({{"plan", plan_to_json(c.plan, cluster)}, {"max_seqlen", c.max_seqlen},
                            {"step_s", c.time.time.total_s()}, {"tokens_per_s", c.time.tokens_per_s}});
    }
    report["runner_ups"] = runner_ups;

    out += "\nwhy not (the best plan with one thing changed):\n";
    nlohmann::json alternatives = nlohmann::json::array();
    // Invalid (u, r) pairs refused for one reason (a framework without ring attention) are one
    // line in the text, with how many there are; the JSON keeps every one.
    std::map<std::string, int64_t> degree_pairs_refused;
    for (const auto& alternative : search_notable_alternatives(result)) {
      const SearchCandidate& c = *alternative.candidate;
      std::string why;
      if (!c.problems.empty()) {
        why = "invalid: " + c.problems.front();
        if (c.plan.ring > 1 && degree_pairs_refused[why]++ > 0) {
          alternatives.push_back({{"change", alternative.change}, {"plan", plan_to_json(c.plan, cluster)}, {"outcome", why}});
          continue;
        }
      } else {
        const int64_t failing = by_length ? c.max_seqlen + seqlen_grid(c.plan, options.length_multiple) : options.seqlen;
        why = candidate_line(c);
        if (c.binding_constraint == kStepTimeLimit)
          why += fmt::format("; at {} the step takes longer than {}", tokens_text(failing), duration_text(options.max_step_s));
        else if (!c.fits || by_length)
          why += fmt::format("; at {} {} runs out ({})", tokens_text(failing), c.binding_constraint,
                             largest_component_describe(model, cluster, c.plan, profile, failing));
      }
      out += fmt::format("  {:<44} {}\n", alternative.change, why);
      alternatives.push_back({{"change", alternative.change}, {"plan", plan_to_json(c.plan, cluster)}, {"outcome", why}});
    }
    for (const auto& [why, count] : degree_pairs_refused)
      if (count > 1) out += fmt::format("  {:<44} {}\n", fmt::format("(and {} more sp x ring pairs)", count - 1), why);
    report["alternatives"] = alternatives;
    // A better plan another framework runs: each framework's own search, priced with its own
    // runtime profile (its precision, its MoE block, its buffers) at the lengths it feeds. longseq's
    // executor is left out: a research executor, not a framework to rent a cluster for.
    if (!machine) {
      const SearchCandidate* best = nullptr;
      Framework best_framework = framework;
      std::vector<SearchResult> others;
      // Each framework's winner beside this one's: "Ulysses or ring?" answered per stack.
      std::vector<FrameworkWinner> winners = {{framework, profile, winner, ""}};
      others.reserve(frameworks_all().size());
      for (Framework other : frameworks_all()) {
        if (other == framework || other == Framework::framework_longseq) continue;
        const FrameworkFacts& other_facts = framework_facts(other);
        const RuntimeProfile other_profile =
            framework_profile(other, runtime_profile_load(!args.profile.empty() ? args.profile : other_facts.runtime_profile));
        if (!args.attention.empty() && !attention_kernel_problem(other_profile, hardware).empty()) continue;
        SearchOptions other_options = options;
        other_options.unsupported = [&model, &cluster, other](const PlanOptions& plan) { return framework_unsupported(other, model, plan, cluster.gpus); };
        other_options.length_multiple = other_facts.length_multiple;
        others.push_back(plan_search(model, cluster, other_profile, other_options));
        const SearchCandidate* candidate = others.back().winner();
        const std::vector<SearchCandidate>& tried = others.back().candidates;
        const bool all_refused = std::all_of(tried.begin(), tried.end(), [](const SearchCandidate& c) { return !c.problems.empty(); });
        winners.push_back({other, other_profile, candidate,
                           all_refused ? fmt::format("it refuses every plan: --framework {} lists why", framework_name(other)) : ""});
        if (!candidate) continue;
        const bool longer = !best || (by_length ? candidate->max_seqlen > best->max_seqlen : candidate->score > best->score);
        if (longer) {
          best = candidate;
          best_framework = other;
        }
      }
      // Only longer (or faster) beyond what the memory model resolves.
      const bool better = best && (by_length ? static_cast<double>(best->max_seqlen) > static_cast<double>(winner->max_seqlen) * (1 + kSearchLengthResolution)
                                             : best->score > winner->score);
      if (better) {
        const std::string reach = by_length ? fmt::format("would reach {} tokens", seqlen_format(best->max_seqlen))
                                            : fmt::format("would run {:.0f} tokens/s", best->time.tokens_per_s);
        const std::string why_not_here = framework_unsupported(framework, model, best->plan);
        out += fmt::format("\nin another framework: --framework {}: {} {}{}\n", framework_name(best_framework), plan_describe(best->plan), reach,
                           why_not_here.empty() ? " (priced with its own runtime profile)" : fmt::format(" ({})", why_not_here));
        report["other_framework"] = {{"framework", framework_name(best_framework)}, {"plan", plan_to_json(best->plan, cluster)},
                                     {"max_seqlen", best->max_seqlen}, {"tokens_per_s", best->time.tokens_per_s},
                                     {"why_not_here", why_not_here}};
      }
      out += frameworks_compared_render(winners, framework, by_length, report);
      if (by_length) out += gpu_count_advice(model, cluster, profile, options, *winner, report);
    }
  }
  if (!reasons.empty()) {
    out += "\ninvalid plans (not predicted):\n";
    nlohmann::json invalid_json = nlohmann::json::array();
    for (const auto& [reason, count] : reasons) {
      out += fmt::format("  {:>4} x {}\n", count, reason);
      invalid_json.push_back({{"reason", reason}, {"plans", count}});
    }
    report["invalid"] = invalid_json;
  }
  if (args.json) std::cout << json_text(report) << "\n";
  else std::cout << out;
  return 0;
}

}  // namespace longseq
