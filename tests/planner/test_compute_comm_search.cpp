// FLOPs and communication volumes by hand for a small model; the search's invariants.
#include <doctest/doctest.h>

#include "models/model_loader.hpp"
#include "planner/comm_model.hpp"
#include "planner/frameworks.hpp"
#include "planner/compute_model.hpp"
#include "planner/cards.hpp"
#include "planner/search.hpp"
#include "planner/time_model.hpp"
#include "support/test_models.hpp"

using namespace longseq;

namespace {

// L=2, h=64, n_q=8, n_kv=2, d=8, f=128, V=512.
ModelSpec tiny() { return testing::small_llama(2, 2); }

HardwareCard card() {
  HardwareCard hardware;
  hardware.name = "test";
  hardware.gpu_memory_gib = 80;
  hardware.gpus_per_node = 4;
  hardware.host_memory_gib = 1000;
  hardware.nccl_intranode_busbw_gbps = 100;
  hardware.internode_gbps_per_node = 40;
  hardware.nccl_latency_us = 10;
  return hardware;
}

}  // namespace

TEST_CASE("layer FLOPs by hand: S = 1000, sp = 2, so 500 local tokens and 4 heads per rank") {
  const LayerForwardFlops flops = layer_forward_flops(tiny(), 1, 1000, 2);
  // q, k, v: 2 * 500 * 64 * (64 + 16 + 16); o: 2 * 500 * 64 * 64.
  CHECK(flops.projections == 2.0 * 500 * 64 * 96 + 2.0 * 500 * 64 * 64);
  // SwiGLU: three [64 x 128] GEMMs.
  CHECK(flops.mlp == 3 * 2.0 * 500 * 64 * 128);
  // Causal attention over the full 1000 tokens for 8/2 = 4 heads: 4 * S^2 * d * heads / 2.
  CHECK(flops.attention == 4.0 * 1000 * 1000 * 8 * 4 / 2);
  CHECK(lm_head_forward_flops(tiny(), 1, 1000, 2) == 2.0 * 500 * 64 * 512);
}

TEST_CASE("step FLOPs: backward 2x, recompute with checkpointing, TiledMLP's extra MLP forward") {
  PlanOptions plan;
  plan.sp = 2;
  const LayerForwardFlops layer = layer_forward_flops(tiny(), 1, 1000, 2);
  const double lm_head = lm_head_forward_flops(tiny(), 1, 1000, 2);
  const StepFlops checkpointed = step_flops_executed(tiny(), plan, 1000);
  CHECK(checkpointed.matmul == doctest::Approx(2 * (layer.projections + layer.mlp) * 4 + 3 * lm_head));
  CHECK(checkpointed.attention == doctest::Approx(2 * layer.attention * (1 + 2.5 + 1)));
  plan.tiled_mlp = true;
  CHECK(step_flops_executed(tiny(), plan, 1000).matmul == doctest::Approx(checkpointed.matmul + 2 * layer.mlp));
  const StepFlops model = step_flops_model(tiny(), plan, 1000);  // no recompute of any kind
  CHECK(model.matmul == doctest::Approx(2 * (layer.projections + layer.mlp) * 3 + 3 * lm_head));
  CHECK(model.attention == doctest::Approx(2 * layer.attention * 3.5));
}

TEST_CASE("the ALST formula reproduces REFERENCE §2.3: 3.8M tokens on 8 GPUs in 6455 s is 591 TFLOPS") {
  const double flos = megatron_flos_per_sample(model_load("llama-3.1-8b"), 3'800'000);
  CHECK(flos / 8 / 6455 / 1e12 == doctest::Approx(591.2).epsilon(0.002));
}

TEST_CASE("collectives: nccl-tests bus factors and the alpha-beta time") {
  CHECK(collective_bus_factor(Collective::collective_all_to_all, 4) == 0.75);
  CHECK(collective_bus_factor(Collective::collective_all_gather, 8) == 0.875);
  CHECK(collective_bus_factor(Collective::collective_reduce_scatter, 2) == 0.5);
  CHECK(collective_bus_factor(Collective::collective_all_reduce, 4) == 1.5);
  CHECK(collective_bus_factor(Collective::collective_all_reduce, 1) == 0);
  const ClusterSpec cluster = cluster_make(card(), 8, 0, 0, 0);  // 2 nodes of 4
  const Link inside = link_for_group(cluster, 4);
  CHECK_FALSE(inside.crosses_nodes);
  CHECK(inside.busbw_gbps == 100);
  const Link across = link_for_group(cluster, 8);
  CHECK(across.crosses_nodes);
  CHECK(across.busbw_gbps == 10);  // 40 GBps per node shared by 4 GPUs
  // 1 GB all-to-all over 4 ranks inside the node: 10 us + 1e9 * 3/4 / 100e9 s.
  CHECK(collective_seconds(Collective::collective_all_to_all, 1e9, 4, inside) == doctest::Approx(10e-6 + 0.0075));
}

