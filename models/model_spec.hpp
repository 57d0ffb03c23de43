// model_spec.hpp: what is trained — the shape of a decoder-only transformer, and its exact
// parameter count.
//
// A ModelSpec comes from a model card (models/cards/*.yaml, built into the binary), from a card
// file given by path, or from a Hugging Face config.json. Size letters used across longseq:
//   L layers, h hidden_size, n_q / n_kv attention heads, d head_dim, f intermediate_size,
//   V vocab_size, S global sequence length, sp sequence-parallel degree, S_l = S / sp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace longseq {

enum class MlpKind { mlp_kind_swiglu, mlp_kind_gelu };        // SwiGLU: gate, up, down; GELU: up, down
enum class NormKind { norm_kind_rmsnorm, norm_kind_layernorm };  // LayerNorm adds a bias vector

// Bounds on a shape, so that no reader hands the planner a model whose sizes overflow int64
// arithmetic. Every dimension fits int32 (the executor's token ids and kernel indices are int32);
// the largest published dense models have h = 18,432 (PaLM 540B) and V ~ 256K, far inside.
constexpr int64_t kModelDimensionLimit = (int64_t{1} << 31) - 1;
// 10^15 parameters is ~500x the largest model trained to date (~2T); a card beyond it is a typo,
// and the bound keeps every parameter and byte count far inside int64 (x18 bytes < 2^63).
constexpr double kModelParameterLimit = 1e15;
// Decoder layers (the largest published model has 126: Llama 3.1 405B) and routed experts per layer
// (DeepSeek-V3 and Kimi K2 have 256 and 384): bounds that catch a typo, far above any model.
constexpr int64_t kModelLayerLimit = 100000;
constexpr int64_t kModelExpertLimit = 65536;

// The key each file names a checked field by, so that ModelSpec::validate's message names the key
// the user wrote (a card's `experts` is a config.json's num_local_experts or num_experts).
struct ModelSpecKeys {
  const char* experts = "experts";
  const char* experts_per_token = "experts_per_token";
  const char* expert_intermediate_size = "expert_intermediate_size";
  const char* shared_expert_intermediate_size = "shared_expert_intermediate_size";
  const char* dense_layers = "dense_layers";
  const char* router_groups = "router_groups";
  const char* router_group_topk = "router_group_topk";
  const char* routed_scaling_factor = "routed_scaling_factor";
  const char* mtp_layers = "mtp_layers";
};

