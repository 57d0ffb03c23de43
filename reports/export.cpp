#include "reports/export.hpp"

#include "models/adapters.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include "io/text_escape.hpp"
#include "models/config_error.hpp"
#include "planner/time_model.hpp"
#include "planner/units.hpp"
#include "reports/memory_report.hpp"

namespace longseq {

namespace {

int64_t data_parallel(const ExportRequest& r) { return r.cluster.gpus / r.plan.sequence_ranks(); }

// What every file records about the plan it was written from.
std::vector<std::string> record_lines(const ExportRequest& r, const char* target) {
  return {fmt::format("written by longseq for {} from a PREDICTED plan: {}", target, plan_describe(r.plan)),
          fmt::format("model {} ({} parameters), sequence length {} tokens, micro batch {}, {} GPUs ({} node(s)), sp={} dp={}",
                      r.model.name, integer_with_commas(parameter_count(r.model).total), integer_with_commas(r.seqlen),
                      r.plan.micro_batch, r.cluster.gpus, r.cluster.nodes, r.plan.sp, data_parallel(r)),
          fmt::format("predicted peak per GPU: {:.1f} GiB of {:.1f} GiB (runtime profile {})", bytes_to_gib(r.predicted_peak_bytes),
                      r.cluster.hardware.gpu_memory_gib, r.profile.name),
          fmt::format("the sequence length is {}", r.seqlen_basis.empty() ? "as planned" : r.seqlen_basis)};
}

// The header every file with comments carries: the record, then what the file cannot express.
std::vector<std::string> header_lines(const ExportRequest& r, const char* target, const std::vector<std::string>& notes) {
  std::vector<std::string> lines = record_lines(r, target);
  lines.insert(lines.end(), notes.begin(), notes.end());
  return lines;
}

// Lines as '#' comments (Python, TOML, shell). A line holds input text (a model's name, a path),
// so each is written as one printable line: a newline in a config.json's name must not end the
// comment and start a statement.
std::string hash_comments(const std::vector<std::string>& lines) {
  std::string text;
  for (const auto& line : lines) text += "# " + one_line_text(line) + "\n";
  return text;
}

// PEFT's target_modules as a Python list's items: the linears the plan adapts.
std::string lora_target_modules(const ExportRequest& r) {
  std::string targets;
  for (const LayerLinear& linear : lora_adapted_linears(r.model, r.plan.lora_all_linear))
    targets += fmt::format("{}\"{}\"", targets.empty() ? "" : ", ", linear.name);
  return targets;
}

// The record a DeepSpeed JSON carries of the plan it was written from. DeepSpeed looks its
// top-level keys up one by one and ignores any other (FRAMEWORKS §1.2, §4.2), the HF Trainer and
// Accelerate fill only "auto" values (§2.7-2.8), so the key travels with the file harmlessly.
nlohmann::json json_record(const ExportRequest& r, const char* target) {
  return {{"written_by", fmt::format("longseq, for {}, from a PREDICTED plan", target)},
          {"plan", plan_describe(r.plan)},
          {"model", r.model.name},
          {"parameters", parameter_count(r.model).total},
          {"sequence_length", r.seqlen},
          {"sequence_length_basis", r.seqlen_basis},
          {"micro_batch", r.plan.micro_batch},
          {"gpus", r.cluster.gpus},
          {"nodes", r.cluster.nodes},
          {"sp", r.plan.sp},
          {"dp", data_parallel(r)},
          {"predicted_peak_gib_per_gpu", std::round(bytes_to_gib(r.predicted_peak_bytes) * 10) / 10},
          {"gpu_memory_gib", r.cluster.hardware.gpu_memory_gib},
          {"runtime_profile", r.profile.name}};
}

// The name a launch line gives the main file: the written file, or `fallback` on stdout.
std::string main_file(const ExportRequest& r, const char* fallback) { return r.main_file_name.empty() ? fallback : r.main_file_name; }

// The ZeRO block every DeepSpeed JSON carries. pin_memory is written out: its default moved from
// false to true in v0.19.5 (FRAMEWORKS §4.2), which changes host memory; the plan assumed pageable
// optimizer states (planner/memory_model.cpp: no pinned staging buffers for the optimizer).
nlohmann::json zero_block(const PlanOptions& plan) {
  nlohmann::json zero = {{"stage", plan.zero_stage}};
  if (plan.zero_stage >= 1)
    zero["offload_optimizer"] = plan.offload_optimizer ? nlohmann::json{{"device", "cpu"}, {"pin_memory", false}}
                                                       : nlohmann::json{{"device", "none"}};
  if (plan.zero_stage == 3)
    zero["offload_param"] = plan.offload_params ? nlohmann::json{{"device", "cpu"}, {"pin_memory", false}}
                                                : nlohmann::json{{"device", "none"}};
  return zero;
}

// The DeepSpeed keys common to the JSON files: bf16, ZeRO, the Ulysses all-to-all in bf16 (the
// default fp32 doubles its volume, FRAMEWORKS §4.5), and sequence_parallel_size (the HF zero.Init
// path needs it; no data_parallel_size beside it, or DeepSpeed builds its own mesh, §4.5).
nlohmann::json deepspeed_common(const ExportRequest& r) {
  nlohmann::json config = {{"bf16", {{"enabled", true}}}, {"zero_optimization", zero_block(r.plan)}};
  if (r.plan.sp > 1) {
    config["sequence_parallel_size"] = r.plan.sp;
    config["seq_parallel_communication_data_type"] = "bf16";
  }
  return config;
}

// A YAML value made of input text (a path): yaml-cpp writes a carriage return or a Unicode line
// break inside a plain scalar as it is, where a YAML reader ends the line; so any text beyond
// printable ASCII is double-quoted, where yaml-cpp escapes control characters, and the export's
// emitter escapes every non-ASCII character (yaml_emitter).
std::string yaml_input_text(YAML::Emitter& out, const std::string& text) {
  if (std::any_of(text.begin(), text.end(), [](char c) { return c < 0x20 || c > 0x7E; })) out << YAML::DoubleQuoted;
  return utf8_repaired(text);
}

void yaml_comments(YAML::Emitter& out, const std::vector<std::string>& lines) {
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) out << YAML::Newline;
    out << YAML::Comment(one_line_text(lines[i]));  // a carriage return would end the comment
  }
}

