// Every --emit target (reports/export.cpp) given hostile text in every field that comes from an
// input: the model's name (a config.json's _name_or_path), its RoPE scaling, the runtime profile's
// name, the --model path, the written files' paths and the length's basis. The first two bytes pick
// the target and a plan shape; the rest is split at NUL bytes into those fields. Each export is
// compared with the same export made with benign text in the same fields: the files must have the
// same statements and keys, the input text only inside string values and comments
// (tests/support/export_structure.hpp says how each file kind is read). A difference aborts.
#include <array>

#include "models/model_loader.hpp"
#include "planner/cards.hpp"
#include "reports/export.hpp"
#include "tests/fuzz/fuzz_harness.hpp"
#include "tests/support/export_structure.hpp"

namespace {

using namespace longseq;

constexpr std::array<const char*, 9> kTargets = {"arctic-training", "accelerate",         "accelerate-fsdp2", "hf-trainer", "torchtitan",
                                                 "unsloth",         "megatron-deepspeed", "deepspeed",        "usp"};

// The input fields, hostile or benign.
struct InputText {
  std::string model_name, rope_scaling, profile_name, model_source, main_file_name, companion_file_name, seqlen_basis;
};

// Benign text in the same shape: empty where the hostile is (a note depends on it), a config.json
// path where it is one (the export reads the folder), a blank inside so shell quotes it as it
// quotes most hostile paths.
InputText benign_of(const InputText& hostile) {
  auto same_shape = [](const std::string& text, const char* benign) { return text.empty() ? std::string() : std::string(benign); };
  InputText benign;
  benign.model_name = same_shape(hostile.model_name, "benign model");
  benign.rope_scaling = same_shape(hostile.rope_scaling, "llama3");
  benign.profile_name = same_shape(hostile.profile_name, "deepspeed-hf");
  const bool json_source = hostile.model_source.size() >= 5 && hostile.model_source.compare(hostile.model_source.size() - 5, 5, ".json") == 0;
  benign.model_source = json_source ? "b e/config.json" : same_shape(hostile.model_source, "b e");
  benign.main_file_name = same_shape(hostile.main_file_name, "/b e/train.file");
  benign.companion_file_name = hostile.companion_file_name.empty() ? "ds_config.deepspeed.json" : "/b e/train.deepspeed.json";
  benign.seqlen_basis = same_shape(hostile.seqlen_basis, "as given");
  return benign;
}

ExportRequest request_of(const InputText& text, uint8_t shape) {
  static const ModelSpec llama = model_load("llama-3.1-8b");
  static const HardwareCard h100 = hardware_card_load("h100-sxm-80gb");
  ExportRequest request;
  request.model = llama;
  request.model.name = text.model_name;
  request.model.rope_scaling = text.rope_scaling;
  request.model_source = text.model_source;
  request.profile.name = text.profile_name;
  request.main_file_name = text.main_file_name;
  if (!text.companion_file_name.empty()) request.companion_file_name = text.companion_file_name;
  request.seqlen_basis = text.seqlen_basis;
  const int64_t nodes = shape & 1 ? 2 : 1;
  request.cluster = cluster_make(h100, 8 * nodes, nodes, 8, 0);
  PlanOptions plan = PlanOptions::alst(8, request.cluster.gpus);
  if (shape & 2) {  // adapters (the HF Trainer and Unsloth scripts' other branch)
    plan = PlanOptions{};
    plan.zero_stage = 0;
    plan.lora_rank = 16;
    plan.qlora = shape & 4;
  } else if (shape & 4) {  // ring attention, PyTorch CP's rotation
    plan.sp = 1;
    plan.ring = 8 * nodes;
  }
  request.plan = plan;
  request.seqlen = 131072;
  request.predicted_peak_bytes = 40.0 * (1 << 30);
  return request;
}

// Exports `text`'s target and shape with its hostile fields and with benign ones; aborts on a
// structural difference.
void export_compare(const std::string& text) {
  const uint8_t target_byte = text.empty() ? 0 : static_cast<uint8_t>(text[0]);
  const uint8_t shape = text.size() < 2 ? 0 : static_cast<uint8_t>(text[1]);
  std::array<std::string, 7> fields;
  size_t field = 0;
  for (size_t i = 2; i < text.size() && field < fields.size(); ++i) {
    if (text[i] == '\0') ++field;
    else fields[field].push_back(text[i]);
  }
  const InputText hostile{fields[0], fields[1], fields[2], fields[3], fields[4], fields[5], fields[6]};
  const std::string target = kTargets[target_byte % kTargets.size()];
  const ExportedConfig hostile_export = config_emit(target, request_of(hostile, shape));
  const ExportedConfig benign_export = config_emit(target, request_of(benign_of(hostile), shape));
  const std::string problem = longseq::test::export_structure_difference(target, benign_export, hostile_export);
  if (!problem.empty()) {
    std::fprintf(stderr, "fuzz: --emit %s: %s\n", target.c_str(), problem.c_str());
    std::abort();
  }
}

}  // namespace

LONGSEQ_FUZZ_TARGET({ export_compare(text); })
