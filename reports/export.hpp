// export.hpp: a plan as the files of the framework that will run it, so that the framework runs
// the plan as planned: an ArcticTraining recipe, an Accelerate YAML with the DeepSpeed JSON it
// names, Megatron-DeepSpeed launch arguments with their DeepSpeed JSON, or a DeepSpeed JSON for a
// plain loop. Every file records the model, sequence length, micro batch and the predicted peak
// (YAML and shell as comments; a JSON's are in the notes); what a file cannot express is a note,
// never silently lost. Formats, keys and version floors: ../shared/FRAMEWORKS.md and REFERENCE §8.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models/model_spec.hpp"
#include "planner/frameworks.hpp"
#include "planner/plan.hpp"

namespace longseq {

struct ExportRequest {
  ModelSpec model;
  std::string model_source;  // what the user gave --model (an HF id or a path), for name_or_path
  PlanOptions plan;
  ClusterSpec cluster;
  RuntimeProfile profile;
  int64_t seqlen = 0;                 // the planned sequence length (global tokens)
  std::string seqlen_basis;           // why this length: "as given", the band's low end, ... (recorded)
  double predicted_peak_bytes = 0;    // per GPU
  // The path the main file (or its launch line) gives the file beside it, the DeepSpeed JSON
  // (Accelerate, Megatron-DeepSpeed) or the training script (Accelerate's FSDP2): absolute when the
  // files are written (so a launch from another folder finds it), the companion's placeholder name
  // when they go to standard output.
  std::string companion_file_name = "ds_config.deepspeed.json";
  // The main file as the launch line names it (absolute when written; a placeholder on stdout).
  std::string main_file_name;
};

struct ExportedFile {
  std::string suffix;   // "" for the main file; the companion's (export_companion) for the file beside it
  std::string text;
};

struct ExportedConfig {
  std::vector<ExportedFile> files;  // the main file first
  std::vector<std::string> notes;   // settings the files cannot express and where to set them, versions, the record
  const std::string& text() const { return files.front().text; }
};

// Targets: "arctic-training", "accelerate", "accelerate-fsdp2", "hf-trainer", "torchtitan", "megatron-deepspeed", "megatron-core",
// "deepspeed", "usp". Throws ConfigError
// (--emit) for another name.
ExportedConfig config_emit(const std::string& target, const ExportRequest& request);

// The file `target` writes beside its main one: a DeepSpeed JSON (Accelerate, Megatron-DeepSpeed)
// or TRL's training script (Accelerate's FSDP2), named by the main file's stem and this suffix, and
// its placeholder name on standard output. suffix null: none.
struct CompanionFile {
  const char* suffix = nullptr;
  const char* placeholder = nullptr;
};
CompanionFile export_companion(const std::string& target);
// Whether `target`'s files train LoRA adapters as planned (the HF Trainer's and Unsloth's scripts).
bool export_writes_adapters(const std::string& target);

ExportedConfig arctic_training_recipe_emit(const ExportRequest& request);
ExportedConfig accelerate_config_emit(const ExportRequest& request);
ExportedConfig accelerate_fsdp2_config_emit(const ExportRequest& request);
ExportedConfig hf_trainer_script_emit(const ExportRequest& request);
ExportedConfig torchtitan_job_emit(const ExportRequest& request);
ExportedConfig unsloth_script_emit(const ExportRequest& request);
ExportedConfig megatron_deepspeed_emit(const ExportRequest& request);
ExportedConfig megatron_core_emit(const ExportRequest& request);
ExportedConfig deepspeed_config_emit(const ExportRequest& request);

}  // namespace longseq