// The weights' location for a trainer: a config.json's directory (a Hugging Face checkpoint); for
// a built-in card its name, which the user replaces with the Hugging Face id (said in a note).
// Ring attention is in none of these frameworks: what to run instead, with the chosen degrees.
void ring_note(const ExportRequest& r, ExportedConfig& exported) {
  if (r.plan.ring <= 1) return;
  exported.notes.push_back(fmt::format(
      "ring attention: DeepSpeed has none; run USP's LongContextAttention(ulysses_degree={}, ring_degree={}) (yunchang) in the model, "
      "or Megatron-Core with context_parallel_size={}; the sequence split zigzag in 2 x {} chunks",
      r.plan.sp, r.plan.ring, r.plan.ring, r.plan.ring));
}

// How the planned run trains a mixture-of-experts model, and what it must not turn on.
void moe_note(const std::string& target, const ExportRequest& r, ExportedConfig& exported) {
  if (!r.model.is_moe()) return;
  if (target == "arctic-training")
    exported.notes.push_back("MoE: ArcticTraining swaps the experts for ArcticMoE whenever the model has experts (arctic_moe \"auto\", "
                             "arctic_training/model/moe on main) and trains it with ZeRO stage 2 at most; planned with "
                             "expert_parallel_size 1 (every rank holds every expert: expert parallelism is not modelled)");
  else if (r.plan.moe_aux_loss || r.model.output_router_logits)
    exported.notes.push_back("MoE: the model's own sparse-MoE block, a ZeRO-3 leaf module by default from DeepSpeed 0.18.0 (every "
                             "expert of a layer gathered at once); set output_router_logits true in the model's config: the plan "
                             "priced the auxiliary loss's kept, concatenated and one-hot router logits");
  else
    exported.notes.push_back("MoE: the model's own sparse-MoE block, a ZeRO-3 leaf module by default from DeepSpeed 0.18.0 (every "
                             "expert of a layer gathered at once); keep output_router_logits false: the auxiliary loss's "
                             "concatenation of every layer's router logits is not in the plan");
}

std::string model_name_or_path(const ExportRequest& r) {
  const std::filesystem::path source(r.model_source);
  if (source.extension() == ".json") return source.parent_path().empty() ? "." : source.parent_path().string();
  return r.model.name;
}
bool model_is_card(const ExportRequest& r) { return std::filesystem::path(r.model_source).extension() != ".json"; }

// transformers' attn_implementation for the plan's kernel (attention_kernel_for): FlashAttention-3
// needs its Hopper build installed (flash-attention hopper/, module flash_attn_interface).
std::string hf_attn_implementation(const ExportRequest& r, ExportedConfig& exported) {
  const std::string kernel = attention_kernel_for(r.profile, r.cluster.hardware, r.plan);
  if (kernel == "fa3")
    exported.notes.push_back("attention: flash_attention_3 needs FlashAttention-3's Hopper build (flash-attention hopper/, flash_attn_interface)");
  // SDPA asked for by name stays SDPA where its backend is FlashAttention-2's code (no flash_attn install).
  if (r.profile.attention_kernel == "sdpa" && attention_kernel_facts(kernel).sdpa_backend) return "sdpa";
  return std::string(attention_kernel_facts(kernel).hf_attn_implementation);
}

// The SDPA backend the step was priced with, where PyTorch picks it (the FSDP2 stacks): a run whose
// PyTorch prefers another backend takes a different time, so the export says which one to expect.
void sdpa_backend_note(const ExportRequest& r, ExportedConfig& exported) {
  const std::string kernel = attention_kernel_for(r.profile, r.cluster.hardware, r.plan);
  if (kernel != "sdpa-cudnn") return;
  exported.notes.push_back(fmt::format(
      "attention: the step is priced for SDPA's cuDNN backend, PyTorch's default on Hopper since 2.5 "
      "(torch.backends.cuda.cudnn_sdp_enabled()); where SDPA runs its flash backend instead, attention takes about {:.2f}x as "
      "long (plan --attention fa2 prices it)",
      attention_tflops(r.cluster.hardware, r.model.head_dim, "sdpa-cudnn") / attention_tflops(r.cluster.hardware, r.model.head_dim, "fa2")));
}

// The torchrun command that starts one process a GPU on every node (the first node's address and
// each node's index to fill in when there are several).
std::string torchrun_launch(const ExportRequest& r, const char* fallback) {
  const int64_t per_node = std::min(r.cluster.gpus, r.cluster.gpus_per_node);
  if (r.cluster.nodes == 1) return fmt::format("torchrun --nproc_per_node {} {}", per_node, shell_quote(main_file(r, fallback)));
  return fmt::format("torchrun --nnodes {} --node_rank NODE_INDEX --master_addr MAIN_NODE_ADDRESS --master_port 29500 --nproc_per_node {} {} "
                     "on each node", r.cluster.nodes, per_node, shell_quote(main_file(r, fallback)));
}

// An Accelerate YAML's machine keys: the processes over all machines, and on several nodes the
// first node's address (without them DeepSpeed's runner falls back to one node's ranks, REFERENCE
// §8; Accelerate's own launcher needs them as much).
void accelerate_machine_keys(YAML::Emitter& out, const ExportRequest& r) {
  out << YAML::Key << "num_processes" << YAML::Value << r.cluster.gpus;  // total over all machines
  out << YAML::Key << "num_machines" << YAML::Value << r.cluster.nodes;
  if (r.cluster.nodes > 1) {
    out << YAML::Key << "machine_rank" << YAML::Value << 0;
    out << YAML::Key << "main_process_ip" << YAML::Value << "MAIN_NODE_ADDRESS";
    out << YAML::Key << "main_process_port" << YAML::Value << 29500;
  }
}

}  // namespace

