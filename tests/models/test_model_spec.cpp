// Model cards, Hugging Face config.json loading and exact parameter counts.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "io/config_error.hpp"
#include "models/adapters.hpp"
#include "models/model_loader.hpp"

using namespace longseq;

namespace {
const std::string kData = LONGSEQ_TEST_DATA_DIR;
}

TEST_CASE("Llama-3.1-8B counts 8,030,261,248 parameters, derived term by term") {
  const ModelSpec model = model_load("llama-3.1-8b");
  const ParameterCount count = parameter_count(model);
  // embedding and untied LM head: 128256 * 4096 each
  CHECK(count.embedding == 525'336'576);
  CHECK(count.lm_head == 525'336'576);
  // q and o: 4096*4096 each; k and v: 4096*1024 each
  CHECK(count.per_layer_attention == 2 * 16'777'216 + 2 * 4'194'304);
  // gate, up, down: 3 * 4096 * 14336
  CHECK(count.per_layer_mlp == 176'160'768);
  CHECK(count.per_layer_norms == 2 * 4096);
  CHECK(count.per_layer == 218'112'000);
  CHECK(count.total == 8'030'261'248);
}

TEST_CASE("published parameter counts of the other built-in cards") {
  CHECK(parameter_count(model_load("llama-3.1-70b")).total == 70'553'706'496);  // 70.55B (HF model card)
  CHECK(parameter_count(model_load("qwen3-4b")).total == 4'022'468'096);        // Qwen3-4B: tied, q/k norms
  CHECK(parameter_count(model_load("qwen3-32b")).total == 32'762'123'264);      // Qwen3-32B: 32.8B
  CHECK(parameter_count(model_load("llama-3-8b")).total == 8'030'261'248);
}

TEST_CASE("GELU/LayerNorm GPT counts biases and tied embeddings by hand") {
  const ModelSpec model = model_load("gpt-2.7b");
  const ParameterCount count = parameter_count(model);
  const int64_t h = 2560, f = 10240, V = 50304;
  CHECK(count.lm_head == 0);  // tied
  CHECK(count.per_layer_attention == 4 * h * h + 3 * h + h);  // q,k,v,o + qkv biases + o bias
  CHECK(count.per_layer_mlp == 2 * h * f + f + h);            // up, down + biases
  CHECK(count.per_layer_norms == 2 * 2 * h);                  // two LayerNorms, weight + bias
  CHECK(count.total == V * h + 32 * count.per_layer + 2 * h);
}

TEST_CASE("the tiny executor model has every Llama feature at a small size") {
  const ModelSpec model = model_load("tiny-llama");
  CHECK(model.num_kv_heads < model.num_q_heads);
  CHECK_FALSE(model.tied_embeddings);
  CHECK(model.vocab_size == 256);
  const int64_t layer = 64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 176 + 2 * 64;
  CHECK(parameter_count(model).total == 2 * 256 * 64 + 4 * layer + 64);
}

TEST_CASE("built-in names match case-insensitively, without organisation or -Instruct") {
  CHECK(model_load("meta-llama/Llama-3.1-8B-Instruct").name == "Llama-3.1-8B");
  CHECK(model_load("Qwen/Qwen3-32B").name == "Qwen3-32B");
  CHECK(builtin_model_names().size() >= 10);
  for (const auto& name : builtin_model_names()) CHECK_NOTHROW(model_load(name));
}

TEST_CASE("Hugging Face config.json: Llama, Mistral, Qwen2 and Qwen3") {
  const ModelSpec llama = model_load(kData + "/hf/llama-3.1-8b.config.json");
  CHECK(parameter_count(llama).total == 8'030'261'248);
  CHECK(llama.head_dim == 128);  // derived: hidden / heads

  // Mistral-7B-v0.1: the Llama shape with a 32000 vocabulary: 7,241,732,096 (published 7.24B).
  CHECK(parameter_count(model_load(kData + "/hf/mistral-7b-v0.1.config.json")).total == 7'241'732'096);

  // Qwen2.5-7B: q/k/v biases (3584 + 512 + 512 per layer); published 7.61B.
  const ModelSpec qwen2 = model_load(kData + "/hf/qwen2.5-7b.config.json");
  CHECK(qwen2.qkv_bias);
  CHECK_FALSE(qwen2.o_proj_bias);
  const int64_t layer = 2 * 3584 * 3584 + 2 * 3584 * 512 + 4608 + 3 * 3584 * 18944 + 2 * 3584;
  CHECK(parameter_count(qwen2).total == 2 * 152064LL * 3584 + 28 * layer + 3584);
  CHECK(parameter_count(qwen2).total == 7'615'616'512);

  // Qwen3-4B from its config.json equals the built-in card.
  const ModelSpec qwen3 = model_load(kData + "/hf/qwen3-4b.config.json");
  CHECK(qwen3.qk_norm);
  CHECK(qwen3.tied_embeddings);
  CHECK(parameter_count(qwen3).total == parameter_count(model_load("qwen3-4b")).total);
}

TEST_CASE("bad model input is a ConfigError naming the file and the key") {
  auto message_of = [](const std::string& name_or_path) -> std::string {
    try {
      model_load(name_or_path);
    } catch (const ConfigError& error) {
      return error.what();
    }
    return "no error";
  };
  const std::string unsupported = message_of(kData + "/hf/gpt2.config.json");
  CHECK(unsupported.find("gpt2.config.json") != std::string::npos);
  CHECK(unsupported.find("architectures") != std::string::npos);
  CHECK(unsupported.find("GPT2LMHeadModel") != std::string::npos);

  CHECK(message_of(kData + "/hf/malformed.config.json").find("malformed JSON") != std::string::npos);
  const std::string missing = message_of(kData + "/hf/missing-key.config.json");
  CHECK(missing.find("intermediate_size") != std::string::npos);
  CHECK(missing.find("missing") != std::string::npos);

  const std::string unknown_key = message_of(kData + "/cards/unknown-key.yaml");
  CHECK(unknown_key.find("unknown-key.yaml") != std::string::npos);
  CHECK(unknown_key.find("'hiden_size'") != std::string::npos);
  CHECK(message_of(kData + "/cards/malformed.yaml").find("malformed YAML at line") != std::string::npos);
  const std::string negative = message_of(kData + "/cards/negative-heads.yaml");
  CHECK(negative.find("num_attention_heads") != std::string::npos);
  CHECK(negative.find("must be a positive integer, got") != std::string::npos);

  const std::string unknown_model = message_of("llama-9000");
  CHECK(unknown_model.find("unknown model 'llama-9000'") != std::string::npos);
  CHECK(unknown_model.find("did you mean llama-") != std::string::npos);  // the nearest cards
  CHECK(unknown_model.find("`longseq models` lists the") != std::string::npos);
}

TEST_CASE("a card whose q heads are not a multiple of its kv heads is rejected") {
  const std::string card =
      "name: x\nnum_hidden_layers: 1\nhidden_size: 8\nnum_attention_heads: 6\nnum_key_value_heads: 4\n"
      "head_dim: 2\nintermediate_size: 8\nvocab_size: 8\nmlp: swiglu\nnorm: rmsnorm\ntie_word_embeddings: true\n";
  CHECK_THROWS_WITH_AS(model_from_card_text(card, "x.yaml"),
                       doctest::Contains("x.yaml: key 'num_key_value_heads'"), ConfigError);
}

TEST_CASE("config.json: RoPE base and scaling, the sliding window, and a name from the model rather than its folder") {
  const ModelSpec mistral = model_load(std::string(LONGSEQ_TEST_DATA_DIR) + "/hf/mistral-7b-v0.1.config.json");
  CHECK(mistral.sliding_window == 4096);
  CHECK(mistral.rope_theta == 10000.0);
  CHECK(mistral.name == "Mistral L32 h4096 (config.json)");  // no _name_or_path: its family and shape, not the folder "hf"
  const ModelSpec llama = model_load(std::string(LONGSEQ_TEST_DATA_DIR) + "/hf/llama-3.1-8b.config.json");
  CHECK(llama.rope_theta == 500000.0);
  CHECK(llama.rope_scaling == "llama3");
  CHECK(llama.sliding_window == 0);
  CHECK(model_load(std::string(LONGSEQ_TEST_DATA_DIR) + "/hf/qwen3-4b.config.json").rope_theta == 1000000.0);
  // The built-in cards carry the same RoPE facts as their config.json.
  CHECK(model_load("llama-3.1-70b").rope_theta == 500000.0);
  CHECK(model_load("llama-3.1-70b").rope_scaling == "llama3");
  CHECK(model_load("qwen3-32b").rope_theta == 1000000.0);
  CHECK(model_load("gpt-13b").rope_theta == 10000.0);
}

TEST_CASE("the catalog: every card's exact parameter count is its model's published total") {
  // Totals as the models' Hugging Face pages and safetensors indexes publish them (tied embeddings
  // counted once; Gemma 3's text model without its vision tower).
  const std::vector<std::pair<const char*, int64_t>> published = {
      {"llama-2-7b", 6'738'415'616},       {"llama-2-13b", 13'015'864'320},      {"llama-2-70b", 68'976'648'192},
      {"llama-3.2-1b", 1'235'814'400},     {"llama-3.2-3b", 3'212'749'824},      {"llama-3.3-70b", 70'553'706'496},
      {"llama-3.1-405b", 405'853'388'800}, {"qwen2.5-0.5b", 494'032'768},        {"qwen2.5-1.5b", 1'543'714'304},
      {"qwen2.5-3b", 3'085'938'688},       {"qwen2.5-7b", 7'615'616'512},        {"qwen2.5-14b", 14'770'033'664},
      {"qwen2.5-32b", 32'763'876'352},     {"qwen2.5-72b", 72'706'203'648},      {"qwq-32b", 32'763'876'352},
      {"qwen2.5-coder-32b", 32'763'876'352}, {"qwen3-0.6b", 596'049'920},        {"qwen3-1.7b", 1'720'574'976},
      {"qwen3-8b", 8'190'735'360},         {"qwen3-14b", 14'768'307'200},        {"mistral-7b-v0.1", 7'241'732'096},
      {"mistral-7b-v0.3", 7'248'023'552},  {"mistral-nemo-12b", 12'247'782'400}, {"yi-6b", 6'061'035'520},
      {"yi-34b", 34'388'917'248},          {"phi-3-mini", 3'821'079'552},        {"phi-3-medium", 13'960'238'080},
      {"phi-4", 14'659'507'200},           {"gemma-2-2b", 2'614'341'888},        {"gemma-2-9b", 9'241'705'984},
      {"gemma-2-27b", 27'227'128'320},     {"gemma-3-1b", 999'885'952},          {"gemma-3-4b", 3'880'263'168},
      {"gemma-3-12b", 11'766'034'176},     {"gemma-3-27b", 27'009'346'304}};
  for (const auto& entry : published) {  // no structured binding: CAPTURE's lambda may not capture one before C++20 (clang)
    const char* name = entry.first;
    CAPTURE(name);
    CHECK(parameter_count(model_load(name)).total == entry.second);
  }
  CHECK(builtin_model_names().size() >= 40);
  // Gemma's four norms a layer are parameters: 4h per layer, hand-computed for Gemma-2-2B.
  const ParameterCount gemma = parameter_count(model_load("gemma-2-2b"));
  CHECK(gemma.per_layer_norms == 4 * 2304);
  CHECK(gemma.per_layer == 2304 * 2048 * 2 + 2304 * 1024 * 2 + 3 * 2304 * 9216 + 4 * 2304);
}

TEST_CASE("a model by its published name: organisation, case and variant suffixes, other names, the nearest suggested") {
  CHECK(model_load("meta-llama/Meta-Llama-3-8B-Instruct").name == "Llama-3-8B");
  CHECK(model_load("Qwen/Qwen2.5-72B-Instruct").name == "Qwen2.5-72B");
  CHECK(model_load("meta-llama/Llama-2-7b-chat-hf").name == "Llama-2-7B");
  CHECK(model_load("google/gemma-2-9b-it").name == "Gemma-2-9B");
  CHECK(model_load("mistralai/Mistral-Nemo-Instruct-2407").name == "Mistral-Nemo-12B");
  CHECK(model_load("microsoft/Phi-3-mini-4k-instruct").name == "Phi-3-mini");
  CHECK(model_load("QWQ-32B").name == "QwQ-32B");
  CHECK(model_load("01-ai/Yi-34B-Chat").name == "Yi-34B");
  CHECK_THROWS_WITH_AS(model_load("lama-3-8b"), doctest::Contains("did you mean llama-3-8b"), ConfigError);
}

TEST_CASE("config.json of Gemma 2, Gemma 3 (its text_config) and Phi-3 is read, MLA and unmodelled MoE refused by name") {
  const std::string hf = std::string(LONGSEQ_TEST_DATA_DIR) + "/hf/";
  const ModelSpec gemma2 = model_load(hf + "gemma-2-9b.config.json");
  CHECK(parameter_count(gemma2).total == parameter_count(model_load("gemma-2-9b")).total);
  CHECK(gemma2.tied_embeddings);  // Gemma2Config's default
  CHECK(gemma2.norms_per_layer == 4);
  CHECK(gemma2.norm_scale_fp32);  // Gemma2RMSNorm: (1 + w) in fp32, as the card says
  CHECK(model_load("gemma-2-9b").norm_scale_fp32);
  CHECK_FALSE(model_load("llama-3.1-8b").norm_scale_fp32);
  CHECK(gemma2.final_logit_softcapping == 30.0);
  CHECK(gemma2.sliding_window == 4096);
  CHECK(gemma2.head_dim == 256);  // not hidden / heads (224)
  const ModelSpec gemma3 = model_load(hf + "gemma-3-4b.config.json");
  CHECK(parameter_count(gemma3).total == parameter_count(model_load("gemma-3-4b")).total);
  CHECK(gemma3.qk_norm);
  CHECK(gemma3.norm_scale_fp32);
  CHECK(gemma3.rope_scaling == "linear");
  const ModelSpec phi3 = model_load(hf + "phi-3-mini.config.json");
  CHECK(parameter_count(phi3).total == 3'821'079'552);
  CHECK(phi3.head_dim == 96);
  const std::string bad = std::string(LONGSEQ_TEST_DATA_DIR) + "/bad/";
  // A trimmed DeepSeek-V2-Lite config.json (its MLA keys only).
  CHECK_THROWS_WITH_AS(model_load(bad + "deepseek-v2-lite.config.json"),
                       doctest::Contains("key 'kv_lora_rank': DeepseekV2ForCausalLM uses multi-head latent attention"), ConfigError);
}

TEST_CASE("config.json of Mixtral, Qwen2-MoE and Qwen3-MoE gives their cards' shapes, partly dense or aux-loss configs are refused") {
  const std::string hf = std::string(LONGSEQ_TEST_DATA_DIR) + "/hf/";
  // (No structured binding: clang refuses one inside doctest's INFO lambda.)
  for (const auto& entry : {std::pair<const char*, const char*>{"qwen3-30b-a3b.config.json", "qwen3-30b-a3b"},
                            {"mixtral-8x7b.config.json", "mixtral-8x7b"}, {"qwen1.5-moe-a2.7b.config.json", "qwen1.5-moe-a2.7b"}}) {
    const char* file = entry.first;
    const ModelSpec read = model_load(hf + file), built_in = model_load(entry.second);
    INFO(file);
    CHECK(read.experts == built_in.experts);
    CHECK(read.experts_per_token == built_in.experts_per_token);
    CHECK(read.expert_intermediate_size == built_in.expert_intermediate_size);
    CHECK(read.shared_expert_intermediate_size == built_in.shared_expert_intermediate_size);
    CHECK(read.shared_expert_gate == built_in.shared_expert_gate);
    CHECK(read.qk_norm == built_in.qk_norm);
    CHECK(read.qkv_bias == built_in.qkv_bias);
    CHECK(read.moe_normalize_topk == built_in.moe_normalize_topk);
    CHECK(read.moe_routing_weights_fp32 == built_in.moe_routing_weights_fp32);
    CHECK(parameter_count(read).total == parameter_count(built_in).total);
    CHECK(parameter_count(read).active == parameter_count(built_in).active);
  }
  CHECK(model_load(hf + "mixtral-8x7b.config.json").expert_intermediate_size == 14336);  // Mixtral's intermediate_size is the expert's
  CHECK(model_load(hf + "mixtral-8x7b.config.json").moe_routing_weights_fp32);  // MixtralTopKRouter returns them uncast
  CHECK_FALSE(model_load(hf + "qwen3-30b-a3b.config.json").moe_routing_weights_fp32);
  const std::string bad = std::string(LONGSEQ_TEST_DATA_DIR) + "/bad/";
  CHECK_THROWS_WITH_AS(model_load(bad + "qwen3-moe-sparse-step.config.json"),
                       doctest::Contains("key 'decoder_sparse_step': Qwen3MoeForCausalLM: one layer in 2 is MoE"), ConfigError);
  // output_router_logits: true trains with the auxiliary loss, which the plan then prices (§12 item 67).
  CHECK(model_load(hf + "qwen3-moe-router-logits.config.json").output_router_logits);
  CHECK_FALSE(model_load(hf + "qwen3-30b-a3b.config.json").output_router_logits);
}

TEST_CASE("gpt-oss: its config.json gives its card (biased experts, sinks, every other layer windowed, the clamped SwiGLU), and its "
          "parameters are OpenAI's") {
  const std::string hf = std::string(LONGSEQ_TEST_DATA_DIR) + "/hf/";
  const ModelSpec read = model_load(hf + "gpt-oss-20b.config.json"), card = model_load("gpt-oss-20b");
  for (const ModelSpec* model : {&read, &card}) {
    CHECK(model->experts == 32);
    CHECK(model->experts_per_token == 4);
    CHECK(model->expert_intermediate_size == 2880);  // intermediate_size is the expert's, as Mixtral's
    CHECK(model->attention_sinks);
    CHECK(model->sliding_window == 128);
    CHECK(model->windowed_layers == 12);  // layer_types: "sliding_attention" on every other layer
    CHECK(model->swiglu_limit == 7.0);
    CHECK(model->qkv_bias);
    CHECK(model->o_proj_bias);
    CHECK(model->mlp_bias);
    CHECK(model->moe_normalize_topk);  // GptOssTopKRouter: the softmax over the top-k logits
  }
  CHECK(parameter_count(read).total == parameter_count(card).total);
  // By hand: embedding and head 2 V h; a layer's attention (q 64 x 64, k and v 8 x 64, o, their
  // biases, 64 sinks), its router (h x 32 and a bias), 32 experts of 3 h I and their biases (2 I + h),
  // two norms; the final norm.
  const int64_t h = 2880, v = 201'088, experts = 32, width = 2880;
  const int64_t attention = h * (4096 + 2 * 512) + 4096 * h + (4096 + 2 * 512) + h + 64;
  const int64_t moe = h * experts + experts + experts * 3 * h * width + experts * (2 * width + h);
  const int64_t total = 2 * v * h + 24 * (attention + moe + 2 * h) + h;
  CHECK(parameter_count(card).total == total);
  // OpenAI's model card: 20.91B in all, 3.61B active (the embedding not counted), and 116.83B and 5.13B.
  CHECK(static_cast<double>(total) == doctest::Approx(20.91e9).epsilon(0.001));
  CHECK(static_cast<double>(parameter_count(card).active - v * h) == doctest::Approx(3.61e9).epsilon(0.002));
  const ModelSpec large = model_load("gpt-oss-120b");
  CHECK(static_cast<double>(parameter_count(large).total) == doctest::Approx(116.83e9).epsilon(0.001));
  CHECK(static_cast<double>(parameter_count(large).active - v * h) == doctest::Approx(5.13e9).epsilon(0.002));
}

TEST_CASE("mixture-of-experts cards: total and active parameters as published, hand-derived for one") {
  // Reference §12 items 51, 53, 55 derive these totals and actives from each config.json.
  CHECK(parameter_count(model_load("mixtral-8x7b")).total == 46'702'792'704);   // 46.7B
  CHECK(parameter_count(model_load("mixtral-8x7b")).active == 12'879'925'248);  // 12.9B
  CHECK(parameter_count(model_load("qwen1.5-moe-a2.7b")).total == 14'315'784'192);
  CHECK(parameter_count(model_load("qwen1.5-moe-a2.7b")).active == 2'689'173'504);
  CHECK(parameter_count(model_load("qwen3-235b-a22b")).total == 235'093'634'560);
  // Qwen3-30B-A3B by hand: per layer the router 2048 x 128 and 128 experts of 3 x 2048 x 768, of
  // which a token uses 8; attention 2048 x (4096 + 2 x 512) + 4096 x 2048 with q/k norms 2 x 128.
  const ModelSpec moe = model_load("qwen3-30b-a3b");
  const int64_t expert = 3 * 2048 * 768;
  const int64_t attention = 2048 * (4096 + 2 * 512) + 4096 * 2048 + 2 * 128;
  const int64_t per_layer = attention + 2048 * 128 + 128 * expert + 2 * 2048;
  const ParameterCount count = parameter_count(moe);
  CHECK(count.per_layer == per_layer);
  CHECK(count.total == 2 * 151936 * 2048 + 48 * per_layer + 2048);
  CHECK(count.total == 30'532'122'624);                       // 30.5B
  CHECK(count.active == count.total - 48 * 120 * expert);     // 3.35B
  CHECK(parameter_count(model_load("llama-3.1-8b")).active == parameter_count(model_load("llama-3.1-8b")).total);
}

TEST_CASE("adapters and NF4 storage by hand: LoRA's r (in + out) per linear, bitsandbytes' packed values and absmax") {
  // One weight of 32,768 values: 16,384 packed bytes; 512 blocks of 64. Without double quantization
  // an fp32 absmax each (2,048) and the 16-entry fp32 code (64); with it a uint8 absmax each (512),
  // an fp32 absmax per 256 of them (2 x 4), the 256-entry fp32 code (1,024) and the fp32 offset.
  CHECK(nf4_weight_bytes(32'768, false) == 16'384 + 2'048 + 64);
  CHECK(nf4_weight_bytes(32'768, true) == 16'384 + 512 + 8 + 64 + 1'024 + 4);
  // Per parameter at scale: 0.5 + 4/64 = 0.5625 and 0.5 + 1/64 + 4/(64 x 256) = 0.51587 (item 19).
  CHECK(nf4_weight_bytes(int64_t{1} << 30, false) / double(int64_t{1} << 30) == doctest::Approx(0.5625).epsilon(1e-6));
  CHECK(nf4_weight_bytes(int64_t{1} << 30, true) / double(int64_t{1} << 30) == doctest::Approx(0.515869).epsilon(1e-5));
  // Llama-3.1-8B: its seven projection types, 6.98B parameters, are 3.35 GiB with double quantization (item 19).
  const ModelSpec llama = model_load("llama-3.1-8b");
  CHECK(layer_linear_parameter_count(llama) == int64_t{32} * (4096 * 4096 * 2 + 2 * 4096 * 1024 + int64_t{3} * 4096 * 14336));
  CHECK(nf4_layer_linears_bytes(llama, true) / 1073741824.0 == doctest::Approx(3.35).epsilon(0.005));
  // LoRA at r = 16 on all seven: r (2h [q] + 2(h + n_kv d) [k, v] + 2h [o] + 3(h + I) [gate, up, down]) L
  // = 41.9M, 83.9M at r = 32 (item 6's figures; its formula's text leaves out o_proj's 2h, its numbers include it).
  CHECK(lora_parameter_count(llama, 16, true) == 16 * (2 * 4096 + 2 * (4096 + 1024) + 2 * 4096 + 3 * (4096 + 14336)) * 32);
  CHECK(lora_parameter_count(llama, 16, true) == 41'943'040);
  CHECK(lora_parameter_count(llama, 32, true) == 83'886'080);
  // PEFT's default targets: q_proj (h -> h) and v_proj (h -> n_kv d).
  CHECK(lora_parameter_count(llama, 8, false) == 8 * ((4096 + 4096) + (4096 + 1024)) * 32);
}

TEST_CASE("8-bit AdamW's state by hand: uint8 moments with an fp32 absmax per 256 values, fp32 moments under 4,096 values") {
  // bitsandbytes Optimizer2State.init_state (Reference §12 item 23): two uint8 moments and two fp32
  // absmax per block of 256; a tensor of fewer than min_8bit_size = 4,096 values keeps fp32 moments.
  CHECK(adam_8bit_state_bytes(4095) == 8.0 * 4095);
  CHECK(adam_8bit_state_bytes(4096) == 2.0 * (4096 + 4 * 16));
  CHECK(adam_8bit_state_bytes(4097) == 2.0 * (4097 + 4 * 17));  // a partial last block has its absmax too
  // Every parameter tensor of a model, in all: the parameter count, for each family's shapes.
  for (const char* name : {"llama-3.1-8b", "qwen3-0.6b", "qwen2.5-7b", "gpt-13b", "gemma-3-1b", "qwen3-30b-a3b", "qwen1.5-moe-a2.7b", "phi-3-mini"}) {
    const ModelSpec model = model_load(name);
    int64_t total = 0;
    for (int64_t elements : parameter_tensor_elements(model)) total += elements;
    INFO(name);
    CHECK(total == parameter_count(model).total);
  }
  // Llama-3.1-8B: every tensor has >= 4,096 values, each a multiple of 256: 2 + 8/256 = 2.03125 bytes a parameter.
  const ModelSpec llama = model_load("llama-3.1-8b");
  CHECK(adam_8bit_model_state_bytes(llama) == 2.03125 * 8'030'261'248.0);
  // Qwen3-0.6B (h = 1,024, d = 128): its two norms and two q/k norms a layer and the final norm stay
  // fp32: 28 x (2 x 1,024 + 2 x 128) + 1,024 = 65,536 values at 8 bytes, the rest at 2.03125.
  const ModelSpec qwen = model_load("qwen3-0.6b");
  const double small = 28.0 * (2 * 1024 + 2 * 128) + 1024;
  CHECK(small == 65'536);
  CHECK(adam_8bit_model_state_bytes(qwen) == doctest::Approx(2.03125 * (596'049'920.0 - small) + 8.0 * small).epsilon(1e-12));
  // LoRA r = 16 on Llama-3.1-8B: every lora_A (16 x in) and lora_B (out x 16) has >= 4,096 values.
  CHECK(adam_8bit_lora_state_bytes(llama, 16, true) == 2.03125 * 41'943'040.0);
}

namespace {

// The Qwen3-30B-A3B config.json with one key replaced (raw JSON text for its value).
std::string qwen3_moe_config_with(const std::string& key, const std::string& value) {
  nlohmann::json config = nlohmann::json::parse(R"({"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 2048, "intermediate_size": 6144,
      "moe_intermediate_size": 768, "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
      "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936, "hidden_act": "silu", "final_logit_softcapping": null})");
  config[key] = nlohmann::json::parse(value);
  return config.dump();
}

std::string config_message(const std::string& text) {
  try {
    model_from_hf_config_text(text, "c.json");
  } catch (const ConfigError& error) {
    return error.what();
  }
  return "(accepted)";
}

std::string card_message(const std::string& extra_line) {
  try {
    model_from_card_text("name: t\nnum_hidden_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\nnum_key_value_heads: 2\nhead_dim: 16\n"
                         "intermediate_size: 128\nvocab_size: 256\nmlp: swiglu\nnorm: rmsnorm\ntie_word_embeddings: false\n" + extra_line,
                         "t.yaml");
  } catch (const ConfigError& error) {
    return error.what();
  }
  return "(accepted)";
}

}  // namespace

TEST_CASE("config.json: every count bounded and every value held to the card's rule, by the key it was read from") {
  // An expert count past any model, which overflowed int64 in the parameter count (reliability
  // issue, item 4), and counts a card refuses (item 5), each refused naming its config.json key.
  CHECK(config_message(qwen3_moe_config_with("num_experts", "1099511627776")) == "c.json: key 'num_experts': 1099511627776 is out of range [0, 65536]");
  CHECK(config_message(qwen3_moe_config_with("num_experts", "0")).find("key 'num_experts': Qwen3MoeForCausalLM is a mixture-of-experts "
                                                                     "architecture: it needs at least one expert, got 0") != std::string::npos);
  CHECK(config_message(qwen3_moe_config_with("num_experts", "-8")).find("key 'num_experts'") != std::string::npos);
  CHECK(config_message(qwen3_moe_config_with("moe_intermediate_size", "0")) == "c.json: key 'moe_intermediate_size': must be a positive integer, got 0");
  CHECK(config_message(qwen3_moe_config_with("num_experts_per_tok", "129")).find("key 'num_experts_per_tok'") != std::string::npos);
  CHECK(config_message(qwen3_moe_config_with("sliding_window", "-1")) == "c.json: key 'sliding_window': -1 is out of range [0, 2147483647]");
  nlohmann::json gemma = nlohmann::json::parse(file_read_text(kData + "/hf/gemma-2-9b.config.json"));
  gemma["final_logit_softcapping"] = -30;
  CHECK(config_message(gemma.dump()).find("key 'final_logit_softcapping': -30 is out of range") != std::string::npos);
  // A value of the wrong type is refused, not read as absent.
  CHECK(config_message(qwen3_moe_config_with("output_router_logits", "\"true\"")).find("key 'output_router_logits'") != std::string::npos);
  CHECK(config_message(qwen3_moe_config_with("mlp_only_layers", "\"0,1\"")) ==
        "c.json: key 'mlp_only_layers': expected a list of layer indices");
  CHECK(config_message(qwen3_moe_config_with("sliding_window", "\"4096\"")).find("key 'sliding_window'") != std::string::npos);
  // Qwen2-MoE's shared expert width.
  nlohmann::json qwen2 = nlohmann::json::parse(qwen3_moe_config_with("shared_expert_intermediate_size", "-1"));
  qwen2["architectures"] = {"Qwen2MoeForCausalLM"};
  CHECK(config_message(qwen2.dump()) == "c.json: key 'shared_expert_intermediate_size': -1 is out of range [0, 2147483647]");
  // The same rule in a card: the same words.
  CHECK(card_message("sliding_window: -1") == "t.yaml: key 'sliding_window': -1 is out of range [0, 2147483647]");
  CHECK(card_message("final_logit_softcapping: -30").find("key 'final_logit_softcapping': -30 is out of range") != std::string::npos);
  CHECK(card_message("experts: 4\nexperts_per_token: 2\nexpert_intermediate_size: 0") ==
        "t.yaml: key 'expert_intermediate_size': must be a positive integer, got 0");
  CHECK(card_message("experts: 1099511627776") == "t.yaml: key 'experts': 1099511627776 is out of range [0, 65536]");
  CHECK(card_message("") == "(accepted)");
}

TEST_CASE("YAML: an alias is refused before any walk of the tree, text that is not UTF-8 by its byte and line") {
  CHECK(card_message("aliases: &a [x, *a]").find("t.yaml: an alias (*name) at line 12, column") != std::string::npos);
  CHECK(card_message("family: \"Lla\xFFma\"") == "t.yaml: not UTF-8 text: byte 208 (line 12) is not part of a UTF-8 character; save the file as UTF-8");
  CHECK(card_message("family: \"Llama \xE2\x80\x94 3\"") == "(accepted)");  // an em dash is UTF-8
}

TEST_CASE("the trained window: config.json's max_position_embeddings, a card's where it carries one, 0 where it does not say") {
  CHECK(model_load(kData + "/hf/qwen3-1.7b.config.json").max_position_embeddings == 40'960);
  CHECK(model_load(kData + "/hf/llama-3.1-8b.config.json").max_position_embeddings == 131'072);
  // Every card with a config.json copy in tests/data carries that file's window (issue 40).
  for (const std::string card : {"llama-3.1-8b", "mistral-7b-v0.1", "mixtral-8x7b", "phi-3-mini", "qwen1.5-moe-a2.7b",
                                  "qwen2.5-7b", "qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-30b-a3b", "gemma-2-9b"}) {
    CAPTURE(card);
    const int64_t window = model_load(card).max_position_embeddings;
    CHECK(window > 0);
    CHECK(window == model_load(kData + "/hf/" + card + ".config.json").max_position_embeddings);
  }
  // Cards without a copy carry their Hub config.json's window; a family's release shares one window, so each
  // equals its copied sibling's (Qwen3-8B's 40,960 is also the figure issue 40 quotes).
  for (const auto& card_and_sibling : std::vector<std::pair<std::string, std::string>>{{"qwen3-8b", "qwen3-4b"},
                                                                                     {"qwen3-32b", "qwen3-4b"},
                                                                                     {"qwen3-235b-a22b", "qwen3-30b-a3b"},
                                                                                     {"llama-3.1-70b", "llama-3.1-8b"},
                                                                                     {"llama-3.1-405b", "llama-3.1-8b"},
                                                                                     {"gemma-2-27b", "gemma-2-9b"},
                                                                                     {"mistral-7b-v0.3", "mistral-7b-v0.1"}}) {
    const std::string& card = card_and_sibling.first;
    const std::string& sibling = card_and_sibling.second;
    CAPTURE(card);
    CHECK(model_load(card).max_position_embeddings == model_load(sibling).max_position_embeddings);
  }
  CHECK(model_load("llama-2-7b").max_position_embeddings == 4'096);
  CHECK(model_load("llama-3-8b").max_position_embeddings == 8'192);
  // Where no source says (the FPDT paper's GPT models, Mistral-NeMo's config value 1,024,000 beside its card's
  // 128K), the card is silent and no warning is given.
  CHECK(model_load("gpt-13b").max_position_embeddings == 0);
  CHECK(model_load("mistral-nemo-12b").max_position_embeddings == 0);
}