struct ModelSpec {
  std::string name;
  std::string family;                // "Llama 3.1", "Qwen2.5": how `longseq models` groups the cards
  std::vector<std::string> aliases;  // other published names of the same weights' shape
  int64_t num_layers = 0;         // L
  int64_t hidden_size = 0;        // h
  int64_t num_q_heads = 0;        // n_q
  int64_t num_kv_heads = 0;       // n_kv (GQA when < n_q, MQA when 1)
  int64_t head_dim = 0;           // d (n_q * d may differ from h, e.g. Qwen3-32B)
  int64_t intermediate_size = 0;  // f
  int64_t vocab_size = 0;         // V
  MlpKind mlp_kind = MlpKind::mlp_kind_swiglu;
  NormKind norm_kind = NormKind::norm_kind_rmsnorm;
  bool tied_embeddings = false;   // LM head shares the embedding matrix
  bool qkv_bias = false;          // biases on q/k/v projections (Qwen2, GPT)
  bool o_proj_bias = false;       // bias on the attention output projection (GPT)
  bool mlp_bias = false;          // biases on the MLP projections (GPT)
  bool qk_norm = false;           // per-head RMSNorm on q and k (Qwen3)
  // Phi-3's qkv_proj and gate_up_proj: Llama's weights, but one output each, q/k/v and gate/up its
  // slices (views), so a saved slice keeps the whole output's storage alive (the frameworks check
  // found attention saving v keep q and k's bytes too).
  bool fused_projections = false;
  // RoPE: the base (HF's default 10000 when config.json has none) and the scaling's rope_type
  // ("llama3", "yarn", ...; "" for none). No memory or FLOP term depends on them; exports must
  // carry them (Megatron-DeepSpeed defaults the base to 10000).
  double rope_theta = 10000;
  std::string rope_scaling;
  // config.json's sliding_window (Mistral): attention over the last this-many tokens; 0 for none.
  // Planned as full causal attention (a kernel that honours the window does less work; longseq's
  // plans say so where it applies).
  int64_t sliding_window = 0;
  // How many of the layers attend within sliding_window (config.json's layer_types, "sliding_attention";
  // gpt-oss alternates: every other layer). 0 with a window: which layers is not known.
  int64_t windowed_layers = 0;
  // A learnable logit per head in each softmax's denominator (gpt-oss's sinks, GptOssAttention.sinks;
  // Megatron's softmax_type "learnable"): n_q parameters a layer, no activation of its own.
  bool attention_sinks = false;
  // gpt-oss's gated activation: SwiGLU with its gate and linear halves clamped to this limit, the
  // linear half offset by 1 and the gate's SiLU at alpha 1.702 (GptOssExperts._apply_gate,
  // swiglu_limit 7.0); 0 for the plain SwiGLU. The same three matrices and saved tensors.
  double swiglu_limit = 0;
  // The positions the model was trained on (config.json's max_position_embeddings, or a card's):
  // past them RoPE runs on angles it never saw unless the run scales it. 0: not known.
  int64_t max_position_embeddings = 0;
  // RMSNorms per decoder layer: 2 (before attention and the MLP), 4 in Gemma 2/3 (and after each:
  // post-attention and post-feedforward norms over the block's output before the residual add).
  int64_t norms_per_layer = 2;
  // Gemma's RMSNorm (modeling_gemma3.py Gemma3RMSNorm.forward: `self._norm(x.float()) * (1.0 +
  // self.weight.float())`, then `.type_as(x)`) scales in fp32 and casts after, where Llama's casts
  // the normalized value first and scales in the activation dtype: an eager Gemma norm saves its
  // normalized value in fp32 and the fp32 (1 + w). Held to PyTorch's saved-tensor hooks.
  bool norm_scale_fp32 = false;
  // Gemma 2's tanh cap on the final logits (0: none): the loss holds further logits-sized tensors
  // the inventory does not price yet (said in plans).
  double final_logit_softcapping = 0;
  // Mixture of experts on every decoder layer (Mixtral, Qwen2-MoE, Qwen3-MoE; Reference §12 part B):
  // `experts` routed experts of width `expert_intermediate_size` (gated, three matrices each), of
  // which a token uses `experts_per_token`, beside shared experts of total width
  // `shared_expert_intermediate_size` on every token (with a sigmoid gate: Qwen2-MoE). 0 experts: a
  // dense model. Counted in parameters (total and active); the planner refuses to price them yet.
  int64_t experts = 0, experts_per_token = 0, expert_intermediate_size = 0, shared_expert_intermediate_size = 0;
  bool shared_expert_gate = false;
  // The chosen experts' probabilities divided by their sum (Mixtral always; Qwen3-MoE's and
  // Qwen2-MoE's norm_topk_prob, false for Qwen2-MoE's releases). Changes the arithmetic, not memory.
  bool moe_normalize_topk = true;
  // The router hands the experts its top-k weights in fp32 (MixtralTopKRouter.forward returns them
  // uncast; Qwen2/3-MoE's routers cast them to the logits' dtype): transformers 5's grouped experts
  // then save the pairs' weights in fp32 and weight the expert outputs in fp32.
  bool moe_routing_weights_fp32 = false;
  // config.json's output_router_logits: the model trains with its auxiliary load-balancing loss
  // (priced as PlanOptions::moe_aux_loss is; Reference §12 item 67).
  bool output_router_logits = false;
  // DeepSeek-V3's MoE layer (DeepseekV3TopkRouter; Megatron's moe_router_score_function "sigmoid"):
  // the router scores each expert by a sigmoid, picks the k among the best `router_group_topk` of
  // `router_groups` groups by the scores plus a per-expert bias that balances the load (a buffer,
  // not trained by gradient: e_score_correction_bias), and scales the renormalized k by
  // `routed_scaling_factor`. Softmax routers: router_sigmoid false, groups 1.
  bool moe_router_sigmoid = false;
  int64_t moe_router_groups = 1, moe_router_group_topk = 1;
  double moe_routed_scaling_factor = 1.0;
  // The first this-many decoder layers keep the dense MLP of width intermediate_size (config.json's
  // first_k_dense_replace: DeepSeek-V3's 3); the rest are MoE. 0: every layer MoE (or dense).
  int64_t dense_layers = 0;
  // Multi-token prediction modules the checkpoint carries (num_nextn_predict_layers): not built by
  // transformers' model nor counted in the parameters; a plan trains without them and says so.
  int64_t mtp_layers = 0;
  bool is_moe() const { return experts > 0; }
  int64_t moe_layers() const { return is_moe() ? num_layers - dense_layers : 0; }