ExportedConfig arctic_training_recipe_emit(const ExportRequest& r) {
  const PlanOptions& p = r.plan;
  ExportedConfig exported;
  const std::string attn_implementation = hf_attn_implementation(r, exported);
  if (p.fpdt) exported.notes.push_back("FPDT: ArcticTraining has no FPDT (it exists only in Megatron-DeepSpeed); this recipe runs without it");
  if (p.zero_stage >= 1 && !p.activation_checkpointing)
    exported.notes.push_back("checkpointing off: model.disable_activation_checkpoint is set (ArcticTraining checkpoints by default)");
  exported.notes.push_back("versions: ArcticTraining >= 0.7.1 (key names of main: fused_adam, eval_interval), DeepSpeed >= 0.18.2, "
                           "liger-kernel >= 0.6.1 with model.type liger");
  if (attn_implementation == "flash_attention_3")
    // AT's model config imports flash_attn (FlashAttention-2's package) for flash_attention_3 too
    // (AT-main config/model.py L85-98), while FlashAttention-3's build installs flash_attn_interface.
    exported.notes.push_back("attention: ArcticTraining's validation imports the flash_attn package for flash_attention_3 too: install "
                             "FlashAttention-2 (flash-attn) beside FlashAttention-3's Hopper build, or the recipe fails validation");
  exported.notes.push_back(fmt::format("launch: arctic_training {} --num_gpus {}{}", main_file(r, "recipe.yml"),
                                       r.cluster.gpus_per_node < r.cluster.gpus ? r.cluster.gpus_per_node : r.cluster.gpus,
                                       r.cluster.nodes > 1 ? fmt::format(" --hostfile hostfile --num_nodes {} --master_addr MAIN_NODE --master_port 29500", r.cluster.nodes) : ""));
  if (r.seqlen % 256 != 0)
    exported.notes.push_back(fmt::format("max_length {} is not a multiple of data.div_length 256: the collator pads every batch to {} "
                                         "tokens, longer than planned", r.seqlen, (r.seqlen + 255) / 256 * 256));
  exported.notes.push_back("data.sources is a placeholder: put your dataset there");
  if (model_is_card(r))
    exported.notes.push_back(fmt::format("model.name_or_path is the card's name ({}): put the Hugging Face id or path of the weights", r.model.name));
  YAML::Emitter out;
  out.SetOutputCharset(YAML::EscapeNonAscii);  // values only: comments are written as they are
  const std::vector<std::string> header = header_lines(r, "ArcticTraining (arctic_training recipe.yml)", exported.notes);
  yaml_comments(out, header);
  out << YAML::BeginMap;
  // Only TrainerConfig keys: ArcticTraining forbids any other (pydantic extra="forbid", §1.2).
  out << YAML::Key << "type" << YAML::Value << "sft";
  out << YAML::Key << "micro_batch_size" << YAML::Value << p.micro_batch;
  out << YAML::Key << "gradient_accumulation_steps" << YAML::Value << 1;
  out << YAML::Key << "sequence_parallel_size" << YAML::Value << p.sp;
  out << YAML::Key << "activation_checkpoint_cpu_offload" << YAML::Value << p.checkpoint_offload;
  out << YAML::Key << "tiled_mlp_compute" << YAML::Value << p.tiled_mlp;
  out << YAML::Key << "model" << YAML::Value << YAML::BeginMap;
  // Liger's fused linear cross entropy is the tiled loss (with sp > 1 ArcticTraining tiles anyway).
  out << YAML::Key << "type" << YAML::Value << (p.tiled_loss ? "liger" : "huggingface");
  out << YAML::Key << "name_or_path" << YAML::Value;
  out << yaml_input_text(out, model_name_or_path(r));
  out << YAML::Key << "attn_implementation" << YAML::Value << attn_implementation;
  out << YAML::Key << "dtype" << YAML::Value << "bf16";
  out << YAML::Key << "disable_activation_checkpoint" << YAML::Value << !p.activation_checkpointing;
  out << YAML::EndMap;
  out << YAML::Key << "data" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "sources" << YAML::Value << YAML::BeginSeq << "REPLACE-WITH-YOUR-DATASET" << YAML::EndSeq;
  // Always emitted: unset, AT-main takes the model's max_position_embeddings (§1.5).
  out << YAML::Key << "max_length" << YAML::Value << r.seqlen;
  out << YAML::Key << "pack_samples" << YAML::Value << true;
  out << YAML::EndMap;
  out << YAML::Key << "optimizer" << YAML::Value << YAML::BeginMap;
  // With offload_optimizer the client optimizer must be DeepSpeed's CPU Adam (§1.6, §4.3).
  out << YAML::Key << "type" << YAML::Value << (p.offload_optimizer ? "cpu_adam" : "fused_adam");
  out << YAML::Key << "learning_rate" << YAML::Value << "1e-5";  // a "human" number (AT config/utils.py)
  out << YAML::EndMap;
  out << YAML::Key << "deepspeed" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "zero_optimization" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "stage" << YAML::Value << p.zero_stage;
  // pin_memory as the plan assumed it, whatever the installed DeepSpeed's default (false until
  // v0.19.4, true from v0.19.5: FRAMEWORKS §4.2).
  if (p.zero_stage >= 1) {
    out << YAML::Key << "offload_optimizer" << YAML::Value << YAML::Flow << YAML::BeginMap << YAML::Key << "device" << YAML::Value
        << (p.offload_optimizer ? "cpu" : "none");
    if (p.offload_optimizer) out << YAML::Key << "pin_memory" << YAML::Value << false;
    out << YAML::EndMap;
  }
  if (p.zero_stage == 3) {
    out << YAML::Key << "offload_param" << YAML::Value << YAML::Flow << YAML::BeginMap << YAML::Key << "device" << YAML::Value
        << (p.offload_params ? "cpu" : "none");
    if (p.offload_params) out << YAML::Key << "pin_memory" << YAML::Value << false;
    out << YAML::EndMap;
  }
  out << YAML::EndMap;
  if (p.sp > 1) out << YAML::Key << "seq_parallel_communication_data_type" << YAML::Value << "bf16";
  out << YAML::Key << "gradient_clipping" << YAML::Value << 1.0;
  out << YAML::EndMap;
  out << YAML::EndMap;
  exported.files.push_back({"", std::string(out.c_str()) + "\n"});
  return exported;
}

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
      "Trainer/TRL arguments: per_device_train_batch_size={} gradient_accumulation_steps=1 bf16=True gradient_checkpointing={} "
      "max_grad_norm=1.0{}; TRL: max_length={} pad_to_multiple_of={} packing=True packing_strategy=\"bfd\" (padding-free, with "
      "position_ids: mandatory from DeepSpeed 0.19.0; TRL >= 1.0 refuses padding_free=True without packing); load the model with "
      "attn_implementation=\"{}\" (= sp_attn_implementation)",
      p.micro_batch, p.activation_checkpointing ? "True" : "False", p.tiled_loss ? " use_liger_kernel=True" : "", r.seqlen, p.sp,
      attn_implementation));
  // Under SDPA a position_ids reset (a second sample packed in, padding) makes transformers
  // build a dense [B, 1, S, S] mask and leave the flash kernels (Reference §11 F3.5, F5.4).
  if (attn_implementation == "sdpa")
    exported.notes.push_back(fmt::format(
        "SDPA with packing: keep one sample of at least {} tokens per packed row (max_length a multiple of pad_to_multiple_of); a "
        "second sample's position_ids reset makes transformers build a dense [1, 1, S, S] mask ({:.0f} GiB at this length) and "
        "leave SDPA's flash and cuDNN kernels (Reference §11 F3.5)",
        r.seqlen, sdpa_dense_mask_bytes(r.seqlen) / kBytesPerGib));
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
  out.SetOutputCharset(YAML::EscapeNonAscii);  // values only: comments are written as they are
  const std::vector<std::string> header = header_lines(r, "Accelerate (accelerate launch --config_file)", exported.notes);
  yaml_comments(out, header);
  out << YAML::BeginMap;
  out << YAML::Key << "compute_environment" << YAML::Value << "LOCAL_MACHINE";
  out << YAML::Key << "distributed_type" << YAML::Value << "DEEPSPEED";
  // No mixed_precision key: with deepspeed_config_file Accelerate refuses any value (§2.5); HF
  // TrainingArguments(bf16=True) sets it, and the JSON's bf16 is "auto".
  accelerate_machine_keys(out, r);
  out << YAML::Key << "deepspeed_config" << YAML::Value << YAML::BeginMap;
  // Every DeepSpeed key arrives only through the JSON (the launcher drops unknown keys, §2.4).
  out << YAML::Key << "deepspeed_config_file" << YAML::Value;
  out << yaml_input_text(out, r.deepspeed_json_name);
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
  exported.notes.push_back(fmt::format(
      "Trainer/TRL arguments: per_device_train_batch_size={} gradient_accumulation_steps=1 bf16=True gradient_checkpointing={}{}; "
      "TRL: max_length={}{} packing=False (refused under CP){}; load the model with attn_implementation=\"sdpa\" "
      "(the Trainer refuses CP with another)",
      p.micro_batch, trainer_checkpointing ? "True" : "False",
      !trainer_checkpointing ? ""
      : p.trl_activation_offload ? " activation_offloading=True (TRL's offload of the checkpoints to pinned host memory)"
                                 : " gradient_checkpointing_kwargs={\"offload\": True} (transformers' checkpoint offload to pinned host memory)",
      // CP's load balancer splits each sequence in 2 x cp chunks (F2.6); without CP nothing needs padding.
      r.seqlen, cp > 1 ? fmt::format(" pad_to_multiple_of={}", 2 * cp) : "",
      p.tiled_loss ? " loss_type=\"chunked_nll\" (TRL's default, 256-token chunks)" : " loss_type=\"nll\""));
  exported.notes.push_back(std::string("versions: Accelerate >= 1.11 (parallelism_config with cp), PyTorch >= 2.6 (context parallelism), TRL >= ") +
                           (p.tiled_loss ? "1.13 (chunked_nll without the fp32 lm_head copy)" : "1.9") +
                           (trainer_checkpointing && !p.trl_activation_offload ? ", transformers >= 5.17 (gradient_checkpointing_kwargs offload; 5.16 "
                                                                                  "ignores it and offloads nothing)" : ""));
  sdpa_backend_note(r, exported);
  exported.notes.push_back(fmt::format("launch: accelerate launch --config_file {} train.py", main_file(r, "accelerate-fsdp2.yaml")));
  if (r.cluster.nodes > 1)
    exported.notes.push_back(fmt::format("{} nodes: run accelerate launch on every node with --machine_rank set to its index, and "
                                         "MAIN_NODE_ADDRESS (main_process_ip) the first node's address", r.cluster.nodes));
  YAML::Emitter out;
  out.SetOutputCharset(YAML::EscapeNonAscii);  // values only: comments are written as they are
  const std::vector<std::string> header = header_lines(r, "Accelerate with FSDP2 and context parallelism (accelerate launch --config_file)", exported.notes);
  yaml_comments(out, header);
  out << YAML::BeginMap;
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
  return exported;
}

