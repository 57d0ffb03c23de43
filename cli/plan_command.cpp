#include "cli/plan_command.hpp"

#include <fmt/format.h>
#include <algorithm>
#include <iostream>
#include <optional>

#include "models/config_error.hpp"
#include "models/model_loader.hpp"
#include "planner/max_seqlen.hpp"
#include "planner/time_model.hpp"
#include "planner/units.hpp"
#include "reports/memory_report.hpp"

namespace longseq {

// Flags as typed; "not given" is kept apart from a value so that defaults come from the plan base
// (the ALST feature set, or --baseline).
struct PlanCommandArgs {
  std::string model;
  std::string gpu = "h100-sxm-80gb";
  std::string profile = "deepspeed-hf";
  // -1: not given (a given 0 or negative value is an error).
  int64_t gpus = -1, nodes = -1, gpus_per_node = -1;
  double host_memory_gib = -1;
  std::string seqlen;
  int64_t sp = -1;
  int zero_stage = -1;
  bool baseline = false;
  // Each switch is a pair; the count of each side says whether it was given.
  int64_t offload_optimizer_on = 0, offload_optimizer_off = 0;
  int64_t offload_params_on = 0, offload_params_off = 0;
  int64_t checkpointing_on = 0, checkpointing_off = 0;
  int64_t checkpoint_offload_on = 0, checkpoint_offload_off = 0;
  int64_t tiled_mlp_on = 0, tiled_mlp_off = 0;
  int64_t tiled_loss_on = 0, tiled_loss_off = 0;
  int64_t mlp_tiles = -1, loss_tiles = -1;
  bool fpdt = false;
  std::string fpdt_chunk;
  int64_t micro_batch = 1;
  bool json = false;
};

namespace {

void switch_register(CLI::App& command, const std::string& name, int64_t& on, int64_t& off, const std::string& help) {
  command.add_flag("--" + name, on, help);
  command.add_flag("--no-" + name, off, "turn off --" + name);
}

// A count the user gave must be positive; -1 (not given) becomes 0, the library's "default".
int64_t positive_or_default(int64_t value, const char* flag) {
  if (value == -1) return 0;
  if (value < 1) throw ConfigError(flag, "", fmt::format("must be positive, got {}", value));
  return value;
}

void switch_apply(bool& value, int64_t on, int64_t off, const std::string& name) {
  if (on > 0 && off > 0) throw ConfigError("--" + name, "", "given together with --no-" + name);
  if (on > 0) value = true;
  if (off > 0) value = false;
}

}  // namespace

std::shared_ptr<PlanCommandArgs> plan_command_register(CLI::App& app) {
  auto args = std::make_shared<PlanCommandArgs>();
  CLI::App* command = app.add_subcommand(
      "plan",
      "Predict per-GPU peak memory (named breakdown) and host memory per node for a plan; without --seqlen, find "
      "the maximum sequence length. Defaults to the ALST feature set: ZeRO-3, optimizer offload, activation "
      "checkpointing, Ulysses SP over as many GPUs as the heads allow, tiled MLP, tiled loss, checkpoint offload.");
  command->add_option("--model,-m", args->model, "built-in card name (see `longseq models`), a card .yaml, or a Hugging Face config.json")
      ->required();
  command->add_option("--gpu", args->gpu, "hardware card name or .yaml (default h100-sxm-80gb; see `longseq hardware`)");
  command->add_option("--gpus,-g", args->gpus, "number of GPUs (default: all GPUs of --nodes)");
  command->add_option("--nodes", args->nodes, "number of nodes (default: as many as --gpus needs)");
  command->add_option("--gpus-per-node", args->gpus_per_node, "GPUs per node (default: the hardware card's)");
  command->add_option("--host-mem-gib", args->host_memory_gib, "host memory per node in GiB (default: the hardware card's)");
  command->add_option("--seqlen,-s", args->seqlen, "sequence length to check, e.g. 32768, 32K, 1.5M (K/M = 10^3/10^6), 128Ki (2^10)");
  command->add_option("--sp", args->sp, "Ulysses sequence-parallel degree (default: largest valid; 1 with --baseline)");
  command->add_option("--zero", args->zero_stage, "ZeRO stage 0..3 (default 3)");
  command->add_flag("--baseline", args->baseline,
                    "start from the ALST paper's baseline instead: ZeRO-3, optimizer offload, checkpointing, sp=1, no tiling or checkpoint offload");
  switch_register(*command, "offload-optimizer", args->offload_optimizer_on, args->offload_optimizer_off,
                  "fp32 master weights, Adam states and gradients in host memory");
  switch_register(*command, "offload-params", args->offload_params_on, args->offload_params_off,
                  "ZeRO-3 weight partitions in host memory (ALST on 1 GPU)");
  switch_register(*command, "checkpointing", args->checkpointing_on, args->checkpointing_off,
                  "activation checkpointing per decoder layer");
  switch_register(*command, "checkpoint-offload", args->checkpoint_offload_on, args->checkpoint_offload_off,
                  "offload checkpointed hidden_states to host memory");
  switch_register(*command, "tiled-mlp", args->tiled_mlp_on, args->tiled_mlp_off, "TiledMLP over the sequence");
  switch_register(*command, "tiled-loss", args->tiled_loss_on, args->tiled_loss_off, "fused, tiled logits and loss");
  command->add_option("--mlp-tiles", args->mlp_tiles, "MLP tile count (default: DeepSpeed's ceil(S/sp / hidden))");
  command->add_option("--loss-tiles", args->loss_tiles, "loss tile count (default: the runtime profile's rule)");
  command->add_option("--micro-batch", args->micro_batch, "samples per rank per step (default 1)");
  command->add_flag("--fpdt", args->fpdt,
                    "FPDT chunked attention with host-resident chunks (turns tiled MLP/loss off: FPDT chunks them itself)");
  command->add_option("--fpdt-chunk", args->fpdt_chunk, "FPDT chunk of the global sequence (default 64Ki = 65536)");
  command->add_option("--profile", args->profile, "runtime profile: deepspeed-hf (default), native, or a .yaml");
  command->add_flag("--json", args->json, "print JSON instead of tables");
  return args;
}

int plan_command_run(const PlanCommandArgs& args) {
  const ModelSpec model = model_load(args.model);
  const HardwareCard hardware = hardware_card_load(args.gpu);
  const RuntimeProfile profile = runtime_profile_load(args.profile);
  if (args.host_memory_gib != -1 && !(args.host_memory_gib > 0))
    throw ConfigError("--host-mem-gib", "", fmt::format("must be positive, got {}", args.host_memory_gib));
  const ClusterSpec cluster =
      cluster_make(hardware, positive_or_default(args.gpus, "--gpus"), positive_or_default(args.nodes, "--nodes"),
                   positive_or_default(args.gpus_per_node, "--gpus-per-node"), std::max(args.host_memory_gib, 0.0));
  const int64_t sp = positive_or_default(args.sp, "--sp");
  const int64_t mlp_tiles = positive_or_default(args.mlp_tiles, "--mlp-tiles");
  const int64_t loss_tiles = positive_or_default(args.loss_tiles, "--loss-tiles");
  if (args.micro_batch < 1 || args.micro_batch > 1'000'000)
    throw ConfigError("--micro-batch", "", fmt::format("must be in [1, 1000000], got {}", args.micro_batch));
  PlanOptions plan = PlanOptions::alst(sp_largest_valid(model, cluster.gpus));
  if (args.baseline) {
    plan.sp = 1;
    plan.tiled_mlp = plan.tiled_loss = plan.checkpoint_offload = false;
  }
  if (sp > 0) plan.sp = sp;
  if (args.zero_stage != -1) plan.zero_stage = args.zero_stage;
  switch_apply(plan.offload_optimizer, args.offload_optimizer_on, args.offload_optimizer_off, "offload-optimizer");
  switch_apply(plan.offload_params, args.offload_params_on, args.offload_params_off, "offload-params");
  switch_apply(plan.activation_checkpointing, args.checkpointing_on, args.checkpointing_off, "checkpointing");
  switch_apply(plan.checkpoint_offload, args.checkpoint_offload_on, args.checkpoint_offload_off, "checkpoint-offload");
  switch_apply(plan.tiled_mlp, args.tiled_mlp_on, args.tiled_mlp_off, "tiled-mlp");
  switch_apply(plan.tiled_loss, args.tiled_loss_on, args.tiled_loss_off, "tiled-loss");
  // Checkpoint offload is part of the default set; turning checkpointing off turns it off too
  // unless the user asked for both, which plan_problems then reports.
  if (!plan.activation_checkpointing && args.checkpoint_offload_on == 0) plan.checkpoint_offload = false;
  plan.mlp_tiles = mlp_tiles;
  plan.loss_tiles = loss_tiles;
  plan.micro_batch = args.micro_batch;
  if (!args.fpdt_chunk.empty() && !args.fpdt) throw ConfigError("--fpdt-chunk", "", "given without --fpdt");
  if (args.fpdt) {
    plan.fpdt = true;
    if (args.tiled_mlp_on == 0) plan.tiled_mlp = false;
    if (args.tiled_loss_on == 0) plan.tiled_loss = false;
    if (!args.fpdt_chunk.empty()) plan.fpdt_chunk_tokens = seqlen_parse(args.fpdt_chunk, "--fpdt-chunk");
  }

  std::vector<std::string> problems = plan_problems(model, cluster, plan);
  std::optional<int64_t> seqlen;
  if (!args.seqlen.empty()) {
    seqlen = seqlen_parse(args.seqlen, "--seqlen");
    for (auto& problem : seqlen_problems(plan, *seqlen)) problems.push_back(problem);
  }
  if (!problems.empty()) {
    std::string joined;
    for (const auto& problem : problems) joined += (joined.empty() ? "" : "; ") + problem;
    throw ConfigError("plan", "", joined);
  }

  const ParameterCount params = parameter_count(model);
  nlohmann::json report = {
      {"model", {{"name", model.name}, {"parameters", params.total}}},
      {"cluster",
       {{"gpu", hardware.name}, {"gpus", cluster.gpus}, {"nodes", cluster.nodes}, {"gpus_per_node", cluster.gpus_per_node},
        {"gpu_memory_gib", hardware.gpu_memory_gib}, {"host_memory_gib_per_node", cluster.host_memory_gib}}},
      {"plan",
       {{"sp", plan.sp}, {"dp", cluster.gpus / plan.sp}, {"zero_stage", plan.zero_stage},
        {"offload_optimizer", plan.offload_optimizer}, {"offload_params", plan.offload_params},
        {"activation_checkpointing", plan.activation_checkpointing}, {"checkpoint_offload", plan.checkpoint_offload},
        {"tiled_mlp", plan.tiled_mlp}, {"tiled_loss", plan.tiled_loss}, {"micro_batch", plan.micro_batch}}},
      {"runtime_profile", profile.name},
  };

  MemoryPrediction prediction;
  std::string headline;
  if (seqlen) {
    prediction = memory_predict(model, cluster, plan, profile, *seqlen);
    headline = fmt::format("sequence length {} ({}): {}", integer_with_commas(*seqlen), seqlen_format(*seqlen),
                           prediction.fits() ? "FITS"
                           : !prediction.fits_gpu() && !prediction.fits_host() ? "does NOT fit (GPU and host memory)"
                           : !prediction.fits_gpu() ? "does NOT fit (GPU memory)" : "does NOT fit (host memory)");
    report["seqlen"] = *seqlen;
  } else {
    const MaxSeqlenResult result = max_seqlen_find(model, cluster, plan, profile, plan.fpdt ? plan.fpdt_chunk_tokens : 0);
    prediction = result.at_max;
    if (result.max_seqlen == 0)
      headline = fmt::format("maximum sequence length: none — even {} tokens exceed {}", result.granularity, result.binding_constraint);
    else
      headline = fmt::format("maximum sequence length: {} tokens ({}), limited by {}", integer_with_commas(result.max_seqlen),
                             seqlen_format(result.max_seqlen), result.binding_constraint);
    report["max_seqlen"] = {{"tokens", result.max_seqlen}, {"granularity", result.granularity},
                            {"binding_constraint", result.binding_constraint}};
  }
  report["prediction"] = memory_prediction_to_json(prediction);
  std::optional<TimePrediction> timing;
  if (prediction.seqlen > 0 && prediction.fits()) {
    timing = time_predict(model, cluster, plan, profile, prediction.seqlen);
    report["time"] = time_prediction_to_json(*timing);
  }

  if (args.json) {
    std::cout << report.dump(2) << "\n";
    return 0;
  }
  std::cout << fmt::format("longseq plan: a PREDICTION of the cost model (runtime profile '{}'), not a measurement\n", profile.name);
  std::cout << fmt::format("  model    {}: {} parameters (L={} h={} heads q/kv={}/{} d={} f={} V={}{})\n", model.name,
                           integer_with_commas(params.total), model.num_layers, model.hidden_size, model.num_q_heads,
                           model.num_kv_heads, model.head_dim, model.intermediate_size, model.vocab_size,
                           model.tied_embeddings ? ", tied" : "");
  std::cout << fmt::format("  cluster  {} x {} ({:.2f} GiB each), {} node(s) of {} GPUs, {:.0f} GiB host memory per node\n",
                           cluster.gpus, hardware.name, hardware.gpu_memory_gib, cluster.nodes, cluster.gpus_per_node,
                           cluster.host_memory_gib);
  std::cout << fmt::format("  plan     {} (dp={})\n\n", plan_describe(plan), cluster.gpus / plan.sp);
  std::cout << headline << "\n";
  std::cout << fmt::format("  at {} tokens: {} tokens per rank", integer_with_commas(prediction.seqlen),
                           integer_with_commas(prediction.local_tokens));
  if (prediction.mlp_tiles > 0) std::cout << fmt::format("; MLP tiles {}", prediction.mlp_tiles);
  if (prediction.loss_tile_tokens > 0) std::cout << fmt::format("; loss tiles of {} tokens", integer_with_commas(prediction.loss_tile_tokens));
  if (prediction.kv_replication > 1) std::cout << fmt::format("; kv heads replicated x{}", prediction.kv_replication);
  std::cout << "\n\n" << memory_table_render(prediction, cluster.ranks_per_node());
  if (timing) std::cout << "\n" << time_table_render(*timing);
  return 0;
}

}  // namespace longseq
