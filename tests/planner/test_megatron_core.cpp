// Megatron-Core with Transformer Engine (issue 42): its GPT layer's saved tensors under tensor
// parallelism with sequence parallelism and under context parallelism, the model states of a TP
// rank with the distributed optimizer, the FLOPs and the TP collectives of a step, and which
// frameworks plan tensor parallelism. Every expected figure is derived by hand from
// docs/reference-megatron-core.md (M1-M3).
#include <doctest/doctest.h>

#include "models/layer_inventory.hpp"
#include "models/model_loader.hpp"
#include "planner/cards.hpp"
#include "planner/comm_model.hpp"
#include "planner/compute_model.hpp"
#include "planner/frameworks.hpp"
#include "planner/memory_model.hpp"
#include "planner/pipeline.hpp"
#include "planner/scenario.hpp"
#include "planner/search.hpp"
#include "planner/time_model.hpp"
#include "reports/export.hpp"
#include "support/export_request.hpp"
#include "support/megatron_layer.hpp"
#include "support/clusters.hpp"
#include "support/memory_items.hpp"

using namespace longseq;
using testing::h100s;
using testing::item_bytes;

namespace {

// Llama-3.1-8B's layer on one of 4 TP ranks: 8 of 32 query heads, 2 of 8 key/value heads (d = 128),
// 3,584 of the MLP's 14,336, 16,384 tokens of which the residual stream holds 4,096.
LayerShape llama_tp4_shape(int64_t sp, int64_t ring) {
  LayerShape shape;
  shape.tokens = 16'384;
  shape.tp = 4;
  shape.sp = sp;
  shape.ring = ring;
  shape.hidden = 4096;
  shape.q_width = 1024;
  shape.kv_width = 256;
  shape.num_q_heads = 8;
  shape.num_kv_heads = 2;
  shape.head_dim = 128;
  shape.intermediate = 3584;
  shape.vocab = 128'256 / 4;
  return shape;
}

LayerImplementation megatron_impl() {
  LayerImplementation impl;
  impl.activation_bytes = 2;
  impl.megatron_te_layer = true;
  impl.megatron_te_cross_entropy = true;
  impl.ulysses_staging_copies = 2;
  return impl;
}

PlanOptions megatron_plan(int64_t tp, int64_t sp, int64_t ring, int zero, bool recompute) {
  PlanOptions plan;
  plan.tp = tp;
  plan.sp = sp;
  plan.ring = ring;
  plan.zero_stage = zero;
  plan.activation_checkpointing = recompute;
  return plan;
}

}  // namespace

TEST_CASE("Megatron's TE layer under TP 4 keeps sequence-parallel shards outside attention and MLP and 1/4 of the widths inside") {
  const double shard = 4096.0 * 4096 * 2;  // [T/t, h] bf16
  const double rsigma = 4096.0 * 8;        // fp32 [T/t], TE's mean and rsigma slots
  const double tokens = 16'384;
  // Saved (M1.1, M1.2): the layer's input, the input norm's output shard and statistics; the QKV
  // output whole (v is a view of it) and the rotated q and k; the attention output and its fp32 lse;
  // the residual, the pre-MLP norm's output shard and statistics; fc1's output (gate and up) and the
  // fused SwiGLU's output.
  const double expected = shard + shard + rsigma + tokens * (1024 + 2 * 256) * 2 + tokens * 1024 * 2 + tokens * 256 * 2 +
                          tokens * 1024 * 2 + tokens * 8 * 4 + shard + shard + rsigma + tokens * 2 * 3584 * 2 + tokens * 3584 * 2;
  CHECK(decoder_layer_saved_bytes(llama_tp4_shape(1, 1), megatron_impl()) == doctest::Approx(expected).epsilon(1e-12));
  // The unfused glu keeps silu's output beside them (one more [T, f/t]).
  LayerImplementation unfused = megatron_impl();
  unfused.megatron_fused_swiglu = false;
  CHECK(decoder_layer_saved_bytes(llama_tp4_shape(1, 1), unfused) - expected == doctest::Approx(tokens * 3584 * 2));
}

TEST_CASE("under p2p context parallelism the layer saves the K/V block last received instead of k, v and the QKV output") {
  const double tokens = 16'384;
  const double no_cp = decoder_layer_saved_bytes(llama_tp4_shape(1, 1), megatron_impl());
  const double p2p = decoder_layer_saved_bytes(llama_tp4_shape(1, 2), megatron_impl());
  // Without CP: QKV (1024 + 512 wide) and k (256); with p2p: one K/V block (2 x 256) in their place.
  CHECK(no_cp - p2p == doctest::Approx(tokens * (1024 + 512 + 256 - 512) * 2));
  // Under a2a the contiguous q, k, v copies are saved (TE makes them contiguous under CP).
  const double a2a = decoder_layer_saved_bytes(llama_tp4_shape(2, 1), megatron_impl());
  CHECK(no_cp - a2a == doctest::Approx(tokens * (1024 + 512 + 256 - 256 - 256) * 2));
}