// A torchtitan job (its TOML; Reference §11 F6.1-F6.4): FSDP2 over dp_shard x cp (HSDP with
// dp_replicate), PyTorch context parallelism with the plan's rotation, full activation
// checkpointing, its default precision (fp32 shards, bf16 gather, fp32 reduce).
ExportedConfig torchtitan_job_emit(const ExportRequest& r) {
  const PlanOptions& p = r.plan;
  ExportedConfig exported;
  const TorchtitanFlavor flavor = torchtitan_flavor(r.model);
  // parallelize_llama asserts seq_len % (tp * 2 * cp) == 0 whatever cp is (tp = 1 here; Reference
  // §11, added 2026-11-26): a length off that grid is written rounded down, which fits as well.
  const int64_t seq_len_multiple = 2 * p.ring;
  const int64_t seq_len = r.seqlen / seq_len_multiple * seq_len_multiple;
  if (seq_len != r.seqlen)
    exported.notes.push_back(fmt::format("seq_len {} is {} rounded down to a multiple of 2 x cp = {} (parallelize_llama asserts seq_len "
                                         "% (tp x 2 x cp) == 0)", seq_len, r.seqlen, seq_len_multiple));
  if (p.sp > 1) exported.notes.push_back("Ulysses: not expressed (torchtitan's sequence parallelism is context parallelism)");
  if (p.zero_stage != 3) exported.notes.push_back(fmt::format("ZeRO-{}: not expressed (torchtitan shards fully with FSDP2)", p.zero_stage));
  if (p.tiled_mlp || p.tiled_loss || p.fpdt || p.checkpoint_offload)
    exported.notes.push_back("tiled MLP / tiled loss / FPDT / checkpoint offload: not in torchtitan's job config; not expressed");
  if (flavor.flavor.empty())
    exported.notes.push_back(fmt::format("model: {} is none of torchtitan's flavors (llama3 8B, 70B, 405B; qwen3 8B, 14B, 32B, 30B-A3B); "
                                         "[model] name and flavor must name one", r.model.name));
  sdpa_backend_note(r, exported);
  exported.notes.push_back(fmt::format("launch: torchrun --nproc_per_node {} -m torchtitan.train --job.config_file {}{}", r.cluster.gpus_per_node,
                                       main_file(r, "torchtitan.toml"),
                                       r.cluster.nodes > 1 ? fmt::format(" on each of the {} nodes (--nnodes {} and a rendezvous endpoint)",
                                                                         r.cluster.nodes, r.cluster.nodes)
                                                           : ""));
  // torchtitan main replaced TOML job files by Python config registries after v0.2.2 (9810191bbb;
  // its --job.config_file raises "--module is required"): this file is v0.2.2's.
  exported.notes.push_back("versions: torchtitan 0.2.2 exactly (the last release that reads a TOML job; main reads Python config "
                           "registries and refuses --job.config_file), PyTorch >= 2.6 (context parallelism)");
  exported.notes.push_back("[model] hf_assets_path is a placeholder: the tokenizer's folder");
  // Its dataloader takes registered names only (c4, c4_test, c4_validation: datasets/hf_datasets.py).
  exported.notes.push_back("[training] dataset is c4, torchtitan's registered default (streamed from the Hugging Face hub); for your "
                           "data, add an entry to DATASETS in torchtitan/datasets/hf_datasets.py and name it here");
  const std::vector<std::string> header = header_lines(r, "torchtitan (torchrun -m torchtitan.train --job.config_file)", exported.notes);
  std::string text = hash_comments(header);
  text += "\n[job]\ndump_folder = \"./outputs\"\n";
  text += "description = " + toml_basic_string(fmt::format("longseq plan: {} at {} tokens", r.model.name, r.seqlen)) + "\n";
  text += fmt::format("\n[model]\nname = \"{}\"\nflavor = \"{}\"\nhf_assets_path = \"REPLACE-WITH-THE-TOKENIZER-FOLDER\"\n",
                      flavor.flavor.empty() ? "REPLACE-WITH-A-MODEL" : flavor.model_name, flavor.flavor.empty() ? "REPLACE-WITH-A-FLAVOR" : flavor.flavor);
  text += "\n[optimizer]\nname = \"AdamW\"\nlr = 8e-4\n";
  // fp32 shards, bf16 gathers, fp32 reduce-scatters: torchtitan's defaults, written out (F6.4);
  // enable_cpu_offload is CPUOffloadPolicy.
  text += fmt::format("\n[training]\nlocal_batch_size = {}\nseq_len = {}\nsteps = 1000\ndataset = \"c4\"\n"
                      "mixed_precision_param = \"bfloat16\"\nmixed_precision_reduce = \"float32\"\nenable_cpu_offload = {}\n",
                      p.micro_batch, seq_len, p.offload_params && p.offload_optimizer ? "true" : "false");
  // FSDP shards over dp_shard x cp (F6.2); -1 takes the ranks the other degrees leave.
  text += fmt::format("\n[parallelism]\ndata_parallel_replicate_degree = {}\ndata_parallel_shard_degree = -1\n"
                      "fsdp_reshard_after_forward = \"default\"\ntensor_parallel_degree = 1\ncontext_parallel_degree = {}\n"
                      "context_parallel_rotate_method = \"{}\"\n",
                      p.dp_replicate, p.ring, p.cp_all_to_all ? "alltoall" : "allgather");
  text += fmt::format("\n[activation_checkpoint]\nmode = \"{}\"\n", p.activation_checkpointing ? "full" : "none");
  exported.files.push_back({"", text});
  return exported;
}

