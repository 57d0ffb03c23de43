#include "models/model_loader.hpp"

#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "models/checked_input.hpp"
#include "models/config_error.hpp"
#include "models/embedded_files.hpp"
#include "models/yaml_reader.hpp"

namespace longseq {

extern const EmbeddedFile builtin_model_cards[];
extern const int builtin_model_cards_count;

namespace {

std::span<const EmbeddedFile> builtin_cards() { return {builtin_model_cards, static_cast<size_t>(builtin_model_cards_count)}; }

// "meta-llama/Llama-3.1-8B-Instruct" -> "llama-3.1-8b": the instruct variant has the same shape.
std::string canonical_model_name(const std::string& name) {
  std::string key = text_to_lower(name);
  if (auto slash = key.rfind('/'); slash != std::string::npos) key = key.substr(slash + 1);
  for (const char* suffix : {"-instruct", "-chat", "-base"}) {
    const std::string s = suffix;
    if (key.size() > s.size() && key.compare(key.size() - s.size(), s.size(), s) == 0) key.resize(key.size() - s.size());
  }
  return key;
}

}  // namespace

std::string file_read_text(const std::string& path) {
  // An ifstream opens a directory and reads it as empty; say what it is instead.
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) throw ConfigError(path, "", "is a directory, not a file");
  std::ifstream stream(path, std::ios::binary);
  if (!stream) throw ConfigError(path, "", "cannot open file");
  std::ostringstream buffer;
  buffer << stream.rdbuf();
  return buffer.str();
}

ModelSpec model_from_card_text(const std::string& yaml_text, const std::string& source_name) {
  YamlReader reader(yaml_text, source_name);
  ModelSpec model;
  model.name = reader.get_string("name");
  model.num_layers = reader.get_int("num_hidden_layers", 1, 100000);
  model.hidden_size = reader.get_int("hidden_size", 1, kModelDimensionLimit);
  model.num_q_heads = reader.get_int("num_attention_heads", 1, kModelDimensionLimit);
  model.num_kv_heads = reader.get_int("num_key_value_heads", 1, kModelDimensionLimit);
  model.head_dim = reader.get_int("head_dim", 1, kModelDimensionLimit);
  model.intermediate_size = reader.get_int("intermediate_size", 1, kModelDimensionLimit);
  model.vocab_size = reader.get_int("vocab_size", 1, kModelDimensionLimit);
  const std::string mlp = reader.get_string("mlp");
  if (mlp == "swiglu") model.mlp_kind = MlpKind::mlp_kind_swiglu;
  else if (mlp == "gelu") model.mlp_kind = MlpKind::mlp_kind_gelu;
  else throw ConfigError(source_name, "mlp", fmt::format("expected swiglu or gelu, got '{}'", mlp));
  const std::string norm = reader.get_string("norm");
  if (norm == "rmsnorm") model.norm_kind = NormKind::norm_kind_rmsnorm;
  else if (norm == "layernorm") model.norm_kind = NormKind::norm_kind_layernorm;
  else throw ConfigError(source_name, "norm", fmt::format("expected rmsnorm or layernorm, got '{}'", norm));
  model.tied_embeddings = reader.get_bool("tie_word_embeddings");
  model.qkv_bias = reader.get_bool("qkv_bias", false);
  model.o_proj_bias = reader.get_bool("o_proj_bias", false);
  model.mlp_bias = reader.get_bool("mlp_bias", false);
  model.qk_norm = reader.get_bool("qk_norm", false);
  model.rope_theta = reader.get_double("rope_theta", 1, 1e12, 10000);
  if (reader.has("rope_scaling")) model.rope_scaling = reader.get_string("rope_scaling");
  reader.reject_unknown_keys();
  model.validate(source_name);
  return model;
}