TEST_CASE("a layer's forward and backward under TP free everything they allocate but the output and the input gradient") {
  for (const auto& [sp, ring] : {std::pair<int64_t, int64_t>{1, 1}, {2, 1}, {1, 2}, {2, 2}}) {
    const TensorTrace trace = testing::megatron_layer_step(llama_tp4_shape(sp, ring), megatron_impl());
    REQUIRE(trace.live_items().size() == 1);
    CHECK(trace.live_items().front().name == "layer.input_grad");
    CHECK(trace.current_bytes() == 4096.0 * 4096 * 2);
  }
}

TEST_CASE("a TP rank's model states: 1/t of the parameters, fp32 gradients whole, the distributed optimizer over world / t ranks") {
  const ModelSpec model = model_load("llama-3.1-8b");
  const ClusterSpec cluster = h100s(16);
  const RuntimeProfile profile = runtime_profile_load("megatron-core");
  const double params = static_cast<double>(parameter_count(model).total);
  const PlanOptions plan = megatron_plan(4, 1, 2, 1, false);
  REQUIRE(plan_problems(model, cluster, plan).empty());
  const MemoryPrediction prediction = memory_predict(model, cluster, plan, profile, 65'536);
  const std::vector<MemoryItem>& items = prediction.phases.front().items;
  CHECK(item_bytes(items, "weights") == doctest::Approx(params / 4 * 2));
  // grad_reduce_in_fp32 (the Megatron-Bridge recipes'): the whole buffer of the rank's share (M3.1).
  CHECK(item_bytes(items, "gradients_fp32") == doctest::Approx(params / 4 * 4));
  // fp32 main parameters and two fp32 moments of the share, over dp x cp = 16 / 4 ranks (M2.4, M3.2).
  CHECK(item_bytes(items, "master_weights") == doctest::Approx(params / 4 * 4 / 4));
  CHECK(item_bytes(items, "optimizer_states") == doctest::Approx(params / 4 * 8 / 4));
}

TEST_CASE("without recompute every layer's saved set is resident at the loss, and the loss holds TE's copy of the vocabulary shard") {
  const ModelSpec model = model_load("llama-3.1-8b");
  const ClusterSpec cluster = h100s(16);
  const RuntimeProfile profile = runtime_profile_load("megatron-core");
  const PlanOptions plan = megatron_plan(4, 1, 1, 1, false);
  const int64_t seqlen = 16'384;
  const MemoryPrediction prediction = memory_predict(model, cluster, plan, profile, seqlen);
  const PhasePeak* loss = nullptr;
  for (const PhasePeak& phase : prediction.phases)
    if (phase.phase == "logits and loss") loss = &phase;
  REQUIRE(loss != nullptr);
  CHECK(item_bytes(loss->items, "saved_activations") ==
        doctest::Approx(32 * decoder_layer_saved_bytes(llama_tp4_shape(1, 1), megatron_impl())).epsilon(1e-9));
  // The logits' shard [T, V/t] and TE's copy of it (M1.4), both bf16, at the loss's peak.
  const double logits = 16'384.0 * (128'256 / 4) * 2;
  CHECK(item_bytes(loss->items, "logits") == doctest::Approx(logits));
  // Megatron's native loss (Megatron-LM refuses TE's): the shard upcast to fp32 beside it (M1.4).
  CHECK(item_bytes(loss->items, "cross_entropy.exp_logits_fp32") == doctest::Approx(2 * logits));
}

