// options.cpp: `longseq run`'s flags, registered with their help.
#include "cli/commands.hpp"
#include "cli/run/internal.hpp"

#include "planner/cards.hpp"

namespace longseq {

// --precision's spellings.
PrecisionRegime precision_regime(const std::string& text) {
  return text == "fsdp2" ? PrecisionRegime::fsdp2 : text == "pure-bf16" ? PrecisionRegime::pure_bf16 : PrecisionRegime::mixed_master;
}

std::shared_ptr<RunCommandArgs> run_command_register(CLI::App& app) {
  auto args = std::make_shared<RunCommandArgs>();
  CLI::App* command = app.add_subcommand(
      "run", "Train a few steps with real kernels (this machine's CPU, or --device cuda); print loss, step time, tokens/s and "
             "MEASURED peak memory, then the planner's PREDICTION for the same plan beside it (runtime profile native, or "
             "native-cuda on a GPU)");
  args->command = command;
  command->add_option("scenario", args->scenario,
                      "a scenario with a run: section (scenarios/README.md); flags given as well override it");
  command->add_option("--model,-m", args->model, "model card or config.json (default tiny-llama)");
  command->add_option("--layers", args->layers, "keep only the first N decoder layers of the model (a layer stack of its shape)")
      ->check(CLI::Range(1, 1 << 20));
  command->add_option("--device", args->device,
                      "cpu: kernels/cpu in fp32 (default); cuda: kernels/cuda in bf16 with cuBLAS, NCCL between ranks, one GPU per "
                      "rank")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  command->add_option("--seqlen,-s", args->seqlen, "tokens per step (default 1Ki)");
  command->add_option("--steps", args->steps, "training steps (default 5)")->check(CLI::Range(1, 100000));
  command->add_flag("--checkpointing", args->checkpointing, "activation checkpointing per layer (recompute in backward)");
  command->add_flag("--checkpoint-offload", args->checkpoint_offload, "checkpoints to the host pool (needs --checkpointing)");
  command->add_option("--mlp-tiles", args->mlp_tiles, "tiled MLP with this many tiles (default: untiled)")->check(CLI::Range(0, 1 << 30));
  command->add_option("--loss-tiles", args->loss_tiles, "tiled logits+loss with this many tiles (default: untiled)")->check(CLI::Range(0, 1 << 30));
  command->add_option("--attention-block", args->attention_block, "attention block size in tokens (default 64)")->check(CLI::Range(1, 1 << 20));
  command->add_option("--data", args->data, "a text file, read as bytes (default: a synthetic long-range copy task)");
  command->add_option("--budget-mib", args->budget_mib, "device memory budget in MiB; exceeding it fails cleanly (default: none)");
  command->add_option("--lr", args->lr, "AdamW learning rate (default 3e-3)");
  command->add_option("--seed", args->seed, "data seed (default 1)");
  command->add_flag("--auto", args->auto_plan,
                    "let the planner choose checkpointing, offload and tile counts for the longest sequence that fits "
                    "--budget-mib, then run that plan at that length (the loop: plan, run, measure)");
  command->add_option("--sp", args->sp,
                      "Ulysses degree under mpirun (default: every rank, divided by --ring); the rest are data parallel")
      ->check(CLI::Range(1, 1 << 20));
  command->add_option("--ring", args->ring,
                      "ring attention degree (default 1: none): the sequence over ring x sp ranks, --sp of them exchanging heads "
                      "(Ulysses) in each of --ring groups that pass key/value blocks around a ring (USP's 2D sequence parallelism; "
                      "zigzag split, so the length must be a multiple of 2 x sp x ring)")
      ->check(CLI::Range(1, 1 << 20));
  command->add_option("--zero", args->zero_stage,
                      "ZeRO stage over all ranks: 0 every rank holds the whole model (default); 1 shards the optimizer states; "
                      "2 also the gradients; 3 also the weights")
      ->check(CLI::IsMember({0, 1, 2, 3}));
  command->add_flag("--offload-optimizer", args->offload_optimizer,
                    "with --zero 1-3: fp32 master weights, gradients and Adam moments in host memory, AdamW on the host "
                    "(ZeRO-Offload, as ALST runs it); the device keeps the weights the kernels read");
  command->add_flag("--offload-params", args->offload_params,
                    "with --zero 3: the weight shards in host memory, each module's brought to the device when it is gathered "
                    "(ZeRO-3 offload_param)");
  command->add_option("--fpdt-chunk", args->fpdt_chunk,
                      "FPDT: attention over chunks of this many tokens of the whole sequence, their q/k/v/output in the host pool, "
                      "k/v fetched chunk by chunk; MLP and loss chunked too (needs --checkpointing; the length a multiple of it)");
  command->add_option("--lora", args->lora_rank,
                      "train LoRA adapters of this rank on the frozen model (the base in the kernels' dtype with no gradient or "
                      "optimizer state; fp32 adapters, AdamW on them alone; untiled MLP, no ZeRO)")
      ->check(CLI::Range(1, 4096));
  command->add_option("--lora-targets", args->lora_targets,
                      "the linears that get adapters: all-linear (q, k, v, o, gate, up, down; the default) or q,v (PEFT's default)");
  command->add_option("--lora-alpha", args->lora_alpha, "the adapters' lora_alpha: their product is scaled by alpha / rank (default 8, PEFT's)");
  command->add_option("--precision", args->precision,
                      "the GPU's bf16 regime: mixed (DeepSpeed's: bf16 weights beside fp32 master weights; the default), fsdp2 "
                      "(FSDP2's: the fp32 shards alone, each module cast to bf16 as it is gathered; needs --zero 3) or pure-bf16 (the "
                      "plain HF Trainer with a bf16 model: bf16 weights, gradients and AdamW moments; one rank). On the CPU (fp32) "
                      "they are the same step")
      ->check(CLI::IsMember({"mixed", "fsdp2", "pure-bf16"}));
  command->add_option("--plan", args->plan_file,
                      "run exactly the plan in this file (`longseq plan ... --plan-out FILE`): model, length, ranks, budget and "
                      "every option come from it");
  command->add_flag("--compare-single-rank", args->compare_single_rank,
                    "under mpirun, rank 0 also trains one unsharded replica on the same samples and prints its loss beside");
  command->add_flag("--json", args->json, "print JSON");
  command->add_option("--peer-timeout-s", args->peer_timeout_s,
                      "under mpirun: how long a collective waits for the other ranks before the job stops with an error naming "
                      "it (default 600; 0 waits forever; a small job whose steps take seconds can use 60 to end a stalled "
                      "rank's job sooner)")
      ->check(CLI::Range(0.0, 1e6));
  command->add_option("--json-out", args->json_out,
                      "also write the JSON result to this file (what `longseq report DIR` reads as DIR/run.json), beside the text; "
                      "checked before training: an existing file is refused without --overwrite");
  command->add_flag("--overwrite", args->overwrite, "let --json-out replace an existing file");
  return args;
}

}  // namespace longseq