ModelSpec model_from_hf_config_text(const std::string& json_text, const std::string& source_name) {
  const nlohmann::json document = json_parse(json_text, source_name);
  const JsonView config(document, source_name);
  if (!config.is_object()) throw ConfigError(source_name, "", "expected a JSON object");
  // Any int64 is read here (2^64-1 is refused as out of range, not wrapped); validate() bounds it.
  auto get_int = [&](const char* key) -> int64_t { return config[key].integer(); };
  auto get_bool = [&](const char* key, bool default_value) -> bool {
    return config.has(key) ? config[key].boolean() : default_value;
  };

  if (!config.has("architectures") || config["architectures"].size() == 0)
    throw ConfigError(source_name, "architectures", "required list of architecture names is missing");
  const std::string architecture = config["architectures"][0].string();
  const bool is_llama = architecture == "LlamaForCausalLM" || architecture == "MistralForCausalLM";
  const bool is_qwen2 = architecture == "Qwen2ForCausalLM";
  const bool is_qwen3 = architecture == "Qwen3ForCausalLM";
  if (!is_llama && !is_qwen2 && !is_qwen3)
    throw ConfigError(source_name, "architectures",
                      fmt::format("unsupported architecture '{}' (supported: LlamaForCausalLM, MistralForCausalLM, "
                                  "Qwen2ForCausalLM, Qwen3ForCausalLM)", architecture));
  if (config.has("hidden_act") && config["hidden_act"].raw() != "silu")
    throw ConfigError(source_name, "hidden_act", fmt::format("{} uses SwiGLU; expected \"silu\", got {}", architecture,
                                                            config["hidden_act"].raw().dump()));

  ModelSpec model;
  // The model's own name where config.json keeps one; otherwise its family and shape (the folder a
  // config.json sits in says nothing: "tmp", "cfg", a snapshot hash).
  model.name = config.string_or("_name_or_path", "");
  model.num_layers = get_int("num_hidden_layers");
  model.hidden_size = get_int("hidden_size");
  model.num_q_heads = get_int("num_attention_heads");
  // HF defaults: no num_key_value_heads means multi-head attention; no head_dim means h / n_q.
  model.num_kv_heads = config.has("num_key_value_heads") ? get_int("num_key_value_heads") : model.num_q_heads;
  if (config.has("head_dim")) {
    model.head_dim = get_int("head_dim");
  } else {
    if (model.num_q_heads <= 0 || model.hidden_size % model.num_q_heads != 0)
      throw ConfigError(source_name, "head_dim", "missing, and hidden_size is not a multiple of num_attention_heads");
    model.head_dim = model.hidden_size / model.num_q_heads;
  }
  model.intermediate_size = get_int("intermediate_size");
  model.vocab_size = get_int("vocab_size");
  if (model.name.empty())
    model.name = fmt::format("{} L{} h{} (config.json)", architecture.substr(0, architecture.find("ForCausalLM")), model.num_layers,
                             model.hidden_size);
  model.mlp_kind = MlpKind::mlp_kind_swiglu;
  model.norm_kind = NormKind::norm_kind_rmsnorm;
  // LlamaConfig, MistralConfig, Qwen2Config and Qwen3Config all default tie_word_embeddings to false.
  model.tied_embeddings = get_bool("tie_word_embeddings", false);
  if (is_llama) {
    // LlamaAttention: attention_bias puts biases on q, k, v and o; mlp_bias on gate, up, down.
    model.qkv_bias = get_bool("attention_bias", false);
    model.o_proj_bias = model.qkv_bias;
    model.mlp_bias = get_bool("mlp_bias", false);
  } else if (is_qwen2) {
    model.qkv_bias = true;  // Qwen2Attention: q/k/v always have biases, o_proj never
  } else {
    model.qkv_bias = get_bool("attention_bias", false);  // Qwen3Attention: q, k, v and o share the flag
    model.o_proj_bias = model.qkv_bias;
    model.qk_norm = true;  // Qwen3Attention always has q_norm and k_norm over head_dim
  }
  // RoPE base and scaling (the base's default is every one of these configs' class default, 10000).
  if (config.has("rope_theta")) {
    model.rope_theta = config["rope_theta"].number();
    if (!(model.rope_theta >= 1 && model.rope_theta <= 1e12))
      throw ConfigError(source_name, "rope_theta", fmt::format("{} is out of range [1, 1e12]", model.rope_theta));
  }
  if (config.has("sliding_window") && !config["sliding_window"].raw().is_null() &&
      !(config.has("use_sliding_window") && config["use_sliding_window"].raw().is_boolean() && !config["use_sliding_window"].boolean()))
    model.sliding_window = config["sliding_window"].integer();
  if (config.has("rope_scaling") && config["rope_scaling"].raw().is_object()) {
    const JsonView scaling = config["rope_scaling"];
    model.rope_scaling = scaling.string_or("rope_type", scaling.string_or("type", "unknown"));
  }
  model.validate(source_name);
  return model;
}

ModelSpec model_with_layers(ModelSpec model, int64_t layers) {
  if (layers < 0) throw ConfigError("--layers", "", fmt::format("must be positive, got {}", layers));
  if (layers > model.num_layers)
    throw ConfigError("--layers", "", fmt::format("{} has {} decoder layers, not {}", model.name, model.num_layers, layers));
  if (layers > 0) model.num_layers = layers;
  return model;
}

std::vector<std::string> builtin_model_names() { return embedded_file_stems(builtin_cards()); }

ModelSpec model_load(const std::string& name_or_path) {
  std::error_code error;
  if (std::filesystem::is_regular_file(name_or_path, error)) {
    const std::string text = file_read_text(name_or_path);
    if (std::filesystem::path(name_or_path).extension() == ".json") return model_from_hf_config_text(text, name_or_path);
    return model_from_card_text(text, name_or_path);
  }
  if (std::filesystem::is_directory(name_or_path, error)) {
    const auto config_path = std::filesystem::path(name_or_path) / "config.json";
    if (std::filesystem::is_regular_file(config_path, error))
      return model_from_hf_config_text(file_read_text(config_path.string()), config_path.string());
    throw ConfigError(name_or_path, "", "is a directory without a config.json");
  }
  if (const EmbeddedFile* card = embedded_file_find(builtin_cards(), canonical_model_name(name_or_path)))
    return model_from_card_text(card->content, std::string("built-in card ") + card->file_name);
  std::string known;
  for (const auto& name : builtin_model_names()) known += (known.empty() ? "" : ", ") + name;
  throw ConfigError("--model", "", fmt::format("unknown model '{}': not a file, and not a built-in card ({})", name_or_path, known));
}

}  // namespace longseq
