// options.cpp: `longseq plan`'s flags: their registration, the choices every plan holds, a plan
// fixed by flags and fitted to a framework, the search's constraints.
#include "cli/plan/internal.hpp"

namespace longseq {

namespace {

void switch_register(CLI::App& command, const std::string& name, int64_t& on, int64_t& off, const std::string& help) {
  command.add_flag("--" + name, on, help);
  command.add_flag("--no-" + name, off, "turn off --" + name);
}

void switch_apply(bool& value, int64_t on, int64_t off, const std::string& name) {
  if (on > 0 && off > 0) throw ConfigError("--" + name, "", "given together with --no-" + name);
  if (on > 0) value = true;
  if (off > 0) value = false;
}

}  // namespace

// A count the user gave must be positive; one not given becomes 0, the library's "default".
int64_t positive_or_default(const std::optional<int64_t>& value, const char* flag) {
  if (!value) return 0;
  if (*value < 1) throw ConfigError(flag, "", fmt::format("must be positive, got {}", *value));
  return *value;
}

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
  command->add_option("--gpu-mem-gib", args->gpu_memory_gib,
                      "GPU memory per GPU in GiB (nvidia-smi's total in MiB / 1024), for a card of another size than --gpu's "
                      "(default: the hardware card's); its rates stay the card's");
  command->add_option("--seqlen,-s", args->seqlen, "sequence length to check, e.g. 32768, 32K, 1.5M (K/M = 10^3/10^6), 128Ki (2^10)");
  command->add_option("--sp", args->sp, "Ulysses sequence-parallel degree (default: largest valid; 1 with --baseline)");
  command->add_option("--ring", args->ring,
                      "ring attention degree r beside Ulysses' sp (u x r ranks on one sequence, key/value blocks passed around "
                      "the ring; default 1: none). Runs in USP's LongContextAttention (--framework usp)");
  command->add_option("--tp", args->tp,
                      "Megatron tensor-parallel degree t with its sequence parallelism (world = dp x t x sp x ring; default 1). "
                      "Runs in Megatron-Core (--framework megatron-core), with its distributed optimizer (--zero 1) or none (--zero 0)")
      ->check(CLI::Range(1, 1 << 20));
  command->add_option("--pp", args->pp,
                      "Megatron pipeline stages p (the layers split evenly, 1F1B over the --global-batch's micro-batches; world = dp x t x "
                      "sp x ring x p; default 1). Runs in Megatron-Core (--framework megatron-core)")
      ->check(CLI::Range(1, 1 << 20));
  command->add_option("--vpp", args->vpp,
                      "virtual pipeline stages a rank holds with --pp (Megatron's interleaved 1F1B: a smaller bubble, more activations "
                      "in flight; needs micro-batches in groups of pp; default 1)")
      ->check(CLI::Range(1, 1 << 20));
  command->add_option("--ep", args->ep,
                      "Megatron expert-parallel degree of a mixture-of-experts model: its experts split over ep ranks, the routed tokens "
                      "exchanged by all-to-all (ep divides the experts and a stage's ranks; default 1). Runs in Megatron-Core "
                      "(--framework megatron-core)")
      ->check(CLI::Range(1, 1 << 20));
  command->add_option("--offload-activations", args->offload_activations,
                      "Megatron-Core without recompute: Transformer Engine offloads the saved activations of the first N layers to "
                      "pinned host memory and reloads them in backward (--cpu-offloading-num-layers), so the GPU holds the other "
                      "layers' (with --no-checkpointing; no --pp)")
      ->check(CLI::Range(1, 1 << 20));
  command->add_option("--recompute-block-layers", args->recompute_block_layers,
                      "Megatron-Core's block recompute: only the first N layers of each pipeline stage (each model chunk under --vpp) "
                      "are recomputed in backward, the others keep their activations (--recompute-method block "
                      "--recompute-num-layers N; fewer than a stage's layers). The Megatron-Core search tries half and three quarters")
      ->check(CLI::Range(1, 1 << 20));
  command->add_option("--recompute-modules", args->recompute_modules,
                      "Megatron-Core's selective recompute, with --no-checkpointing: these modules' outputs are dropped after forward "
                      "and recomputed in backward, the layers keeping the rest (comma-separated: layernorm = MLA's input norm and the MoE "
                      "layer's pre-MLP norm, moe_act = the experts' activation, mla_up_proj = MLA's q, k and v, mlp = a dense layer's "
                      "MLP, checkpointed whole; "
                      "--recompute-granularity selective --recompute-modules). The Megatron-Core search tries every one the model has");
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
  command->add_option("--checkpoint-every", args->checkpoint_every,
                      "checkpoint one decoder layer in every N, the others keeping what they save (torchtitan's layer-selective "
                      "AC, activation_checkpoint.selective_ac_option; default 1: every layer; the torchtitan search tries 1-4)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  command->add_flag("--checkpoint-ops", args->checkpoint_ops,
                    "checkpoint every decoder layer under torchtitan's op-level selective AC (selective_ac_option = \"op\": "
                    "attention's outputs and every other matmul's kept, the rest recomputed; the torchtitan search tries it)");
  command->add_option("--mlp-tiles", args->mlp_tiles, "MLP tile count (default: DeepSpeed's ceil(S/sp / hidden))");
  command->add_option("--loss-tiles", args->loss_tiles, "loss tile count (default: the runtime profile's rule)");
  command->add_option("--micro-batch", args->micro_batch,
                      "samples per rank per micro-step (default 1), or searched at --seqlen: max (the largest micro batch whose "
                      "best plan fits) or fastest (the one whose best plan runs the most tokens/s)");
  command->add_option("--global-batch", args->global_batch,
                      "samples per optimizer step over the cluster: each data-parallel rank accumulates gradients over "
                      "global / (micro batch x dp) micro-steps (the exports' gradient_accumulation_steps); the step time, "
                      "tokens/s and cost are per optimizer step (default: one micro batch per rank, no accumulation)");
  command->add_option("--global-batch-tokens", args->global_batch_tokens,
                      "the global batch in tokens per optimizer step (4M, 2Mi): a whole number of --seqlen samples");
  command->add_option("--lora", args->lora_rank,
                      "train LoRA adapters of this rank on a frozen base (PEFT: fp32 adapters, no base gradients or optimizer "
                      "states); plans for the HF Trainer / TRL (--framework hf-trainer) on one GPU a replica");
  command->add_option("--lora-targets", args->lora_targets,
                      "the linears that get adapters: all-linear (q, k, v, o, gate, up, down; the default, Unsloth's) or q,v "
                      "(PEFT's default for Llama, Qwen, Mistral, Gemma)");
  command->add_flag("--qlora", args->qlora, "the base's linears in 4-bit NF4 with double quantization and bf16 compute (QLoRA); needs --lora");
  command->add_flag("--adam-8bit", args->adam_8bit,
                    "bitsandbytes' 8-bit AdamW (optim=\"adamw_8bit\": uint8 moments, ~2.03 bytes a parameter); the HF Trainer / TRL");
  command->add_flag("--cp-all-gather", args->cp_all_gather,
                    "Megatron-Core's cp_comm_type all_gather for --ring R: each attention gathers the whole sequence's K and V "
                    "before it runs (not overlapped), in place of p2p's ring; --framework megatron-core");
  command->add_flag("--fp8", args->fp8,
                    "Transformer Engine's FP8 under Megatron-Core (--fp8-format hybrid, the delayed recipe): the decoder layers' "
                    "linears in FP8 (their GEMMs, saved inputs and weight copies), attention and the output layer in bf16; "
                    "a card with FP8 tensor cores (Ada, Hopper, Blackwell); --framework megatron-core");
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
                      "the framework the plan is for (not given: the one that serves the model best here, arctic-training unless "
                      "another reaches further or runs faster, and the header says why): arctic-training (ALST's trainer, a switch "
                      "for each of its techniques), hf-accelerate (Accelerate / HF Trainer / TRL), megatron-deepspeed (where FPDT lives), "
                      "deepspeed (a plain deepspeed.initialize loop), usp (a DeepSpeed loop with USP's Ulysses x ring attention), "
                      "accelerate-fsdp2 (Accelerate / Trainer / TRL on FSDP2 with PyTorch context parallelism), hf-trainer (the plain "
                      "HF Trainer / TRL in bf16; where LoRA adapters are planned), unsloth (one GPU: its offloaded checkpointing "
                      "and fused loss, LoRA/QLoRA), torchtitan (PyTorch's trainer: FSDP2 with "
                      "context parallelism, its Llama 3 flavors), longseq (its own executor). The search explores "
                      "only what it runs and says what another framework would reach");
  command->add_flag("--json", args->json, "print JSON instead of tables");
  command->add_flag("--tensors", args->tensors,
                    "also list the tensors one decoder layer saves for backward, as the plan's runtime runs it (name, category, "
                    "bytes; JSON: the \"tensors\" object, docs/memory-model.md)");
  command->add_option("--emit", args->emit,
                      "write the (chosen) plan as a framework's files instead of the report: arctic-training (recipe YAML), "
                      "accelerate (Accelerate YAML + the DeepSpeed JSON it names), megatron-deepspeed (launch arguments + "
                      "DeepSpeed JSON), deepspeed or usp (DeepSpeed JSON for a plain loop), accelerate-fsdp2 (Accelerate's FSDP2 + "
                      "context-parallelism YAML + the TRL SFTTrainer script it launches, STEM.train.py), torchtitan (its TOML job), unsloth (a FastLanguageModel script), hf-trainer (a TRL "
                      "SFTTrainer script, with PEFT's LoraConfig for adapters) or megatron-core (Megatron-LM's pretrain_gpt.py torchrun "
                      "script)");
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
  held.fp8 = args.fp8;
  held.cp_all_gather = args.cp_all_gather;
  held.micro_batch = std::max<int64_t>(1, micro_batch_fixed(args));
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

