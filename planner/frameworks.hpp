// frameworks.hpp: the frameworks a plan can be run in, and which plan options each can run (for
// which models). The search explores only what the target framework runs; an option another
// framework runs is named in the plan's "why not" lines. Sources: ../shared/FRAMEWORKS.md and
// ../shared/REFERENCE.md §8, cited per rule in frameworks.cpp.
#pragma once

#include <string>
#include <vector>

#include "models/model_spec.hpp"
#include "planner/plan.hpp"

namespace longseq {

enum class Framework {
  framework_arctic_training,     // ArcticTraining: ALST's own trainer (recipe YAML)
  framework_hf_accelerate,       // Accelerate / HF Trainer / TRL (Accelerate YAML + DeepSpeed JSON)
  framework_megatron_deepspeed,  // Megatron-DeepSpeed: Ulysses and FPDT (launch arguments + DeepSpeed JSON)
  framework_deepspeed,           // a plain deepspeed.initialize loop (DeepSpeed JSON)
  framework_usp,                 // a DeepSpeed loop with USP's LongContextAttention: Ulysses x ring attention
  framework_longseq,             // longseq's own executor (`longseq run`); ring attention planned, not yet executed
};

// ArcticTraining: the framework the ALST techniques ship in, and the only one with a switch for
// each of them (tiled MLP, checkpoint offload, Ulysses, tiled loss); see the README.
inline constexpr Framework kDefaultFramework = Framework::framework_arctic_training;

const char* framework_name(Framework framework);  // "arctic-training", ...
std::vector<Framework> frameworks_all();
// Throws ConfigError(flag, "", reason listing the names) for an unknown name.
Framework framework_parse(const std::string& name, const std::string& flag = "--framework");

// Why `framework` cannot run `plan` for `model`, naming the option and the source; empty when it can.
std::string framework_unsupported(Framework framework, const ModelSpec& model, const PlanOptions& plan);
// The frameworks that run `plan` for `model` (longseq's executor always among them).
std::vector<Framework> frameworks_running(const ModelSpec& model, const PlanOptions& plan);

}  // namespace longseq
