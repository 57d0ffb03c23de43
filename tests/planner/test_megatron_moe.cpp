// Megatron-Core's MoE layer and expert parallelism (issue 42): the layer's saved tensors with q/k
// norms and its routed experts, what each layer's all-to-all dispatcher keeps all step, a rank's
// model states with its experts split over ep ranks, the dispatcher's all-to-all in the step time,
// the rules of ep, the search and the export; gpt-oss (windows, sinks, its clamped SwiGLU) under it.
// Every expected figure is derived by hand from docs/reference-megatron-core.md (M6) and
// megatron-core 0.19.2's code it cites.
#include <doctest/doctest.h>

#include "models/layer_inventory.hpp"
#include "models/model_loader.hpp"
#include "planner/cards.hpp"
#include "planner/comm_model.hpp"
#include "planner/compute_model.hpp"
#include "planner/frameworks.hpp"
#include "planner/memory_model.hpp"
#include "planner/scenario.hpp"
#include "planner/search.hpp"
#include "planner/time_model.hpp"
#include "reports/export.hpp"
#include "support/export_request.hpp"
#include "support/clusters.hpp"
#include "support/memory_items.hpp"
#include "support/megatron_layer.hpp"

using namespace longseq;
using testing::h100s;
using testing::item_bytes;

namespace {

// Qwen3-30B-A3B's layer on one of 2 TP ranks: 16 of 32 query heads, 2 of 4 key/value heads (d = 128),
// q/k norms; 128 experts of width 768, 8 a token, over `ep` ranks; 16,384 tokens of which the
// residual stream (and the router) holds 8,192.
LayerShape qwen3_moe_tp2_shape(int64_t ep, int64_t ring = 1) {
  LayerShape shape;
  shape.tokens = 16'384;
  shape.tp = 2;
  shape.ep = ep;
  shape.ring = ring;
  shape.hidden = 2048;
  shape.q_width = 2048;
  shape.kv_width = 256;
  shape.num_q_heads = 16;
  shape.num_kv_heads = 2;
  shape.head_dim = 128;
  shape.qk_norm = true;
  shape.intermediate = 3072;
  shape.vocab = 151'936 / 2;
  shape.experts = 128;
  shape.experts_per_token = 8;
  shape.expert_intermediate = 768;
  return shape;
}

PlanOptions megatron_plan(int64_t tp, int64_t ep, int64_t ring, bool recompute) {
  PlanOptions plan;
  plan.tp = tp;
  plan.ep = ep;
  plan.ring = ring;
  plan.zero_stage = 1;
  plan.activation_checkpointing = recompute;
  return plan;
}

constexpr double kSharedTokens = 8192;  // T_s = T / t
constexpr double kPairs = 8192.0 * 8;   // P = T_s k

}  // namespace

TEST_CASE("Megatron's MoE layer saves the norms, the router's fp32 scores and the sorted tokens, fc1's output and the weighted SwiGLU's") {
  const double tokens = 16'384, shard = kSharedTokens * 2048 * 2, rsigma = kSharedTokens * 8;
  // Attention (M1.1-M1.2 as the dense layer's) with q/k norms: the input, the input norm's output and
  // statistics, the QKV output (v is a view of it), each q/k norm's contiguous input copy and per-head
  // fp32 statistics, the rotated q and k, the attention output and its fp32 lse, the residual.
  const double attention = shard + shard + rsigma + tokens * (2048 + 2 * 256) * 2 + tokens * 2048 * 2 + tokens * 16 * 4 + tokens * 256 * 2 +
                           tokens * 2 * 4 + tokens * 2048 * 2 + tokens * 256 * 2 + tokens * 2048 * 2 + tokens * 16 * 4 + shard;
  // The MoE layer (M6.4): the pre-MLP norm's output and statistics; the top-k softmax [T_s, k] and the
  // aux loss's softmax [T_s, E], fp32; the permuted probabilities [P]; the tokens sorted by local
  // expert [P, h] (16 experts a rank); fc1's [P, 2 f_e] and the weighted SwiGLU's [P, f_e].
  const double moe = shard + rsigma + kSharedTokens * 8 * 4 + kSharedTokens * 128 * 4 + kPairs * 2 + kPairs * 2048 * 2 + kPairs * 2 * 768 * 2 +
                     kPairs * 768 * 2;
  CHECK(decoder_layer_saved_bytes(qwen3_moe_tp2_shape(8), testing::megatron_te_layer_impl()) == doctest::Approx(attention + moe).epsilon(1e-12));
  // One rank with every expert sorts them all the same; 128 ranks of one expert each sort nothing, and
  // fc1 saves the tokens as the all-to-all delivered them: as many bytes.
  CHECK(decoder_layer_saved_bytes(qwen3_moe_tp2_shape(1), testing::megatron_te_layer_impl()) == doctest::Approx(attention + moe).epsilon(1e-12));
  CHECK(decoder_layer_saved_bytes(qwen3_moe_tp2_shape(128), testing::megatron_te_layer_impl()) == doctest::Approx(attention + moe).epsilon(1e-12));
}

