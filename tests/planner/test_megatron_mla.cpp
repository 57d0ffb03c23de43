// DeepSeek-V3 under Megatron-Core (issue 42): multi-head latent attention's saved tensors and its
// backward, the sigmoid router's, the dense first layers in the parameter count and the pipeline's
// stages, MLA's FLOPs and exchanges, and the model read from its card and its config.json. Every
// expected figure is derived by hand from docs/reference-megatron-core.md M9 and the code it cites
// (megatron-core 0.19.2 multi_latent_attention.py, moe_utils.py; transformers' DeepseekV3 classes).
#include <doctest/doctest.h>

#include "models/layer_inventory.hpp"
#include "models/model_loader.hpp"
#include "planner/cards.hpp"
#include "planner/comm_model.hpp"
#include "planner/compute_model.hpp"
#include "io/config_error.hpp"
#include "planner/pipeline.hpp"
#include "planner/plan.hpp"
#include "planner/memory_model.hpp"
#include "planner/scenario.hpp"
#include "support/megatron_layer.hpp"
#include "support/clusters.hpp"
#include "support/memory_items.hpp"

using namespace longseq;
using testing::h100s;

namespace {

// DeepSeek-V3's layer on one of 8 TP ranks: 16 of 128 heads, q and k heads of 192 (128 + a rotary
// 64), v heads of 128, a q latent of 1536 and a kv latent of 512; 16,384 tokens on the rank, of
// which the residual stream holds 2,048. Dense (its first layers' MLP, 18432 / 8 wide) unless
// `experts`: then its MoE layer, 256 experts of 2048 over `ep` ranks, 8 a token, a shared expert.
LayerShape deepseek_v3_tp8_shape(bool experts = false, int64_t ep = 256) {
  LayerShape shape;
  shape.tokens = 16'384;
  shape.tp = 8;
  shape.ep = ep;
  shape.hidden = 7168;
  shape.num_q_heads = 16;
  shape.num_kv_heads = 16;
  shape.head_dim = 192;
  shape.q_width = 16 * 192;
  shape.kv_width = 16 * 192;
  shape.v_width = 16 * 128;
  shape.mla_q_rank = 1536;
  shape.mla_kv_rank = 512;
  shape.mla_rope_dim = 64;
  shape.intermediate = 18'432 / 8;
  shape.vocab = 129'280 / 8;
  if (experts) {
    shape.experts = 256;
    shape.experts_per_token = 8;
    shape.expert_intermediate = 2048;
    shape.shared_expert_intermediate = 2048;
    shape.moe_router_sigmoid = true;
    shape.moe_router_fp32 = true;
  }
  return shape;
}

constexpr double kTokens = 16'384, kShardTokens = 2048;

// DeepSeek-V3 on tp=8 x ep=256 with the distributed optimizer, without full recompute.
PlanOptions deepseek_v3_tp8_ep256_plan() {
  PlanOptions plan;
  plan.tp = 8;
  plan.ep = 256;
  plan.zero_stage = 1;
  plan.activation_checkpointing = false;
  return plan;
}

}  // namespace

TEST_CASE("MLA under TP saves the input norm's output, both latents and their norms' outputs, then q, k, v at 192, 192 and 128 a head") {
  const double h_shard = kShardTokens * 7168 * 2, rsigma = kShardTokens * 8;
  // The layer's input and the input norm's output and statistics (a TENorm of its own: the down-
  // projections run on the shard, not gathered); the q latent [T_s, 1536] (q_up's norm input) and its
  // norm's output and statistics; the kv latent's contiguous copy [T_s, 512] and its norm's; query
  // and key [T, 16 x 192], value [T, 16 x 128]; the attention output [T, 16 x 128] and its fp32 lse
  // [T, 16]; the residual after the output projection.
  const double attention = h_shard + h_shard + rsigma + 2 * (kShardTokens * 1536 * 2) + rsigma + 2 * (kShardTokens * 512 * 2) + rsigma +
                           2 * (kTokens * 16 * 192 * 2) + kTokens * 16 * 128 * 2 + kTokens * 16 * 128 * 2 + kTokens * 16 * 4 + h_shard;
  // The dense MLP (M1.1-M1.2): the pre-MLP norm's output and statistics, fc1's [T, 2 f/t] and the
  // SwiGLU's [T, f/t].
  const double mlp = h_shard + rsigma + kTokens * 2 * 2304 * 2 + kTokens * 2304 * 2;
  CHECK(decoder_layer_saved_bytes(deepseek_v3_tp8_shape(), testing::megatron_te_layer_impl()) == doctest::Approx(attention + mlp).epsilon(1e-12));
  // q projected directly (no q latent, DeepSeek-V2-Lite's shape): no latent, norm or statistics for q.
  LayerShape direct_q = deepseek_v3_tp8_shape();
  direct_q.mla_q_rank = 0;
  CHECK(decoder_layer_saved_bytes(direct_q, testing::megatron_te_layer_impl()) ==
        doctest::Approx(attention + mlp - 2 * (kShardTokens * 1536 * 2) - rsigma).epsilon(1e-12));
}

