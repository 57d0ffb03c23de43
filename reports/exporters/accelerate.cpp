// accelerate.cpp: --emit accelerate, Accelerate's YAML for DeepSpeed with the DeepSpeed JSON it names
// and the Trainer/TRL arguments beside it (FRAMEWORKS §2).
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

ExportedConfig accelerate_config_emit(const ExportRequest& r) {
  const PlanOptions& p = r.plan;
  ExportedConfig exported;
  const std::string attn_implementation = hf_attn_implementation(r, exported);
  if (p.fpdt) exported.notes.push_back("FPDT: the HF/Accelerate Ulysses path has no FPDT (only Megatron-DeepSpeed); this file runs without it");
  if (p.tiled_mlp) exported.notes.push_back("tiled MLP: no Trainer/TRL switch; patch the MLP with DeepSpeed's TiledMLP in the script");
  if (p.checkpoint_offload)
    exported.notes.push_back("checkpoint offload: no Trainer/TRL switch; ArcticTraining's CheckpointFunction CPU-offload patch in the script");
  // TRL's sequence-parallel recipe packs with BFD, which implies padding-free (position_ids, which
  // DeepSpeed's Ulysses requires from 0.19.0); TRL >= 1.0 refuses padding_free=True without packing
  // ("max_length is not enforced"; Reference §11 F5.4).
  exported.notes.push_back(fmt::format(
      "Trainer/TRL arguments: per_device_train_batch_size={} gradient_accumulation_steps={} bf16=True gradient_checkpointing={} "
      "max_grad_norm=1.0{}; TRL: max_length={} pad_to_multiple_of={} packing=True packing_strategy=\"bfd\" (padding-free, with "
      "position_ids: mandatory from DeepSpeed 0.19.0; TRL >= 1.0 refuses padding_free=True without packing); load the model with "
      "attn_implementation=\"{}\" (= sp_attn_implementation){}",
      p.micro_batch, accumulation_steps(r), p.activation_checkpointing ? "True" : "False", p.tiled_loss ? " use_liger_kernel=True" : "", r.seqlen, p.sp,
      attn_implementation, rope_extension(r).factor > 0 ? " and " + rope_scaling_keyword(rope_extension(r)) : ""));
  // Under SDPA a position_ids reset (a second sample packed in, padding) makes transformers
  // build a dense [B, 1, S, S] mask and leave the flash kernels (Reference §11 F3.5, F5.4).
  if (attn_implementation == "sdpa")
    exported.notes.push_back(fmt::format(
        "SDPA with packing: keep one sample of at least {} tokens per packed row (max_length a multiple of pad_to_multiple_of); a "
        "second sample's position_ids reset makes transformers build a dense [1, 1, S, S] mask ({:.0f} GiB at this length) and "
        "leave SDPA's flash and cuDNN kernels (Reference §11 F3.5)",
        r.seqlen, sdpa_dense_mask_bytes(r.seqlen) / kBytesPerGib));
  // Adapters under DeepSpeed (with or without ZeRO offload): PEFT's LoraConfig through TRL, as the
  // hf-trainer script writes it; DeepSpeed then trains them as any parameter (bf16 with an fp32
  // master, the plan's pricing under deepspeed-hf).
  for (std::string& note : adapter_notes(r, p.offload_optimizer ? "DeepSpeed trains them as any parameter, their optimizer on the host with ZeRO-Offload"
                                                                 : "DeepSpeed trains them as any parameter"))
    exported.notes.push_back(std::move(note));
  // The Trainer's sequence parallelism is transformers PR #41832 (transformers 5): 4.57.x runs an sp
  // config as plain data parallelism (Accelerate issue #3889), each rank training the whole length.
  exported.notes.push_back(p.sp > 1 ? "versions: Accelerate >= 1.12 (older ones ignore the SP keys), DeepSpeed >= 0.18.2, transformers >= 5.0 "
                                      "(its Trainer's sequence parallelism, PR #41832; 4.57 runs this as plain data parallelism), TRL >= 0.26"
                                    : "versions: Accelerate >= 1.12, DeepSpeed >= 0.18.2, transformers >= 4.51.3");
  // bf16 is explicit in the JSON and on the launch line: "auto" resolves to false in a native
  // Accelerate loop without --mixed_precision (§2.7), which would train in fp32. The YAML may not
  // carry mixed_precision beside deepspeed_config_file (§2.5); the command line may.
  exported.notes.push_back(fmt::format("launch: accelerate launch --config_file {} --mixed_precision bf16 train.py (no --use_deepspeed: it "
                                       "would keep the SP keys out)", main_file(r, "accelerate.yaml")));
  if (r.cluster.nodes > 1)
    // With num_machines > 1 and the pdsh launcher, Accelerate runs `deepspeed --hostfile ...
    // --master_addr main_process_ip` from the node it is started on (FRAMEWORKS §2.6).
    exported.notes.push_back(fmt::format(
        "{} nodes: replace MAIN_NODE_ADDRESS (main_process_ip) with the first node's address, write `hostfile` with one "
        "`HOSTNAME slots={}` line per node, and run accelerate launch on the first node only: DeepSpeed's pdsh launcher starts "
        "every node's ranks; the files are named by absolute path, so every node must see them at the same path (a shared "
        "file system)",
        r.cluster.nodes, r.cluster.gpus_per_node));
  YAML::Emitter out;
  yaml_document_begin(out, r, "Accelerate (accelerate launch --config_file)", exported.notes);
  out << YAML::Key << "compute_environment" << YAML::Value << "LOCAL_MACHINE";
  out << YAML::Key << "distributed_type" << YAML::Value << "DEEPSPEED";
  // No mixed_precision key: with deepspeed_config_file Accelerate refuses any value (§2.5); HF
  // TrainingArguments(bf16=True) sets it, and the JSON's bf16 is "auto".
  accelerate_machine_keys(out, r);
  out << YAML::Key << "deepspeed_config" << YAML::Value << YAML::BeginMap;
  // Every DeepSpeed key arrives only through the JSON (the launcher drops unknown keys, §2.4).
  out << YAML::Key << "deepspeed_config_file" << YAML::Value;
  out << yaml_input_text(out, r.companion_file_name);
  out << YAML::Key << "zero3_init_flag" << YAML::Value << (p.zero_stage == 3);
  if (r.cluster.nodes > 1) {
    out << YAML::Key << "deepspeed_multinode_launcher" << YAML::Value << "pdsh";
    out << YAML::Key << "deepspeed_hostfile" << YAML::Value << "hostfile";
  }
  out << YAML::EndMap;
  out << YAML::Key << "parallelism_config" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "parallelism_config_dp_shard_size" << YAML::Value << data_parallel(r);  // dp x sp = processes (§2.3)
  out << YAML::Key << "parallelism_config_sp_size" << YAML::Value << p.sp;
  out << YAML::Key << "parallelism_config_sp_backend" << YAML::Value << "deepspeed";
  out << YAML::Key << "parallelism_config_sp_seq_length_is_variable" << YAML::Value << true;
  out << YAML::Key << "parallelism_config_sp_attn_implementation" << YAML::Value << attn_implementation;
  out << YAML::EndMap;
  out << YAML::EndMap;
  exported.files.push_back({"", std::string(out.c_str()) + "\n"});
  // The JSON: the batch keys and clipping "auto", which the HF Trainer and Accelerate fill
  // (dp-based batch; an explicit integer fails the Trainer's world-size check, REFERENCE §8).
  nlohmann::json config = deepspeed_common(r);
  config["train_batch_size"] = "auto";
  config["train_micro_batch_size_per_gpu"] = "auto";
  config["gradient_accumulation_steps"] = "auto";
  config["gradient_clipping"] = "auto";
  // bf16 as planned, not "auto": a native Accelerate loop resolves "auto" from mixed_precision,
  // false without it; the HF Trainer checks it against bf16=True (the argument above).
  config["bf16"] = {{"enabled", true}};
  config["longseq_plan"] = json_record(r, "Accelerate / HF Trainer / TRL");
  exported.files.push_back({".deepspeed.json", json_text(config) + "\n"});
  return exported;
}

}  // namespace longseq
