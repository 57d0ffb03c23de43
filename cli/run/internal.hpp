// internal.hpp: `longseq run`'s flags as typed, shared by its registration (cli/run/options.cpp)
// and the command (cli/run_command.cpp).
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <optional>
#include <string>

#include "executor/trainer.hpp"

namespace longseq {

// --precision's spellings.
PrecisionRegime precision_regime(const std::string& text);


struct RunCommandArgs {
  std::string scenario;
  CLI::App* command = nullptr;  // to tell flags given from defaults when a scenario supplies values
  std::string model = "tiny-llama";
  int64_t layers = 0;  // 0: the card's
  std::string device = "cpu";
  std::string seqlen = "1Ki";
  int64_t steps = 5;
  bool checkpointing = false, checkpoint_offload = false;
  int64_t mlp_tiles = 0, loss_tiles = 0, attention_block = 64;
  std::string data;
  double budget_mib = 0;
  double lr = 3e-3;
  uint32_t seed = 1;
  bool auto_plan = false;
  int64_t sp = 0;  // 0: every rank of the run (mpirun -np N) not taken by the ring
  int64_t ring = 1;
  int zero_stage = 0;
  bool offload_optimizer = false, offload_params = false;
  std::string fpdt_chunk;  // empty: no FPDT
  int64_t lora_rank = 0;   // 0: full training
  std::string lora_targets = "all-linear";
  double lora_alpha = 8;   // PEFT's LoraConfig default
  std::string precision = "mixed";  // the bf16 schedule's regime: mixed (DeepSpeed's) or fsdp2
  std::string plan_file;
  bool compare_single_rank = false;
  bool json = false;
  std::optional<std::string> json_out;
  bool overwrite = false;
  double peer_timeout_s = 600;
};

}  // namespace longseq
