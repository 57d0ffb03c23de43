// A config.json is downloaded, untrusted input: its _name_or_path reaches every export's header and
// some of their values. Per file kind, a hostile name (and hostile paths) leaves the file with the
// statements and keys of the same export made from a benign name (tests/support/export_structure.hpp),
// and the specific attacks of the exports issue are checked by what they would have written.
#include <doctest/doctest.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "models/model_loader.hpp"
#include "planner/cards.hpp"
#include "reports/export.hpp"
#include "tests/support/export_structure.hpp"

using namespace longseq;

namespace {

// A Llama-3.1-8B config.json whose _name_or_path is `name` (given as raw JSON string text).
ModelSpec llama_named(const std::string& name) {
  const std::string config = fmt::format(
      R"({{"architectures": ["LlamaForCausalLM"], "_name_or_path": {}, "hidden_size": 4096, "intermediate_size": 14336,
          "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256,
          "rope_theta": 500000.0, "rope_scaling": {{"rope_type": "llama3"}}, "hidden_act": "silu"}})",
      nlohmann::json(name).dump());
  return model_from_hf_config_text(config, "config.json");
}

ExportRequest request_for(const ModelSpec& model, const std::string& folder, const PlanOptions& plan, int64_t nodes) {
  ExportRequest request;
  request.model = model;
  request.model_source = folder + "/config.json";
  request.cluster = cluster_make(hardware_card_load("h100-sxm-80gb"), 8 * nodes, nodes, 8, 0);
  request.plan = plan;
  request.profile.name = "deepspeed-hf";
  request.seqlen = 131072;
  request.seqlen_basis = "as given";
  request.predicted_peak_bytes = 40.0 * (1 << 30);
  request.main_file_name = folder + "/train.file";
  request.companion_file_name = folder + "/train.deepspeed.json";
  return request;
}

PlanOptions lora_plan() {
  PlanOptions plan;
  plan.zero_stage = 0;
  plan.lora_rank = 16;
  return plan;
}

// The issue's names: a newline that ends a '#' comment and starts a Python statement, a carriage
// return (ends a Python comment, adds a YAML key), a double quote (TOML), Unicode line breaks.
const char* const kHostileNames[] = {"x\nopen('P','w').write('x')\n#", "x\rtype: evil\r", "my \"fine-tuned\" llama", "a\xE2\x80\xA8" "b\xC2\x85" "c"};

}  // namespace

TEST_CASE("a hostile _name_or_path leaves every export's statements and keys as a benign name's (each file kind)") {
  const ModelSpec benign = llama_named("benign model");
  for (const char* name : kHostileNames) {
    const ModelSpec hostile = llama_named(name);
    for (const char* target : {"arctic-training", "accelerate", "accelerate-fsdp2", "hf-trainer", "torchtitan", "unsloth", "megatron-deepspeed",
                               "deepspeed", "usp"}) {
      for (int64_t nodes : {1, 2}) {
        const PlanOptions plan = std::string(target) == "hf-trainer" || std::string(target) == "unsloth" ? lora_plan() : PlanOptions::alst(8, 8 * nodes);
        CAPTURE(target);
        CAPTURE(nodes);
        const ExportedConfig benign_files = config_emit(target, request_for(benign, "/b e", plan, nodes));
        // The folder is hostile too: a shell command substitution and a blank in a path.
        const ExportedConfig hostile_files = config_emit(target, request_for(hostile, "/w s $(touch pwned)", plan, nodes));
        CHECK(test::export_structure_difference(target, benign_files, hostile_files) == "");
      }
    }
  }
}

TEST_CASE("the issue's attacks, by what each file kind now holds") {
  const ModelSpec injected = llama_named("x\nopen('P','w').write('x')\n#");
  // Python: the name stays inside the comment, escaped; no line of the script is the injected call.
  const ExportedConfig script = config_emit("hf-trainer", request_for(injected, "/m", lora_plan(), 1));
  CHECK(script.text().find("\nopen(") == std::string::npos);
  CHECK(script.text().find("x\\nopen('P','w').write('x')\\n#") != std::string::npos);
  // TOML: the quoted name is one escaped basic string.
  const ExportedConfig toml = config_emit("torchtitan", request_for(llama_named("my \"fine-tuned\" llama"), "/m", PlanOptions::alst(8, 8), 1));
  CHECK(toml.text().find("description = \"longseq plan: my \\\"fine-tuned\\\" llama at 131072 tokens\"\n") != std::string::npos);
  // Shell: the DeepSpeed JSON's path is one single-quoted word.
  const ExportedConfig megatron = config_emit("megatron-deepspeed", request_for(injected, "/w s $(touch pwned)", PlanOptions::alst(8, 8), 1));
  CHECK(megatron.text().find("--deepspeed_config '/w s $(touch pwned)/train.deepspeed.json'") != std::string::npos);
  // YAML: a carriage return in the name adds no key.
  const ExportedConfig recipe = config_emit("arctic-training", request_for(llama_named("x\rtype: evil"), "/m", PlanOptions::alst(8, 8), 1));
  CHECK(YAML::Load(recipe.text())["type"].as<std::string>() == "sft");
  CHECK(recipe.text().find('\r') == std::string::npos);
}

TEST_CASE("text that is not UTF-8 in a path is written with U+FFFD in JSON, YAML, Python and TOML, never stopping the export") {
  const ModelSpec model = llama_named("llama");
  for (const char* target : {"arctic-training", "accelerate", "hf-trainer", "torchtitan", "deepspeed"}) {
    CAPTURE(target);
    const PlanOptions plan = std::string(target) == "hf-trainer" ? lora_plan() : PlanOptions::alst(8, 8);
    const ExportedConfig files = config_emit(target, request_for(model, "/runs/bad\xFF", plan, 1));
    for (const ExportedFile& file : files.files) CHECK(utf8_valid(file.text));
  }
  // Shell keeps a path's bytes inside its quotes (it is the path); the header is UTF-8.
  const ExportedConfig megatron = config_emit("megatron-deepspeed", request_for(model, "/runs/bad\xFF", PlanOptions::alst(8, 8), 1));
  CHECK(megatron.text().find("--deepspeed_config '/runs/bad\xFF/train.deepspeed.json'") != std::string::npos);
}