int64_t micro_batch_fixed(const PlanCommandArgs& args) {
  if (micro_batch_objective(args)) return 0;
  int64_t value = 0;
  size_t used = 0;
  try {
    value = std::stoll(args.micro_batch, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != args.micro_batch.size())
    throw ConfigError("--micro-batch", "", fmt::format("expected a count, max or fastest, got '{}'", args.micro_batch));
  if (value < 1 || value > 1'000'000) throw ConfigError("--micro-batch", "", fmt::format("must be in [1, 1000000], got {}", value));
  return value;
}

std::optional<MicroBatchObjective> micro_batch_objective(const PlanCommandArgs& args) {
  if (args.micro_batch == "max") return MicroBatchObjective::micro_batch_largest;
  if (args.micro_batch == "fastest") return MicroBatchObjective::micro_batch_fastest;
  return std::nullopt;
}

int64_t global_batch_samples(const PlanCommandArgs& args, std::optional<int64_t> seqlen) {
  if (args.global_batch && args.global_batch_tokens)
    throw ConfigError("--global-batch", "", "given with --global-batch-tokens; give the global batch one way");
  if (args.global_batch) {
    if (*args.global_batch < 1 || *args.global_batch > 1'000'000'000)
      throw ConfigError("--global-batch", "", fmt::format("must be in [1, 1e9] samples, got {}", *args.global_batch));
    return *args.global_batch;
  }
  if (!args.global_batch_tokens) return 0;
  const int64_t tokens = seqlen_parse(*args.global_batch_tokens, "--global-batch-tokens");
  if (!seqlen)
    throw ConfigError("--global-batch-tokens", "", "counts samples of --seqlen tokens: give --seqlen (or --global-batch in samples)");
  if (tokens % *seqlen != 0)
    throw ConfigError("--global-batch-tokens", "", fmt::format("{} tokens are not a whole number of {}-token samples (nearest: {} or {})",
                                                               integer_with_commas(tokens), integer_with_commas(*seqlen),
                                                               integer_with_commas(tokens / *seqlen * *seqlen),
                                                               integer_with_commas((tokens / *seqlen + 1) * *seqlen)));
  return tokens / *seqlen;
}

bool plan_flags_given(const PlanCommandArgs& args) {
  return args.alst || args.baseline || args.sp || args.ring || args.tp || args.pp || args.vpp || args.ep || args.offload_activations || args.recompute_block_layers || args.recompute_modules || args.zero_stage || args.mlp_tiles || args.loss_tiles || args.fpdt ||
         args.checkpoint_every || args.checkpoint_ops ||
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
  if (args.tp || args.pp || args.vpp || args.ep || args.offload_activations || args.recompute_block_layers || args.recompute_modules) {
    // Megatron's plan, not ALST's set: its distributed optimizer, no offload, no ALST tiling (each
    // flag below may still ask for one, and plan_problems says why not).
    plan.tp = args.tp.value_or(1);
    plan.pp = args.pp.value_or(1);
    plan.vpp = args.vpp.value_or(1);
    plan.ep = args.ep.value_or(1);
    plan.offload_activation_layers = args.offload_activations.value_or(0);
    plan.recompute_block_layers = args.recompute_block_layers.value_or(0);
    if (args.recompute_modules) plan.recompute_modules = megatron_recompute_modules_parse(*args.recompute_modules, "--recompute-modules", "");
    plan.zero_stage = 1;
    plan.offload_optimizer = plan.offload_params = plan.checkpoint_offload = plan.tiled_mlp = plan.tiled_loss = false;
    if (args.sp == std::nullopt) plan.sp = 1;  // Megatron's a2a (Ulysses) only where asked
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
  if (args.checkpoint_every) {
    plan.checkpoint_every = *args.checkpoint_every;
    // One layer in N keeps its checkpoints on the GPU (torchtitan offloads none): the ALST set's
    // offload leaves unless asked for.
    if (plan.checkpoint_every > 1 && args.checkpoint_offload_on == 0) plan.checkpoint_offload = false;
  }
  if (args.checkpoint_ops) {
    plan.checkpoint_ops = true;
    if (args.checkpoint_offload_on == 0) plan.checkpoint_offload = false;  // likewise: torchtitan offloads none
  }
  // Likewise parameter offload (ALST's on one GPU) leaves with ZeRO-3 unless asked for.
  if (plan.zero_stage != 3 && args.offload_params_on == 0) plan.offload_params = false;
  plan.mlp_tiles = positive_or_default(args.mlp_tiles, "--mlp-tiles");
  plan.loss_tiles = positive_or_default(args.loss_tiles, "--loss-tiles");
  for (const auto& [tiles, flag] : {std::pair{plan.mlp_tiles, "--mlp-tiles"}, std::pair{plan.loss_tiles, "--loss-tiles"}})
    if (tiles > kTileCountLimit) throw ConfigError(flag, "", fmt::format("{} tiles is not a plausible count (at most {})", tiles, kTileCountLimit));
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
  const std::optional<int64_t> sp = args.sp, ring = args.ring, tp = args.tp, pp = args.pp, vpp = args.vpp, ep = args.ep,
                               offload_activations = args.offload_activations, recompute_block_layers = args.recompute_block_layers;
  const std::optional<MegatronRecomputeModules> recompute_modules =
      args.recompute_modules ? std::optional(megatron_recompute_modules_parse(*args.recompute_modules, "--recompute-modules", "")) : std::nullopt;
  const std::optional<int> zero = args.zero_stage;
  const bool fpdt = args.fpdt;
  const std::optional<int64_t> checkpoint_every = args.checkpoint_every;
  const bool checkpoint_ops = args.checkpoint_ops;
  const std::optional<int64_t> chunk = args.fpdt_chunk ? std::optional<int64_t>(seqlen_parse(*args.fpdt_chunk, "--fpdt-chunk")) : std::nullopt;
  return [=](const PlanOptions& plan) {
    auto holds = [](const std::optional<bool>& wanted, bool value) { return !wanted || *wanted == value; };
    return (!sp || plan.sp == *sp) && (!ring || plan.ring == *ring) && (!tp || plan.tp == *tp) && (!pp || plan.pp == *pp) && (!vpp || plan.vpp == *vpp) && (!ep || plan.ep == *ep) &&
           (!offload_activations || plan.offload_activation_layers == *offload_activations) &&
           (!recompute_block_layers || plan.recompute_block_layers == *recompute_block_layers) &&
           (!recompute_modules || plan.recompute_modules == *recompute_modules) && (!zero || plan.zero_stage == *zero) &&
           holds(offload_optimizer, plan.offload_optimizer) && holds(offload_params, plan.offload_params) &&
           holds(checkpointing, plan.activation_checkpointing) && holds(checkpoint_offload, plan.checkpoint_offload) &&
           holds(tiled_mlp, plan.tiled_mlp) && holds(tiled_loss, plan.tiled_loss) && (!fpdt || plan.fpdt) &&
           (!chunk || (plan.fpdt && plan.fpdt_chunk_tokens == *chunk)) &&
           (!checkpoint_every || plan.checkpoint_every == *checkpoint_every) && (!checkpoint_ops || plan.checkpoint_ops);
  };
}

std::string problems_join(const std::vector<std::string>& problems) {
  std::string joined;
  for (const auto& problem : problems) joined += (joined.empty() ? "" : "; ") + problem;
  return joined;
}

}  // namespace longseq