TEST_CASE("MLA's forward and backward free all they make, under TP or not, with a ring or a2a, with a q latent or without") {
  for (const int64_t tp : {1, 8})
    for (const int64_t q_rank : {0, 1536})
      for (const bool experts : {false, true})
        for (const auto& [sp, ring] : {std::pair<int64_t, int64_t>{1, 1}, {1, 2}, {2, 1}}) {
          LayerShape shape = deepseek_v3_tp8_shape(experts);
          shape.tp = tp;
          shape.mla_q_rank = q_rank;
          shape.sp = sp;
          shape.ring = ring;
          const TensorTrace trace = testing::megatron_layer_step(shape);
          REQUIRE(trace.live_items().size() == 1);
          CHECK(trace.live_items().front().name == "layer.input_grad");
          CHECK(trace.current_bytes() == static_cast<double>(shape.hidden_state_tokens()) * 7168 * 2);
        }
}

TEST_CASE("the sigmoid router in fp32 saves the scores over every expert, the chosen k with their int64 indices, the probabilities in fp32") {
  LayerShape sigmoid = deepseek_v3_tp8_shape(/*experts=*/true);
  LayerShape softmax = sigmoid;
  softmax.moe_router_sigmoid = false;
  softmax.moe_router_fp32 = false;
  const double experts = 256, k = 8, pairs = kShardTokens * k;
  // Softmax (normalized top-k, bf16 logits): the fp32 softmax over the k [T_s, k] and bf16 permuted
  // probabilities [P]. Sigmoid in fp32: its fp32 output [T_s, E], the gathered k scores (fp32) and
  // their int64 indices, the sum [T_s, 1] the division saves, and fp32 permuted probabilities.
  const double softmax_router = kShardTokens * k * 4 + pairs * 2;
  const double sigmoid_router = kShardTokens * experts * 4 + kShardTokens * k * (4 + 8) + kShardTokens * 4 + pairs * 4;
  CHECK(decoder_layer_saved_bytes(sigmoid, testing::megatron_te_layer_impl()) - decoder_layer_saved_bytes(softmax, testing::megatron_te_layer_impl()) ==
        doctest::Approx(sigmoid_router - softmax_router).epsilon(1e-9));
  // The dispatcher keeps the dense probabilities in the logits' dtype: fp32 here, beside the bool
  // routing map and TE's int32 row-id map [T_s, 2E + 1].
  CHECK(megatron_moe_dispatcher_held_bytes(sigmoid, testing::megatron_te_layer_impl()) ==
        doctest::Approx(kShardTokens * experts * 4 + kShardTokens * experts + kShardTokens * (2 * experts + 1) * 4).epsilon(1e-12));
}