TEST_CASE("the MoE layer's forward holds the permuted, dispatched and sorted tokens at once, and its backward frees all it made") {
  for (const int64_t ep : {1, 8, 128}) {
    for (const int64_t ring : {1, 2}) {
      const TensorTrace trace = testing::megatron_layer_step(qwen3_moe_tp2_shape(ep, ring));
      REQUIRE(trace.live_items().size() == 1);
      CHECK(trace.live_items().front().name == "layer.input_grad");
      CHECK(trace.current_bytes() == kSharedTokens * 2048 * 2);
    }
  }
  // At the forward's peak (the combine), MoELayer still names the permuted tokens and the
  // all-to-all's output beside the sorted copy fc1 saved, fc2's output and its two copies back.
  TensorTrace trace;
  trace.set_record_peak_items(true);
  trace.alloc(kCategoryLayer, "layer.input", kSharedTokens * 2048 * 2);
  decoder_layer_forward(trace, qwen3_moe_tp2_shape(8), testing::megatron_te_layer_impl(), /*keep_for_backward=*/false);
  for (const char* name : {"moe.permuted_tokens", "moe.dispatched_tokens", "moe.expert_inputs", "moe.fc2_output", "moe.unsorted_output",
                           "moe.combined_output"})
    CHECK_MESSAGE(testing::peak_item_bytes(trace, name) == doctest::Approx(kPairs * 2048 * 2), name);
}

