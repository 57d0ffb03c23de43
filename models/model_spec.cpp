#include "models/model_spec.hpp"

#include <algorithm>
#include <fmt/format.h>

#include "io/config_error.hpp"

namespace longseq {

void ModelSpec::validate(const std::string& source, const ModelSpecKeys& keys) const {
  auto require_within = [&](int64_t value, int64_t minimum, int64_t maximum, const char* key) {
    if (value < minimum || value > maximum)
      throw ConfigError(source, key, value < minimum && minimum == 1 ? fmt::format("must be a positive integer, got {}", value)
                                                                     : fmt::format("{} is out of range [{}, {}]", value, minimum, maximum));
  };
  auto require_positive = [&](int64_t value, const char* key) {
    if (value <= 0) throw ConfigError(source, key, fmt::format("must be a positive integer, got {}", value));
    if (value > kModelDimensionLimit)
      throw ConfigError(source, key, fmt::format("{} is beyond the largest dimension longseq accepts ({})", value, kModelDimensionLimit));
  };
  require_within(num_layers, 1, kModelLayerLimit, "num_hidden_layers");
  require_positive(hidden_size, "hidden_size");
  require_positive(num_q_heads, "num_attention_heads");
  require_positive(num_kv_heads, "num_key_value_heads");
  require_positive(head_dim, "head_dim");
  require_positive(intermediate_size, "intermediate_size");
  require_positive(vocab_size, "vocab_size");
  if (norms_per_layer != 2 && norms_per_layer != 4)  // the layouts there are: Llama's, and Gemma's sandwich
    throw ConfigError(source, "norms_per_layer", fmt::format("{}: expected 2 (before attention and the MLP) or 4 (after each too, "
                                                             "Gemma 2/3)", norms_per_layer));
  require_within(sliding_window, 0, kModelDimensionLimit, "sliding_window");  // 0: no window
  require_within(windowed_layers, 0, num_layers, "windowed_layers");
  if (!(swiglu_limit >= 0 && swiglu_limit <= 1e6)) throw ConfigError(source, "swiglu_limit", fmt::format("{}: expected 0 (none) to 1e6", swiglu_limit));
  if (swiglu_limit > 0 && mlp_kind != MlpKind::mlp_kind_swiglu)
    throw ConfigError(source, "swiglu_limit", "a clamped SwiGLU needs mlp: swiglu");
  if (windowed_layers > 0 && sliding_window == 0)
    throw ConfigError(source, "windowed_layers", fmt::format("{} layers attend within a window, but sliding_window is not given", windowed_layers));
  require_within(max_position_embeddings, 0, kModelDimensionLimit, "max_position_embeddings");  // 0: not known
  if (!(rope_theta >= 1 && rope_theta <= 1e12)) throw ConfigError(source, "rope_theta", fmt::format("{} is out of range [1, 1e12]", rope_theta));
  if (!(final_logit_softcapping >= 0 && final_logit_softcapping <= 1e6))
    throw ConfigError(source, "final_logit_softcapping", fmt::format("{} is out of range [0, 1e6] (0 or null: no capping)", final_logit_softcapping));
  require_within(experts, 0, kModelExpertLimit, keys.experts);
  if (experts > 0) {
    if (experts_per_token < 1 || experts_per_token > experts)
      throw ConfigError(source, keys.experts_per_token, fmt::format("{} experts per token: {} experts need 1 to {}", experts_per_token, experts, experts));
    require_positive(expert_intermediate_size, keys.expert_intermediate_size);
    require_within(shared_expert_intermediate_size, 0, kModelDimensionLimit, keys.shared_expert_intermediate_size);
  }
  require_within(dense_layers, 0, experts > 0 ? num_layers - 1 : 0, keys.dense_layers);
  require_within(mtp_layers, 0, kModelLayerLimit, keys.mtp_layers);
  if (experts > 0) {
    require_within(moe_router_groups, 1, experts, keys.router_groups);
    if (experts % moe_router_groups != 0)
      throw ConfigError(source, keys.router_groups, fmt::format("{} experts do not split into {} groups", experts, moe_router_groups));
    require_within(moe_router_group_topk, 1, moe_router_groups, keys.router_group_topk);
    if (!(moe_routed_scaling_factor > 0 && moe_routed_scaling_factor <= 1e6))
      throw ConfigError(source, keys.routed_scaling_factor, fmt::format("{}: expected a positive factor up to 1e6", moe_routed_scaling_factor));
  }
  if (is_latent_attention()) {
    const LatentAttention& mla = latent_attention;
    require_within(mla.q_lora_rank, 0, kModelDimensionLimit, "q_lora_rank");  // 0: q projected directly
    require_positive(mla.kv_lora_rank, "kv_lora_rank");
    require_within(mla.qk_rope_head_dim, 1, head_dim - 1, "qk_rope_head_dim");  // head_dim = qk_nope_head_dim + qk_rope_head_dim
    require_positive(mla.v_head_dim, "v_head_dim");
    if (num_kv_heads != num_q_heads)
      throw ConfigError(source, "num_key_value_heads", fmt::format("multi-head latent attention up-projects k and v for every one of the {} "
                                                                   "query heads, got {}", num_q_heads, num_kv_heads));
  }
  if (num_q_heads % num_kv_heads != 0)
    throw ConfigError(source, "num_key_value_heads",
                      fmt::format("{} query heads are not a multiple of {} key/value heads", num_q_heads, num_kv_heads));
  // The parameter count in double (exact enough to compare with the bound) before parameter_count
  // does it in int64: each of its terms is at most the total, so within the bound none overflows.
  // The experts are in it: 2^16 experts of width 2^31 would overflow int64 in parameter_count.
  const double h = static_cast<double>(hidden_size), f = static_cast<double>(intermediate_size);
  const double q_features = static_cast<double>(num_q_heads) * static_cast<double>(head_dim);
  const double kv_features = static_cast<double>(num_kv_heads) * static_cast<double>(head_dim);
  const double e = static_cast<double>(experts);
  const double moe = h * e + e * 3 * h * static_cast<double>(expert_intermediate_size) + 3 * h * static_cast<double>(shared_expert_intermediate_size) + h;
  const double per_layer = h * (q_features + 2 * kv_features) + q_features * h + 3 * h * f + moe + 5 * (h + f + q_features);
  const double total = 2 * static_cast<double>(vocab_size) * h + static_cast<double>(num_layers) * per_layer + h;
  if (!(total <= kModelParameterLimit))
    throw ConfigError(source, "", fmt::format("{:.3g} parameters: beyond any model longseq plans for (at most {:.0e})", total,
                                              kModelParameterLimit));
}

ParameterCount parameter_count(const ModelSpec& model) {
  const int64_t h = model.hidden_size;
  const int64_t f = model.intermediate_size;
  const int64_t norm_params = model.norm_kind == NormKind::norm_kind_layernorm ? 2 * h : h;

  ParameterCount count;
  count.embedding = model.vocab_size * h;
  count.lm_head = model.tied_embeddings ? 0 : model.vocab_size * h;
  count.final_norm = norm_params;

  // Attention: q, k, v, o projections (+ biases) and Qwen3's per-head q/k norms.
  const int64_t qkv_out = model.q_width() + 2 * model.kv_width();
  count.per_layer_attention = h * qkv_out + model.q_width() * h;
  if (model.is_latent_attention()) {
    // DeepseekV3Attention: q_a_proj [h -> r_q] with q_a_layernorm and q_b_proj [r_q -> n d_qk] (or
    // q_proj [h -> n d_qk] where q_lora_rank is null), kv_a_proj_with_mqa [h -> r_kv + d_rope] with
    // kv_a_layernorm, kv_b_proj [r_kv -> n (d_nope + d_v)], o_proj [n d_v -> h].
    const ModelSpec::LatentAttention& mla = model.latent_attention;
    const int64_t q_rank = mla.q_lora_rank, kv_rank = mla.kv_lora_rank, d_nope = model.head_dim - mla.qk_rope_head_dim;
    count.per_layer_attention = (q_rank > 0 ? h * q_rank + q_rank + q_rank * model.q_width() : h * model.q_width()) +
                                h * (kv_rank + mla.qk_rope_head_dim) + kv_rank + kv_rank * model.num_q_heads * (d_nope + mla.v_head_dim) +
                                model.v_width() * h;
  }
  if (model.qkv_bias) count.per_layer_attention += qkv_out;
  if (model.o_proj_bias) count.per_layer_attention += h;
  if (model.qk_norm) count.per_layer_attention += 2 * model.head_dim;
  if (model.attention_sinks) count.per_layer_attention += model.num_q_heads;

  // MLP: SwiGLU has gate, up, down; GELU has up, down.
  const int64_t mlp_matrices = model.mlp_kind == MlpKind::mlp_kind_swiglu ? 3 : 2;
  count.per_layer_mlp = mlp_matrices * h * f;
  if (model.mlp_bias) count.per_layer_mlp += (mlp_matrices - 1) * f + h;
  const int64_t dense_mlp = count.per_layer_mlp;  // (a MoE model's dense first layers keep it)

  count.per_layer_norms = model.norms_per_layer * norm_params;  // before attention and the MLP (and after them: Gemma)
  // Mixture of experts (Reference §12 item 4.11): the router h x E, E gated experts, the shared
  // experts and their gate replace the dense MLP; a token uses k of the E experts.
  int64_t unused_expert_parameters = 0;
  if (model.is_moe()) {
    const int64_t expert = 3 * h * model.expert_intermediate_size;
    count.per_layer_routed_experts = model.experts * expert;
    count.per_layer_mlp = h * model.experts + count.per_layer_routed_experts + 3 * h * model.shared_expert_intermediate_size +
                          (model.shared_expert_gate ? h : 0);
    // Biased experts (gpt-oss's gate_up_proj_bias [E, 2 I_e] and down_proj_bias [E, h]) and router (bias [E]).
    if (model.mlp_bias) count.per_layer_mlp += model.experts * (2 * model.expert_intermediate_size + h) + model.experts;
    // An expert a token is not routed to leaves its biases unused too.
    unused_expert_parameters = (model.experts - model.experts_per_token) * (expert + (model.mlp_bias ? 2 * model.expert_intermediate_size + h : 0));
  }
  count.per_layer = count.per_layer_attention + count.per_layer_mlp + count.per_layer_norms;
  if (model.dense_layers > 0) count.per_dense_layer = count.per_layer_attention + dense_mlp + count.per_layer_norms;
  // (validate holds dense_layers at 0 but for a MoE model)
  count.total = count.embedding + (model.num_layers - model.dense_layers) * count.per_layer + model.dense_layers * count.per_dense_layer +
                count.final_norm + count.lm_head;
  count.active = count.total - model.moe_layers() * unused_expert_parameters;
  // Dense: the MLP's or q_proj's; MoE (an expert loop's nn.Linear each): an expert's, the router's
  // or a shared expert's (a grouped-GEMM implementation's stacked [E, ...] weights: memory_model).
  count.largest_layer_matrix = model.is_moe() ? std::max({h * model.expert_intermediate_size, h * model.experts,
                                                          h * model.shared_expert_intermediate_size, h * model.q_width(),
                                                          model.dense_layers > 0 ? h * f : 0})
                                              : std::max(h * f, h * model.q_width());
  return count;
}

const char* mlp_kind_name(MlpKind kind) { return kind == MlpKind::mlp_kind_swiglu ? "swiglu" : "gelu"; }
const char* norm_kind_name(NormKind kind) { return kind == NormKind::norm_kind_rmsnorm ? "rmsnorm" : "layernorm"; }

}  // namespace longseq