// An Unsloth script (Reference §12 items 25-40): FastLanguageModel with the planned length, a 4-bit
// base for QLoRA, get_peft_model with the planned adapters and its offloaded checkpointing, TRL's
// SFTTrainer (Unsloth's fused, chunked cross entropy runs by itself).
ExportedConfig unsloth_script_emit(const ExportRequest& r) {
  const PlanOptions& p = r.plan;
  ExportedConfig exported;
  if (p.sequence_ranks() > 1 || p.zero_stage > 0 || p.offload_optimizer || p.offload_params || p.fpdt)
    exported.notes.push_back("sequence parallelism, ZeRO, offload of states, FPDT: not expressed (Unsloth trains on one GPU)");
  exported.notes.push_back("the plan priced Unsloth's LoRA layers with PEFT's saved tensors; its fused LoRA kernels save fewer (item 37)");
  // Unsloth pins trl<=0.24.0, which accepts every SFTConfig argument this script passes.
  exported.notes.push_back(std::string("versions: unsloth >= 2025.9 with unsloth_zoo (offloaded checkpointing, fused cross entropy), TRL "
                                       "0.24 (Unsloth pins trl<=0.24.0)") +
                           (p.qlora || p.adam_8bit ? ", bitsandbytes >= 0.45" : ""));
  exported.notes.push_back(fmt::format("launch: python {}", main_file(r, "train_unsloth.py")));
  exported.notes.push_back("the dataset is a placeholder: put yours in load_dataset(...)");
  if (model_is_card(r))
    exported.notes.push_back(fmt::format("MODEL is the card's name ({}): put the Hugging Face id or path of the weights", r.model.name));
  const std::vector<std::string> header = header_lines(r, "Unsloth (python script)", exported.notes);
  std::string text = hash_comments(header);
  text += "from unsloth import FastLanguageModel  # first: it patches transformers and TRL\nimport torch\n"
          "from datasets import load_dataset\nfrom trl import SFTConfig, SFTTrainer\n\n";
  text += fmt::format("MODEL = {}\nMAX_SEQ_LENGTH = {}\n\n", python_string_literal(model_name_or_path(r)), r.seqlen);
  std::string load = fmt::format("model_name=MODEL, max_seq_length=MAX_SEQ_LENGTH, dtype=torch.bfloat16, load_in_4bit={}",
                                 p.qlora ? "True" : "False");
  if (!p.lora()) load += ", full_finetuning=True";
  if (p.tiled_mlp) load += ", unsloth_tiled_mlp=True";  // item 34
  text += fmt::format("model, tokenizer = FastLanguageModel.from_pretrained({})\n", load);
  const std::string checkpointing = !p.activation_checkpointing ? "False" : p.checkpoint_offload ? "\"unsloth\"" : "True";
  if (p.lora()) {
    const std::string targets = lora_target_modules(r);
    // Its defaults (item 40) but for the planned rank and targets: dropout 0 and no bias install
    // the fused kernels.
    text += fmt::format("model = FastLanguageModel.get_peft_model(model, r={}, lora_alpha={}, lora_dropout=0, bias=\"none\",\n"
                        "                                      target_modules=[{}], use_gradient_checkpointing={})\n",
                        p.lora_rank, p.lora_rank, targets, checkpointing);
  }
  std::string config = fmt::format("output_dir=\"out\", max_length=MAX_SEQ_LENGTH, per_device_train_batch_size={}, "
                                   "gradient_accumulation_steps=1, bf16=True", p.micro_batch);
  if (!p.lora()) config += fmt::format(",\n                 gradient_checkpointing={}", p.activation_checkpointing ? "True" : "False");
  if (p.adam_8bit) config += ", optim=\"adamw_8bit\"";
  text += fmt::format("args = SFTConfig({})\n", config);
  text += "trainer = SFTTrainer(model=model, processing_class=tokenizer, args=args,\n"
          "                     train_dataset=load_dataset(\"REPLACE-WITH-YOUR-DATASET\", split=\"train\"))\n";
  text += "trainer.train()\n";
  exported.files.push_back({"", text});
  return exported;
}