TEST_CASE("Ulysses all-to-all volume by hand, with kv replication") {
  // sp = 2: 500 tokens per rank; q and out 64 wide, k and v 16 wide: 500 * (2*64 + 2*16) * 2 bytes.
  CHECK(ulysses_layer_all_to_all_bytes(tiny(), 1, 1000, 2, 2) == 500.0 * 160 * 2);
  // sp = 4 > n_kv = 2: k and v are replicated twice: 250 * (2*64 + 2*32) * 2 bytes.
  CHECK(ulysses_layer_all_to_all_bytes(tiny(), 1, 1000, 4, 2) == 250.0 * 192 * 2);
  CHECK(ulysses_layer_all_to_all_bytes(tiny(), 1, 1000, 1, 2) == 0);
}

TEST_CASE("search: the winner fits, nothing enumerated is longer, head rules are never broken") {
  // Llama-3.1-8B on 12 GPUs (2 nodes of 6): sp = 3, 6, 12 break the head rules (32 q heads).
  const ModelSpec model = model_load("llama-3.1-8b");
  const ClusterSpec cluster = cluster_make(hardware_card_load("h100-sxm-80gb"), 12, 0, 6, 0);
  const RuntimeProfile profile = runtime_profile_load("deepspeed-hf");
  const SearchResult result = plan_search(model, cluster, profile, {});
  const SearchCandidate* winner = result.winner();
  REQUIRE(winner != nullptr);
  CHECK(winner->max_seqlen > 0);
  CHECK(memory_predict(model, cluster, winner->plan, profile, winner->max_seqlen).fits());
  int64_t invalid = 0;
  for (const auto& candidate : result.candidates) {
    if (!candidate.problems.empty()) {
      ++invalid;
      CHECK((candidate.plan.sp == 3 || candidate.plan.sp == 6 || candidate.plan.sp == 12));
      continue;
    }
    // Lengths within the search's resolution tie (and the faster plan wins among them).
    CHECK(static_cast<double>(candidate.max_seqlen) <= static_cast<double>(winner->max_seqlen) * (1.0 + kSearchLengthResolution));
  }
  CHECK(invalid > 0);
  CHECK(winner->plan.sp != 3);
  CHECK(winner->plan.sp != 6);
  CHECK(winner->plan.sp != 12);
  CHECK(model.num_q_heads % winner->plan.sp == 0);
  CHECK(result.evaluated + result.pruned + invalid == static_cast<int64_t>(result.candidates.size()));
  CHECK_FALSE(search_notable_alternatives(result).empty());
}

TEST_CASE("search for throughput: the winner fits the length and is the fastest that does") {
  const ModelSpec model = model_load("llama-3.1-8b");
  const ClusterSpec cluster = cluster_make(hardware_card_load("h100-sxm-80gb"), 8, 0, 0, 0);
  const RuntimeProfile profile = runtime_profile_load("deepspeed-hf");
  SearchOptions options;
  options.objective = SearchObjective::objective_throughput;
  options.seqlen = 1 << 20;
  const SearchResult result = plan_search(model, cluster, profile, options);
  const SearchCandidate* winner = result.winner();
  REQUIRE(winner != nullptr);
  CHECK(memory_predict(model, cluster, winner->plan, profile, options.seqlen).fits());
  for (const auto& candidate : result.candidates)
    if (candidate.problems.empty() && candidate.fits) CHECK(candidate.time.tokens_per_s <= winner->time.tokens_per_s);
}

