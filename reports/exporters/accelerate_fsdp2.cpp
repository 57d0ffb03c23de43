// accelerate_fsdp2.cpp: --emit accelerate-fsdp2, Accelerate's FSDP2 + context parallelism YAML
// (Reference §11 F4.6).
#include "reports/exporters/common.hpp"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>

#include "io/text_escape.hpp"
#include "models/adapters.hpp"
#include "planner/time_model.hpp"
#include "planner/units.hpp"
#include "io/config_error.hpp"
#include "reports/memory_report.hpp"

namespace longseq {

using namespace exporters;

// Accelerate's FSDP2 + context parallelism YAML (Reference §11 F4.6, F1.16-F1.19), with the
// Trainer/TRL arguments it needs beside it (F5.1-F5.7).
ExportedConfig accelerate_fsdp2_config_emit(const ExportRequest& r) {
  const PlanOptions& p = r.plan;
  ExportedConfig exported;
  const int64_t cp = p.ring;
  if (p.sp > 1) exported.notes.push_back("Ulysses: not expressed (Accelerate runs sp_size under DeepSpeed only; --emit accelerate)");
  if (p.zero_stage != 3) exported.notes.push_back(fmt::format("ZeRO-{}: not expressed (this file shards fully, FSDP2's only planned layout)", p.zero_stage));
  const bool cpu_offload = p.offload_optimizer && p.offload_params;
  if (p.offload_optimizer != p.offload_params)
    exported.notes.push_back("optimizer/parameter offload: not expressed (fsdp_offload_params moves parameters, gradients and optimizer together)");
  if (p.tiled_mlp) exported.notes.push_back("tiled MLP: no Trainer/TRL switch; not expressed");
  if (p.fpdt) exported.notes.push_back("FPDT: exists only in Megatron-DeepSpeed; not expressed");
  // Checkpoint offload is transformers' gradient-checkpointing offload, which runs under the
  // Trainer's own checkpointing: FSDP's wrapper is then off (both cannot be on, F5.6).
  const bool trainer_checkpointing = p.activation_checkpointing && p.checkpoint_offload;
  // The Trainer's and TRL's arguments the plan needs, each with why where it is not plain: said in
  // a note and written into the SFTTrainer script beside the YAML.
  struct Argument {
    std::string keyword;  // name=value, a Python literal
    std::string why;      // "" or a parenthesis for the note
  };
  std::vector<Argument> trainer = {{fmt::format("per_device_train_batch_size={}", p.micro_batch), ""},
                                   {fmt::format("gradient_accumulation_steps={}", accumulation_steps(r)), ""}};
  // Without it the Trainer runs every micro-step but the last under FSDP2's
  // set_requires_gradient_sync(False) (trainer.py's training loop; Accelerate's no_sync), which
  // keeps each parameter's unsharded gradient for the whole window: a full unsharded copy of
  // the gradients per rank. Reduce-scattered every micro-step they stay sharded, as planned.
  if (accumulation_steps(r) > 1) trainer.push_back({"accelerator_config={\"gradient_accumulation_kwargs\": {\"sync_each_batch\": True}}", ""});
  trainer.push_back({"bf16=True", ""});
  trainer.push_back({fmt::format("gradient_checkpointing={}", trainer_checkpointing ? "True" : "False"), ""});
  if (trainer_checkpointing)
    trainer.push_back(p.trl_activation_offload
                          ? Argument{"activation_offloading=True", "(TRL's offload of the checkpoints to pinned host memory)"}
                          : Argument{"gradient_checkpointing_kwargs={\"offload\": True}", "(transformers' checkpoint offload to pinned host memory)"});
  std::vector<Argument> trl = {{fmt::format("max_length={}", r.seqlen), ""}};
  // CP's load balancer splits each sequence in 2 x cp chunks (F2.6) and TRL refuses packing under
  // CP; without CP neither applies.
  if (cp > 1) {
    trl.push_back({fmt::format("pad_to_multiple_of={}", 2 * cp), ""});
    trl.push_back({"packing=False", "(refused under CP)"});
  }
  trl.push_back(p.tiled_loss ? Argument{"loss_type=\"chunked_nll\"", "(TRL's default, 256-token chunks)"} : Argument{"loss_type=\"nll\"", ""});
  auto said = [](const std::vector<Argument>& arguments) {
    std::string text;
    for (const Argument& argument : arguments) text += " " + argument.keyword + (argument.why.empty() ? "" : " " + argument.why);
    return text;
  };
  exported.notes.push_back(fmt::format("Trainer/TRL arguments:{}; TRL:{}; load the model with attn_implementation=\"sdpa\"{}{}", said(trainer),
                                       said(trl), cp > 1 ? " (the Trainer refuses CP with another)" : "",
                                       rope_extension(r).factor > 0 ? " and " + rope_scaling_keyword(rope_extension(r)) : ""));
  // Adapters: FSDP2 shards them with the layer they sit in; with a 4-bit base Accelerate skips its
  // fp32 upcast, so they stay in PEFT's dtype (fsdp_utils.py fsdp2_prepare_model).
  for (std::string& note : adapter_notes(r, "FSDP2 shards them with their layer's unit")) exported.notes.push_back(std::move(note));
  // Accelerate 1.11 has parallelism_config with cp, but transformers 5.17's Trainer reads its
  // sp_backend (trainer.py __init__), added in 1.12: 1.11 fails at the Trainer's construction
  // (tests/frameworks, the FSDP2 floor stage).
  exported.notes.push_back(std::string("versions: Accelerate >= 1.12 (parallelism_config with cp; transformers 5.17's Trainer reads its "
                                       "sp_backend, which 1.11 lacks), PyTorch >= 2.6 (context parallelism), TRL >= ") +
                           (p.tiled_loss ? "1.13 (chunked_nll without the fp32 lm_head copy)" : "1.9") +
                           (trainer_checkpointing && !p.trl_activation_offload ? ", transformers >= 5.17 (gradient_checkpointing_kwargs offload; 5.16 "
                                                                                  "ignores it and offloads nothing)" : ""));
  sdpa_backend_note(r, exported);
  exported.notes.push_back(fmt::format("launch: accelerate launch --config_file {} {}", main_file(r, "accelerate-fsdp2.yaml"),
                                       r.companion_file_name));
  exported.notes.push_back("the dataset is a placeholder: put yours in the script's load_dataset(...)");
  card_name_note(r, "MODEL", exported);
  if (r.cluster.nodes > 1)
    exported.notes.push_back(fmt::format("{} nodes: run accelerate launch on every node with --machine_rank set to its index, and "
                                         "MAIN_NODE_ADDRESS (main_process_ip) the first node's address", r.cluster.nodes));
  YAML::Emitter out;
  yaml_document_begin(out, r, "Accelerate with FSDP2 and context parallelism (accelerate launch --config_file)", exported.notes);
  out << YAML::Key << "compute_environment" << YAML::Value << "LOCAL_MACHINE";
  out << YAML::Key << "distributed_type" << YAML::Value << "FSDP";
  out << YAML::Key << "mixed_precision" << YAML::Value << "bf16";
  accelerate_machine_keys(out, r);
  out << YAML::Key << "fsdp_config" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "fsdp_version" << YAML::Value << 2;
  out << YAML::Key << "fsdp_auto_wrap_policy" << YAML::Value << "TRANSFORMER_BASED_WRAP";
  out << YAML::Key << "fsdp_activation_checkpointing" << YAML::Value << (p.activation_checkpointing && !trainer_checkpointing);
  out << YAML::Key << "fsdp_reshard_after_forward" << YAML::Value << true;
  out << YAML::Key << "fsdp_offload_params" << YAML::Value << cpu_offload;
  out << YAML::Key << "fsdp_cpu_ram_efficient_loading" << YAML::Value << true;
  out << YAML::Key << "fsdp_state_dict_type" << YAML::Value << "SHARDED_STATE_DICT";
  out << YAML::EndMap;
  // FSDP shards over dp_shard x cp (F1.17); the product of the sizes is num_processes (F4.2).
  out << YAML::Key << "parallelism_config" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "parallelism_config_dp_replicate_size" << YAML::Value << p.dp_replicate;
  out << YAML::Key << "parallelism_config_dp_shard_size" << YAML::Value << r.cluster.gpus / (cp * p.dp_replicate);
  out << YAML::Key << "parallelism_config_tp_size" << YAML::Value << 1;
  out << YAML::Key << "parallelism_config_cp_size" << YAML::Value << cp;
  out << YAML::Key << "parallelism_config_cp_comm_strategy" << YAML::Value << (p.cp_all_to_all ? "alltoall" : "allgather");
  out << YAML::EndMap;
  out << YAML::EndMap;
  exported.files.push_back({"", std::string(out.c_str()) + "\n"});
  // TRL's SFTTrainer with the arguments above, as `accelerate launch` runs it beside the YAML.
  std::vector<std::string> config = {"output_dir=\"out\""};
  for (const auto* arguments : {&trainer, &trl})
    for (const Argument& argument : *arguments) config.push_back(argument.keyword);
  exported.files.push_back(
      {".train.py", trl_script_text(r, header_lines(r, "TRL's SFTTrainer under Accelerate's FSDP2 (python script)", exported.notes), "sdpa", config)});
  return exported;
}

}  // namespace longseq