// A TRL SFTTrainer script for the plain HF Trainer path, with PEFT's LoraConfig and bitsandbytes'
// BitsAndBytesConfig when the plan trains adapters (Reference §12 items 5, 8, 13, 15-16; §11 F5.1-F5.7).
ExportedConfig hf_trainer_script_emit(const ExportRequest& r) {
  const PlanOptions& p = r.plan;
  ExportedConfig exported;
  const std::string attn_implementation = hf_attn_implementation(r, exported);
  if (p.sp > 1 || p.ring > 1) exported.notes.push_back("sequence parallelism: not expressed (the plain Trainer has none; --emit accelerate or accelerate-fsdp2)");
  if (p.zero_stage > 0 || p.offload_optimizer || p.offload_params) exported.notes.push_back("ZeRO and offload: not expressed (--emit accelerate for DeepSpeed)");
  if (p.tiled_mlp || p.fpdt) exported.notes.push_back("tiled MLP / FPDT: not expressed");
  exported.notes.push_back(std::string("versions: transformers >= 4.56 (from_pretrained(dtype=...)), TRL >= 0.26") +
                           (p.lora() ? ", PEFT >= 0.17" : "") + (p.qlora || p.adam_8bit ? ", bitsandbytes >= 0.45" : "") +
                           (p.tiled_loss ? ", liger-kernel >= 0.6.1 (use_liger_kernel)" : "") +
                           (p.checkpoint_offload && !p.trl_activation_offload ? "; transformers >= 5.17 for gradient_checkpointing_kwargs offload (the "
                                                                                 "script checks it)" : ""));
  exported.notes.push_back(r.cluster.gpus > 1 ? fmt::format("launch: {} (DDP: a replica a GPU)", torchrun_launch(r, "train.py"))
                                               : fmt::format("launch: python {}", main_file(r, "train.py")));
  exported.notes.push_back("the dataset is a placeholder: put yours in load_dataset(...)");
  if (model_is_card(r))
    exported.notes.push_back(fmt::format("MODEL is the card's name ({}): put the Hugging Face id or path of the weights", r.model.name));
  const std::vector<std::string> header = header_lines(r, "the HF Trainer / TRL (python script)", exported.notes);
  std::string text = hash_comments(header);
  text += "import torch\nfrom datasets import load_dataset\nfrom transformers import AutoModelForCausalLM";
  text += p.qlora ? ", BitsAndBytesConfig\n" : "\n";
  const bool transformers_offload = p.activation_checkpointing && p.checkpoint_offload && !p.trl_activation_offload;
  if (transformers_offload)
    // gradient_checkpointing_kwargs={"offload": True} shipped in transformers 5.17; 5.16 accepts the
    // key and offloads nothing, so the planned length would not fit (TRL's 1M example checks too).
    text += "import transformers\nfrom packaging.version import Version\n";
  if (p.lora()) text += "from peft import LoraConfig\n";
  text += "from trl import SFTConfig, SFTTrainer\n\n";
  if (transformers_offload)
    text += "if Version(transformers.__version__) < Version(\"5.17\"):\n"
            "    raise SystemExit(\"the plan offloads checkpoints with gradient_checkpointing_kwargs={'offload': True}, which needs \"\n"
            "                     \"transformers >= 5.17; this is \" + transformers.__version__)\n\n";
  text += fmt::format("MODEL = {}\n\n", python_string_literal(model_name_or_path(r)));
  std::string load_arguments = fmt::format("dtype=torch.bfloat16, attn_implementation=\"{}\"", attn_implementation);
  if (p.qlora) {
    // The QLoRA recipes' settings, not transformers' defaults (fp4, no double quantization, fp32
    // compute; item 16): NF4, double quantization, bf16 compute, as the plan priced.
    text += "quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=\"nf4\", bnb_4bit_use_double_quant=True,\n"
            "                                  bnb_4bit_compute_dtype=torch.bfloat16)\n";
    load_arguments += ", quantization_config=quantization";
  }
  text += fmt::format("model = AutoModelForCausalLM.from_pretrained(MODEL, {})\n", load_arguments);
  if (p.lora()) {
    const std::string targets = lora_target_modules(r);
    // Adapters stay fp32 (autocast_adapter_dtype's default, item 8); with a 4-bit base TRL casts
    // them to bf16 (item 13): what the plan priced either way (the hf-trainer profile).
    text += fmt::format("peft_config = LoraConfig(r={}, lora_alpha={}, lora_dropout=0.0, target_modules=[{}], task_type=\"CAUSAL_LM\")\n",
                        p.lora_rank, p.lora_rank, targets);
  }
  std::string config = fmt::format("output_dir=\"out\", max_length={}, per_device_train_batch_size={}, gradient_accumulation_steps=1, bf16=True",
                                   r.seqlen, p.micro_batch);
  config += fmt::format(",\n                 gradient_checkpointing={}", p.activation_checkpointing ? "True" : "False");
  // Checkpoint offload: TRL's activation offloading when the plan holds it (F5.2), else transformers'.
  if (p.activation_checkpointing && p.checkpoint_offload)
    config += p.trl_activation_offload ? ", activation_offloading=True" : ", gradient_checkpointing_kwargs={\"offload\": True}";
  if (p.tiled_loss) config += ", use_liger_kernel=True";
  // bitsandbytes' AdamW8bit (Reference §12 item 23), not its paged variant: paged state lives in
  // CUDA managed memory outside the allocator the plan counts (item 24).
  if (p.adam_8bit) config += ", optim=\"adamw_8bit\"";
  text += fmt::format("args = SFTConfig({})\n", config);
  text += fmt::format("trainer = SFTTrainer(model=model, args=args, train_dataset=load_dataset(\"REPLACE-WITH-YOUR-DATASET\", split=\"train\"){})\n",
                      p.lora() ? ", peft_config=peft_config" : "");
  text += "trainer.train()\n";
  exported.files.push_back({"", text});
  return exported;
}

