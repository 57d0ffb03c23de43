// Transformer Engine's FP8 under Megatron-Core (issue 42; docs/reference-megatron-core.md M10): what
// the linears save and hold in FP8, the weights' FP8 copies, the GEMMs priced at the FP8 rate with the
// LM head left in bf16, the casts, the export, and who refuses it. Every expected figure is derived
// by hand from TE 2.20.2's linear.py / layernorm_linear.py and Megatron-Core 0.19.2 as M10 cites them.
#include <doctest/doctest.h>

#include <algorithm>

#include "models/adapters.hpp"
#include "models/layer_inventory.hpp"
#include "models/model_loader.hpp"
#include "planner/cards.hpp"
#include "planner/compute_model.hpp"
#include "planner/frameworks.hpp"
#include "io/config_error.hpp"
#include "planner/memory_model.hpp"
#include "planner/scenario.hpp"
#include "planner/time_model.hpp"
#include "reports/export.hpp"
#include "support/export_request.hpp"
#include "support/clusters.hpp"
#include "support/megatron_layer.hpp"
#include "support/memory_items.hpp"

using namespace longseq;
using testing::item_bytes;

namespace {

// Llama-3.1-8B's layer on one of `tp` TP ranks, 16,384 tokens a rank (the residual stream's 16,384 / tp).
LayerShape llama_shape(int64_t tp) {
  LayerShape shape;
  shape.tokens = 16'384;
  shape.tp = tp;
  shape.hidden = 4096;
  shape.q_width = 4096 / tp;
  shape.kv_width = 1024 / tp;
  shape.num_q_heads = 32 / tp;
  shape.num_kv_heads = 8 / tp;
  shape.head_dim = 128;
  shape.intermediate = 14'336 / tp;
  shape.vocab = 128'256 / tp;
  return shape;
}

LayerImplementation fp8_impl(bool fp8, bool transposed_copies = true) {
  LayerImplementation impl = testing::megatron_te_layer_impl();
  impl.te_fp8 = fp8;
  impl.te_fp8_transposed_copies = transposed_copies;
  return impl;
}

PlanOptions megatron_plan(int64_t tp, int64_t ring, bool fp8) {
  PlanOptions plan;
  plan.tp = tp;
  plan.ring = ring;
  plan.zero_stage = 1;
  plan.activation_checkpointing = true;
  plan.fp8 = fp8;
  return plan;
}

}  // namespace

