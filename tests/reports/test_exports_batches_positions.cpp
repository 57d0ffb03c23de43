// Every export writes the plan's gradient accumulation in its framework's own batch keys, and past the
// model's trained positions YaRN where the framework takes it, or a note that says why not (issue 40).
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include "io/config_error.hpp"
#include "planner/scenario.hpp"
#include "reports/export.hpp"
#include "tests/support/export_request.hpp"

using namespace longseq;

TEST_CASE("a global batch of 64 on 16 GPUs at sp=4, micro batch 2: 8 accumulation steps in every framework's batch keys") {
  PlanOptions plan = PlanOptions::alst(4);  // dp = 16 / 4 = 4
  plan.micro_batch = 2;
  plan.global_batch = 64;  // 64 / (2 x 4) = 8 micro-steps
  const ExportRequest request = testing::export_request("llama-3.1-8b", 16, plan, 131072);

  const auto deepspeed = nlohmann::json::parse(deepspeed_config_emit(request).text());
  CHECK(deepspeed["gradient_accumulation_steps"] == 8);
  CHECK(deepspeed["train_micro_batch_size_per_gpu"] == 2);
  CHECK(deepspeed["train_batch_size"] == 64);  // DeepSpeed's check: micro x accumulation x world / sp
  CHECK(deepspeed["longseq_plan"]["gradient_accumulation_steps"] == 8);
  CHECK(deepspeed["longseq_plan"]["global_batch"] == 64);

  const YAML::Node arctic = YAML::Load(config_emit("arctic-training", request).text());
  CHECK(arctic["gradient_accumulation_steps"].as<int>() == 8);
  CHECK(arctic["micro_batch_size"].as<int>() == 2);

  const std::string megatron = config_emit("megatron-deepspeed", request).text();
  CHECK(megatron.find("--micro-batch-size 2 --global-batch-size 64") != std::string::npos);

  PlanOptions fsdp2_plan = plan;
  fsdp2_plan.sp = 1;
  fsdp2_plan.ring = 4;
  fsdp2_plan.offload_optimizer = fsdp2_plan.offload_params = false;
  fsdp2_plan.tiled_mlp = false;
  fsdp2_plan.checkpoint_offload = false;
  const ExportRequest fsdp2 = testing::export_request("llama-3.1-8b", 16, fsdp2_plan, 131072);
  const ExportedConfig accelerate_fsdp2 = config_emit("accelerate-fsdp2", fsdp2);
  bool sync_each_batch = false, accumulation = false;
  for (const std::string& note : accelerate_fsdp2.notes) {
    accumulation |= note.find("per_device_train_batch_size=2 gradient_accumulation_steps=8 ") != std::string::npos;
    sync_each_batch |= note.find("accelerator_config={\"gradient_accumulation_kwargs\": {\"sync_each_batch\": True}}") != std::string::npos;
  }
  CHECK(accumulation);
  CHECK(sync_each_batch);  // reduce-scattered every micro-step, the gradients stay sharded as planned
  const std::string torchtitan = config_emit("torchtitan", fsdp2).text();
  CHECK(torchtitan.find("local_batch_size = 2\nglobal_batch_size = 64\n") != std::string::npos);

  PlanOptions trainer = fsdp2_plan;
  trainer.ring = 1;
  trainer.zero_stage = 0;
  trainer.tiled_loss = false;
  trainer.global_batch = 2 * 16 * 2;  // 2 micro-steps on 16 replicas
  const std::string script = config_emit("hf-trainer", testing::export_request("llama-3.1-8b", 16, trainer, 16384)).text();
  CHECK(script.find("per_device_train_batch_size=2, gradient_accumulation_steps=2,") != std::string::npos);
}