TEST_CASE("DeepSeek-V3's dense first layers save less and peak lower than its MoE layers (the running layer is priced as a MoE layer)") {
  for (const int64_t tokens : {8'192, 16'384, 262'144}) {
    LayerShape dense = deepseek_v3_tp8_shape(), moe = deepseek_v3_tp8_shape(/*experts=*/true);
    dense.tokens = moe.tokens = tokens;
    CHECK(decoder_layer_saved_bytes(dense, testing::megatron_te_layer_impl()) < decoder_layer_saved_bytes(moe, testing::megatron_te_layer_impl()));
    CHECK(testing::megatron_layer_step(dense).peak_bytes() < testing::megatron_layer_step(moe).peak_bytes());
  }
}

TEST_CASE("DeepSeek-V3's parameters: MLA's projections, 3 dense layers and 58 MoE ones, 671.03B in all and 37.55B active") {
  const ModelSpec model = model_load("deepseek-v3");
  const ParameterCount count = parameter_count(model);
  // q_a_proj 7168 x 1536 and its norm, q_b_proj 1536 x 128 x 192, kv_a_proj_with_mqa 7168 x 576, its
  // norm 512, kv_b_proj 512 x 128 x (128 + 128), o_proj 128 x 128 x 7168.
  const int64_t attention = 7168LL * 1536 + 1536 + 1536LL * 128 * 192 + 7168LL * 576 + 512 + 512LL * 128 * 256 + 128LL * 128 * 7168;
  CHECK(count.per_layer_attention == attention);
  CHECK(attention == 187'107'328);
  const int64_t norms = 2 * 7168;
  const int64_t dense = attention + 3LL * 7168 * 18'432 + norms;
  // The router 7168 x 256 (its expert bias a buffer, untrained), 256 experts and one shared of 3 x 7168 x 2048.
  const int64_t moe = attention + 7168LL * 256 + 257LL * 3 * 7168 * 2048 + norms;
  CHECK(count.per_dense_layer == dense);
  CHECK(count.per_layer == moe);
  CHECK(count.per_layer_routed_experts == 256LL * 3 * 7168 * 2048);
  const int64_t embedding = 129'280LL * 7168;
  CHECK(count.total == 2 * embedding + 3 * dense + 58 * moe + 7168);
  CHECK(count.total == 671'026'404'352);
  CHECK(count.active == count.total - 58LL * 248 * 3 * 7168 * 2048);
  CHECK(count.active == 37'552'282'624);
  CHECK(model.moe_layers() == 58);
  // Its config.json reads as the card: the same shape, router and latents.
  const ModelSpec config = model_load(std::string(LONGSEQ_TEST_DATA_DIR) + "/hf/deepseek-v3.config.json");
  CHECK(parameter_count(config).total == count.total);
  CHECK(parameter_count(config).active == count.active);
  CHECK(config.head_dim == 192);
  CHECK(config.v_width() == 128 * 128);
  CHECK((config.latent_attention.q_lora_rank == 1536 && config.latent_attention.kv_lora_rank == 512 &&
         config.latent_attention.qk_rope_head_dim == 64));
  CHECK((config.moe_router_sigmoid && config.moe_router_groups == 8 && config.moe_router_group_topk == 4));
  CHECK(config.moe_routed_scaling_factor == 2.5);
  CHECK((config.dense_layers == 3 && config.mtp_layers == 1 && config.shared_expert_intermediate_size == 2048 && !config.shared_expert_gate));
  CHECK(config.rope_scaling == "yarn");
}

TEST_CASE("pipeline stages hold the dense first layers on the first stage: its parameters and MoE layers, and the last stage's") {
  const ModelSpec model = model_load("deepseek-v3");
  const ParameterCount count = parameter_count(model);
  PlanOptions plan;
  plan.pp = 4;
  plan.tp = 8;
  plan.ep = 64;
  const ClusterSpec cluster = h100s(256);
  // 61 layers on 4 stages: middle stages of ceil(61 / 4) = 16, the first and last sharing 29: 14 and 15.
  const std::vector<PipelineStage> stages = pipeline_stages(model, cluster, plan);
  REQUIRE(stages.size() >= 2);
  CHECK(stages.front().layers == 14);
  CHECK(stages.front().moe_layers == 11);
  CHECK(stages.front().parameters == count.embedding + 3 * count.per_dense_layer + 11 * count.per_layer);
  CHECK(stages.back().layers == 15);
  CHECK(stages.back().moe_layers == 15);
  CHECK(stages.back().parameters == 15 * count.per_layer + count.final_norm + count.lm_head);
}

TEST_CASE("MLA's FLOPs: its five projections, attention over 192-wide scores and 128-wide values, the dense layers' MLP averaged in") {
  const ModelSpec model = model_load("deepseek-v3");
  const double s = 4096, h = 7168;
  const LayerForwardFlops flops = layer_forward_flops(model, 1, 4096, 1);
  CHECK(flops.projections == doctest::Approx(2 * s * (h * 1536 + 1536 * 128 * 192 + h * 576 + 512 * 128 * 256 + 128 * 128 * h)).epsilon(1e-12));
  // Causal: QK^T over 192 and PV over 128 a head, each 2 S^2 d halved.
  CHECK(flops.attention == doctest::Approx(s * s * (192 + 128) * 128).epsilon(1e-12));
  // 58 MoE layers (router, 8 routed and 1 shared expert a token) and 3 dense ones (18432 wide).
  const double moe_mlp = 2 * s * h * (3.0 * (8 * 2048 + 2048) + 256), dense_mlp = 3 * 2 * s * h * 18'432;
  CHECK(flops.mlp == doctest::Approx((58 * moe_mlp + 3 * dense_mlp) / 61).epsilon(1e-12));
  // Ulysses (cp_comm_type a2a) exchanges q and k at 192 a head, v and the output at 128.
  CHECK(ulysses_layer_all_to_all_bytes(model, 1, 65'536, 8, 2) == doctest::Approx(65'536.0 / 8 * 128 * (192 + 128 + 192 + 128) * 2).epsilon(1e-12));
}

TEST_CASE("selective recompute drops MLA's input norm output and q, k, v, the pre-MLP norm's output and the experts' activation") {
  const LayerShape full = deepseek_v3_tp8_shape(/*experts=*/true);
  LayerShape selective = full;
  selective.recompute = {/*layernorm=*/true, /*moe_act=*/true, /*mla_up_proj=*/true};
  const double h_shard = kShardTokens * 7168 * 2, pairs = kShardTokens * 8;
  // Dropped: the two norms' outputs [T_s, h]; q and k [T, 16 x 192], v [T, 16 x 128]; the weighted
  // SwiGLU's output [P, 2048] (one expert a rank: P = T_s k tokens arrive).
  const double dropped = 2 * h_shard + 2 * (kTokens * 16 * 192 * 2) + kTokens * 16 * 128 * 2 + pairs * 2048 * 2;
  CHECK(decoder_layer_saved_bytes(full, testing::megatron_te_layer_impl()) - decoder_layer_saved_bytes(selective, testing::megatron_te_layer_impl()) ==
        doctest::Approx(dropped).epsilon(1e-12));
  // Each one alone drops its own.
  LayerShape one = full;
  one.recompute.moe_act = true;
  CHECK(decoder_layer_saved_bytes(full, testing::megatron_te_layer_impl()) - decoder_layer_saved_bytes(one, testing::megatron_te_layer_impl()) ==
        doctest::Approx(pairs * 2048 * 2).epsilon(1e-12));
  // Backward recomputes them and frees all it makes, under TP or not, with or without a q latent.
  for (const int64_t tp : {1, 8})
    for (const int64_t q_rank : {0, 1536}) {
      LayerShape shape = selective;
      shape.tp = tp;
      shape.mla_q_rank = q_rank;
      const TensorTrace trace = testing::megatron_layer_step(shape);
      REQUIRE(trace.live_items().size() == 1);
      CHECK(trace.live_items().front().name == "layer.input_grad");
    }
}

TEST_CASE("selective recompute in a plan: without full recompute, of modules the model has, MLA's without context parallelism") {
  const ModelSpec deepseek = model_load("deepseek-v3"), llama = model_load("llama-3.1-8b");
  const ClusterSpec cluster = h100s(256);
  PlanOptions plan = deepseek_v3_tp8_ep256_plan();
  plan.recompute_modules = megatron_recompute_modules_parse("layernorm,moe_act,mla_up_proj", "--recompute-modules", "");
  CHECK(plan_problems(deepseek, cluster, plan).empty());
  CHECK(plan_describe(plan).find("+recompute(layernorm,moe_act,mla_up_proj)") != std::string::npos);
  // MLA's up-projections recomputed: their two GEMMs again, per layer 2 T n (r_q d_qk + r_kv (d_nope + d_v)), over t.
  PlanOptions none = plan;
  none.recompute_modules = {};
  const double tokens = 8192, extra = 61 * 2 * tokens * 128 * (1536.0 * 192 + 512.0 * 256) / 8;
  CHECK(step_flops_executed(deepseek, plan, 8192).matmul - step_flops_executed(deepseek, none, 8192).matmul == doctest::Approx(extra).epsilon(1e-9));
  plan.ring = 2;  // TE's context-parallel attention keeps its own q, k, v
  CHECK(!plan_problems(deepseek, cluster, plan).empty());
  plan.ring = 1;
  plan.activation_checkpointing = true;  // selective is instead of full
  CHECK(!plan_problems(deepseek, cluster, plan).empty());
  // A dense GPT layer fuses its norms and has no experts or latents.
  PlanOptions dense;
  dense.activation_checkpointing = false;
  dense.recompute_modules.layernorm = true;
  CHECK(!plan_problems(llama, cluster, dense).empty());
  CHECK_THROWS_AS(megatron_recompute_modules_parse("core_attn", "--recompute-modules", ""), ConfigError);
}

TEST_CASE("a scenario fixes or holds Megatron's recompute: recompute_block_layers, recompute_modules, offload_activation_layers") {
  const std::string head = "name: x\nmodel: deepseek-v3\ncluster: {gpu: h100-sxm-80gb}\n";
  const Scenario fixed = scenario_from_text(
      head + "plan: {framework: megatron-core, tp: 8, ep: 256, activation_checkpointing: false, recompute_modules: \"layernorm,moe_act,mla_up_proj\"}\n"
             "sweep: {gpus: [256], seqlen: [8Ki]}\n",
      "x.yaml");
  const std::vector<SweepRow> rows = scenario_run(fixed);
  REQUIRE(rows.size() == 1);
  REQUIRE(rows[0].plan);
  CHECK(rows[0].error == "");
  CHECK(plan_describe(*rows[0].plan) == "tp=8 ep=256 sp=1 zero=1 -checkpointing +recompute(layernorm,moe_act,mla_up_proj)");
  // A search holds a block recompute count given.
  const Scenario held = scenario_from_text("name: x\nmodel: llama-3.1-70b\ncluster: {gpu: h100-sxm-80gb}\n"
                                           "plan: {search: max-seqlen, framework: megatron-core, pp: 2, recompute_block_layers: 20}\nsweep: {gpus: [32]}\n",
                                           "x.yaml");
  const std::vector<SweepRow> held_rows = scenario_run(held);
  REQUIRE(held_rows.size() == 1);
  REQUIRE(held_rows[0].plan);
  CHECK(held_rows[0].plan->recompute_block_layers == 20);
  CHECK_THROWS_WITH_AS(scenario_from_text(head + "plan: {recompute_modules: \"core_attn\"}\nsweep: {gpus: [8]}\n", "x.yaml"),
                       doctest::Contains("unknown recompute module 'core_attn'"), ConfigError);
}

TEST_CASE("without recompute DeepSeek-V3's 3 dense first layers keep a dense layer's tensors and its 58 MoE layers a MoE layer's") {
  const ModelSpec model = model_load("deepseek-v3");
  const ClusterSpec cluster = h100s(256);
  const PlanOptions plan = deepseek_v3_tp8_ep256_plan();
  const MemoryPrediction prediction = memory_predict(model, cluster, plan, runtime_profile_load("megatron-core"), 4096);
  // At the loss every layer's tensors are resident: T = 4,096 tokens, T_s = 512 on a TP rank.
  LayerShape moe = deepseek_v3_tp8_shape(/*experts=*/true), dense = deepseek_v3_tp8_shape();
  moe.tokens = dense.tokens = 4096;
  const double expected = 3 * decoder_layer_saved_bytes(dense, testing::megatron_te_layer_impl()) +
                          58 * decoder_layer_saved_bytes(moe, testing::megatron_te_layer_impl());
  int loss_phases = 0;
  for (const PhasePeak& phase : prediction.phases)
    if (phase.phase == "logits and loss") {
      ++loss_phases;
      CHECK(testing::item_bytes(phase.items, "saved_activations") == doctest::Approx(expected).epsilon(1e-9));
    }
  CHECK(loss_phases == 1);
}
