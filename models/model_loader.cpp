#include "models/model_loader.hpp"

#include "io/nearest_names.hpp"

#include <algorithm>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/checked_input.hpp"
#include "io/config_error.hpp"
#include "io/embedded_files.hpp"
#include "io/yaml_reader.hpp"

namespace longseq {

extern const EmbeddedFile builtin_model_cards[];
extern const int builtin_model_cards_count;

namespace {

std::span<const EmbeddedFile> builtin_cards() { return {builtin_model_cards, static_cast<size_t>(builtin_model_cards_count)}; }

// "meta-llama/Llama-3.1-8B-Instruct" -> "llama-3.1-8b": a name as published, without its
// organisation and in lower case, then without the suffixes of its fine-tuned variants (the same
// shape): -Instruct, -Chat, -Base, -hf, -it, -pt, in any order.
std::vector<std::string> candidate_names(const std::string& name) {
  std::string key = text_to_lower(name);
  if (auto slash = key.rfind('/'); slash != std::string::npos) key = key.substr(slash + 1);
  std::vector<std::string> candidates = {key};
  for (bool stripped = true; stripped;) {
    stripped = false;
    for (const char* suffix : {"-instruct", "-chat", "-base", "-hf", "-it", "-pt"}) {
      const std::string s = suffix;
      if (key.size() > s.size() && key.compare(key.size() - s.size(), s.size(), s) == 0) {
        key.resize(key.size() - s.size());
        candidates.push_back(key);
        stripped = true;
      }
    }
  }
  return candidates;
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
  model.family = reader.get_string("family", model.name);
  for (auto& [node, key] : reader.get_sequence("aliases")) model.aliases.push_back(reader.node_to_string(node, key));
  // Every number is read whole and in int64 here; ModelSpec::validate holds each field's range, the
  // same rule for a card and a config.json.
  auto any_int = [&](const char* key) { return reader.get_int(key, INT64_MIN, INT64_MAX); };
  auto any_int_or = [&](const char* key, int64_t default_value) { return reader.get_int(key, INT64_MIN, INT64_MAX, default_value); };
  auto any_number_or = [&](const char* key, double default_value) {
    return reader.get_double(key, std::numeric_limits<double>::lowest(), std::numeric_limits<double>::max(), default_value);
  };
  model.num_layers = any_int("num_hidden_layers");
  model.hidden_size = any_int("hidden_size");
  model.num_q_heads = any_int("num_attention_heads");
  model.num_kv_heads = any_int("num_key_value_heads");
  model.head_dim = any_int("head_dim");
  model.intermediate_size = any_int("intermediate_size");
  model.vocab_size = any_int("vocab_size");
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
  model.fused_projections = reader.get_bool("fused_projections", false);
  model.rope_theta = any_number_or("rope_theta", 10000);
  if (reader.has("rope_scaling")) model.rope_scaling = reader.get_string("rope_scaling");
  model.sliding_window = any_int_or("sliding_window", 0);
  model.windowed_layers = any_int_or("windowed_layers", 0);
  model.attention_sinks = reader.get_bool("attention_sinks", false);
  model.swiglu_limit = any_number_or("swiglu_limit", 0);
  model.max_position_embeddings = any_int_or("max_position_embeddings", 0);
  model.norms_per_layer = any_int_or("norms_per_layer", 2);
  model.norm_scale_fp32 = reader.get_bool("norm_scale_fp32", false);
  model.final_logit_softcapping = any_number_or("final_logit_softcapping", 0);
  model.experts = any_int_or("experts", 0);
  model.experts_per_token = any_int_or("experts_per_token", 0);
  model.expert_intermediate_size = any_int_or("expert_intermediate_size", 0);
  model.shared_expert_intermediate_size = any_int_or("shared_expert_intermediate_size", 0);
  model.shared_expert_gate = reader.get_bool("shared_expert_gate", false);
  model.moe_normalize_topk = reader.get_bool("normalize_topk", true);
  model.moe_routing_weights_fp32 = reader.get_bool("routing_weights_fp32", false);
  const std::string router_score = reader.get_string("router_score", "softmax");
  if (router_score != "softmax" && router_score != "sigmoid")
    throw ConfigError(source_name, "router_score", fmt::format("expected softmax or sigmoid, got '{}'", router_score));
  model.moe_router_sigmoid = router_score == "sigmoid";
  model.moe_router_groups = any_int_or("router_groups", 1);
  model.moe_router_group_topk = any_int_or("router_group_topk", 1);
  model.moe_routed_scaling_factor = any_number_or("routed_scaling_factor", 1.0);
  model.dense_layers = any_int_or("dense_layers", 0);
  model.mtp_layers = any_int_or("mtp_layers", 0);
  model.latent_attention.q_lora_rank = any_int_or("q_lora_rank", 0);
  model.latent_attention.kv_lora_rank = any_int_or("kv_lora_rank", 0);
  model.latent_attention.qk_rope_head_dim = any_int_or("qk_rope_head_dim", 0);
  model.latent_attention.v_head_dim = any_int_or("v_head_dim", 0);
  reader.reject_unknown_keys();
  model.validate(source_name);
  return model;
}

namespace {

// The experts of Mixtral (MixtralSparseMoeBlock), Qwen2-MoE and Qwen3-MoE (SparseMoeBlock), from
// their config.json keys (Reference §12 items 50, 52, 54).
// Returns the keys this config.json names the expert fields by (for ModelSpec::validate's messages).
ModelSpecKeys moe_read(const JsonView& config, const std::string& source_name, const std::string& architecture, bool is_mixtral,
                       bool is_qwen2_moe, bool is_gpt_oss, ModelSpec& model) {
  ModelSpecKeys keys;
  // gpt-oss names its experts as Mixtral does (GptOssConfig: num_local_experts, intermediate_size
  // the expert's width, num_experts_per_tok).
  const bool mixtral_keys = is_mixtral || is_gpt_oss;
  keys.experts = mixtral_keys ? "num_local_experts" : "num_experts";
  keys.experts_per_token = "num_experts_per_tok";
  keys.expert_intermediate_size = mixtral_keys ? "intermediate_size" : "moe_intermediate_size";
  model.experts = config[keys.experts].integer();
  // The architecture is a MoE block: no experts would plan a dense model of another shape.
  if (model.experts < 1)
    throw ConfigError(source_name, keys.experts, fmt::format("{} is a mixture-of-experts architecture: it needs at least one expert, got {}",
                                                             architecture, model.experts));
  model.experts_per_token = config[keys.experts_per_token].integer();
  // Mixtral's intermediate_size is each expert's width; Qwen's is the dense width of layers that
  // are not MoE, moe_intermediate_size the expert's.
  model.expert_intermediate_size = config[keys.expert_intermediate_size].integer();
  // Mixtral renormalizes always (softmax over the top-k logits); the Qwen MoE blocks when
  // norm_topk_prob (its default false: Qwen2MoeConfig, Qwen3MoeConfig).
  // gpt-oss's router takes the softmax over its top-k logits (GptOssTopKRouter.forward): renormalized too.
  if (!mixtral_keys) model.moe_normalize_topk = config.has("norm_topk_prob") && config["norm_topk_prob"].boolean();
  model.moe_routing_weights_fp32 = is_mixtral;  // MixtralTopKRouter returns fp32 weights; the Qwen routers cast them
  if (is_qwen2_moe) {
    model.shared_expert_intermediate_size = config["shared_expert_intermediate_size"].integer();
    model.shared_expert_gate = model.shared_expert_intermediate_size > 0;  // Qwen2MoeSparseMoeBlock's shared_expert_gate
  }
  if (!mixtral_keys) {
    // Every decoder layer is taken as MoE: a layer i is one iff i is not in mlp_only_layers and
    // (i + 1) % decoder_sparse_step == 0 (Qwen3MoeDecoderLayer.__init__, §12 item 54).
    if (config.has("decoder_sparse_step") && config["decoder_sparse_step"].integer() != 1)
      throw ConfigError(source_name, "decoder_sparse_step",
                        fmt::format("{}: one layer in {} is MoE, the others dense; longseq prices every decoder layer alike (MoE on each)",
                                    architecture, config["decoder_sparse_step"].integer()));
    if (config.has("mlp_only_layers") && !config["mlp_only_layers"].raw().is_array())
      config["mlp_only_layers"].fail("expected a list of layer indices");
    if (config.has("mlp_only_layers") && !config["mlp_only_layers"].raw().empty())
      throw ConfigError(source_name, "mlp_only_layers",
                        fmt::format("{}: some layers are dense; longseq prices every decoder layer alike (MoE on each)", architecture));
  }
  // The auxiliary loss concatenates every layer's router logits and one_hot masks outside any
  // checkpoint (§12 item 67): tens of GiB at long context; priced when the config keeps it.
  if (config.has("output_router_logits")) model.output_router_logits = config["output_router_logits"].boolean();
  return keys;
}

constexpr ModelSpecKeys kDeepseekV3Keys{"n_routed_experts", "num_experts_per_tok", "moe_intermediate_size", "n_shared_experts",
                                         "first_k_dense_replace", "n_group", "topk_group", "routed_scaling_factor", "num_nextn_predict_layers"};

// DeepseekV3ForCausalLM (transformers' modeling_deepseek_v3.py; docs/reference-megatron-core.md M9):
// multi-head latent attention, and from layer first_k_dense_replace on a MoE layer of
// n_routed_experts routed and n_shared_experts shared experts of moe_intermediate_size (the shared
// ones ungated), routed by DeepseekV3TopkRouter's sigmoid over groups.
// Returns the keys its config.json names the fields by (for ModelSpec::validate's messages), as moe_read.
ModelSpecKeys deepseek_v3_read(const JsonView& config, const std::string& source_name, ModelSpec& model) {
  auto get_int_or = [&](const char* key, int64_t default_value) -> int64_t {
    return config.has(key) && !config[key].raw().is_null() ? config[key].integer() : default_value;
  };
  ModelSpec::LatentAttention& mla = model.latent_attention;
  mla.q_lora_rank = get_int_or("q_lora_rank", 0);  // null: q projected directly (DeepSeek-V2-Lite's shape)
  mla.kv_lora_rank = config["kv_lora_rank"].integer();
  mla.qk_rope_head_dim = config["qk_rope_head_dim"].integer();
  mla.v_head_dim = config["v_head_dim"].integer();
  model.qkv_bias = model.o_proj_bias = config.has("attention_bias") && config["attention_bias"].boolean();
  if (model.qkv_bias)
    throw ConfigError(source_name, "attention_bias", "biased latent projections are not modelled (DeepSeek-V3 has none)");
  model.experts = config["n_routed_experts"].integer();
  model.experts_per_token = config["num_experts_per_tok"].integer();
  model.expert_intermediate_size = config["moe_intermediate_size"].integer();
  model.shared_expert_intermediate_size = get_int_or("n_shared_experts", 0) * model.expert_intermediate_size;
  model.moe_normalize_topk = config.has("norm_topk_prob") && config["norm_topk_prob"].boolean();
  // DeepseekV3TopkRouter scores by sigmoid whatever scoring_func says; a config naming another is
  // a model transformers would run differently from its name.
  if (config.has("scoring_func") && config["scoring_func"].raw() != "sigmoid")
    throw ConfigError(source_name, "scoring_func", fmt::format("DeepseekV3ForCausalLM's router scores by sigmoid, got {}", config["scoring_func"].raw().dump()));
  model.moe_router_sigmoid = true;
  model.moe_router_groups = get_int_or("n_group", 1);
  model.moe_router_group_topk = get_int_or("topk_group", 1);
  if (config.has("routed_scaling_factor")) model.moe_routed_scaling_factor = config["routed_scaling_factor"].number();
  model.dense_layers = get_int_or("first_k_dense_replace", 0);
  if (get_int_or("moe_layer_freq", 1) != 1)
    throw ConfigError(source_name, "moe_layer_freq", "only every layer after the dense first ones MoE (moe_layer_freq 1) is modelled");
  model.mtp_layers = get_int_or("num_nextn_predict_layers", 0);
  return kDeepseekV3Keys;
}

}  // namespace

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
  const bool is_mixtral = architecture == "MixtralForCausalLM";
  const bool is_qwen2_moe = architecture == "Qwen2MoeForCausalLM";
  const bool is_qwen3_moe = architecture == "Qwen3MoeForCausalLM";
  const bool is_gpt_oss = architecture == "GptOssForCausalLM";
  const bool is_deepseek_v3 = architecture == "DeepseekV3ForCausalLM";
  const bool is_moe = is_mixtral || is_qwen2_moe || is_qwen3_moe || is_gpt_oss || is_deepseek_v3;
  // Architectures whose layers longseq cannot price are refused by what they hold (Reference §12
  // part B): other mixture-of-experts blocks (DeepSeek-V2's softmax group-limited router, Llama 4's
  // dense bmm over all experts) and multi-head latent attention outside DeepSeek-V3's layer.
  if (!is_moe)
    for (const char* key : {"num_local_experts", "num_experts", "n_routed_experts"})
      if (config.has(key) && config[key].raw().is_number_integer() && config[key].integer() > 1)
        throw ConfigError(source_name, key, fmt::format("{} is a mixture-of-experts model ({} experts) whose block longseq does not model "
                                                        "(it models Mixtral, Qwen2-MoE, Qwen3-MoE, gpt-oss and DeepSeek-V3)", architecture, config[key].integer()));
  if (!is_deepseek_v3 && config.has("kv_lora_rank") && !config["kv_lora_rank"].raw().is_null())
    throw ConfigError(source_name, "kv_lora_rank", fmt::format("{} uses multi-head latent attention, which longseq models in "
                                                               "DeepseekV3ForCausalLM's layer only", architecture));
  // Multimodal wrappers keep the language model in text_config (Gemma 3, Llama 4).
  if (config.has("text_config") && config["text_config"].raw().is_object() &&
      (architecture == "Gemma3ForConditionalGeneration" || architecture == "Llama4ForConditionalGeneration")) {
    nlohmann::json text = config["text_config"].raw();
    text["architectures"] = nlohmann::json::array({architecture == "Gemma3ForConditionalGeneration" ? "Gemma3ForCausalLM" : "Llama4ForCausalLM"});
    if (!text.contains("_name_or_path") && config.has("_name_or_path")) text["_name_or_path"] = config["_name_or_path"].string();
    return model_from_hf_config_text(text.dump(), source_name + " (text_config)");
  }
  // Mixtral's attention is Mistral's; Qwen2-MoE's and Qwen3-MoE's are Qwen2's and Qwen3's.
  const bool is_llama = architecture == "LlamaForCausalLM" || architecture == "MistralForCausalLM" || is_mixtral;
  const bool is_qwen2 = architecture == "Qwen2ForCausalLM" || is_qwen2_moe;
  const bool is_qwen3 = architecture == "Qwen3ForCausalLM" || is_qwen3_moe;
  const bool is_gemma2 = architecture == "Gemma2ForCausalLM";
  const bool is_gemma3 = architecture == "Gemma3ForCausalLM";
  const bool is_phi3 = architecture == "Phi3ForCausalLM";
  if (!is_llama && !is_qwen2 && !is_qwen3 && !is_gemma2 && !is_gemma3 && !is_phi3 && !is_gpt_oss && !is_deepseek_v3)
    throw ConfigError(source_name, "architectures",
                      fmt::format("unsupported architecture '{}' (supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, "
                                  "Qwen3ForCausalLM, MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, GptOssForCausalLM, DeepseekV3ForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM (and Gemma3ForConditionalGeneration's "
                                  "text_config), Phi3ForCausalLM)", architecture));
  // Gemma's gated MLP runs GELU-tanh where Llama's runs SiLU: the same three matrices and saved tensors.
  const char* activation = is_gemma2 || is_gemma3 ? "gelu_pytorch_tanh" : "silu";
  const char* activation_key = is_gemma2 || is_gemma3 ? "hidden_activation" : "hidden_act";
  if (config.has(activation_key) && config[activation_key].raw() != activation)
    throw ConfigError(source_name, activation_key, fmt::format("{}'s gated MLP: expected \"{}\", got {}", architecture, activation,
                                                               config[activation_key].raw().dump()));