ExportedConfig megatron_deepspeed_emit(const ExportRequest& r) {
  const PlanOptions& p = r.plan;
  const ModelSpec& m = r.model;
  ExportedConfig exported;
  if (p.tiled_mlp || p.tiled_loss)
    exported.notes.push_back("tiled MLP / tiled loss: Megatron-DeepSpeed chunks the FFN and the loss only inside FPDT; not expressed");
  if (p.fpdt && !(m.mlp_kind == MlpKind::mlp_kind_gelu && m.mlp_bias && m.qkv_bias))
    exported.notes.push_back("FPDT: Megatron-DeepSpeed's FPDT layer needs a GPT-shaped model (GeLU MLP with bias, biased q/k/v); " + m.name +
                             " is not, so these arguments fail as written");
  if (p.fpdt && p.fpdt_chunk_tokens % (32 * p.sp) != 0)
    exported.notes.push_back(fmt::format("FPDT chunk {} is not a multiple of 32 x sp = {} (FPDT's loss chunks need it)", p.fpdt_chunk_tokens,
                                         32 * p.sp));
  exported.notes.push_back(p.fpdt ? "versions: Megatron-DeepSpeed main with FPDT (676a482c or later); DeepSpeed >= 0.19.1 with flash-attn "
                                    "2.7 (DeepSpeed 0.16.1-0.19.0 call flash-attn <= 2.6.3 only, FRAMEWORKS §3.2)"
                                  : "versions: Megatron-DeepSpeed main (676a482c or later), DeepSpeed >= 0.10.2, flash-attn 2.x");
  if (!m.rope_scaling.empty())
    exported.notes.push_back(fmt::format("RoPE scaling '{}' of {} is not expressed: Megatron-DeepSpeed's rotary embedding has no such "
                                         "scaling, so positions train with the plain base", m.rope_scaling, m.name));
  if (m.rope_theta != std::floor(m.rope_theta))
    exported.notes.push_back(fmt::format("RoPE base {} is not a whole number; --rotary-position-embeddings-theta takes an int", m.rope_theta));
  exported.notes.push_back("data, tokenizer and schedule arguments (--data-path, --tokenizer-type/--tokenizer-model, --train-iters, --lr) are yours");
  if (r.cluster.nodes > 1)
    exported.notes.push_back(fmt::format("{} nodes: write `hostfile` with one `HOSTNAME slots={}` line per node and run the script on the "
                                         "first node (DeepSpeed's launcher starts the others); the DeepSpeed JSON is named by absolute "
                                         "path, so every node must see it at the same path", r.cluster.nodes, r.cluster.gpus_per_node));
  const bool swiglu = m.mlp_kind == MlpKind::mlp_kind_swiglu;
  std::vector<std::string> args = {
      fmt::format("--num-layers {}", m.num_layers), fmt::format("--hidden-size {}", m.hidden_size),
      fmt::format("--ffn-hidden-size {}", m.intermediate_size),  // always: the default is not the model's (§3.5)
      fmt::format("--num-attention-heads {}", m.num_q_heads), fmt::format("--num-key-value-heads {}", m.num_kv_heads),
      fmt::format("--kv-channels {}", m.head_dim), fmt::format("--seq-length {}", r.seqlen),
      fmt::format("--max-position-embeddings {}", r.seqlen)};
  if (swiglu) args.push_back("--swiglu");
  args.push_back(m.norm_kind == NormKind::norm_kind_rmsnorm ? "--normalization rmsnorm" : "--normalization layernorm");
  // The base always: Megatron's default is 10000, not Llama 3's 500000 or Qwen3's 1000000 (§3.5).
  args.push_back(fmt::format("--use-rotary-position-embeddings --rotary-position-embeddings-theta {:.0f}", std::floor(m.rope_theta)));
  if (!m.tied_embeddings) args.push_back("--untie-embeddings-and-output-weights");
  if (!m.qkv_bias && !m.mlp_bias) args.push_back("--disable-bias-linear");
  args.push_back("--attention-dropout 0 --hidden-dropout 0");
  args.push_back(fmt::format("--micro-batch-size {} --global-batch-size {}", p.micro_batch, p.micro_batch * data_parallel(r)));
  args.push_back(fmt::format("--ds-sequence-parallel-size {}", p.sp));
  if (p.fpdt)  // the offloading switch keeps the chunks in host memory (default off, REFERENCE §8)
    args.push_back(fmt::format("--ds-sequence-parallel-fpdt --ds-sequence-parallel-fpdt-chunk-size {} --ds-sequence-parallel-fpdt-offloading",
                               p.fpdt_chunk_tokens));
  args.push_back("--use-flash-attn-v2 --tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 --no-pipeline-parallel");
  if (p.activation_checkpointing) {
    args.push_back("--checkpoint-activations --deepspeed-activation-checkpointing");
    if (p.checkpoint_offload) args.push_back("--checkpoint-in-cpu");
  }
  args.push_back(fmt::format("--bf16 --zero-stage {}", p.zero_stage));  // zero.Init only at 3; the JSON sets the engine's stage
  if (p.offload_optimizer) args.push_back("--cpu-optimizer");  // DeepSpeedCPUAdam, required with offload_optimizer (§3.4)
  args.push_back("--deepspeed --deepspeed_config " + shell_quote(r.deepspeed_json_name));
  std::string script = "#!/usr/bin/env bash\n";
  script += hash_comments(header_lines(r, "Megatron-DeepSpeed (pretrain_gpt.py)", exported.notes));
  script += fmt::format("deepspeed{} --num_gpus {} pretrain_gpt.py \\\n",
                        r.cluster.nodes > 1 ? fmt::format(" --hostfile hostfile --num_nodes {}", r.cluster.nodes) : "",
                        std::min(r.cluster.gpus, r.cluster.gpus_per_node));
  for (size_t i = 0; i < args.size(); ++i) script += "  " + args[i] + (i + 1 < args.size() ? " \\\n" : "\n");
  exported.files.push_back({"", script});
  // Megatron fills nothing: the batch keys equal --micro-batch-size and --global-batch-size (§3.4).
  nlohmann::json config = deepspeed_common(r);
  config["train_micro_batch_size_per_gpu"] = p.micro_batch;
  config["train_batch_size"] = p.micro_batch * data_parallel(r);
  config["gradient_clipping"] = 1.0;
  config["longseq_plan"] = json_record(r, "Megatron-DeepSpeed");
  exported.files.push_back({".deepspeed.json", json_text(config) + "\n"});
  return exported;
}