  // Multi-head latent attention (DeepSeek-V2/V3; config.json's q_lora_rank, kv_lora_rank,
  // qk_nope_head_dim, qk_rope_head_dim, v_head_dim): q through a rank-q_lora_rank bottleneck (0:
  // projected directly), k and v up-projected per head from a shared kv_lora_rank latent, each head's
  // q and k a qk_nope_head_dim part and a qk_rope_head_dim part (the rotary part of k is one per
  // token, shared by the heads), v of v_head_dim. Attention then runs as multi-head attention with
  // head_dim = qk_nope + qk_rope for q and k (num_kv_heads = num_q_heads) and v_head_dim for v.
  struct LatentAttention {
    int64_t q_lora_rank = 0, kv_lora_rank = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  };
  LatentAttention latent_attention;
  bool is_latent_attention() const { return latent_attention.kv_lora_rank > 0; }

  // Throws ConfigError(source, key, reason) on an impossible shape or a value out of its range: the
  // one rule for each field, whichever file (card, config.json) it was read from.
  void validate(const std::string& source, const ModelSpecKeys& keys = {}) const;

  int64_t q_width() const { return num_q_heads * head_dim; }    // q_proj output features
  int64_t kv_width() const { return num_kv_heads * head_dim; }  // k_proj / v_proj output features (MLA: k's)
  // The value heads' width: kv_width, or MLA's n_q * v_head_dim (the attention output's width too).
  int64_t v_width() const { return is_latent_attention() ? num_q_heads * latent_attention.v_head_dim : kv_width(); }
};

// Exact parameter counts, by where they live (ZeRO-3 gathers them per module).
struct ParameterCount {
  int64_t embedding = 0;          // V*h
  int64_t per_layer = 0;          // one decoder layer
  int64_t per_layer_attention = 0;
  int64_t per_layer_mlp = 0;
  int64_t per_layer_norms = 0;    // also what ZeRO-3 keeps unpartitioned (below its persistence threshold)
  // Of per_layer_mlp, the routed experts' matrices (E gated experts, 3 h x I_e each): what Megatron's
  // expert parallelism splits over ep ranks (0 for a dense model).
  int64_t per_layer_routed_experts = 0;
  // A model whose first layers are dense (ModelSpec::dense_layers): per_layer above is a MoE layer's,
  // this a dense layer's (its attention, norms and the dense MLP); 0 when every layer is alike.
  int64_t per_dense_layer = 0;
  int64_t final_norm = 0;
  int64_t lm_head = 0;            // 0 when tied
  int64_t largest_layer_matrix = 0;  // largest weight tensor in a decoder layer (its gradient is produced whole)
  int64_t total = 0;
  int64_t active = 0;  // what one token uses: the total less the experts it is not routed to (= total, dense)
};

ParameterCount parameter_count(const ModelSpec& model);

const char* mlp_kind_name(MlpKind kind);
const char* norm_kind_name(NormKind kind);

}  // namespace longseq