TEST_CASE("shared experts (Qwen2-MoE's, gated): fc1's and the SwiGLU's outputs at a TP rank's width, and the gate's multiply inputs") {
  LayerShape shared = qwen3_moe_tp2_shape(8);
  shared.shared_expert_intermediate = 5632;
  const double tokens = 16'384, shard = kSharedTokens * 2048 * 2;
  const double ungated_extra = tokens * 2 * (5632 / 2) * 2 + tokens * (5632 / 2) * 2;  // fc1 [T, 2 I_s / t], SwiGLU [T, I_s / t]
  const double base = decoder_layer_saved_bytes(qwen3_moe_tp2_shape(8), testing::megatron_te_layer_impl());
  CHECK(decoder_layer_saved_bytes(shared, testing::megatron_te_layer_impl()) == doctest::Approx(base + ungated_extra).epsilon(1e-12));
  // Gated: the multiply saves the MLP's output [T_s, h] and the sigmoid's [T_s, 1].
  shared.shared_expert_gate = true;
  CHECK(decoder_layer_saved_bytes(shared, testing::megatron_te_layer_impl()) == doctest::Approx(base + ungated_extra + shard + kSharedTokens * 2).epsilon(1e-12));
  for (const bool gate : {false, true}) {
    for (const int64_t tp : {1, 2}) {
      LayerShape shape = shared;
      shape.shared_expert_gate = gate;
      shape.tp = tp;
      const TensorTrace trace = testing::megatron_layer_step(shape);
      REQUIRE(trace.live_items().size() == 1);
      CHECK(trace.current_bytes() == static_cast<double>(shape.hidden_state_tokens()) * 2048 * 2);
    }
  }
  // Megatron-Core plans Qwen1.5-MoE (60 experts, a gated shared expert) with its experts split: ep
  // divides the 60 (4 here), and its export names the shared expert and its gate.
  const ModelSpec model = model_load("qwen1.5-moe-a2.7b");
  CHECK(framework_unsupported(Framework::framework_megatron_core, model, megatron_plan(2, 4, 1, true), 8).empty());
  ExportRequest request = testing::export_request("qwen1.5-moe-a2.7b", 8, megatron_plan(2, 4, 1, true), 32'768);
  request.profile = runtime_profile_load("megatron-core");
  const std::string script = config_emit("megatron-core", request).text();
  CHECK(script.find("  --moe-shared-expert-intermediate-size 5632 --moe-shared-expert-gate \\\n") != std::string::npos);
  CHECK(script.find("  --moe-router-pre-softmax \\\n") != std::string::npos);  // norm_topk_prob false: softmax over all, then top-k
  // That softmax, over all 128 experts in fp32, is what the router saves in place of the top-k's [T_s, k].
  LayerShape pre_softmax = qwen3_moe_tp2_shape(8);
  pre_softmax.moe_normalize_topk = false;
  CHECK(decoder_layer_saved_bytes(pre_softmax, testing::megatron_te_layer_impl()) == doctest::Approx(base + kSharedTokens * (128 - 8) * 4).epsilon(1e-12));
}

TEST_CASE("each MoE layer's dispatcher keeps its probabilities, routing map and row-id map: bf16, bool and int32 [T_s, 2E + 1]") {
  const double expected = kSharedTokens * 128 * 2 + kSharedTokens * 128 * 1 + kSharedTokens * (2 * 128 + 1) * 4;
  CHECK(megatron_moe_dispatcher_held_bytes(qwen3_moe_tp2_shape(8), testing::megatron_te_layer_impl()) == doctest::Approx(expected));
  LayerShape dense = qwen3_moe_tp2_shape(1);
  dense.experts = 0;
  CHECK(megatron_moe_dispatcher_held_bytes(dense, testing::megatron_te_layer_impl()) == 0);
}

TEST_CASE("under expert parallelism a rank holds 1/ep of the experts whole and 1/t of the rest, the optimizer each over its group") {
  const ModelSpec model = model_load("qwen3-30b-a3b");
  const ClusterSpec cluster = h100s(16);
  const RuntimeProfile profile = runtime_profile_load("megatron-core");
  const double total = static_cast<double>(parameter_count(model).total);
  const double experts = 48.0 * 128 * 3 * 2048 * 768;
  const PlanOptions plan = megatron_plan(2, 16, 1, true);  // dp = 8
  REQUIRE(plan_problems(model, cluster, plan).empty());
  const MemoryPrediction prediction = memory_predict(model, cluster, plan, profile, 16'384);
  const std::vector<MemoryItem>& items = prediction.phases.front().items;
  const double rank_parameters = (total - experts) / 2 + experts / 16;
  CHECK(item_bytes(items, "weights") == doctest::Approx(rank_parameters * 2));
  CHECK(item_bytes(items, "gradients_fp32") == doctest::Approx(rank_parameters * 4));
  // The dense share over dp x cp = 16 / 2 ranks, the experts' over the expert-data-parallel 16 / 16.
  const double optimizer_parameters = (total - experts) / 2 / 8 + experts / 16 / 1;
  CHECK(item_bytes(items, "master_weights") == doctest::Approx(optimizer_parameters * 4));
  CHECK(item_bytes(items, "optimizer_states") == doctest::Approx(optimizer_parameters * 8));
  // 48 layers' dispatchers, each with the [8,192, E] probabilities and maps of its last forward.
  CHECK(item_bytes(items, "moe.dispatcher_state") == doctest::Approx(48 * megatron_moe_dispatcher_held_bytes(qwen3_moe_tp2_shape(16),
                                                                                                              testing::megatron_te_layer_impl())));
}

TEST_CASE("the dispatcher's all-to-all: the routed T_s k tokens out and back, forward, recompute and backward, over the ep ranks' link") {
  const ModelSpec model = model_load("qwen3-30b-a3b");
  const ClusterSpec cluster = h100s(8);
  const RuntimeProfile profile = runtime_profile_load("megatron-core");
  const int64_t seqlen = 32'768;
  const TimePrediction time = time_predict(model, cluster, megatron_plan(2, 8, 1, true), profile, seqlen);
  const Link link = link_for_group(cluster, 8);
  const double routed = 32'768.0 / 2 * 8 * 2048 * 2;  // [T_s k, h] bf16
  // Dispatch and combine in the forward and again in the recompute, both mirrored in backward.
  CHECK(time.time.expert_all_to_all_s == doctest::Approx(48 * 6 * collective_seconds(Collective::collective_all_to_all, routed, 8, link)));
  CHECK(time_predict(model, cluster, megatron_plan(2, 1, 1, true), profile, seqlen).time.expert_all_to_all_s == 0);
  // Without recompute, four exchanges a layer.
  CHECK(time_predict(model, cluster, megatron_plan(2, 8, 1, false), profile, seqlen).time.expert_all_to_all_s ==
        doctest::Approx(48 * 4 * collective_seconds(Collective::collective_all_to_all, routed, 8, link)));
  // The MoE layer gathers nothing over the TP ranks (its expert TP group is one rank): the attention's
  // gather and reduce-scatter alone, in the forward and the recompute, and the backward's gather.
  const Link tp_link = link_for_group(cluster, 2);
  const double gathered = 32'768.0 * 2048 * 2;  // [T, h] bf16
  const double all_gather = tp_link.latency_us * 1e-6 + collective_seconds(Collective::collective_all_gather, gathered, 2, tp_link);
  const double reduce_scatter = tp_link.latency_us * 1e-6 + collective_seconds(Collective::collective_reduce_scatter, gathered, 2, tp_link);
  const double backward_matmul = time.time.matmul_s * 2.0 / 4.0;  // backward's share of the GEMMs, recompute on
  CHECK(time.time.tensor_parallel_exposed_s ==
        doctest::Approx(48 * (2 * (all_gather + reduce_scatter) + all_gather) + std::max(0.0, 48 * (all_gather + reduce_scatter) - backward_matmul)));
}

TEST_CASE("expert parallelism: Megatron-Core's alone, ep dividing the experts and a stage's ranks, and the search choosing it") {
  const ModelSpec model = model_load("qwen3-30b-a3b");
  const ClusterSpec cluster = h100s(8);
  CHECK(framework_unsupported(Framework::framework_megatron_core, model, megatron_plan(2, 8, 1, true), 8).empty());
  const std::string refusal = framework_unsupported(Framework::framework_deepspeed, model, megatron_plan(1, 8, 1, true), 8);
  CHECK(refusal.find("no expert parallelism") != std::string::npos);
  auto first_problem = [&](const ModelSpec& m, const ClusterSpec& c, const PlanOptions& p) {
    const std::vector<std::string> problems = plan_problems(m, c, p);
    return problems.empty() ? std::string() : problems.front();
  };
  CHECK(first_problem(model, h100s(6), megatron_plan(1, 3, 1, true)).find("does not divide Qwen3-30B-A3B's 128 experts") != std::string::npos);
  PlanOptions staged = megatron_plan(1, 8, 1, true);
  staged.pp = 2;  // 8 ranks a stage of 16: ep 8 fits, 16 does not
  CHECK(plan_problems(model, h100s(16), staged).empty());
  staged.ep = 16;
  CHECK(first_problem(model, h100s(16), staged).find("ranks of a pipeline stage") != std::string::npos);
  CHECK(first_problem(model_load("llama-3.1-8b"), cluster, megatron_plan(1, 2, 1, true)).find("has no experts") != std::string::npos);

  SearchOptions options;
  search_options_for_framework(options, Framework::framework_megatron_core, model, cluster);
  CHECK(options.expert_parallel == std::vector<int64_t>{1, 2, 4, 8});
  const SearchResult result = plan_search(model, cluster, runtime_profile_load("megatron-core"), options);
  REQUIRE(result.winner() != nullptr);
  // 30.5B parameters' states on 8 GPUs leave room for activations only with the experts split 8 ways.
  CHECK(result.winner()->plan.ep == 8);
}

TEST_CASE("--emit megatron-core writes the MoE layer as planned: experts, top-k, their width, ep with ETP 1, the all-to-all dispatcher") {
  PlanOptions plan = megatron_plan(4, 8, 2, true);
  ExportRequest request = testing::export_request("qwen3-30b-a3b", 8, plan, 49'152);
  request.profile = runtime_profile_load("megatron-core");
  const std::string script = config_emit("megatron-core", request).text();
  for (const char* expected :
       {"  --qk-layernorm \\\n", "  --num-experts 128 --moe-router-topk 8 --moe-ffn-hidden-size 768 \\\n",
        "  --expert-model-parallel-size 8 --expert-tensor-parallel-size 1 \\\n",
        "  --moe-grouped-gemm --moe-token-dispatcher-type alltoall --moe-permute-fusion \\\n",
        "  --moe-router-load-balancing-type aux_loss --moe-aux-loss-coeff 1e-3 \\\n"})
    CHECK_MESSAGE(script.find(expected) != std::string::npos, expected);
  CHECK(script.find("--moe-router-pre-softmax") == std::string::npos);  // Qwen3 renormalizes its top-k (norm_topk_prob)
  // Megatron builds its own MoE layer: no note about the model code's block, which DeepSpeed gathers as
  // a ZeRO-3 leaf module and FSDP2 with its decoder layer's unit.
  auto moe_note_of = [](const ExportedConfig& exported) {
    for (const std::string& note : exported.notes)
      if (note.rfind("MoE: ", 0) == 0) return note;
    return std::string();
  };
  CHECK(moe_note_of(config_emit("megatron-core", request)).empty());
  PlanOptions zero3;
  zero3.zero_stage = 3;
  const ExportRequest hf_request = testing::export_request("qwen3-30b-a3b", 8, zero3, 16'384);
  CHECK(moe_note_of(config_emit("deepspeed", hf_request)).find("a ZeRO-3 leaf module") != std::string::npos);
  CHECK(moe_note_of(config_emit("accelerate-fsdp2", hf_request)).find("its decoder layer's FSDP2 unit") != std::string::npos);
  request = testing::export_request("llama-3.1-8b", 8, megatron_plan(2, 1, 1, true), 32'768);
  request.profile = runtime_profile_load("megatron-core");
  CHECK(config_emit("megatron-core", request).text().find("--num-experts") == std::string::npos);
}

TEST_CASE("gpt-oss under Megatron-Core: windows on every other layer cut their attention to S W pairs, sinks run with a2a only") {
  const ModelSpec model = model_load("gpt-oss-20b");
  // 12 of 24 layers attend within 128 tokens: the average layer's attention is (12 + 12 x 2 x 128 / S) / 24
  // of a causal one's.
  ModelSpec full = model;
  full.windowed_layers = 0;
  const int64_t seqlen = 131'072;
  CHECK(layer_forward_flops(model, 1, seqlen, 1).attention ==
        doctest::Approx(layer_forward_flops(full, 1, seqlen, 1).attention * (12 + 12 * 2.0 * 128 / 131'072) / 24));
  CHECK(layer_forward_flops(model, 1, seqlen, 1).mlp == layer_forward_flops(full, 1, seqlen, 1).mlp);

  // Sinks are TE's learnable softmax, planned under Megatron-Core alone; TE's context parallelism runs
  // them (and sliding windows) with cp_comm_type a2a only.
  CHECK(framework_unsupported(Framework::framework_deepspeed, model, PlanOptions{}, 8).find("attention sinks") != std::string::npos);
  PlanOptions ulysses = megatron_plan(4, 8, 1, true);
  ulysses.sp = 2;
  CHECK(framework_unsupported(Framework::framework_megatron_core, model, ulysses, 16).empty());
  CHECK(framework_unsupported(Framework::framework_megatron_core, model, megatron_plan(4, 8, 2, true), 16).find("a2a only") !=
        std::string::npos);
  // A window on layers config.json does not name (Mistral v0.1's) is not in a pattern Megatron expresses.
  CHECK(framework_unsupported(Framework::framework_megatron_core, model_load("mistral-7b-v0.1"), megatron_plan(1, 1, 1, true), 8)
            .find("not in a pattern") != std::string::npos);

  // 20.9B parameters' states on 8 GPUs: the search splits the experts.
  const ClusterSpec cluster = h100s(8);
  SearchOptions options;
  search_options_for_framework(options, Framework::framework_megatron_core, model, cluster);
  const SearchResult result = plan_search(model, cluster, runtime_profile_load("megatron-core"), options);
  REQUIRE(result.winner() != nullptr);
  CHECK(result.winner()->plan.ep == 8);
  CHECK(result.winner()->plan.ring == 1);

  // Its export: the window (W - 1, 0) with every other layer full, the sinks, the clamped SwiGLU as
  // Megatron's quick-GeGLU with an offset.
  ExportRequest request = testing::export_request("gpt-oss-20b", 16, ulysses, 131'072);
  request.profile = runtime_profile_load("megatron-core");
  const std::string script = config_emit("megatron-core", request).text();
  for (const char* expected :
       {"  --window-size 127,0 --window-attn-skip-freq 2 \\\n", "  --softmax-type learnable \\\n",
        "  --quick-geglu --glu-linear-offset 1.0 --activation-func-clamp-value 7 \\\n", "  --context-parallel-size 2 --cp-comm-type a2a \\\n"})
    CHECK_MESSAGE(script.find(expected) != std::string::npos, expected);
  CHECK(script.find("--swiglu") == std::string::npos);
  CHECK(script.find("--disable-bias-linear") == std::string::npos);  // its linears carry biases
}

TEST_CASE("a scenario plans expert parallelism: ep fixes a plan's expert ranks, or is held by a search") {
  const std::string head = "name: x\nmodel: qwen3-30b-a3b\ncluster: {gpu: h100-sxm-80gb}\n";
  const Scenario fixed = scenario_from_text(head + "plan: {framework: megatron-core, tp: 4, ep: 8, ring: 2}\nsweep: {gpus: [8], seqlen: [32Ki]}\n",
                                            "x.yaml");
  const std::vector<SweepRow> fixed_rows = scenario_run(fixed);
  REQUIRE(fixed_rows.size() == 1);
  REQUIRE(fixed_rows[0].plan);
  CHECK(fixed_rows[0].error == "");
  CHECK(plan_describe(*fixed_rows[0].plan) == "tp=4 ep=8 sp=1 ring=2 zero=1 +checkpointing");
  const Scenario held = scenario_from_text(head + "plan: {search: max-seqlen, framework: megatron-core, ep: 4}\nsweep: {gpus: [16]}\n", "x.yaml");
  const std::vector<SweepRow> held_rows = scenario_run(held);
  REQUIRE(held_rows.size() == 1);
  REQUIRE(held_rows[0].plan);
  CHECK(held_rows[0].plan->ep == 4);
}

TEST_CASE("the MoE layer in FP8: the experts' inputs padded, saved quantized as fc2's are, and every expert's weights copied in FP8") {
  LayerImplementation fp8 = testing::megatron_te_layer_impl();
  fp8.te_fp8 = true;
  const double tokens = 16'384, shard = kSharedTokens * 2048 * 2;
  // The attention as the dense layer's in FP8 (M10.1: the fused input norm's output a byte an element,
  // a quantized copy of the attention output); the MoE layer's separate pre-MLP norm and router stay
  // bf16; the sorted tokens fc1 saves [P, h] and the SwiGLU's output fc2 saves [P, f_e] a byte an
  // element; the padded probabilities saved in place of the unpadded, as large (M10.4).
  const double bf16 = decoder_layer_saved_bytes(qwen3_moe_tp2_shape(8), testing::megatron_te_layer_impl());
  CHECK(decoder_layer_saved_bytes(qwen3_moe_tp2_shape(8), fp8) ==
        doctest::Approx(bf16 - shard / 2 + tokens * 2048 - kPairs * 2048 - kPairs * 768).epsilon(1e-12));
  // Its step frees all it makes, sorting or not, on either card.
  for (const int64_t ep : {1, 8, 128})
    for (const bool transposed : {true, false}) {
      fp8.te_fp8_transposed_copies = transposed;
      const TensorTrace step = testing::megatron_layer_step(qwen3_moe_tp2_shape(ep), fp8);
      REQUIRE(step.live_items().size() == 1);
      CHECK(step.live_items().front().name == "layer.input_grad");
    }
  // Shared experts (TE's linears, M10.1): fc1 saves its quantized input [T_s, h] beside the norm's
  // output the router saves; fc2 its quantized input [T, I_s / t] in place of the SwiGLU's bf16 output.
  LayerShape shared = qwen3_moe_tp2_shape(8);
  shared.shared_expert_intermediate = 5632;
  fp8.te_fp8_transposed_copies = true;
  const double with_shared_bf16 = decoder_layer_saved_bytes(shared, testing::megatron_te_layer_impl());
  CHECK(decoder_layer_saved_bytes(shared, fp8) - decoder_layer_saved_bytes(qwen3_moe_tp2_shape(8), fp8) ==
        doctest::Approx(with_shared_bf16 - bf16 + kSharedTokens * 2048 - tokens * (5632 / 2)).epsilon(1e-12));
  for (const int64_t tp : {1, 2})
    for (const bool gate : {false, true}) {
      LayerShape shape = shared;
      shape.tp = tp;
      shape.shared_expert_gate = gate;
      const TensorTrace step = testing::megatron_layer_step(shape, fp8);
      REQUIRE(step.live_items().size() == 1);
      CHECK(step.live_items().front().name == "layer.input_grad");
    }
  // TE's linears in one MoE layer of Qwen1.5-MoE (q, k, v, o at 2048 x 2048, the shared expert's
  // 3 x 2048 x 5632 over tp = 2; 15 of its 60 experts of 3 x 2048 x 1408 on each of ep = 4 ranks).
  CHECK(te_fp8_linear_parameters(model_load("qwen1.5-moe-a2.7b"), megatron_plan(2, 4, 1, true), 0, 1) ==
        doctest::Approx((4.0 * 2048 * 2048 + 3.0 * 2048 * 5632) / 2 + 15.0 * 3 * 2048 * 1408));
  // The weights' FP8 copies (two bytes a weight on Hopper): the attention's TP share and the rank's
  // 16 experts whole, over 48 layers.
  const ModelSpec model = model_load("qwen3-30b-a3b");
  PlanOptions plan = megatron_plan(2, 8, 1, true);
  plan.fp8 = true;
  REQUIRE(plan_problems(model, h100s(8), plan).empty());
  const MemoryPrediction prediction = memory_predict(model, h100s(8), plan, runtime_profile_load("megatron-core"), 16'384);
  const double attention = 2.0 * 2048 * 4096 + 2.0 * 2048 * 512;  // q and o [2048, 32 x 128], k and v [2048, 4 x 128]
  const double experts = 16.0 * 3 * 2048 * 768;
  CHECK(item_bytes(prediction.phases.front().items, "fp8_weight_copies") == doctest::Approx(48 * (attention / 2 + experts) * 2));
}
