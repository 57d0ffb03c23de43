// torchtitan's op-level selective activation checkpointing (issue 40): what a layer keeps under
// its op policy (the layer input, SDPA's outputs and every other mm's output), what its backward
// recomputes (the other mms and no attention core), where it is planned and how it is exported.
#include <doctest/doctest.h>

#include "models/layer_inventory.hpp"
#include "models/model_loader.hpp"
#include "planner/cards.hpp"
#include "planner/compute_model.hpp"
#include "planner/frameworks.hpp"
#include "planner/memory_model.hpp"
#include "planner/search.hpp"
#include "reports/export.hpp"
#include "support/export_request.hpp"
#include "support/clusters.hpp"
#include "support/memory_items.hpp"

using namespace longseq;
using testing::h100s;
using testing::phase_bytes;

namespace {

// Llama-3.1-8B on 8 GPUs under FSDP alone (torchtitan without CP), every layer checkpointed.
PlanOptions fsdp_checkpointed() {
  PlanOptions plan;
  plan.sp = 1;
  plan.ring = 1;
  plan.zero_stage = 3;
  plan.activation_checkpointing = true;
  return plan;
}

}  // namespace

TEST_CASE("op-level SAC keeps the input, q_proj's, v_proj's, SDPA's (output and fp32 logsumexp), gate_proj's and down_proj's outputs") {
  LayerShape shape;  // Llama-3.1-8B, 16,384 tokens on a rank
  shape.tokens = 16'384;
  shape.hidden = 4096;
  shape.q_width = 4096;
  shape.kv_width = 1024;
  shape.num_q_heads = 32;
  shape.intermediate = 14'336;
  LayerImplementation impl;
  impl.activation_bytes = 2;
  // Per token: input 4096 x 2, wq 4096 x 2, wv 1024 x 2, SDPA 4096 x 2 + 32 x 4, w1 14336 x 2, w2 4096 x 2.
  const double per_token = 4096 * 2 + 4096 * 2 + 1024 * 2 + 4096 * 2 + 32 * 4 + 14'336 * 2 + 4096 * 2;
  CHECK(per_token == 63'616);
  CHECK(decoder_layer_op_selective_saved_bytes(shape, impl) == 16'384 * per_token);
}

TEST_CASE("op-level SAC in the memory model: each layer below holds its saved set, not its input alone, and less than no checkpointing") {
  const ModelSpec model = model_load("llama-3.1-8b");  // 32 layers
  const ClusterSpec cluster = h100s(8);
  const RuntimeProfile profile = runtime_profile_load("fsdp2-torchtitan");
  const int64_t seqlen = 16'384;  // 16,384 tokens a rank: no sequence parallelism
  const PlanOptions full = fsdp_checkpointed();
  PlanOptions ops = full;
  ops.checkpoint_ops = true;
  CHECK(plan_problems(model, cluster, ops).empty());
  const double x_bytes = 16'384.0 * 4096 * 2;
  const double op_saved = 16'384.0 * 63'616;
  const MemoryPrediction checkpointed = memory_predict(model, cluster, full, profile, seqlen, true);
  const MemoryPrediction selective = memory_predict(model, cluster, ops, profile, seqlen, true);
  const std::string backward = "backward of the last decoder layer";
  REQUIRE(phase_bytes(checkpointed, backward) > 0);
  // The last layer's backward: 31 layers below, each keeping op_saved instead of x.
  CHECK(phase_bytes(selective, backward) - phase_bytes(checkpointed, backward) == doctest::Approx(31 * (op_saved - x_bytes)).epsilon(1e-9));
  // The loss: all 32 layers' sets resident.
  CHECK(phase_bytes(selective, "logits and loss") - phase_bytes(checkpointed, "logits and loss") ==
        doctest::Approx(32 * (op_saved - x_bytes)).epsilon(1e-9));
  PlanOptions none = full;
  none.activation_checkpointing = false;
  CHECK(selective.gpu_peak_bytes > checkpointed.gpu_peak_bytes);
  CHECK(selective.gpu_peak_bytes < memory_predict(model, cluster, none, profile, seqlen, true).gpu_peak_bytes);
}

TEST_CASE("op-level SAC recomputes k_proj, o_proj and up_proj and no attention core") {
  const ModelSpec model = model_load("llama-3.1-8b");
  const int64_t seqlen = 65'536;
  const PlanOptions full = fsdp_checkpointed();
  PlanOptions ops = full;
  ops.checkpoint_ops = true;
  PlanOptions none = full;
  none.activation_checkpointing = false;
  const double tokens = 65'536;
  const double recomputed_per_layer = 2 * tokens * 4096 * (1024 + 4096 + 14'336);  // wk, wo, w3
  CHECK(op_selective_recomputed_matmul_flops(model, 1, seqlen, 1) == recomputed_per_layer);
  CHECK(step_flops_executed(model, ops, seqlen).matmul - step_flops_executed(model, none, seqlen).matmul ==
        doctest::Approx(32 * recomputed_per_layer));
  CHECK(step_flops_executed(model, ops, seqlen).attention == step_flops_executed(model, none, seqlen).attention);
  CHECK(step_flops_executed(model, full, seqlen).attention > step_flops_executed(model, ops, seqlen).attention);
  CHECK(recomputed_attention_share(model, ops) == 0.0);
  CHECK(recomputed_attention_share(model, full) == 1.0);
  // MFU's model FLOPs do not count recompute of either kind.
  CHECK(step_flops_model(model, ops, seqlen).total() == step_flops_model(model, full, seqlen).total());
}

TEST_CASE("op-level SAC: torchtitan's without CP, refused with one layer in N, offload, FPDT and TiledMLP, and its TOML") {
  const ModelSpec model = model_load("llama-3.1-8b");
  const ClusterSpec cluster = h100s(8);
  PlanOptions ops = fsdp_checkpointed();
  ops.checkpoint_ops = true;
  CHECK(framework_unsupported(Framework::framework_torchtitan, model, ops, 8).empty());
  CHECK(framework_unsupported(Framework::framework_accelerate_fsdp2, model, ops, 8).find("op-level selective checkpointing is torchtitan's") !=
        std::string::npos);
  PlanOptions ring = ops;
  ring.ring = 8;
  CHECK(framework_unsupported(Framework::framework_torchtitan, model, ring, 8).find("under context parallelism") != std::string::npos);
  PlanOptions every = ops;
  every.checkpoint_every = 2;
  CHECK(plan_problems(model, cluster, every).size() == 1);
  PlanOptions offloaded = ops;
  offloaded.checkpoint_offload = true;
  CHECK(plan_problems(model, cluster, offloaded).size() == 1);
  PlanOptions unchecked = ops;
  unchecked.activation_checkpointing = false;
  CHECK(plan_problems(model, cluster, unchecked).size() == 1);

  // The torchtitan search tries it: a search held to it finds a plan at 8Ki on 8 GPUs.
  SearchOptions options;
  search_options_for_framework(options, Framework::framework_torchtitan, model, cluster);
  CHECK(options.checkpoint_ops);
  options.admits = [](const PlanOptions& plan) { return plan.checkpoint_ops; };
  options.objective = SearchObjective::objective_throughput;
  options.seqlen = 8192;
  const SearchResult result = plan_search(model, cluster, runtime_profile_load("fsdp2-torchtitan"), options);
  REQUIRE(result.winner() != nullptr);
  CHECK(result.winner()->plan.checkpoint_ops);
  CHECK(result.winner()->plan.ring == 1);
  SearchOptions other;
  search_options_for_framework(other, Framework::framework_accelerate_fsdp2, model, cluster);
  CHECK_FALSE(other.checkpoint_ops);

  ExportRequest request = testing::export_request("llama-3.1-8b", 8, ops, 32'768);
  request.profile = runtime_profile_load("fsdp2-torchtitan");
  const std::string toml = config_emit("torchtitan", request).text();
  CHECK(toml.find("[activation_checkpoint]\nmode = \"selective\"\nselective_ac_option = \"op\"\n") != std::string::npos);
}