TEST_CASE("search: held options, the step-time limit, and the simpler plan in a tie") {
  const ModelSpec model = model_load("llama-3.1-8b");
  const ClusterSpec cluster = cluster_make(hardware_card_load("h100-sxm-80gb"), 8, 0, 0, 0);
  const RuntimeProfile profile = runtime_profile_load("deepspeed-hf");
  // Held options: every plan searched has them; nothing else is listed.
  SearchOptions held;
  held.admits = [](const PlanOptions& plan) { return plan.zero_stage == 2 && !plan.offload_optimizer; };
  const SearchResult zero2 = plan_search(model, cluster, profile, held);
  REQUIRE(zero2.winner() != nullptr);
  for (const auto& candidate : zero2.candidates) CHECK((candidate.plan.zero_stage == 2 && !candidate.plan.offload_optimizer));
  // The step-time limit: the maximum is cut where the step passes it, and the step there is within it.
  SearchOptions limited;
  limited.max_step_s = 600;
  const SearchResult fast = plan_search(model, cluster, profile, limited);
  REQUIRE(fast.winner() != nullptr);
  CHECK(fast.winner()->time.time.total_s() <= 600);
  const int64_t grid = seqlen_grid(fast.winner()->plan, 1);
  CHECK(time_predict(model, cluster, fast.winner()->plan, profile, fast.winner()->max_seqlen + grid).time.total_s() > 600);
  CHECK(fast.winner()->max_seqlen < plan_search(model, cluster, profile, {}).winner()->max_seqlen);
  // The complexity a tie compares: each memory-saving feature and each ZeRO stage counts one.
  PlanOptions plain;
  plain.zero_stage = 0;
  plain.offload_optimizer = plain.offload_params = plain.activation_checkpointing = plain.checkpoint_offload = false;
  plain.tiled_mlp = plain.tiled_loss = plain.fpdt = false;
  CHECK(plan_complexity(plain) == 0);
  PlanOptions alst = PlanOptions::alst(8, 8);
  CHECK(plan_complexity(alst) == 3 + 1 + 1 + 1 + 1 + 1);  // zero 3, optimizer offload, checkpointing and its offload, both tilings
  alst.offload_params = true;
  CHECK(plan_complexity(alst) == 9);
}

TEST_CASE("MoE FLOPs are the active ones: the router, k experts and the shared expert a token uses") {
  // Qwen3-30B-A3B at S = 8192, sp = 8 (1024 local tokens): router 2048 x 128, 8 experts of three
  // 2048 x 768 GEMMs each, no shared expert.
  const ModelSpec qwen3 = model_load("qwen3-30b-a3b");
  CHECK(layer_forward_flops(qwen3, 1, 8192, 8).mlp == 2.0 * 1024 * 2048 * (3 * 8 * 768 + 128));
  // Qwen1.5-MoE-A2.7B: 60 experts of 1408, 4 a token, a shared expert of 5632 with its 2048 x 1 gate.
  const ModelSpec qwen2_moe = model_load("qwen1.5-moe-a2.7b");
  CHECK(layer_forward_flops(qwen2_moe, 1, 1024, 1).mlp == 2.0 * 1024 * 2048 * (3 * (4 * 1408 + 5632) + 60 + 1));
  // Megatron's formula counts the active parameters (8 P s + 16 L h s^2).
  CHECK(megatron_flos_per_sample(qwen3, 1000) ==
        8.0 * static_cast<double>(parameter_count(qwen3).active) * 1000 + 16.0 * 48 * 2048 * 1000.0 * 1000);
}

TEST_CASE("search pruning changes no answer: the winner, the runner-ups and every why-not line equal a full search's") {
  struct Case { const char* model; int64_t gpus; const char* profile; };
  for (const Case& c : {Case{"llama-3.1-70b", 8, "deepspeed-hf"}, Case{"llama-3.1-70b", 64, "deepspeed-hf"},
                        Case{"llama-3.1-8b", 256, "deepspeed-hf"}, Case{"qwen2.5-7b", 16, "deepspeed-hf"},
                        Case{"qwen3-30b-a3b", 8, "deepspeed-hf"}}) {
    CAPTURE(c.model);
    CAPTURE(c.gpus);
    const ModelSpec model = model_load(c.model);
    const ClusterSpec cluster = cluster_make(hardware_card_load("h100-sxm-80gb"), c.gpus, 0, 0, 0);
    const RuntimeProfile profile = runtime_profile_load(c.profile);
    SearchOptions options;
    const SearchResult pruned = plan_search(model, cluster, profile, options);
    options.prune = false;
    const SearchResult full = plan_search(model, cluster, profile, options);
    CHECK(full.pruned == 0);
    if (c.gpus >= 64) CHECK(pruned.pruned > 0);  // the point of it: most plans at scale are one probe
    REQUIRE(pruned.candidates.size() == full.candidates.size());
    for (size_t i = 0; i < kSearchShownPlans; ++i) {
      CAPTURE(i);
      CHECK(plan_describe(pruned.candidates[i].plan) == plan_describe(full.candidates[i].plan));
      CHECK(pruned.candidates[i].max_seqlen == full.candidates[i].max_seqlen);
      CHECK(pruned.candidates[i].fits == full.candidates[i].fits);
    }
    const auto pruned_alternatives = search_notable_alternatives(pruned), full_alternatives = search_notable_alternatives(full);
    REQUIRE(pruned_alternatives.size() == full_alternatives.size());
    for (size_t i = 0; i < full_alternatives.size(); ++i) {
      CAPTURE(full_alternatives[i].change);
      CHECK(pruned_alternatives[i].change == full_alternatives[i].change);
      CHECK(pruned_alternatives[i].candidate->max_seqlen == full_alternatives[i].candidate->max_seqlen);
      CHECK(pruned_alternatives[i].candidate->problems == full_alternatives[i].candidate->problems);
    }
  }
}

