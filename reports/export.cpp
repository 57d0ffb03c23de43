#include "reports/export.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

namespace longseq {

namespace {

// Plan settings that live in code or trainer arguments rather than in either config file.
std::vector<std::string> settings_outside_configs(const PlanOptions& plan) {
  std::vector<std::string> notes;
  if (plan.activation_checkpointing)
    notes.push_back("activation checkpointing: enable it in the trainer (HF: gradient_checkpointing=True)");
  if (plan.checkpoint_offload)
    notes.push_back("checkpoint offload: for HF models ALST offloads with ArcticTraining's CheckpointFunctionWithCPUOffload "
                    "patch; DeepSpeed's own activation_checkpointing.cpu_checkpointing only covers its checkpointing API");
  if (plan.tiled_mlp)
    notes.push_back("tiled MLP: no config key; enable DeepSpeed's TiledMLP in code (ArcticTraining: tiled_mlp_compute)");
  if (plan.tiled_loss)
    notes.push_back("tiled logits+loss: no config key; use Liger's fused linear cross entropy (HF: use_liger_kernel=True)");
  if (plan.fpdt)
    notes.push_back(fmt::format("FPDT: a Megatron-DeepSpeed option, not a config key (ds_sequence_parallel_fpdt, "
                                "ds_sequence_parallel_fpdt_chunk_size = {})", plan.fpdt_chunk_tokens));
  return notes;
}

}  // namespace

ExportedConfig deepspeed_config_emit(const PlanOptions& plan, const ClusterSpec& cluster, const RuntimeProfile& profile) {
  nlohmann::json zero = {{"stage", plan.zero_stage}};
  if (plan.zero_stage >= 1) zero["offload_optimizer"] = {{"device", plan.offload_optimizer ? "cpu" : "none"}};
  if (plan.zero_stage == 3) zero["offload_param"] = {{"device", plan.offload_params ? "cpu" : "none"}};
  if (profile.zero_reduce_bucket_elements > 0) zero["reduce_bucket_size"] = profile.zero_reduce_bucket_elements;
  if (plan.zero_stage == 3 && profile.zero_prefetch_bucket_elements > 0)
    zero["stage3_prefetch_bucket_size"] = profile.zero_prefetch_bucket_elements;
  nlohmann::json config = {
      {"train_micro_batch_size_per_gpu", plan.micro_batch},
      {"gradient_accumulation_steps", 1},
      {"train_batch_size", plan.micro_batch * (cluster.gpus / plan.sp)},
      {"bf16", {{"enabled", profile.weight_bytes == 2}}},
      {"zero_optimization", zero},
      {"sequence_parallel_size", plan.sp},
      {"seq_parallel_communication_data_type", profile.activation_bytes == 2 ? "bf16" : "fp32"},
      {"activation_checkpointing",
       {{"partition_activations", false}, {"cpu_checkpointing", plan.checkpoint_offload},
        {"contiguous_memory_optimization", false}}},
  };
  ExportedConfig exported;
  exported.text = config.dump(2) + "\n";
  exported.notes = settings_outside_configs(plan);
  return exported;
}

ExportedConfig accelerate_config_emit(const PlanOptions& plan, const ClusterSpec& cluster, const RuntimeProfile& profile) {
  ExportedConfig exported;
  exported.notes = settings_outside_configs(plan);
  YAML::Emitter out;
  out << YAML::Comment("Accelerate config written by longseq from a PREDICTED plan: " + plan_describe(plan));
  for (const auto& note : exported.notes) out << YAML::Newline << YAML::Comment("not expressible here: " + note);
  out << YAML::BeginMap;
  out << YAML::Key << "compute_environment" << YAML::Value << "LOCAL_MACHINE";
  out << YAML::Key << "distributed_type" << YAML::Value << "DEEPSPEED";
  out << YAML::Key << "mixed_precision" << YAML::Value << (profile.weight_bytes == 2 ? "bf16" : "no");
  out << YAML::Key << "num_machines" << YAML::Value << cluster.nodes;
  out << YAML::Key << "num_processes" << YAML::Value << cluster.gpus;
  out << YAML::Key << "deepspeed_config" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "zero_stage" << YAML::Value << plan.zero_stage;
  out << YAML::Key << "offload_optimizer_device" << YAML::Value << (plan.offload_optimizer ? "cpu" : "none");
  out << YAML::Key << "offload_param_device" << YAML::Value << (plan.offload_params ? "cpu" : "none");
  if (plan.zero_stage == 3) out << YAML::Key << "zero3_init_flag" << YAML::Value << true;
  out << YAML::Key << "seq_parallel_communication_data_type" << YAML::Value << (profile.activation_bytes == 2 ? "bf16" : "fp32");
  out << YAML::EndMap;
  // The HF Ulysses integration's keys (../shared/seeds/003): dp_replicate x dp_shard x sp = processes.
  out << YAML::Key << "parallelism_config" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "parallelism_config_sp_size" << YAML::Value << plan.sp;
  out << YAML::Key << "parallelism_config_sp_backend" << YAML::Value << "deepspeed";
  out << YAML::Key << "parallelism_config_dp_shard_size" << YAML::Value << cluster.gpus / plan.sp;
  out << YAML::Key << "parallelism_config_sp_seq_length_is_variable" << YAML::Value << true;
  out << YAML::Key << "parallelism_config_sp_attn_implementation" << YAML::Value << "flash_attention_2";
  out << YAML::EndMap;
  out << YAML::EndMap;
  exported.text = std::string(out.c_str()) + "\n";
  return exported;
}

}  // namespace longseq