TEST_CASE("past the trained positions each export sets YaRN over the window (factor ceil(S / window)) or says why it cannot") {
  const std::string qwen3 = std::string(LONGSEQ_TEST_DATA_DIR) + "/hf/qwen3-1.7b.config.json";  // max_position_embeddings 40,960
  PlanOptions plan = PlanOptions::alst(4);
  ExportRequest past = testing::export_request(qwen3, 8, plan, 131072);  // ceil(131,072 / 40,960) = 4
  const std::string keyword =
      "rope_scaling={\"rope_type\": \"yarn\", \"factor\": 4.0, \"original_max_position_embeddings\": 40960, \"rope_theta\": 1000000.0}";

  PlanOptions trainer;
  trainer.sp = 1;
  trainer.zero_stage = 0;
  trainer.offload_optimizer = trainer.offload_params = false;
  trainer.tiled_mlp = trainer.tiled_loss = trainer.checkpoint_offload = false;
  ExportRequest script = testing::export_request(qwen3, 1, trainer, 131072);
  CHECK(config_emit("hf-trainer", script).text().find("from_pretrained(MODEL, dtype=torch.bfloat16, attn_implementation=\"flash_attention_3\", " +
                                                      keyword + ")") != std::string::npos);
  const YAML::Node arctic = YAML::Load(config_emit("arctic-training", past).text());
  CHECK(arctic["model"]["hf_config_kwargs"]["rope_scaling"]["rope_type"].as<std::string>() == "yarn");
  CHECK(arctic["model"]["hf_config_kwargs"]["rope_scaling"]["factor"].as<double>() == 4.0);
  CHECK(arctic["model"]["hf_config_kwargs"]["rope_scaling"]["original_max_position_embeddings"].as<int>() == 40960);
  auto said = [&](const std::string& target, const std::string& text) {
    for (const std::string& note : config_emit(target, past).notes)
      if (note.find(text) != std::string::npos) return true;
    return false;
  };
  CHECK(said("accelerate", "load the model with attn_implementation=\"flash_attention_3\" (= sp_attn_implementation) and " + keyword));
  CHECK(said("deepspeed", "RoPE past the trained positions: 131,072 tokens against the model's 40,960 (max_position_embeddings); the JSON "
                          "cannot set it; load the model in the loop with: " + keyword));
  CHECK(said("megatron-deepspeed", "Megatron-DeepSpeed's rotary embedding has no YaRN"));

  // A model that scales RoPE already keeps its scaling (Llama 3.1's llama3 to 131,072): nothing is set past it.
  ExportRequest llama = testing::export_request("llama-3.1-8b", 1, trainer, 262'144);
  REQUIRE(llama.model.max_position_embeddings == 131'072);
  CHECK(config_emit("hf-trainer", llama).text().find("rope_scaling") == std::string::npos);

  // Within the window (32,768 < 40,960) nothing is set or said.
  ExportRequest within = testing::export_request(qwen3, 8, plan, 32768);
  script.seqlen = 32768;
  CHECK(config_emit("hf-trainer", script).text().find("rope_scaling") == std::string::npos);
  CHECK_FALSE(YAML::Load(config_emit("arctic-training", within).text())["model"]["hf_config_kwargs"]);
  for (const std::string& note : config_emit("deepspeed", within).notes) CHECK(note.find("RoPE past") == std::string::npos);
}

TEST_CASE("a scenario holds micro_batch, global_batch and checkpoint_every as the plan flags do, and bad values name the key") {
  const std::string text =
      "name: batches\nmodel: llama-3.1-8b\ncluster: {gpu: h100-sxm-80gb}\n"
      "plan: {search: throughput, framework: torchtitan, micro_batch: 2, global_batch: 64, checkpoint_every: 2}\n"
      "sweep: {gpus: [8], seqlen: [16384]}\n";
  const Scenario scenario = scenario_from_text(text, "batches.yaml");
  const std::vector<SweepRow> rows = scenario_run(scenario);
  REQUIRE(rows.size() == 1);
  REQUIRE(rows[0].plan.has_value());
  CHECK(rows[0].plan->micro_batch == 2);
  CHECK(rows[0].plan->global_batch == 64);
  CHECK(rows[0].plan->checkpoint_every == 2);
  CHECK_THROWS_WITH_AS(scenario_from_text("name: x\nmodel: m\ncluster: {gpu: g}\nplan: {global_batch: 0}\nsweep: {gpus: [1]}\n", "x.yaml"),
                       doctest::Contains("x.yaml: key 'plan.global_batch'"), ConfigError);
}
