// model_loader.hpp: ModelSpec from a built-in card name, a card file, or a Hugging Face config.json.
#pragma once

#include <string>
#include <vector>

#include "models/model_spec.hpp"

namespace longseq {

// Resolves `name_or_path`: an existing file ending in .json is read as a Hugging Face config.json,
// any other existing file as a model card; otherwise a built-in card name, matched
// case-insensitively, ignoring an organisation prefix ("meta-llama/") and an "-Instruct" suffix.
// Throws ConfigError naming the file/key and the reason.
ModelSpec model_load(const std::string& name_or_path);

// A model card (YAML) given as text; `source_name` is used in error messages.
ModelSpec model_from_card_text(const std::string& yaml_text, const std::string& source_name);

// A Hugging Face config.json given as text. Supported architectures: LlamaForCausalLM,
// MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM.
ModelSpec model_from_hf_config_text(const std::string& json_text, const std::string& source_name);

// The first `layers` decoder layers of `model` (the flag --layers): a stack of its shape, for runs
// and predictions that cannot hold the whole model. 0 keeps every layer; more than the model has
// throws ConfigError naming --layers.
ModelSpec model_with_layers(ModelSpec model, int64_t layers);

// Names of the built-in cards, sorted.
std::vector<std::string> builtin_model_names();

// Reads a whole file; throws ConfigError when it cannot be read.
std::string file_read_text(const std::string& path);

}  // namespace longseq
