// common.cpp: the exporters' shared helpers (common.hpp says what each is for).
#include "reports/exporters/common.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <system_error>
#include <fmt/format.h>

#include "io/text_escape.hpp"
#include "models/adapters.hpp"
#include "planner/time_model.hpp"
#include "planner/units.hpp"
#include "io/config_error.hpp"
#include "reports/memory_report.hpp"

namespace longseq::exporters {

int64_t data_parallel(const ExportRequest& r) { return data_parallel_ranks(r.cluster, r.plan); }

RopeExtension rope_extension(const ExportRequest& r) {
  const ModelSpec& m = r.model;
  // A model that scales RoPE already (Llama 3.1's llama3, Gemma 3's linear, a YaRN config) keeps its
  // scaling: YaRN over its extended window on the unscaled base would not be the model's positions.
  // Past that window the plan's caveat speaks; the exports set nothing.
  if (m.max_position_embeddings <= 0 || r.seqlen <= m.max_position_embeddings || !m.rope_scaling.empty()) return {};
  return {(r.seqlen + m.max_position_embeddings - 1) / m.max_position_embeddings, m.max_position_embeddings, m.rope_theta};
}

std::string rope_scaling_keyword(const RopeExtension& extension) {
  return fmt::format("rope_scaling={{\"rope_type\": \"yarn\", \"factor\": {}.0, \"original_max_position_embeddings\": {}, \"rope_theta\": {:.1f}}}",
                     extension.factor, extension.original_window, extension.rope_theta);
}

std::string rope_extension_note(const ExportRequest& r, const RopeExtension& extension, const std::string& where) {
  return fmt::format("RoPE past the trained positions: {} tokens against the model's {} (max_position_embeddings); {}: {}",
                     integer_with_commas(r.seqlen), integer_with_commas(extension.original_window), where,
                     rope_scaling_keyword(extension));
}

int64_t accumulation_steps(const ExportRequest& r) { return gradient_accumulation_steps(r.cluster, r.plan); }

int64_t global_batch(const ExportRequest& r) { return r.plan.micro_batch * data_parallel(r) * accumulation_steps(r); }

// What every file records about the plan it was written from.
std::vector<std::string> record_lines(const ExportRequest& r, const char* target) {
  return {fmt::format("written by longseq for {} from a PREDICTED plan: {}", target, plan_describe(r.plan)),
          fmt::format("model {} ({} parameters), sequence length {} tokens, micro batch {}{}, {} GPUs ({} node(s)), sp={} dp={}",
                      r.model.name, integer_with_commas(parameter_count(r.model).total), integer_with_commas(r.seqlen),
                      r.plan.micro_batch,
                      accumulation_steps(r) > 1 ? fmt::format(" x {} accumulation steps (global batch {})", accumulation_steps(r), global_batch(r))
                                                : "",
                      r.cluster.gpus, r.cluster.nodes, r.plan.sp, data_parallel(r)),
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

std::vector<std::string> adapter_notes(const ExportRequest& r, const std::string& how_trained) {
  const PlanOptions& p = r.plan;
  if (!p.lora()) return {};
  std::vector<std::string> notes = {fmt::format("adapters: SFTTrainer(..., peft_config=LoraConfig(r={}, lora_alpha={}, lora_dropout=0.0, "
                                                "target_modules=[{}], task_type=\"CAUSAL_LM\")) (PEFT; {})",
                                                p.lora_rank, p.lora_rank, lora_target_modules(r), how_trained)};
  // A sharded base needs the packed weights in a floating dtype: ZeRO-3 partitions only the
  // model's dtype (Reference §12 item 14, PEFT's DeepSpeed guide) and Accelerate 1.15's FSDP2
  // leaves uint8 Params4bit unsharded (fsdp_utils.py fsdp2_prepare_model, its ignored_params).
  // NF4, double quantization and bf16 compute are the recipes' (item 16).
  if (p.qlora)
    notes.push_back(std::string("4-bit base: from_pretrained(..., dtype=torch.bfloat16, quantization_config=BitsAndBytesConfig("
                                "load_in_4bit=True, bnb_4bit_quant_type=\"nf4\", bnb_4bit_use_double_quant=True, "
                                "bnb_4bit_compute_dtype=torch.bfloat16") +
                    (p.zero_stage == 3 ? ", bnb_4bit_quant_storage=torch.bfloat16))  (the packed weights are sharded only in a floating "
                                         "dtype: PEFT's DeepSpeed and FSDP guides)"
                                       : "))"));
  return notes;
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
          {"gradient_accumulation_steps", accumulation_steps(r)},
          {"global_batch", global_batch(r)},
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
// emitter escapes every non-ASCII character (yaml_document_begin).
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

void yaml_document_begin(YAML::Emitter& out, const ExportRequest& r, const char* target, const std::vector<std::string>& notes) {
  out.SetOutputCharset(YAML::EscapeNonAscii);  // values only: comments are written as they are
  yaml_comments(out, header_lines(r, target, notes));
  out << YAML::BeginMap;
}

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
  else {
    // How the block's experts are gathered: with their decoder layer's FSDP2 unit (Accelerate wraps
    // each decoder layer, Reference §11 F1.16), or as a ZeRO-3 leaf module (DeepSpeed 0.18.0 on).
    const char* gathered = target == "accelerate-fsdp2" ? "gathered with its decoder layer's FSDP2 unit (every expert of a layer at once)"
                                                        : "a ZeRO-3 leaf module by default from DeepSpeed 0.18.0 (every expert of a layer "
                                                          "gathered at once)";
    exported.notes.push_back(
        r.plan.moe_aux_loss || r.model.output_router_logits
            ? fmt::format("MoE: the model's own sparse-MoE block, {}; set output_router_logits true in the model's config: the plan "
                          "priced the auxiliary loss's kept, concatenated and one-hot router logits", gathered)
            : fmt::format("MoE: the model's own sparse-MoE block, {}; keep output_router_logits false: the auxiliary loss's "
                          "concatenation of every layer's router logits is not in the plan", gathered));
  }
}

namespace {

// Whether --model was a Hugging Face id, an organization and a repository ("meta-llama/Llama-3.1-8B"),
// rather than a card's name or a file here: Hub ids are letters, digits, '-', '_' and '.', one '/'
// between two names (huggingface_hub's validate_repo_id), and no such file exists (a card file or a
// config.json the model was read from does).
bool model_source_is_hub_id(const std::string& source) {
  const size_t slash = source.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == source.size() || source.find('/', slash + 1) != std::string::npos) return false;
  for (char c : source)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' || c == '/')) return false;
  std::error_code ignored;
  return source[0] != '.' && !std::filesystem::exists(source, ignored);
}

}  // namespace

// The weights' location for a trainer: a config.json's directory (a Hugging Face checkpoint), the
// Hub id the user gave, or for a built-in card its name, which the user replaces (card_name_note).
std::string model_name_or_path(const ExportRequest& r) {
  const std::filesystem::path source(r.model_source);
  if (source.extension() == ".json") return source.parent_path().empty() ? "." : source.parent_path().string();
  if (model_source_is_hub_id(r.model_source)) return r.model_source;  // the weights the user named
  return r.model.name;
}
bool model_is_card(const ExportRequest& r) {
  return std::filesystem::path(r.model_source).extension() != ".json" && !model_source_is_hub_id(r.model_source);
}

void card_name_note(const ExportRequest& r, const char* where, ExportedConfig& exported) {
  if (model_is_card(r))
    exported.notes.push_back(fmt::format("{} is the card's name ({}): put the Hugging Face id or path of the weights", where, r.model.name));
}

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

}  // namespace longseq::exporters