ExportedConfig deepspeed_config_emit(const ExportRequest& r) {
  const PlanOptions& p = r.plan;
  ExportedConfig exported;
  for (const auto& line : record_lines(r, "a plain deepspeed.initialize loop")) exported.notes.push_back(line);
  if (p.sp > 1)
    exported.notes.push_back("Ulysses: call UlyssesSPAttentionHF.register_with_transformers and wrap the DataLoader in "
                             "UlyssesSPDataLoaderAdapter (DeepSpeed >= 0.18.2); sequence_parallel_size alone does not switch it on");
  if (p.activation_checkpointing) exported.notes.push_back("activation checkpointing: model.gradient_checkpointing_enable() in the script");
  if (p.checkpoint_offload)
    exported.notes.push_back("checkpoint offload: ArcticTraining's CheckpointFunction CPU-offload patch (DeepSpeed's cpu_checkpointing "
                             "acts only through deepspeed.checkpointing)");
  if (p.tiled_mlp) exported.notes.push_back("tiled MLP: deepspeed.runtime.sequence_parallel.ulysses_sp.TiledMLP in the script");
  if (p.tiled_loss) exported.notes.push_back("tiled loss: TiledFusedLogitsLoss (DeepSpeed >= 0.17.4) or Liger's fused CE in the script");
  if (p.fpdt) exported.notes.push_back("FPDT: only in Megatron-DeepSpeed (--emit megatron-deepspeed); not expressed here");
  nlohmann::json config = deepspeed_common(r);
  // Nothing fills "auto" in a plain loop (§4.1): dp-based integers; clipping explicit (its
  // default moved from 0 to 1.0 in v0.19.3, §4.4).
  config["train_micro_batch_size_per_gpu"] = p.micro_batch;
  config["gradient_accumulation_steps"] = 1;
  // DeepSpeed's mesh knows only the Ulysses group (sequence_parallel_size): the world over it is
  // its data-parallel size, so a ring's ranks count as replicas and its batch check wants
  // micro x world / sp ("train_batch_size 1 != 1 * 1 * 2" otherwise).
  config["train_batch_size"] = p.micro_batch * r.cluster.gpus / p.sp;
  if (p.ring > 1)
    exported.notes.push_back(fmt::format(
        "USP's groups: DeepSpeed sees sequence_parallel_size={} only and counts the {} ring ranks of a sequence as data-parallel "
        "replicas (train_batch_size {} = micro x world / sp); build the groups with yunchang's set_seq_parallel_pg({}, {}, rank, "
        "world_size), give the {} ranks of one ring the same sample (each keeps its zigzag chunks), and average the loss over "
        "them as DeepSpeed averages gradients: each rank's mean over its chunk", p.sp, p.ring, p.micro_batch * r.cluster.gpus / p.sp,
        p.sp, p.ring, p.ring));
  config["gradient_clipping"] = 1.0;
  // Optimizer offload needs DeepSpeed to build its CPU Adam from this block (no client optimizer, §4.3).
  config["optimizer"] = {{"type", "AdamW"}, {"params", {{"lr", 1e-5}, {"betas", {0.9, 0.95}}, {"eps", 1e-8}, {"weight_decay", 0.0}}}};
  if (p.offload_optimizer) exported.notes.push_back("optimizer offload: pass no optimizer to deepspeed.initialize (the JSON's AdamW becomes CPU Adam)");
  config["longseq_plan"] = json_record(r, "a plain deepspeed.initialize loop");
  exported.files.push_back({"", json_text(config) + "\n"});
  return exported;
}

bool export_writes_deepspeed_json(const std::string& target) {
  return target == "accelerate" || target == "hf-accelerate" || target == "megatron-deepspeed";
}

ExportedConfig config_emit(const std::string& target, const ExportRequest& request) {
  ExportedConfig exported;
  if (target == "arctic-training") exported = arctic_training_recipe_emit(request);
  else if (target == "accelerate" || target == "hf-accelerate") exported = accelerate_config_emit(request);
  else if (target == "accelerate-fsdp2") exported = accelerate_fsdp2_config_emit(request);
  else if (target == "hf-trainer") exported = hf_trainer_script_emit(request);
  else if (target == "torchtitan") exported = torchtitan_job_emit(request);
  else if (target == "unsloth") exported = unsloth_script_emit(request);
  else if (target == "megatron-deepspeed") exported = megatron_deepspeed_emit(request);
  else if (target == "deepspeed" || target == "usp") exported = deepspeed_config_emit(request);
  if (!exported.files.empty()) {
    if (target != "accelerate-fsdp2" && target != "torchtitan" && target != "unsloth") ring_note(request, exported);  // theirs is PyTorch's CP, in the file
    moe_note(target, request, exported);
    return exported;
  }
  throw ConfigError("--emit", "", fmt::format("expected arctic-training, accelerate, accelerate-fsdp2, hf-trainer, unsloth, torchtitan, "
                                              "megatron-deepspeed, deepspeed or usp, got '{}'", target));
}

}  // namespace longseq