TEST_CASE("full recompute keeps each layer's input as a sequence-parallel shard") {
  const ModelSpec model = model_load("llama-3.1-8b");
  const ClusterSpec cluster = h100s(16);
  const RuntimeProfile profile = runtime_profile_load("megatron-core");
  const MemoryPrediction prediction = memory_predict(model, cluster, megatron_plan(4, 1, 1, 1, true), profile, 16'384);
  // 31 checkpoints below the last layer at the forward of the last: [16,384 / 4, 4096] bf16 each.
  CHECK(item_bytes(prediction.phases.front().items, "hidden_states_checkpoints") == doctest::Approx(31 * 4096.0 * 4096 * 2));
}

TEST_CASE("tensor parallelism divides a rank's FLOPs by t, and its exposed collectives are the forward's four and backward's two gathers") {
  const ModelSpec model = model_load("llama-3.1-8b");
  const ClusterSpec cluster = h100s(8);
  const RuntimeProfile profile = runtime_profile_load("megatron-core");
  const int64_t seqlen = 32'768;
  const StepFlops one = step_flops_executed(model, megatron_plan(1, 1, 1, 0, false), seqlen);
  const StepFlops four = step_flops_executed(model, megatron_plan(4, 1, 1, 0, false), seqlen);
  CHECK(four.matmul == doctest::Approx(one.matmul / 4));
  CHECK(four.attention == doctest::Approx(one.attention / 4));

  const TimePrediction time = time_predict(model, cluster, megatron_plan(4, 1, 1, 0, false), profile, seqlen);
  const Link link = link_for_group(cluster, 4);
  const double gathered = 32'768.0 * 4096 * 2;  // [T, h] bf16
  const double all_gather = link.latency_us * 1e-6 + collective_seconds(Collective::collective_all_gather, gathered, 4, link);
  const double reduce_scatter = link.latency_us * 1e-6 + collective_seconds(Collective::collective_reduce_scatter, gathered, 4, link);
  const double backward_matmul = time.time.matmul_s * 2.0 / 3.0;
  const double expected = 32 * (2 * (all_gather + reduce_scatter) + 2 * all_gather) +
                          std::max(0.0, 32 * 2 * (all_gather + reduce_scatter) - backward_matmul);
  CHECK(time.time.tensor_parallel_exposed_s == doctest::Approx(expected));
  CHECK(time.time.tensor_parallel_exposed_s > 0);
  // Without TP there is none.
  CHECK(time_predict(model, cluster, megatron_plan(1, 1, 1, 0, false), profile, seqlen).time.tensor_parallel_exposed_s == 0);
}

TEST_CASE("tensor parallelism: Megatron-Core's alone, its head rules, and its search over TP degrees inside a node") {
  const ModelSpec model = model_load("llama-3.1-8b");
  const ClusterSpec cluster = h100s(16);
  const PlanOptions tp2 = megatron_plan(2, 1, 1, 1, true);
  CHECK(framework_unsupported(Framework::framework_megatron_core, model, tp2, 16).empty());
  const std::string refusal = framework_unsupported(Framework::framework_hf_accelerate, model, tp2, 16);
  CHECK(refusal.find("no tensor parallelism") != std::string::npos);
  CHECK(refusal.find("megatron-core") != std::string::npos);
  // 8 key/value heads split over 16 TP ranks: Megatron's divide() refuses it.
  const std::vector<std::string> problems = plan_problems(model, h100s(16), megatron_plan(16, 1, 1, 1, true));
  REQUIRE(!problems.empty());
  CHECK(problems.front().find("key/value heads") != std::string::npos);
  // ZeRO-3 is not Megatron's.
  CHECK(framework_unsupported(Framework::framework_megatron_core, model, megatron_plan(1, 1, 1, 3, true), 16).find("ZeRO-1") !=
        std::string::npos);

  SearchOptions options;
  search_options_for_framework(options, Framework::framework_megatron_core, model, cluster);
  CHECK(options.tensor_parallel == std::vector<int64_t>{1, 2, 4, 8});
  options.objective = SearchObjective::objective_throughput;
  options.seqlen = 131'072;
  const SearchResult result = plan_search(model, cluster, runtime_profile_load("megatron-core"), options);
  REQUIRE(result.winner() != nullptr);
  CHECK(result.winner()->plan.tp > 1);
}

TEST_CASE("--emit megatron-core writes pretrain_gpt.py's arguments for the plan: TP with SP, a2a+p2p over u x r, the distributed optimizer") {
  PlanOptions plan = megatron_plan(4, 2, 2, 1, true);
  ExportRequest request = testing::export_request("llama-3.1-8b", 16, plan, 131'072);
  request.profile = runtime_profile_load("megatron-core");
  const std::string script = config_emit("megatron-core", request).text();
  for (const char* expected :
       {"export CUDA_DEVICE_MAX_CONNECTIONS=1\n", "torchrun --nproc-per-node 8 --nnodes 2 ", " pretrain_gpt.py \\\n",
        "  --num-layers 32 \\\n", "  --ffn-hidden-size 14336 \\\n", "  --group-query-attention --num-query-groups 8 \\\n",
        "  --seq-length 131072 --max-position-embeddings 131072 \\\n", "  --position-embedding-type rope --rotary-base 500000 \\\n",
        "  --micro-batch-size 1 --global-batch-size 1 \\\n", "  --tensor-model-parallel-size 4 --sequence-parallel \\\n",
        "  --context-parallel-size 4 --cp-comm-type a2a+p2p --hierarchical-context-parallel-sizes 2 2 \\\n",
        "  --use-distributed-optimizer \\\n", "  --recompute-granularity full --recompute-method uniform --recompute-num-layers 1 \"$@\"\n"})
    CHECK_MESSAGE(script.find(expected) != std::string::npos, expected);
  CHECK(script.find("\n  --cross-entropy") == std::string::npos);  // the native loss: no fusion argument
  // p2p alone, a2a alone, none; no recompute, no distributed optimizer.
  request.plan = megatron_plan(2, 1, 4, 0, false);
  const std::string ring = config_emit("megatron-core", request).text();
  CHECK(ring.find("--context-parallel-size 4 --cp-comm-type p2p \\\n") != std::string::npos);
  CHECK(ring.find("--use-distributed-optimizer") == std::string::npos);
  CHECK(ring.find("--recompute-granularity") == std::string::npos);
  request.plan = megatron_plan(8, 2, 1, 1, true);
  CHECK(config_emit("megatron-core", request).text().find("--context-parallel-size 2 --cp-comm-type a2a \\\n") != std::string::npos);
  request.plan = megatron_plan(8, 1, 1, 1, true);
  CHECK(config_emit("megatron-core", request).text().find("--context-parallel-size") == std::string::npos);
}

TEST_CASE("pipeline stages under 1F1B: the first holds min(pp, m) micro-batches and the embedding, the last one and the head and loss") {
  const ModelSpec model = model_load("llama-3.1-70b");  // 80 layers
  const ClusterSpec cluster = h100s(256);
  PlanOptions plan = megatron_plan(8, 1, 8, 1, true);
  plan.pp = 4;
  plan.global_batch = 16;  // dp = 256 / (8 x 8 x 4) = 1: 16 micro-batches
  REQUIRE(plan_problems(model, cluster, plan).empty());
  const ParameterCount params = parameter_count(model);
  const std::vector<PipelineStage> stages = pipeline_stages(model, cluster, plan);
  REQUIRE(stages.size() == 2);
  CHECK(stages[0].layers == 20);
  CHECK(stages[0].in_flight == 4);
  CHECK(!stages[0].loss);
  CHECK(stages[0].parameters == params.embedding + 20 * params.per_layer);
  CHECK(stages[1].in_flight == 1);
  CHECK(stages[1].loss);
  CHECK(stages[1].parameters == 20 * params.per_layer + params.final_norm + params.lm_head);
  CHECK(pipeline_slots(cluster, plan) == 16 + 3);
  // Two micro-batches only: the first stage holds two (the warm-up is capped by them).
  plan.global_batch = 2;
  CHECK(pipeline_stages(model, cluster, plan)[0].in_flight == 2);

  // The first stage's forward of its last layer: 4 micro-batches x 20 layers of sequence-parallel
  // checkpoints, less the running layer's own input.
  plan.global_batch = 16;
  const RuntimeProfile profile = runtime_profile_load("megatron-core");
  const MemoryPrediction prediction = memory_predict(model, cluster, plan, profile, 1'048'576);
  const PhasePeak& first_forward = prediction.phases.front();
  CHECK(first_forward.phase == "forward of the last decoder layer (first pipeline stage)");
  const double checkpoint = 1'048'576.0 / 8 / 8 * 8192 * 2;  // [S / (r t), h] bf16
  CHECK(item_bytes(first_forward.items, "hidden_states_checkpoints") == doctest::Approx(79 * checkpoint));
  // The first stage holds the embedding's share and no head: its weights are the stage's parameters / t,
  // its fp32 gradient buffer whole, its optimizer states over dp x cp = 256 / (8 x 4) = 8 ranks.
  const double stage_share = static_cast<double>(stages[0].parameters) / 8;
  CHECK(item_bytes(first_forward.items, "weights") == doctest::Approx(stage_share * 2));
  CHECK(item_bytes(first_forward.items, "gradients_fp32") == doctest::Approx(stage_share * 4));
  CHECK(item_bytes(first_forward.items, "optimizer_states") == doctest::Approx(stage_share * 8 / 8));
  // The last stage runs the loss; the first does not.
  int loss_phases = 0;
  for (const PhasePeak& phase : prediction.phases) loss_phases += phase.phase == "logits and loss (last pipeline stage)";
  CHECK(loss_phases == 1);
  CHECK(prediction.phases.size() == 5);
}

TEST_CASE("the 1F1B bubble is pp - 1 micro-batch slots of a stage's work, and a stage computes 1/pp of the layers") {
  const ModelSpec model = model_load("llama-3.1-70b");
  const ClusterSpec cluster = h100s(64);
  const RuntimeProfile profile = runtime_profile_load("megatron-core");
  PlanOptions flat = megatron_plan(8, 1, 8, 1, true);
  flat.global_batch = 8;  // dp 1: 8 micro-batches
  PlanOptions piped = flat;
  piped.ring = 2;
  piped.pp = 4;
  const int64_t seqlen = 131'072;
  const StepFlops one = step_flops_executed(model, megatron_plan(8, 1, 2, 1, true), seqlen);
  const StepFlops staged = step_flops_executed(model, piped, seqlen);
  CHECK(staged.total() == doctest::Approx(one.total() / 4));
  const TimePrediction time = time_predict(model, cluster, piped, profile, seqlen);
  const StepTime& t = time.time;
  const double slot = (t.matmul_s + t.attention_s + t.ulysses_all_to_all_s + t.ring_exposed_s + t.ring_final_hop_s + t.tensor_parallel_exposed_s +
                       t.elementwise_s) / 8;
  CHECK(t.pipeline_bubble_s == doctest::Approx(3 * slot));
  CHECK(t.pipeline_p2p_s > 0);
  CHECK(time_predict(model, cluster, flat, profile, seqlen).time.pipeline_bubble_s == 0);
  // Pipeline parallelism is Megatron-Core's alone.
  PlanOptions pipeline_only = megatron_plan(1, 1, 1, 1, true);
  pipeline_only.pp = 2;
  CHECK(framework_unsupported(Framework::framework_hf_accelerate, model, pipeline_only, 64).find("no pipeline parallelism") != std::string::npos);
  // 80 layers on three stages: Megatron's uneven split, ceil(80 / 3) = 27 in the middle stage and the
  // other 53 shared, 26 first and 27 last.
  PlanOptions uneven = piped;
  uneven.pp = 3;
  const PipelineSplit split = pipeline_split(model, uneven);
  CHECK((split.first == 26 && split.middle == 27 && split.last == 27));
}

TEST_CASE("a scenario plans Megatron-Core's layouts: tp and pp fix a plan, or are held by a search") {
  const std::string head = "name: x\nmodel: llama-3.1-70b\ncluster: {gpu: h100-sxm-80gb}\n";
  // A fixed plan: tp 8 x pp 2 x ring 4 on 64 GPUs, the distributed optimizer and recompute by default.
  const Scenario fixed = scenario_from_text(
      head + "plan: {framework: megatron-core, tp: 8, pp: 2, ring: 4, global_batch: 8}\nsweep: {gpus: [64], seqlen: [256Ki]}\n", "x.yaml");
  const std::vector<SweepRow> fixed_rows = scenario_run(fixed);
  REQUIRE(fixed_rows.size() == 1);
  REQUIRE(fixed_rows[0].plan);
  CHECK(fixed_rows[0].error == "");
  CHECK(plan_describe(*fixed_rows[0].plan) == "tp=8 pp=2 sp=1 ring=4 zero=1 +checkpointing global-batch=8");
  // A search holding tp 4: every point's plan has it.
  const Scenario held = scenario_from_text(head + "plan: {search: max-seqlen, framework: megatron-core, tp: 4}\nsweep: {gpus: [64]}\n", "x.yaml");
  const std::vector<SweepRow> held_rows = scenario_run(held);
  REQUIRE(held_rows.size() == 1);
  REQUIRE(held_rows[0].plan);
  CHECK(held_rows[0].plan->tp == 4);
  CHECK(held_rows[0].framework == "megatron-core");
}

TEST_CASE("the interleaved schedule: chunks of L / (pp vpp) layers, the warm-up's chunks in flight, (pp - 1) / vpp slots of bubble") {
  const ModelSpec model = model_load("llama-3.1-70b");  // 80 layers
  const ClusterSpec cluster = h100s(256);
  PlanOptions plan = megatron_plan(8, 1, 8, 1, true);
  plan.pp = 4;
  plan.vpp = 2;
  plan.global_batch = 16;  // 16 micro-batches, 32 chunks
  REQUIRE(plan_problems(model, cluster, plan).empty());
  const std::vector<PipelineStage> stages = pipeline_stages(model, cluster, plan);
  CHECK(stages[0].layers == 10);
  // Rank 0 warms up (4 - 0 - 1) x 2 + (2 - 1) x 4 = 10 chunk forwards, then one more before its first backward.
  CHECK(stages[0].in_flight == 11);
  CHECK(stages[1].in_flight == 5);  // the last rank: (2 - 1) x 4 + 1
  CHECK(pipeline_slots(cluster, plan) == doctest::Approx(16 + 1.5));
  const MemoryPrediction prediction = memory_predict(model, cluster, plan, runtime_profile_load("megatron-core"), 1'048'576);
  const double checkpoint = 1'048'576.0 / 8 / 8 * 8192 * 2;
  CHECK(item_bytes(prediction.phases.front().items, "hidden_states_checkpoints") == doctest::Approx((11 * 10 - 1) * checkpoint));
  // Micro-batches not in groups of pp are refused, as Megatron's schedule refuses them.
  plan.global_batch = 6;
  const std::vector<std::string> problems = plan_problems(model, cluster, plan);
  REQUIRE(!problems.empty());
  CHECK(problems.front().find("groups of pp=4") != std::string::npos);
  // The export names the virtual stages.
  plan.global_batch = 16;
  ExportRequest request = testing::export_request("llama-3.1-70b", 256, plan, 1'048'576);
  request.profile = runtime_profile_load("megatron-core");
  CHECK(config_emit("megatron-core", request).text().find("--pipeline-model-parallel-size 4 --num-virtual-stages-per-pipeline-rank 2 \\\n") !=
        std::string::npos);
}

TEST_CASE("uneven pipeline stages: Megatron's first and last stage layers where pp does not divide them, and the second stage's peak") {
  const ModelSpec llama_405b = model_load("llama-3.1-405b");  // 126 layers
  PlanOptions plan = megatron_plan(8, 1, 4, 1, true);
  plan.pp = 16;
  plan.global_batch = 16;
  // 8 layers on each of the 14 middle stages, 7 on the first and the last (Llama 3's own split).
  const PipelineSplit split = pipeline_split(llama_405b, plan);
  CHECK(split.first == 7);
  CHECK(split.middle == 8);
  CHECK(split.last == 7);
  const ClusterSpec cluster = h100s(512);
  REQUIRE(plan_problems(llama_405b, cluster, plan).empty());
  // The second stage holds 15 micro-batches of 8 layers (120 layers' checkpoints) against the first's
  // 16 of 7 (112): it is predicted too.
  const std::vector<PipelineStage> stages = pipeline_stages(llama_405b, cluster, plan);
  REQUIRE(stages.size() == 3);
  CHECK(stages[1].name == "second pipeline stage");
  CHECK(stages[1].layers == 8);
  CHECK(stages[1].in_flight == 15);
  // The schedule waits on the 8-layer stages: a rank computes 8/126 of the model.
  const StepFlops one = step_flops_executed(llama_405b, megatron_plan(8, 1, 4, 1, true), 131'072);
  CHECK(step_flops_executed(llama_405b, plan, 131'072).total() == doctest::Approx(one.total() * 8.0 / 126.0));
  // The export writes the split; Megatron-LM's own check of it is the frameworks check's.
  ExportRequest request = testing::export_request("llama-3.1-405b", 512, plan, 131'072);
  request.profile = runtime_profile_load("megatron-core");
  CHECK(config_emit("megatron-core", request).text().find("--decoder-first-pipeline-num-layers 7 --decoder-last-pipeline-num-layers 7") !=
        std::string::npos);
  // Interleaving an uneven split is not planned; a split that leaves the first stage nothing is refused.
  plan.vpp = 2;
  CHECK(!plan_problems(llama_405b, cluster, plan).empty());
  const ModelSpec llama_8b = model_load("llama-3.1-8b");  // 32 layers
  PlanOptions thin = megatron_plan(1, 1, 1, 1, true);
  thin.pp = 15;  // middle 3 x 13 = 39 > 32
  const std::vector<std::string> problems = plan_problems(llama_8b, cluster_make(hardware_card_load("h100-sxm-80gb"), 15, 1, 15, 0), thin);
  REQUIRE(!problems.empty());
  CHECK(problems.front().find("leaves no layer to the first or last stage") != std::string::npos);
}

TEST_CASE("TE's activation offloading: the GPU holds L - n layers' saved activations, the host n, the copies hidden behind L - n layers") {
  const ModelSpec model = model_load("llama-3.1-8b");
  const ClusterSpec cluster = h100s(8);
  const RuntimeProfile profile = runtime_profile_load("megatron-core");
  const int64_t seqlen = 65'536;
  PlanOptions plan = megatron_plan(8, 1, 1, 1, false);
  plan.offload_activation_layers = 24;
  REQUIRE(plan_problems(model, cluster, plan).empty());
  CHECK(framework_unsupported(Framework::framework_megatron_core, model, plan, 8).empty());
  // A TP 8 layer's saved set at 65,536 tokens (8,192 a rank in the residual stream).
  LayerShape shape = llama_tp4_shape(1, 1);
  shape.tokens = 65'536;
  shape.tp = 8;
  shape.q_width = 512;
  shape.kv_width = 128;
  shape.num_q_heads = 4;
  shape.num_kv_heads = 1;
  shape.intermediate = 1792;
  shape.vocab = (128'256 + 7) / 8;
  LayerImplementation impl = megatron_impl();
  impl.megatron_te_cross_entropy = false;
  impl.flash_attention_dq_accumulator = true;
  const double saved = decoder_layer_saved_bytes(shape, impl);
  const MemoryPrediction prediction = memory_predict(model, cluster, plan, profile, seqlen);
  const PhasePeak* loss = nullptr;
  for (const PhasePeak& phase : prediction.phases)
    if (phase.phase == "logits and loss") loss = &phase;
  REQUIRE(loss != nullptr);
  // At the loss the first 24 layers' sets are on the host (cpu_offload.py L602-622): 8 on the GPU.
  CHECK(item_bytes(loss->items, "saved_activations") == doctest::Approx(8 * saved).epsilon(1e-9));
  CHECK(item_bytes(prediction.host_items, "te_offloaded_activations_pinned") == doctest::Approx(8 * 24 * saved).epsilon(1e-9));

  // The copies, 24 sets down and up over PCIe, hide behind the other 8 layers' compute.
  const TimePrediction time = time_predict(model, cluster, plan, profile, seqlen);
  const HardwareCard& card = cluster.hardware;
  const double copies_s = 24 * saved * (1 / (card.pcie_device_to_host_gbps * 1e9) + 1 / (card.pcie_host_to_device_gbps * 1e9));
  CHECK(time.time.activation_offload_s == doctest::Approx(std::max(0.0, copies_s - (time.time.matmul_s + time.time.attention_s) * 8 / 32)));
  CHECK(time.time.activation_offload_s > 0);

  // Megatron refuses it with recompute, with pipeline stages and for every layer (transformer_config.py
  // L1707-1722); the other frameworks have no layer-wise offload.
  PlanOptions recompute = plan;
  recompute.activation_checkpointing = true;
  CHECK_FALSE(plan_problems(model, cluster, recompute).empty());
  PlanOptions staged = plan;
  staged.pp = 2;
  CHECK_FALSE(plan_problems(model, cluster, staged).empty());
  PlanOptions every = plan;
  every.offload_activation_layers = 32;
  CHECK_FALSE(plan_problems(model, cluster, every).empty());
  PlanOptions deepspeed;
  deepspeed.activation_checkpointing = false;
  deepspeed.offload_activation_layers = 16;
  CHECK(framework_unsupported(Framework::framework_deepspeed, model, deepspeed, 8).find("no layer-wise activation offloading") !=
        std::string::npos);

  // The export turns it on by the count (arguments.py L1869-1870).
  ExportRequest request = testing::export_request("llama-3.1-8b", 8, plan, seqlen);
  request.profile = profile;
  const std::string script = config_emit("megatron-core", request).text();
  CHECK(script.find("  --cpu-offloading-num-layers 24 ") != std::string::npos);
  CHECK(script.find("--recompute-granularity") == std::string::npos);
}

TEST_CASE("block recompute: the first n layers of a stage keep their input, the others what they save, n a copy in every micro-batch in flight") {
  const ModelSpec model = model_load("llama-3.1-70b");  // 80 layers: 20 a stage on 4
  const ClusterSpec cluster = h100s(256);
  const RuntimeProfile profile = runtime_profile_load("megatron-core");
  PlanOptions plan = megatron_plan(8, 1, 8, 1, true);
  plan.pp = 4;
  plan.global_batch = 16;  // dp 1: 16 micro-batches; the first stage holds 4
  plan.recompute_block_layers = 12;
  REQUIRE(plan_problems(model, cluster, plan).empty());
  const int64_t seqlen = 262'144;
  const MemoryPrediction prediction = memory_predict(model, cluster, plan, profile, seqlen);
  // The first stage's backward of its last layer (index 19, not checkpointed: 19 >= 12): below it 3
  // earlier micro-batches' 20 layers (12 checkpointed, 8 saving each) and this one's 19 (12 and 7).
  const PhasePeak* backward = nullptr;
  for (const PhasePeak& phase : prediction.phases)
    if (phase.phase == "backward of the last decoder layer (first pipeline stage)") backward = &phase;
  REQUIRE(backward != nullptr);
  const double checkpoint = 262'144.0 / 8 / 8 * 8192 * 2;  // [S / (r t), h] bf16
  CHECK(item_bytes(backward->items, "hidden_states_checkpoints") == doctest::Approx(48 * checkpoint));
  // A saving layer's bytes, from the same stage without recompute (3 x 20 + 19 layers saving).
  PlanOptions no_recompute = plan;
  no_recompute.activation_checkpointing = false;
  no_recompute.recompute_block_layers = 0;
  double per_layer = 0;
  for (const PhasePeak& phase : memory_predict(model, cluster, no_recompute, profile, seqlen).phases)
    if (phase.phase == backward->phase) per_layer = item_bytes(phase.items, "saved_activations") / 79;
  REQUIRE(per_layer > 0);
  CHECK(item_bytes(backward->items, "saved_activations") == doctest::Approx(31 * per_layer).epsilon(1e-9));
  // The step recomputes 12 of each stage's 20 layers: 12 / 20 of the forward again.
  CHECK(recomputed_layer_share(model, plan) == doctest::Approx(0.6));
  // As many as a stage holds is every layer's recompute: refused, as the flag outside Megatron-Core is.
  plan.recompute_block_layers = 20;
  CHECK(!plan_problems(model, cluster, plan).empty());
  plan.recompute_block_layers = 12;
  PlanOptions fsdp;  // a torchtitan plan but for the block recompute
  fsdp.recompute_block_layers = 12;
  CHECK(framework_unsupported(Framework::framework_torchtitan, model, fsdp, 256).find("no block recompute") != std::string::npos);
  // The export writes Megatron's block method with the count.
  ExportRequest request = testing::export_request("llama-3.1-70b", 256, plan, seqlen);
  CHECK(config_emit("megatron-core", request).text().find("--recompute-granularity full --recompute-method block --recompute-num-layers 12") !=
        std::string::npos);
}

TEST_CASE("cp_comm_type all_gather: K and V of the whole sequence gathered twice in forward, four times their size in backward, all exposed") {
  // llama_tp4_shape's K or V block is 16,384 tokens x 256 (2 kv heads of 128) in bf16.
  const double kv_block = 16'384.0 * 256 * 2;
  LayerImplementation all_gather = megatron_impl();
  all_gather.megatron_cp_all_gather = true;
  // Saved as p2p's: the local q, k, v (p2p saves the K/V block last received, as large), out and lse (M2.2).
  CHECK(decoder_layer_saved_bytes(llama_tp4_shape(1, 4), all_gather) ==
        doctest::Approx(decoder_layer_saved_bytes(llama_tp4_shape(1, 4), megatron_impl())));
  // Forward's transient: K and V of all r ring ranks gathered and reordered (2 r (K + V)), the
  // layer's peak on a ring of 64; backward's: gathered and reordered again, dK and dV of the whole
  // sequence and the steps' partials (4 r (K + V)), its peak.
  TensorTrace forward;
  forward.alloc(kCategoryLayer, "layer.input", 4096.0 * 4096 * 2);
  decoder_layer_forward(forward, llama_tp4_shape(1, 64), all_gather, true);
  CHECK(forward.peak_moment() == "attention");
  CHECK(testing::peak_item_bytes(forward, "cp.kv_all_gathered") == 2 * 64 * 2 * kv_block);
  forward.alloc(kCategoryLayer, "layer.output_grad", 4096.0 * 4096 * 2);
  decoder_layer_backward(forward, llama_tp4_shape(1, 64), all_gather);
  REQUIRE(forward.live_items().size() == 1);
  CHECK(forward.live_items().front().name == "layer.input_grad");
  CHECK(testing::peak_item_bytes(forward, "cp.all_gather_backward") == 4 * 64 * 2 * kv_block);

  // Time: the gather exposed in each forward (the recompute's too), gather and reduce-scatter in backward.
  const ModelSpec model = model_load("llama-3.1-8b");
  const ClusterSpec cluster = h100s(16);
  const RuntimeProfile profile = runtime_profile_load("megatron-core");
  PlanOptions plan = megatron_plan(4, 1, 4, 1, true);
  plan.cp_all_gather = true;
  REQUIRE(plan_problems(model, cluster, plan).empty());
  const int64_t seqlen = 65'536;
  const TimePrediction time = time_predict(model, cluster, plan, profile, seqlen);
  const Link link = link_for_group(cluster, 4 * 4);  // the ring's ranks lie t = 4 apart
  const double block = 65'536.0 / 4 * (256 + 256) * 2;  // this rank's K and V at its 2 kv heads
  const double gather = link.latency_us * 1e-6 + collective_seconds(Collective::collective_all_gather, 4 * block, 4, link);
  const double scatter = link.latency_us * 1e-6 + collective_seconds(Collective::collective_reduce_scatter, 4 * block, 4, link);
  CHECK(time.time.ring_exposed_s == doctest::Approx(32 * (2 * gather + gather + scatter)));
  CHECK(time.time.ring_final_hop_s == 0);

  // Megatron-Core's alone, over the ring degree alone; the export writes it.
  PlanOptions without_ring = plan;
  without_ring.ring = 1;
  CHECK(plan_problems(model, cluster, without_ring).front().find("--cp-all-gather") == 0);
  PlanOptions fsdp = megatron_plan(1, 1, 4, 3, true);
  fsdp.cp_all_gather = true;
  CHECK(framework_unsupported(Framework::framework_accelerate_fsdp2, model, fsdp, 16).find("--cp-all-gather") != std::string::npos);
  ExportRequest request = testing::export_request("llama-3.1-8b", 16, plan, 65'536);
  request.profile = profile;
  CHECK(config_emit("megatron-core", request).text().find("--context-parallel-size 4 --cp-comm-type all_gather \\\n") != std::string::npos);
}

TEST_CASE("selective recompute of a dense layer's MLP: it keeps only its input, reruns its forward and collectives in backward") {
  const double tokens = 16'384, shard = 4096.0 * 4096 * 2, rsigma = 4096.0 * 8;
  LayerShape mlp = llama_tp4_shape(1, 1);
  mlp.recompute.mlp = true;
  // Without the pre-MLP norm's output and statistics, fc1's output (gate and up) and the SwiGLU's output;
  // the residual it starts from is the checkpoint's input, kept.
  CHECK(decoder_layer_saved_bytes(llama_tp4_shape(1, 1), megatron_impl()) - decoder_layer_saved_bytes(mlp, megatron_impl()) ==
        doctest::Approx(shard + rsigma + tokens * 2 * 3584 * 2 + tokens * 3584 * 2));
  for (const int64_t ring : {1, 2}) {
    LayerShape shape = llama_tp4_shape(1, ring);
    shape.recompute.mlp = true;
    const TensorTrace trace = testing::megatron_layer_step(shape, megatron_impl());
    REQUIRE(trace.live_items().size() == 1);
    CHECK(trace.live_items().front().name == "layer.input_grad");
  }
  // The rerun's MLP GEMMs, and its gather and reduce-scatter (exposed, as the forward's).
  const ModelSpec model = model_load("llama-3.1-8b");
  PlanOptions selective = megatron_plan(4, 1, 1, 1, false);
  selective.recompute_modules.mlp = true;
  const PlanOptions none = megatron_plan(4, 1, 1, 1, false);
  const int64_t seqlen = 32'768;
  const LayerForwardFlops layer = layer_forward_flops(model, 1, seqlen, 1);
  CHECK(step_flops_executed(model, selective, seqlen).matmul - step_flops_executed(model, none, seqlen).matmul ==
        doctest::Approx(32 * layer.mlp / 4));
  const ClusterSpec cluster = h100s(8);
  const RuntimeProfile profile = runtime_profile_load("megatron-core");
  const Link link = link_for_group(cluster, 4);
  const double gathered = 32'768.0 * 4096 * 2;
  const double rerun = 2 * link.latency_us * 1e-6 + collective_seconds(Collective::collective_all_gather, gathered, 4, link) +
                       collective_seconds(Collective::collective_reduce_scatter, gathered, 4, link);
  const double exposed_selective = time_predict(model, cluster, selective, profile, seqlen).time.tensor_parallel_exposed_s;
  const double exposed_none = time_predict(model, cluster, none, profile, seqlen).time.tensor_parallel_exposed_s;
  CHECK(exposed_selective - exposed_none == doctest::Approx(32 * rerun).epsilon(0.02));  // (the backward's hidden share moves a little)
  // A MoE model's layers are not dense: refused; the export writes it.
  CHECK(plan_problems(model_load("qwen3-30b-a3b"), cluster, selective).front().find("--recompute-modules mlp") == 0);
  ExportRequest request = testing::export_request("llama-3.1-8b", 8, selective, seqlen);
  request.profile = profile;
  CHECK(config_emit("megatron-core", request).text().find("--recompute-granularity selective --recompute-modules mlp") != std::string::npos);
}
