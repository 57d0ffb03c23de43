// common.hpp: what every exporter (reports/exporters/*.cpp) shares: the record each file carries
// of its plan, comment headers written as one printable line each, DeepSpeed's common blocks, the
// notes every target adds (ring attention, MoE, SDPA's backend), the model's path and the launch
// lines. Not a public header: reports/export.hpp is the exports' interface.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>
#include <yaml-cpp/yaml.h>

#include "reports/export.hpp"

namespace longseq::exporters {

int64_t data_parallel(const ExportRequest& r);

// A planned length past the model's trained positions (config.json's max_position_embeddings) with
// no RoPE scaling by a factor in its config: YaRN over that window, factor ceil(S / window), as
// TRL's 1M-token example sets it (Reference §11 F5.7: factor 32 over 32,768 for 1,048,576 tokens).
// factor 0: not set (within the window, no window known, or a RoPE scaling the model has already).
struct RopeExtension {
  int64_t factor = 0;
  int64_t original_window = 0;
  double rope_theta = 0;  // the model's base, written beside: transformers 5 builds rope_parameters from this dict alone
};
RopeExtension rope_extension(const ExportRequest& r);
// The keyword transformers' from_pretrained takes for it (rope_scaling: transformers 4 reads it and
// transformers 5 standardizes it into rope_parameters), e.g. rope_scaling={"rope_type": "yarn", ...}, with
// rope_theta inside as TRL's 1M example writes it: without it transformers 5.24's rope_parameters
// lack the base and YaRN's init fails (tests/frameworks, test_hf_trainer_yarn_...).
std::string rope_scaling_keyword(const RopeExtension& extension);
// What a target that cannot set it says: the length, the window, the keyword for the user's loading code.
std::string rope_extension_note(const ExportRequest& r, const RopeExtension& extension, const std::string& where);

// Micro-steps per optimizer step (the plan's global batch over micro batch x dp; 1 without one),
// and the samples one optimizer step takes over the cluster.
int64_t accumulation_steps(const ExportRequest& r);
int64_t global_batch(const ExportRequest& r);

// What every file records about the plan it was written from.
std::vector<std::string> record_lines(const ExportRequest& r, const char* target);

// The header every file with comments carries: the record, then what the file cannot express.
std::vector<std::string> header_lines(const ExportRequest& r, const char* target, const std::vector<std::string>& notes);

// Lines as '#' comments (Python, TOML, shell). A line holds input text (a model's name, a path),
// so each is written as one printable line: a newline in a config.json's name must not end the
// comment and start a statement.
std::string hash_comments(const std::vector<std::string>& lines);

// PEFT's target_modules as a Python list's items: the linears the plan adapts.
std::string lora_target_modules(const ExportRequest& r);

// The notes an Accelerate export (DeepSpeed's or FSDP2's) gives an adapter plan: PEFT's LoraConfig
// through TRL (`how_trained` says what the stack then does with the adapters), and for QLoRA the
// 4-bit base's BitsAndBytesConfig, with bf16 quant storage where the base is sharded (ZeRO-3,
// FSDP2). None without adapters.
std::vector<std::string> adapter_notes(const ExportRequest& r, const std::string& how_trained);

// The record a DeepSpeed JSON carries of the plan it was written from. DeepSpeed looks its
// top-level keys up one by one and ignores any other (FRAMEWORKS §1.2, §4.2), the HF Trainer and
// Accelerate fill only "auto" values (§2.7-2.8), so the key travels with the file harmlessly.
nlohmann::json json_record(const ExportRequest& r, const char* target);

// The name a launch line gives the main file: the written file, or `fallback` on stdout.
std::string main_file(const ExportRequest& r, const char* fallback);

// The ZeRO block every DeepSpeed JSON carries. pin_memory is written out: its default moved from
// false to true in v0.19.5 (FRAMEWORKS §4.2), which changes host memory; the plan assumed pageable
// optimizer states (planner/memory_model.cpp: no pinned staging buffers for the optimizer).
nlohmann::json zero_block(const PlanOptions& plan);

// The DeepSpeed keys common to the JSON files: bf16, ZeRO, the Ulysses all-to-all in bf16 (the
// default fp32 doubles its volume, FRAMEWORKS §4.5), and sequence_parallel_size (the HF zero.Init
// path needs it; no data_parallel_size beside it, or DeepSpeed builds its own mesh, §4.5).
nlohmann::json deepspeed_common(const ExportRequest& r);

// A YAML value made of input text (a path): yaml-cpp writes a carriage return or a Unicode line
// break inside a plain scalar as it is, where a YAML reader ends the line; so any text beyond
// printable ASCII is double-quoted, where yaml-cpp escapes control characters, and the export's
// emitter escapes every non-ASCII character (yaml_document_begin).
std::string yaml_input_text(YAML::Emitter& out, const std::string& text);

void yaml_comments(YAML::Emitter& out, const std::vector<std::string>& lines);

// A YAML export's start: every non-ASCII character in values escaped, the header (header_lines for
// `target` and the notes) as comments, and the top-level map opened.
void yaml_document_begin(YAML::Emitter& out, const ExportRequest& r, const char* target, const std::vector<std::string>& notes);

// Ring attention is in none of these frameworks: what to run instead, with the chosen degrees.
void ring_note(const ExportRequest& r, ExportedConfig& exported);

// How the planned run trains a mixture-of-experts model, and what it must not turn on.
void moe_note(const std::string& target, const ExportRequest& r, ExportedConfig& exported);

// The weights' location for a trainer: a config.json's directory (a Hugging Face checkpoint); for
// a built-in card its name, which the user replaces with the Hugging Face id (said in a note).
std::string model_name_or_path(const ExportRequest& r);

bool model_is_card(const ExportRequest& r);

// Where the model is a built-in card (not a config.json or a Hub id), the note that `where` (MODEL,
// model.name_or_path) holds the card's name for the user to replace with the weights'.
void card_name_note(const ExportRequest& r, const char* where, ExportedConfig& exported);

// A TRL SFTTrainer script (Python): `header` as comments, the model loaded in bf16 with
// `attn_implementation` (YaRN past the trained positions, a QLoRA plan's 4-bit base), PEFT's
// LoraConfig for adapters, SFTConfig with `config_arguments` (each "name=value", Python literals
// longseq wrote), a placeholder dataset and the trainer. The plain HF Trainer's script and the one
// beside Accelerate's FSDP2 YAML (reports/exporters/hf_trainer.cpp).
std::string trl_script_text(const ExportRequest& r, const std::vector<std::string>& header, const std::string& attn_implementation,
                            const std::vector<std::string>& config_arguments);

// transformers' attn_implementation for the plan's kernel (attention_kernel_for): FlashAttention-3
// needs its Hopper build installed (flash-attention hopper/, module flash_attn_interface).
std::string hf_attn_implementation(const ExportRequest& r, ExportedConfig& exported);

// The SDPA backend the step was priced with, where PyTorch picks it (the FSDP2 stacks): a run whose
// PyTorch prefers another backend takes a different time, so the export says which one to expect.
void sdpa_backend_note(const ExportRequest& r, ExportedConfig& exported);

// The torchrun command that starts one process a GPU on every node (the first node's address and
// each node's index to fill in when there are several).
std::string torchrun_launch(const ExportRequest& r, const char* fallback);

// An Accelerate YAML's machine keys: the processes over all machines, and on several nodes the
// first node's address (without them DeepSpeed's runner falls back to one node's ranks, REFERENCE
// §8; Accelerate's own launcher needs them as much).
void accelerate_machine_keys(YAML::Emitter& out, const ExportRequest& r);

}  // namespace longseq::exporters