TEST_CASE("in FP8 the linears save their inputs a byte an element: the norms' outputs, fc2's input, and a copy of the attention output") {
  const double tokens = 16'384;
  for (const int64_t tp : {1, 4}) {
    const double shard = tokens / static_cast<double>(tp) * 4096 * 2;  // [T/t, h] bf16
    const double bf16 = decoder_layer_saved_bytes(llama_shape(tp), fp8_impl(false));
    // The two fused norms' outputs at half their bf16 bytes (M10.1: with_quantized_norm); fc2 keeps
    // its quantized input [T, f/t] in place of the SwiGLU's bf16 output; the output projection keeps
    // a quantized copy [T, n d / t] of the attention output, which the attention saves in bf16 too.
    const double expected = bf16 - 2 * shard / 2 - tokens * (14'336.0 / static_cast<double>(tp)) + tokens * (4096.0 / static_cast<double>(tp));
    CHECK(decoder_layer_saved_bytes(llama_shape(tp), fp8_impl(true)) == doctest::Approx(expected).epsilon(1e-12));
    // What is saved keeps one usage (M10.1): the same on a card that keeps no transposed copies.
    CHECK(decoder_layer_saved_bytes(llama_shape(tp), fp8_impl(true, false)) == doctest::Approx(expected).epsilon(1e-12));
  }
}

TEST_CASE("in FP8 fc1's backward holds its output gradient quantized twice, its gathered input and its transpose under TP") {
  const double tokens = 16'384, shard = 4096.0 * 4096 * 2, rsigma = 4096.0 * 8;
  const TensorTrace trace = testing::megatron_layer_step(llama_shape(4), fp8_impl(true));
  CHECK(trace.peak_moment() == "fc1 and pre-MLP norm backward");
  // Live then: the input, the input norm's FP8 output and statistics, QKV, q, k, the attention output,
  // its lse and its FP8 copy, the residual, the pre-MLP norm's FP8 output and statistics, the output's
  // gradient; fc1's output gradient [T, 2 f/t] bf16 and its two FP8 copies (row-wise for dgrad,
  // transposed for wgrad: 2 bytes an element), the saved FP8 shard gathered [T, h] and transposed (2
  // bytes an element), and the input gradient produced whole [T, h] bf16 before its reduce-scatter.
  const double expected = shard + shard / 2 + rsigma + tokens * (1024 + 512) * 2 + tokens * 1024 * 2 + tokens * 256 * 2 + tokens * 1024 * 2 +
                          tokens * 8 * 4 + tokens * 1024 + shard + shard / 2 + rsigma + shard + tokens * 2 * 3584 * 2 +
                          tokens * 2 * 3584 * 2 + tokens * 4096 * 2 + tokens * 4096 * 2;
  CHECK(trace.peak_bytes() == doctest::Approx(expected).epsilon(1e-12));
  // Everything it made is freed but the input gradient, on either card, with or without TP and CP,
  // and with the MLP checkpointed (te_checkpoint, transformer_layer.py L882-890).
  for (const int64_t tp : {1, 4})
    for (const int64_t ring : {1, 2})
      for (const bool transposed : {true, false}) {
        LayerShape cp_shape = llama_shape(tp);
        cp_shape.ring = ring;
        cp_shape.recompute.mlp = transposed && ring == 2;
        const TensorTrace step = testing::megatron_layer_step(cp_shape, fp8_impl(true, transposed));
        REQUIRE(step.live_items().size() == 1);
        CHECK(step.live_items().front().name == "layer.input_grad");
        // A checkpointed forward keeps only its output.
        TensorTrace checkpointed;
        checkpointed.alloc(kCategoryLayer, "layer.input", 16'384.0 / static_cast<double>(tp) * 4096 * 2);
        decoder_layer_forward(checkpointed, cp_shape, fp8_impl(true, transposed), false);
        CHECK(checkpointed.live_items().size() == 2);
      }
}

TEST_CASE("TE's FP8 weight copies: every linear of the rank's layers, its TP share, two bytes a weight on Hopper and one on Blackwell") {
  const ModelSpec model = model_load("llama-3.1-8b");
  const RuntimeProfile profile = runtime_profile_load("megatron-core");
  const double linears = static_cast<double>(layer_linear_parameter_count(model));  // 32 x (q, k, v, o, gate, up, down)
  CHECK(linears == doctest::Approx(32.0 * (4096.0 * (4096 + 2 * 1024) + 4096.0 * 4096 + 3 * 4096.0 * 14'336)));
  const MemoryPrediction hopper = memory_predict(model, testing::card_cluster("h100-sxm-80gb", 16), megatron_plan(4, 2, true), profile, 65'536);
  CHECK(item_bytes(hopper.phases.front().items, "fp8_weight_copies") == doctest::Approx(linears / 4 * 2));
  const MemoryPrediction blackwell = memory_predict(model, testing::card_cluster("b200-180gb", 16), megatron_plan(4, 2, true), profile, 65'536);
  CHECK(item_bytes(blackwell.phases.front().items, "fp8_weight_copies") == doctest::Approx(linears / 4));
  // None in bf16.
  const MemoryPrediction bf16 = memory_predict(model, testing::card_cluster("h100-sxm-80gb", 16), megatron_plan(4, 2, false), profile, 65'536);
  CHECK(item_bytes(bf16.phases.front().items, "fp8_weight_copies") == 0);
  // Under pipeline parallelism a stage's layers only: 80 layers on 4 stages, 20 a rank.
  const ModelSpec big = model_load("llama-3.1-70b");
  PlanOptions staged = megatron_plan(8, 1, true);
  staged.pp = 4;
  staged.global_batch = 4;
  const MemoryPrediction stages = memory_predict(big, testing::card_cluster("h100-sxm-80gb", 32), staged, profile, 16'384);
  CHECK(item_bytes(stages.phases.front().items, "fp8_weight_copies") ==
        doctest::Approx(static_cast<double>(layer_linear_parameter_count(big)) / 80 * 20 / 8 * 2));
}

TEST_CASE("in FP8 the layers' GEMMs run at the FP8 rate, the LM head's at bf16's, and TP gathers a byte an element") {
  const ModelSpec model = model_load("llama-3.1-8b");
  const ClusterSpec cluster = testing::card_cluster("h100-sxm-80gb", 8);
  const RuntimeProfile profile = runtime_profile_load("megatron-core");
  const int64_t seqlen = 32'768;
  const StepFlops bf16 = step_flops_executed(model, megatron_plan(4, 1, false), seqlen);
  const StepFlops fp8 = step_flops_executed(model, megatron_plan(4, 1, true), seqlen);
  const double lm_head = 3 * lm_head_forward_flops(model, 1, seqlen, 1) / 4;  // forward and both gradients, a TP rank's
  CHECK(fp8.matmul == doctest::Approx(lm_head));
  CHECK(fp8.matmul_fp8 == doctest::Approx(bf16.matmul - lm_head));
  CHECK(fp8.total() == doctest::Approx(bf16.total()));
  // The card's measured bf16 share of peak (794.5 of 989) on its FP8 peak (1,979): 1,589.8 TFLOPS.
  CHECK(fp8_matmul_achieved_tflops(cluster.hardware) == doctest::Approx(1979.0 * 794.5 / 989.0));
  const TimePrediction time = time_predict(model, cluster, megatron_plan(4, 1, true), profile, seqlen);
  CHECK(time.time.matmul_s == doctest::Approx(lm_head / 794.5e12 + fp8.matmul_fp8 / (1979.0 * 794.5 / 989.0 * 1e12)));
  // Both quantizations and the GEMM rate make the FP8 step faster; its exposed TP collectives smaller
  // (the gathers carry a byte an element, the reduce-scatters bf16).
  const TimePrediction bf16_time = time_predict(model, cluster, megatron_plan(4, 1, false), profile, seqlen);
  CHECK(time.time.total_s() < bf16_time.time.total_s());
  CHECK(time.time.tensor_parallel_exposed_s < bf16_time.time.tensor_parallel_exposed_s);
  CHECK(time.time.elementwise_s > bf16_time.time.elementwise_s);  // the casts
}

TEST_CASE("FP8 is Megatron-Core's, on a card with FP8 tensor cores, for its dense GPT layer, and the export writes TE's hybrid format") {
  const ModelSpec model = model_load("llama-3.1-8b");
  const PlanOptions plan = megatron_plan(4, 2, true);
  CHECK(plan_problems(model, testing::card_cluster("h100-sxm-80gb", 16), plan).empty());
  CHECK(plan_describe(plan).find(" +fp8") != std::string::npos);
  const std::vector<std::string> ampere = plan_problems(model, testing::card_cluster("a100-80gb", 16), plan);
  REQUIRE(ampere.size() == 1);
  CHECK(ampere.front().find("no FP8 tensor rate") != std::string::npos);
  const ClusterSpec h100s = testing::card_cluster("h100-sxm-80gb", 16);
  CHECK(plan_problems(model_load("qwen1.5-moe-a2.7b"), h100s, plan).empty());  // MoE with a shared expert (M10.4)
  const std::vector<std::string> deepseek = plan_problems(model_load("deepseek-v3"), testing::card_cluster("h100-sxm-80gb", 256), plan);
  CHECK(std::any_of(deepseek.begin(), deepseek.end(), [](const std::string& problem) { return problem.find("latent attention") != std::string::npos; }));
  CHECK(framework_unsupported(Framework::framework_megatron_core, model, plan, 16).empty());
  for (const Framework other : {Framework::framework_torchtitan, Framework::framework_accelerate_fsdp2, Framework::framework_arctic_training}) {
    PlanOptions single = plan;
    single.tp = 1;
    single.ring = 1;
    single.zero_stage = 3;
    CHECK_MESSAGE(framework_unsupported(other, model, single, 16).find("FP8") != std::string::npos, framework_unsupported(other, model, single, 16));
  }
  ExportRequest request = testing::export_request("llama-3.1-8b", 16, plan, 131'072);
  request.profile = runtime_profile_load("megatron-core");
  const std::string script = config_emit("megatron-core", request).text();
  CHECK(script.find("  --fp8-format hybrid --fp8-recipe delayed \\\n") != std::string::npos);
  request.plan.fp8 = false;
  CHECK(config_emit("megatron-core", request).text().find("--fp8") == std::string::npos);
}

TEST_CASE("a scenario plans FP8 and all_gather context parallelism: fixed in a plan, held by a search, refused by a run") {
  const std::string head = "name: x\nmodel: llama-3.1-8b\ncluster: {gpu: h100-sxm-80gb}\n";
  const Scenario fixed = scenario_from_text(
      head + "plan: {framework: megatron-core, tp: 2, ring: 8, fp8: true, cp_all_gather: true}\nsweep: {gpus: [16], seqlen: [128Ki]}\n", "x.yaml");
  const std::vector<SweepRow> rows = scenario_run(fixed);
  REQUIRE(rows.size() == 1);
  REQUIRE(rows[0].plan);
  CHECK(rows[0].error == "");
  CHECK(plan_describe(*rows[0].plan) == "tp=2 sp=1 ring=8 zero=1 +checkpointing +fp8 cp-comm=all_gather");
  const Scenario held = scenario_from_text(head + "plan: {search: max-seqlen, framework: megatron-core, tp: 2, fp8: true}\nsweep: {gpus: [16]}\n",
                                           "x.yaml");
  const std::vector<SweepRow> held_rows = scenario_run(held);
  REQUIRE(held_rows.size() == 1);
  REQUIRE(held_rows[0].plan);
  CHECK(held_rows[0].plan->fp8);
  CHECK_THROWS_WITH_AS(scenario_run_options(scenario_from_text("name: r\nmodel: llama-3.1-8b\ncluster: {gpu: cpu-device}\n"
                                                                "plan: {fp8: true}\nrun: {steps: 1, seqlen: 1024}\n",
                                                                "r.yaml")),
                       doctest::Contains("plan.fp8"), ConfigError);
}