  ModelSpec model;
  // The model's own name where config.json keeps one; otherwise its family and shape (the folder a
  // config.json sits in says nothing: "tmp", "cfg", a snapshot hash).
  model.name = config.string_or("_name_or_path", "");
  model.num_layers = get_int("num_hidden_layers");
  model.hidden_size = get_int("hidden_size");
  model.num_q_heads = get_int("num_attention_heads");
  // HF defaults: no num_key_value_heads means multi-head attention; no head_dim means h / n_q.
  model.num_kv_heads = config.has("num_key_value_heads") ? get_int("num_key_value_heads") : model.num_q_heads;
  if (is_deepseek_v3) {
    // DeepseekV3Attention: q and k heads of qk_nope_head_dim + qk_rope_head_dim (its config's
    // head_dim is the rotary part's, DeepseekV3Config.__init__); v heads of v_head_dim.
    model.head_dim = get_int("qk_nope_head_dim") + get_int("qk_rope_head_dim");
  } else if (config.has("head_dim")) {
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
  // LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config and Phi3Config default tie_word_embeddings
  // to false; Gemma2Config and Gemma3TextConfig to true.
  model.tied_embeddings = get_bool("tie_word_embeddings", is_gemma2 || is_gemma3);
  if (is_llama) {
    // LlamaAttention: attention_bias puts biases on q, k, v and o; mlp_bias on gate, up, down.
    model.qkv_bias = get_bool("attention_bias", false);
    model.o_proj_bias = model.qkv_bias;
    model.mlp_bias = get_bool("mlp_bias", false);
  } else if (is_qwen2) {
    model.qkv_bias = true;  // Qwen2Attention: q/k/v always have biases, o_proj never
  } else if (is_qwen3) {
    model.qkv_bias = get_bool("attention_bias", false);  // Qwen3Attention: q, k, v and o share the flag
    model.o_proj_bias = model.qkv_bias;
    model.qk_norm = true;  // Qwen3Attention always has q_norm and k_norm over head_dim
  } else if (is_gpt_oss) {
    // GptOssAttention: attention_bias (default true) on q, k, v and o, and its sinks, a learnable
    // logit per head; GptOssExperts' gate_up_proj_bias and down_proj_bias and the router's bias.
    model.qkv_bias = get_bool("attention_bias", true);
    model.o_proj_bias = model.qkv_bias;
    model.mlp_bias = true;
    model.attention_sinks = true;
    model.swiglu_limit = config.has("swiglu_limit") ? config["swiglu_limit"].number() : 7.0;
  } else if (is_gemma2 || is_gemma3) {
    // Gemma2/3DecoderLayer: input, post-attention, pre-feedforward and post-feedforward RMSNorms;
    // Gemma 3 adds q/k norms; attention_bias on q, k, v and o.
    model.norms_per_layer = 4;
    model.norm_scale_fp32 = true;  // Gemma2RMSNorm and Gemma3RMSNorm alike: (1 + w) in fp32, cast after
    model.qk_norm = is_gemma3;
    model.qkv_bias = get_bool("attention_bias", false);
    model.o_proj_bias = model.qkv_bias;
    if (config.has("final_logit_softcapping") && !config["final_logit_softcapping"].raw().is_null())
      model.final_logit_softcapping = config["final_logit_softcapping"].number();
  }
  // Phi3Attention's qkv_proj and Phi3MLP's gate_up_proj fuse Llama's projections: the same weights,
  // one output each.
  model.fused_projections = is_phi3;
  // RoPE base and scaling (the base's default is every one of these configs' class default, 10000).
  if (config.has("rope_theta")) model.rope_theta = config["rope_theta"].number();
  // A window of null is none; use_sliding_window false (Qwen2) turns a given one off. A value of
  // another type or out of range is refused (validate), not taken as no window.
  if (config.has("sliding_window") && !(config.has("use_sliding_window") && !config["use_sliding_window"].boolean()))
    model.sliding_window = config["sliding_window"].integer();
  // gpt-oss's window: GptOssConfig's defaults where its config.json leaves them out (sliding_window
  // 128; layer_types every other layer "sliding_attention", from the first).
  if (is_gpt_oss) {
    if (!config.has("sliding_window")) model.sliding_window = 128;
    model.windowed_layers = (model.num_layers + 1) / 2;
    if (config.has("layer_types")) {
      if (!config["layer_types"].raw().is_array()) config["layer_types"].fail("expected a list of layer types");
      model.windowed_layers = 0;
      for (const auto& type : config["layer_types"].raw())
        if (type == "sliding_attention") ++model.windowed_layers;
    }
  }
  if (config.has("max_position_embeddings") && !config["max_position_embeddings"].raw().is_null())
    model.max_position_embeddings = config["max_position_embeddings"].integer();
  if (config.has("rope_scaling") && config["rope_scaling"].raw().is_object()) {
    const JsonView scaling = config["rope_scaling"];
    model.rope_scaling = scaling.string_or("rope_type", scaling.string_or("type", "unknown"));
  }
  const ModelSpecKeys keys = is_deepseek_v3 ? deepseek_v3_read(config, source_name, model)
                             : is_moe       ? moe_read(config, source_name, architecture, is_mixtral, is_qwen2_moe, is_gpt_oss, model)
                                            : ModelSpecKeys{};
  model.validate(source_name, keys);
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
  const std::vector<std::string> candidates = candidate_names(name_or_path);
  for (const std::string& candidate : candidates)
    if (const EmbeddedFile* card = embedded_file_find(builtin_cards(), candidate))
      return model_from_card_text(card->content, std::string("built-in card ") + card->file_name);
  // A card's other published names (Meta-Llama-3-8B, Mistral-Nemo-Base-2407, gemma-3-4b-it), and
  // its display name, in any case.
  std::vector<std::pair<std::string, std::string>> known_names;  // (lower-case name, card stem)
  for (const std::string& stem : builtin_model_names()) {
    const ModelSpec card = model_load(stem);
    known_names.emplace_back(stem, stem);
    known_names.emplace_back(text_to_lower(card.name), stem);
    for (const std::string& alias : card.aliases) known_names.emplace_back(text_to_lower(alias), stem);
  }
  for (const std::string& candidate : candidates)
    for (const auto& [known, stem] : known_names)
      if (candidate == known) return model_load(stem);
  // Published families whose layers longseq refuses when given their config.json (above): said by
  // name here too, instead of suggesting unrelated cards.
  static const std::pair<const char*, const char*> kRefusedFamilies[] = {
      {"deepseek-v2", "DeepSeek-V2's router is a softmax over groups (DeepSeek-V3's card and config.json are modelled)"},
      {"kimi-k2", "Kimi K2 is DeepSeek-V3's architecture with 384 experts and 64 heads: pass its config.json"},
      {"llama-4", "Llama 4's experts run as a dense bmm over all experts"},
  };
  const std::string lowered = text_to_lower(name_or_path);
  for (const auto& [family, why] : kRefusedFamilies)
    if (lowered.find(family) != std::string::npos)
      throw ConfigError("--model", "", fmt::format("'{}' is not modelled: {}, which longseq does not price (Reference §12 part B; it "
                                                   "models dense Llama/Qwen/Mistral/Gemma/Phi layers and Mixtral, Qwen2-MoE, Qwen3-MoE, gpt-oss and DeepSeek-V3 blocks)",
                                                   name_or_path, why));
  // The nearest names, to suggest.
  std::vector<std::pair<size_t, std::string>> nearest;
  for (const auto& [known, stem] : known_names) nearest.emplace_back(edit_distance(candidates.back(), known), stem);
  std::sort(nearest.begin(), nearest.end());
  std::vector<std::string> suggestions;
  for (const auto& [distance, stem] : nearest)
    if (suggestions.size() < 3 && std::find(suggestions.begin(), suggestions.end(), stem) == suggestions.end()) suggestions.push_back(stem);
  const std::string said = names_listed(suggestions);
  throw ConfigError("--model", "", fmt::format("unknown model '{}': not a file, and no built-in card has that name; did you mean {}? "
                                               "(`longseq models` lists the {} cards; a config.json or a card file of your own also works)",
                                               name_or_path, said, builtin_model_names().size()));
}

}  // namespace longseq
