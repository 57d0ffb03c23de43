// export.cpp: the exporters' registry: each --emit target, its writer (reports/exporters/), and
// what config_emit adds to every target's notes. A target is one row here and one file there.
#include "reports/export.hpp"

#include <fmt/format.h>

#include "io/config_error.hpp"
#include "reports/exporters/common.hpp"

namespace longseq {

namespace {

struct Exporter {
  const char* target;
  ExportedConfig (*write)(const ExportRequest&);
  CompanionFile companion;  // what it writes beside its main file, if anything
  // Its ring is USP's or Megatron-Core's (said in a note); false where the file runs PyTorch's
  // context parallelism itself, or the framework has no ring.
  bool ring_note;
  bool adapters;  // its files train LoRA adapters as planned
  // A MoE model runs the model code's own block (said in a note: moe_note); false where the
  // framework builds its own MoE layer and its file says how (Megatron-Core's arguments).
  bool model_moe_block = true;
};

constexpr CompanionFile kDeepSpeedJson = {".deepspeed.json", "ds_config.deepspeed.json"};

constexpr Exporter kExporters[] = {
    {"arctic-training", arctic_training_recipe_emit, {}, true, false},
    {"accelerate", accelerate_config_emit, kDeepSpeedJson, true, true},
    {"hf-accelerate", accelerate_config_emit, kDeepSpeedJson, true, true},
    {"accelerate-fsdp2", accelerate_fsdp2_config_emit, {".train.py", "train.py"}, false, true},
    {"hf-trainer", hf_trainer_script_emit, {}, true, true},
    {"unsloth", unsloth_script_emit, {}, false, true},
    {"torchtitan", torchtitan_job_emit, {}, false, false},
    {"megatron-deepspeed", megatron_deepspeed_emit, kDeepSpeedJson, true, false},
    {"megatron-core", megatron_core_emit, {}, false, false, false},
    {"deepspeed", deepspeed_config_emit, {}, true, false},
    {"usp", deepspeed_config_emit, {}, true, false},
};

const Exporter* exporter_find(const std::string& target) {
  for (const Exporter& exporter : kExporters)
    if (target == exporter.target) return &exporter;
  return nullptr;
}

}  // namespace

CompanionFile export_companion(const std::string& target) {
  const Exporter* exporter = exporter_find(target);
  return exporter ? exporter->companion : CompanionFile{};
}

bool export_writes_adapters(const std::string& target) {
  const Exporter* exporter = exporter_find(target);
  return exporter && exporter->adapters;
}

ExportedConfig config_emit(const std::string& target, const ExportRequest& request) {
  const Exporter* exporter = exporter_find(target);
  if (!exporter)
    throw ConfigError("--emit", "", fmt::format("expected arctic-training, accelerate, accelerate-fsdp2, hf-trainer, unsloth, torchtitan, "
                                                "megatron-deepspeed, megatron-core, deepspeed or usp, got '{}'", target));
  ExportedConfig exported = exporter->write(request);
  if (exporter->ring_note) exporters::ring_note(request, exported);
  if (exporter->model_moe_block) exporters::moe_note(target, request, exported);
  return exported;
}

}  // namespace longseq