TEST_CASE("Ulysses, USP's ring and PyTorch CP side by side: each wins where the sources say it should") {
  // Heads fewer than the GPUs favour a ring (Ulysses splits heads: sp divides the query heads; HF
  // blog, Reference §11 F4.2's comparison table). Qwen2.5-0.5B has 14 query heads: on 16 GPUs
  // Ulysses reaches sp = 2 at most, USP's ring (or PyTorch CP) spreads the sequence over all 16.
  const ClusterSpec sixteen = cluster_make(hardware_card_load("h100-sxm-80gb"), 16, 0, 0, 0);
  const ModelSpec few_heads = model_load("qwen2.5-0.5b");
  auto best = [](const ModelSpec& model, const ClusterSpec& cluster, Framework framework, SearchOptions options) {
    options.unsupported = [&](const PlanOptions& plan) { return framework_unsupported(framework, model, plan); };
    const RuntimeProfile profile = framework_profile(framework, runtime_profile_load(framework_facts(framework).runtime_profile));
    const SearchResult result = plan_search(model, cluster, profile, options);
    REQUIRE(result.winner() != nullptr);
    return *result.winner();
  };
  const SearchCandidate ulysses = best(few_heads, sixteen, Framework::framework_hf_accelerate, {});
  const SearchCandidate usp = best(few_heads, sixteen, Framework::framework_usp, {});
  const SearchCandidate cp = best(few_heads, sixteen, Framework::framework_accelerate_fsdp2, {});
  CHECK(ulysses.plan.sp <= 2);
  CHECK(usp.plan.sequence_ranks() == 16);
  CHECK(cp.plan.ring == 16);
  CHECK(usp.max_seqlen > 2 * ulysses.max_seqlen);
  CHECK(cp.max_seqlen > 2 * ulysses.max_seqlen);
  // Ulysses' lower communication at high bandwidth (ALST §3.2; USP's paper): inside one node, with
  // heads to spare, USP's search for the fastest step at a length both fit picks the all-to-all over
  // the ring's r - 1 block passes a layer.
  const ClusterSpec node = cluster_make(hardware_card_load("h100-sxm-80gb"), 8, 0, 0, 0);
  SearchOptions throughput;
  throughput.objective = SearchObjective::objective_throughput;
  throughput.seqlen = 1 << 16;
  const SearchCandidate fastest = best(model_load("llama-3.1-8b"), node, Framework::framework_usp, throughput);
  CHECK(fastest.fits_with_margin);  // among the plans that fit with margin (sp=4 x dp=2 here)
  CHECK(fastest.plan.sp > 1);
  CHECK(fastest.plan.ring == 1);
}

TEST_CASE("nothing fits at a given length: the closest plan first is the one that needs the least more memory, GPU or host") {
  // Llama-3.1-70B at 1Mi tokens on 8 H100s under ArcticTraining (issue 41, item 3): it used to be the
  // simplest invalid-by-memory plan (sp=1, ZeRO-0, no checkpointing), the furthest from fitting.
  const ModelSpec model = model_load("llama-3.1-70b");
  const ClusterSpec cluster = cluster_make(hardware_card_load("h100-sxm-80gb"), 8, 0, 0, 0);
  SearchOptions options;
  search_options_for_framework(options, Framework::framework_arctic_training, model, cluster);
  options.objective = SearchObjective::objective_throughput;
  options.seqlen = 1 << 20;
  const SearchResult result = plan_search(model, cluster, runtime_profile_load("deepspeed-hf"), options);
  REQUIRE(result.winner() == nullptr);
  auto overshoot = [](const SearchCandidate& c) {
    return std::max(c.memory.gpu_peak_bytes / c.memory.gpu_capacity_bytes, c.memory.host_bytes_per_node / c.memory.host_capacity_bytes);
  };
  const SearchCandidate& closest = result.candidates.front();
  REQUIRE(closest.problems.empty());
  int64_t compared = 0;
  for (const SearchCandidate& candidate : result.candidates)
    if (candidate.problems.empty()) {
      CHECK(overshoot(closest) <= overshoot(candidate));
      ++compared;
    }
  CHECK(compared > 100);
  CHECK(closest.plan.sp == 8);
  CHECK(closest.plan.activation_checkpointing);
}
