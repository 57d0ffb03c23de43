// run_command.cpp: `longseq run` — train a few steps with real kernels on this machine, measure,
// and set the planner's `native` prediction for the same plan beside the measurement.
#include <chrono>
#include <filesystem>
#include <cstdlib>
#include <memory>
#include <optional>
#include <cstdio>
#include <fmt/format.h>
#include <cmath>
#include <iostream>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>
#include <limits>
#include <map>
#include <random>
#include <nlohmann/json.hpp>

#include "io/text_escape.hpp"
#include "cli/commands.hpp"
#include "cli/run/internal.hpp"
#include "executor/component_seconds.hpp"
#include "executor/trainer.hpp"
#ifdef LONGSEQ_HAVE_MPI
#include "executor/mpi_communicator.hpp"
#endif
#ifdef LONGSEQ_HAVE_CUDA
#include "executor/cuda_memory.hpp"
#include "executor/llama_cuda.hpp"
#include "kernels/cuda/device_query.hpp"
#endif
#ifdef LONGSEQ_HAVE_NCCL
#include "executor/nccl_communicator.hpp"
#endif
#include "io/config_error.hpp"
#include "models/layer_inventory.hpp"
#include "models/model_loader.hpp"
#include "io/output_files.hpp"
#include "io/process.hpp"
#include "planner/max_seqlen.hpp"
#include "planner/time_model.hpp"
#include "planner/scenario.hpp"
#include "planner/memory_model.hpp"
#include "planner/frameworks.hpp"
#include "planner/plan_file.hpp"
#include "planner/units.hpp"
#include "reports/memory_report.hpp"

namespace longseq {

namespace {

std::map<std::string, double> bytes_by_category(const std::vector<TraceItem>& items) {
  std::map<std::string, double> totals;
  for (const auto& item : items) totals[std::string(item.category)] += item.bytes;
  return totals;
}

std::map<std::string, double> bytes_by_category(const std::vector<MemoryItem>& items) {
  std::map<std::string, double> totals;
  for (const auto& item : items) totals[item.category] += item.bytes;
  return totals;
}

}  // namespace

namespace {

// Where a measurement was taken: this machine's name.
std::string host_name() {
  char name[256] = {};
  return gethostname(name, sizeof name - 1) == 0 ? std::string(name) : std::string("this machine");
}

// MPI for the length of a run launched by mpirun (Open MPI sets OMPI_COMM_WORLD_SIZE); without
// it a run is one rank and needs no MPI.
struct Ranks {
  // world: host-memory collectives (MPI, or one rank); on a GPU the sequence, ring and data groups and
  // zero_world (ZeRO-3 over every rank) are NCCL communicators over the same ranks.
  std::unique_ptr<Communicator> world, sequence_group, ring_group, data_group, zero_world;
  int world_rank = 0, world_size = 1;
  bool mpi = false;
  int gpu = -1;  // this rank's GPU, -1 on the CPU
  Communicator& zero_group() { return zero_world ? *zero_world : *world; }
  ~Ranks() {
    sequence_group.reset();
    ring_group.reset();
    data_group.reset();
    zero_world.reset();
    world.reset();
#ifdef LONGSEQ_HAVE_MPI
    if (mpi) MPI_Finalize();
#endif
  }
};

void ranks_start(Ranks& ranks) {
#ifdef LONGSEQ_HAVE_MPI
  if (std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE")) {
    MPI_Init(nullptr, nullptr);
    mpi_errors_return(MPI_COMM_WORLD);  // errors come back to longseq, which names the rank and reason
    ranks.mpi = true;
    ranks.world = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD);
    ranks.world_rank = ranks.world->rank();
    ranks.world_size = ranks.world->size();
    rank_threads_set(ranks_on_this_node(ranks.world_size));
    return;
  }
#endif
  ranks.world = std::make_unique<SingleRankCommunicator>();
}

// Ulysses groups of sp consecutive ranks (inside a node: the all-to-all wants the fastest links);
// a sequence over ring such groups, whose ranks with the same heads form a ring; data parallel
// across sequences.
void ranks_split(Ranks& ranks, int64_t sp, int64_t ring) {
#ifdef LONGSEQ_HAVE_MPI
  if (ranks.mpi) {
    auto& world = static_cast<MpiCommunicator&>(*ranks.world);
    const int64_t rank = ranks.world_rank, sequence_ranks = sp * ring;
    MpiCommunicator sequence = world.split(static_cast<int>(rank / sp), ranks.world_rank);
    // Without a ring there is no ring group (a one-rank NCCL communicator would still take buffers).
    std::optional<MpiCommunicator> ring_peers;
    if (ring > 1) ring_peers.emplace(world.split(static_cast<int>(rank / sequence_ranks * sp + rank % sp), ranks.world_rank));
    MpiCommunicator data = world.split(static_cast<int>(rank % sequence_ranks), ranks.world_rank);
    if (ranks.gpu >= 0) {
#ifdef LONGSEQ_HAVE_NCCL
      // NCCL over the same groups, bootstrapped by them (the MPI handles are not needed after).
      ranks.sequence_group = std::make_unique<NcclCommunicator>(sequence.comm(), ranks.gpu);
      if (ring_peers) ranks.ring_group = std::make_unique<NcclCommunicator>(ring_peers->comm(), ranks.gpu);
      else ranks.ring_group = std::make_unique<SingleRankCommunicator>();
      ranks.data_group = std::make_unique<NcclCommunicator>(data.comm(), ranks.gpu);
      ranks.zero_world = std::make_unique<NcclCommunicator>(world.comm(), ranks.gpu);
      return;
#else
      throw ConfigError("--device", "", "cuda across ranks needs NCCL, and this build found none");
#endif
    }
    ranks.sequence_group = std::make_unique<MpiCommunicator>(std::move(sequence));
    if (ring_peers) ranks.ring_group = std::make_unique<MpiCommunicator>(std::move(*ring_peers));
    else ranks.ring_group = std::make_unique<SingleRankCommunicator>();
    ranks.data_group = std::make_unique<MpiCommunicator>(std::move(data));
    return;
  }
#endif
  (void)sp;
  (void)ring;
  ranks.sequence_group = std::make_unique<SingleRankCommunicator>();
  ranks.ring_group = std::make_unique<SingleRankCommunicator>();
  ranks.data_group = std::make_unique<SingleRankCommunicator>();
}

// What the training loop reads (and the report it fills), for either device's model.
struct TrainLoop {
  const RunCommandArgs& args;
  const ModelSpec& model;
  Ranks& ranks;
  const PlanOptions& plan;
  const TrainingOptions& options;
  Arena& device;
  Arena& host;
  const std::vector<float>& initial_weights;
  const std::string& text;
  int64_t seqlen, dp, dp_rank, local_tokens;
  bool speaker;
  int64_t world_size;
  nlohmann::json& report;
};

template <class Model>
constexpr bool on_gpu_model() {
#ifdef LONGSEQ_HAVE_CUDA
  return std::is_same_v<Model, CudaLlamaModel>;
#else
  return false;
#endif
}

// Builds the model (whole, or ZeRO-3 shards), trains args.steps steps and prints each. Returns the
// device memory outside the arena at the end (CUDA context, cuBLAS, NCCL; 0 on the CPU).
template <class Model>
double model_train(const TrainLoop& loop) {
  const auto& [args, model, ranks, plan, options, device, host, initial_weights, text, seqlen, dp, dp_rank, local_tokens, speaker,
               world_size, report] = loop;
  // The plan's model states: ZeRO over every rank (ZeRO-3 builds only this rank's shards, as
  // zero.Init does, so no rank ever holds the whole model); what is offloaded lives in the host
  // pool beside the offloaded checkpoints.
  std::optional<Model> model_storage;
  // With LoRA the base is frozen and the adapters start as PEFT's (lora_B zero: step 1 is the base's loss).
  const LoraConfig lora{plan.lora_rank, static_cast<float>(args.lora_alpha), plan.lora_all_linear};
  model_storage.emplace(model, device, plan.zero_stage >= 1 ? &ranks.zero_group() : nullptr,
                        ModelStates{plan.zero_stage, plan.offload_optimizer, plan.offload_params, lora, precision_regime(args.precision)},
                        &host);
  Model& llama = *model_storage;
  llama.load_parameters(initial_weights.data());
  // --compare-single-rank: rank 0 also trains one unsharded replica on group 0's samples.
  std::optional<Arena> reference_device, reference_host;
  std::optional<LlamaModel> reference;
  const bool compare = args.compare_single_rank && ranks.world_rank == 0 && world_size > 1;
  if (compare) {
    reference_device.emplace("reference device");
    reference_host.emplace("reference host");
    reference.emplace(model, *reference_device, nullptr, ModelStates{0, false, false, lora, PrecisionRegime::mixed_master}, nullptr);
    reference->load_parameters(initial_weights.data());
  }
  if (speaker)
    fmt::print("{:>5} {:>9} {:>9} {:>10} {:>16} {:>14}{}\n", "step", "loss", "seconds", "tokens/s", "device peak MiB", "host peak MiB",
               compare ? "   loss on 1 rank" : "");
  // Fault injection for the test of the job's failure path (tests/CMakeLists.txt): this rank fails
  // at the start of step 2, while the others wait in its collectives. Every input that could make
  // one rank fail is compared across ranks first, so no input reaches this path any more.
  const char* fail_on_rank = std::getenv("LONGSEQ_TEST_FAIL_ON_RANK");
  // Progress inside a step, on rank 0: on a terminal redrawn in place, in a log a line at most every
  // 10 s, and only once the step has run 3 s (a short step says nothing). The ETA weighs a layer's
  // backward (with its recompute) as twice its forward.
  const bool tty = isatty(fileno(stderr)) != 0;
  TrainingOptions step_options = options;
  int64_t current_step = 0;
  std::chrono::steady_clock::time_point step_start, last_said;
  bool said = false;
  if (speaker)
    step_options.progress = [&](const char* phase, int64_t done, int64_t layers) {
      const auto now = std::chrono::steady_clock::now();
      const double elapsed = std::chrono::duration<double>(now - step_start).count();
      if (elapsed < 3 || (!tty && std::chrono::duration<double>(now - last_said).count() < 10)) return;
      last_said = now;
      said = true;
      const double done_layers = static_cast<double>(done), all_layers = static_cast<double>(layers);
      const double fraction = (std::string(phase) == "forward" ? done_layers : all_layers + 2.0 * done_layers) / (3.0 * all_layers);
      const std::string line = fmt::format("  step {}: {} of layer {}/{}, {:.0f} s so far, about {:.0f} s to go", current_step, phase,
                                           done, layers, elapsed, elapsed / std::max(fraction, 1e-3) - elapsed);
      if (tty) fmt::print(stderr, "\r{:<100}", line);
      else fmt::print(stderr, "{}\n", line);
    };
  for (int64_t step = 1; step <= args.steps; ++step) {
    current_step = step;
    step_start = last_said = std::chrono::steady_clock::now();
    said = false;
    if (fail_on_rank && step == 2 && std::atoi(fail_on_rank) == ranks.world_rank)
      throw ConfigError("LONGSEQ_TEST_FAIL_ON_RANK", "", "this rank was asked to fail at step 2 (a test of the job's failure path)");
    const uint32_t sample_seed = args.seed + static_cast<uint32_t>((step - 1) * dp + dp_rank + 1);
    const Sample sample = args.data.empty() ? sample_synthetic(seqlen, model.vocab_size, sample_seed)
                                            : sample_from_text(text, seqlen, ((step - 1) * dp + dp_rank) * seqlen);
    const auto start = std::chrono::steady_clock::now();
    const ComponentSeconds components_before = component_seconds();
    SequenceParallel parallel{ranks.sequence_group.get(), sample.positions.data(), ranks.ring_group.get()};
    // This rank's tokens: with FPDT its piece of every chunk (FPDT's layout), otherwise its slice of
    // its ring group's two chunks (the zigzag layout; without a ring, a contiguous slice).
    // (Plain copies of the loop's fields: a lambda may not capture structured bindings before C++20.)
    const int64_t sp = plan.sp, ring = plan.ring, group_rank = ranks.world_rank % plan.sp,
                  sequence_rank = ranks.world_rank % plan.sequence_ranks(), fpdt_chunk = options.fpdt_chunk_tokens;
    auto rank_values = [=](const std::vector<int32_t>& values) {
      if (fpdt_chunk > 0) return fpdt_layout_rank_tokens(values, sp, group_rank, fpdt_chunk);
      return ring_layout_rank_tokens(values, sp, ring, sequence_rank);
    };
    const std::vector<int32_t> tokens = rank_values(sample.tokens), labels = rank_values(sample.labels),
                               positions = rank_values(sample.positions);
    StepResult result =
        llama.forward_backward(tokens.data(), labels.data(), positions.data(), local_tokens, step_options, device, host, parallel);
    if (said && tty) fmt::print(stderr, "\r{:<100}\r", "");  // the progress line gives way to the step's row
    if (dp > 1) {  // the gradient is the mean over the data-parallel groups' samples
      // ZeRO-3's reduce-scatter already summed every rank's part; replicas sum across groups.
      if (!llama.partitioned()) ranks.data_group->all_reduce(llama.gradients(), llama.local_parameter_count());
      llama.gradients_scale(1.0f / static_cast<float>(dp));
      double loss = result.loss;
      ranks.data_group->all_reduce(&loss, 1);
      result.loss = loss / static_cast<double>(dp);
    }
    llama.adamw_step(static_cast<float>(args.lr), 0.9f, 0.95f, 1e-8f, 0.0f);
    llama.ops().synchronize();  // a GPU step is done when its queued work is
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const ComponentSeconds spent = component_seconds() - components_before;
    double reference_loss = 0;
    if (compare) {
      reference_loss = reference->forward_backward(sample.tokens.data(), sample.labels.data(), sample.positions.data(), seqlen,
                                                   options, *reference_device, *reference_host).loss;
      reference->adamw_step(static_cast<float>(args.lr), 0.9f, 0.95f, 1e-8f, 0.0f);
    }
    const double tokens_per_s = static_cast<double>(seqlen * dp) / seconds;
    report["steps"].push_back({{"step", step}, {"loss", result.loss}, {"seconds", seconds}, {"tokens_per_s", tokens_per_s},
                               {"device_peak_mib", device.peak_bytes() / (1 << 20)}, {"host_peak_mib", host.peak_bytes() / (1 << 20)}});
    if (compare) report["steps"].back()["loss_on_one_rank"] = reference_loss;
    // Where the step's time went on this rank (the CPU kernels' and MPI's own clocks; a GPU's
    // calls return before their work is done, so only the total is measured there).
    if (!on_gpu_model<Model>())
      report["steps"].back()["components_s"] = {{"matmul", spent.matmul},           {"attention", spent.attention},
                                                {"communication", spent.communication}, {"host_copies", spent.host_copies},
                                                {"optimizer", spent.optimizer},     {"other", seconds - spent.sum()}};
    if (speaker)
      fmt::print("{:>5} {:>9.4f} {:>9.3f} {:>10.0f} {:>16.2f} {:>14.2f}{}\n", step, result.loss, seconds, tokens_per_s,
                 device.peak_bytes() / (1 << 20), host.peak_bytes() / (1 << 20),
                 compare ? fmt::format(" {:>16.4f}", reference_loss) : "");
  }
  double outside_arena_bytes = 0;
#ifdef LONGSEQ_HAVE_CUDA
  // With the pool trimmed to live bytes (device_memory_outside_arena_bytes does it), what the GPU
  // holds beyond the arena's live bytes is the runtime's own.
  if constexpr (on_gpu_model<Model>()) outside_arena_bytes = device_memory_outside_arena_bytes(device);
#endif
  return outside_arena_bytes;
}

// The file `model_load` reads for a --model value: the file itself, a folder's config.json; "" for
// a built-in card's name (it is in the binary).
std::string model_file_path(const std::string& name_or_path) {
  std::error_code error;
  if (std::filesystem::is_directory(name_or_path, error)) return (std::filesystem::path(name_or_path) / "config.json").string();
  return std::filesystem::exists(name_or_path, error) ? name_or_path : "";
}

// The contents of the model file a plan file names, which every rank reads after the agreement:
// the same plan.json naming r/config.json with another rope_theta on one node trained with exit 0.
// A plan file this rank cannot read fingerprints as its error, so ranks that fail alike agree and
// stop on the same message after it.
std::string plan_model_fingerprint(const std::string& plan_path) {
  if (plan_path.empty()) return "";
  try {
    return file_fingerprint(model_file_path(plan_file_read(plan_path).model));
  } catch (const ConfigError& error) {
    return error.what();
  }
}

int run_on_ranks(const RunCommandArgs& given, Ranks& ranks) {
  // A scenario supplies model, plan and run settings; a flag given on the command line wins.
  RunCommandArgs args = given;
  const bool speaker = ranks.world_rank == 0 && !args.json;  // only rank 0 prints tables
  if (!given.scenario.empty()) {
    const Scenario scenario = scenario_load(given.scenario);
    if (!scenario.run) throw ConfigError(given.scenario, "run", "this scenario has no run: section (it is for longseq sweep)");
    auto unset = [&](const char* flag) { return given.command->count(flag) == 0; };
    if (unset("--model")) args.model = scenario.model;
    const Scenario::Run& run = *scenario.run;
    if (unset("--seqlen") && run.seqlen) args.seqlen = std::to_string(*run.seqlen);
    if (unset("--steps")) args.steps = run.steps;
    if (unset("--budget-mib") && run.budget_mib) args.budget_mib = *run.budget_mib;
    if (unset("--auto")) args.auto_plan = run.auto_plan;
    if (unset("--data")) args.data = run.data;
    // Every plan key is either honoured here or refused by name (scenario_run_options).
    const ScenarioRunOptions plan = scenario_run_options(scenario);
    if (unset("--checkpointing") && plan.checkpointing) args.checkpointing = *plan.checkpointing;
    if (unset("--checkpoint-offload") && plan.checkpoint_offload) args.checkpoint_offload = *plan.checkpoint_offload;
    if (unset("--mlp-tiles") && plan.mlp_tiles) args.mlp_tiles = *plan.mlp_tiles;
    if (unset("--loss-tiles") && plan.loss_tiles) args.loss_tiles = *plan.loss_tiles;
    if (unset("--sp") && plan.sp) args.sp = *plan.sp;
    if (unset("--ring") && plan.ring) args.ring = *plan.ring;
    if (unset("--zero") && plan.zero_stage) args.zero_stage = *plan.zero_stage;
    if (unset("--offload-optimizer") && plan.offload_optimizer) args.offload_optimizer = *plan.offload_optimizer;
    if (unset("--offload-params") && plan.offload_params) args.offload_params = *plan.offload_params;
    if (unset("--fpdt-chunk") && plan.fpdt_chunk_tokens) args.fpdt_chunk = std::to_string(*plan.fpdt_chunk_tokens);
    if (unset("--lora") && plan.lora_rank) args.lora_rank = *plan.lora_rank;
    if (unset("--lora-targets") && plan.lora_all_linear) args.lora_targets = *plan.lora_all_linear ? "all-linear" : "q,v";
    if (speaker) fmt::print("scenario {}: {}\n", scenario.name, scenario.description);
  }
  if (ranks.world_size > 1) {
    // Every rank must run the same configuration; a mismatch (an MPMD launch, a per-rank wrapper)
    // stops the job here, by name, before the first collective of the run.
    peer_timeout_set(args.peer_timeout_s);
    auto text = [](auto value) { return fmt::format("{}", value); };
    ranks_agree(*ranks.world, {{"--model", args.model},
                               {"--layers", text(args.layers)},
                               {"--device", args.device},
                               {"--seqlen", args.seqlen},
                               {"--steps", text(args.steps)},
                               {"--checkpointing", text(args.checkpointing)},
                               {"--checkpoint-offload", text(args.checkpoint_offload)},
                               {"--mlp-tiles", text(args.mlp_tiles)},
                               {"--loss-tiles", text(args.loss_tiles)},
                               {"--attention-block", text(args.attention_block)},
                               {"--data", args.data},
                               {"--budget-mib", text(args.budget_mib)},
                               {"--lr", text(args.lr)},
                               {"--seed", text(args.seed)},
                               {"--auto", text(args.auto_plan)},
                               {"--sp", text(args.sp)},
                               {"--ring", text(args.ring)},
                               {"--zero", text(args.zero_stage)},
                               {"--offload-optimizer", text(args.offload_optimizer)},
                               {"--offload-params", text(args.offload_params)},
                               {"--fpdt-chunk", args.fpdt_chunk},
                               {"--lora", text(args.lora_rank)},
                               {"--lora-targets", args.lora_targets},
                               {"--lora-alpha", text(args.lora_alpha)},
                               {"--precision", args.precision},
                               {"--plan", args.plan_file},
                               {"--compare-single-rank", text(args.compare_single_rank)},
                               {"--peer-timeout-s", text(args.peer_timeout_s)},
                               // The files' contents, not only their names: a stale copy of the plan
                               // on one node would hang in a collective, a different text would train
                               // each sequence's parts on different data.
                               {"--plan (the file's contents)", file_fingerprint(args.plan_file)},
                               {"--data (the file's contents)", file_fingerprint(args.data)},
                               {"--model (the file's contents)", file_fingerprint(model_file_path(args.model))},
                               {"the scenario file's contents", file_fingerprint(args.scenario)},
                               {"the model the plan file names (its contents)", plan_model_fingerprint(args.plan_file)}});
  }
  // --plan: the file says what to run; flags that would say otherwise are refused by name.
  std::optional<PlanFile> plan_file;
  if (!args.plan_file.empty()) {
    plan_file = plan_file_read(args.plan_file);
    for (const char* flag : {"--seqlen", "--checkpointing", "--checkpoint-offload", "--mlp-tiles", "--loss-tiles", "--budget-mib", "--auto",
                             "--sp", "--ring", "--zero", "--offload-optimizer", "--offload-params", "--fpdt-chunk", "--device", "--lora",
                             "--lora-targets"})
      if (given.command->count(flag) > 0)
        throw ConfigError(flag, "", "given with --plan, which decides it (" + args.plan_file + "); drop one of them");
    if (given.command->count("--model") > 0 && args.model != plan_file->model && args.model != plan_file->model_name)
      throw ConfigError(args.plan_file, "model", fmt::format("the plan is for {}, not --model {}", plan_file->model_name, args.model));
    if (given.command->count("--layers") > 0 && args.layers != plan_file->layers)
      throw ConfigError(args.plan_file, "model.layers", fmt::format("the plan is for {} layers, not --layers {}", plan_file->layers, args.layers));
    if (plan_file->ranks != ranks.world_size)
      throw ConfigError(args.plan_file, "ranks", fmt::format("the plan is for {} rank(s) and this run has {} (mpirun -np {})",
                                                             plan_file->ranks, ranks.world_size, plan_file->ranks));
    args.model = plan_file->model;
    args.layers = plan_file->layers;
    args.device = plan_file->device;
  }
  const ModelSpec model = model_with_layers(model_load(args.model), args.layers);  // the planner predicts the same stack
  if (plan_file) {
    if (model.name != plan_file->model_name || parameter_count(model).total != plan_file->parameters)
      throw ConfigError(args.plan_file, "model", fmt::format("the plan is for {} with {} parameters, and {} now loads {} with {}",
                                                             plan_file->model_name, plan_file->parameters, plan_file->model, model.name,
                                                             parameter_count(model).total));
  }
  executor_model_check(model);
  const bool on_gpu = args.device == "cuda";
  std::string device_description = "CPU, fp32";  // where the measurement is taken
  double device_memory_bytes = static_cast<double>(sysconf(_SC_AVPHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  if (on_gpu) {
#ifdef LONGSEQ_HAVE_CUDA
    const CudaDeviceInfo info = cuda_device_query();
    if (info.device_count == 0)
      throw ConfigError("--device", "", "cuda: no GPU to run on: " + (info.error.empty() ? std::string("no CUDA device visible") : info.error));
    // One GPU per rank: the node-local rank picks it (Open MPI's OMPI_COMM_WORLD_LOCAL_RANK).
    const char* local_rank = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    ranks.gpu = (local_rank ? std::atoi(local_rank) : 0) % info.device_count;
    device_memory_bytes = static_cast<double>(cuda_device_select(ranks.gpu));
    device_description = "GPU " + info.name + ", bf16";
    if (args.compare_single_rank)
      throw ConfigError("--compare-single-rank", "", "is for CPU runs (a replica would share this rank's GPU)");
#else
    throw ConfigError("--device", "", "cuda: no GPU to run on: this build has no CUDA (nvcc was not found when it was configured)");
#endif
  }
  // Given, a budget is a device's memory: positive, and at most 1 TiB (2^20 MiB, beyond any device built).
  if ((given.command->count("--budget-mib") > 0 && !(args.budget_mib > 0)) || args.budget_mib < 0)
    throw ConfigError("--budget-mib", "", fmt::format("must be positive, got {}", args.budget_mib));
  if (args.budget_mib > kMostBudgetMib)
    throw ConfigError("--budget-mib", "", fmt::format("{:g} MiB per rank is not a plausible device (at most {:.0f} MiB, 1 TiB)", args.budget_mib,
                                                      kMostBudgetMib));
  if (args.lr <= 0 || args.lr > 1) throw ConfigError("--lr", "", fmt::format("must be in (0, 1], got {}", args.lr));
  // The adapters (none without --lora): held by every plan the run may take.
  HeldChoices adapters;
  if (args.lora_rank > 0) {
    adapters.lora_rank = args.lora_rank;
    adapters.lora_all_linear = HeldChoices::lora_targets_parse(args.lora_targets, "--lora-targets", "");
  } else if (given.command->count("--lora-targets") > 0) {
    throw ConfigError("--lora-targets", "", "chooses the adapters' linears: give --lora RANK too");
  }
  if (!(args.lora_alpha > 0 && args.lora_alpha <= 1e6))
    throw ConfigError("--lora-alpha", "", fmt::format("must be in (0, 1e6], got {}", args.lora_alpha));
  // Where rank 0 writes the result, checked before training rather than after it.
  std::optional<OutputFileTarget> json_out;
  if (args.json_out && ranks.world_rank == 0)
    json_out = output_file_check(*args.json_out, "--json-out", args.overwrite, {args.scenario, args.plan_file, args.data, args.model});
  if (!args.data.empty() && model.vocab_size < 256) throw ConfigError("--data", "", "byte-level text needs a vocabulary of at least 256");
  const std::string text = args.data.empty() ? std::string() : file_read_text(args.data);
  const int64_t world_size = ranks.world_size;

  // The plan: from the file, from the planner's search (--auto), or from the flags.
  MachineTarget target;
  target.device = args.device;
  target.ranks = world_size;
  if (args.budget_mib > 0) target.budget_bytes = args.budget_mib * 1024 * 1024;
  if (plan_file) target.budget_bytes = plan_file->device_budget_bytes;
  const double budget_bytes = target.budget_bytes;
  // The prediction for the device that runs: fp32 on the CPU, bf16 with the GPU's runtime terms.
  const PrecisionRegime precision = precision_regime(args.precision);
  if (precision != PrecisionRegime::mixed_master && (plan_file || args.auto_plan))
    throw ConfigError("--precision", "", args.precision + " goes with a plan given by flags; plan files and --auto plan DeepSpeed's mixed regime");
  if (precision == PrecisionRegime::pure_bf16 &&
      (args.zero_stage != 0 || args.offload_optimizer || args.offload_params || args.lora_rank > 0 || world_size > 1))
    throw ConfigError("--precision", "", "pure-bf16 is the plain HF Trainer's regime: one rank, without ZeRO, offload or adapters");
  if (precision == PrecisionRegime::fsdp2 && args.zero_stage != 3)
    throw ConfigError("--precision", "", "fsdp2 shards every module fully: add --zero 3");
  if (precision == PrecisionRegime::fsdp2 && (args.offload_optimizer || args.offload_params || args.lora_rank > 0))
    throw ConfigError("--precision", "", "fsdp2 runs here without offload or adapters (CPUOffloadPolicy and PEFT under FSDP2 are planned, not run)");
  const RuntimeProfile profile = machine_profile(target, precision);
  // --budget-mib bounds the arena (which enforces it); on a GPU the planner's per-GPU memory also
  // holds the runtime's context, workspace and NCCL buffers beside it.
  const ClusterSpec cluster = machine_cluster(target);
  PlanOptions plan;
  int64_t seqlen = 0;
  if (plan_file) {
    plan = plan_file->plan;
    seqlen = plan_file->seqlen;
    if (plan_file->profile != profile.name)
      throw ConfigError(args.plan_file, "profile", fmt::format("the plan was predicted with profile {}; the {} executor's is {}",
                                                               plan_file->profile, args.device, profile.name));
    if (speaker) fmt::print("longseq run --plan {}: {} for {} tokens on {} rank(s), {:.0f} MiB per rank (as planned)\n", args.plan_file,
                            plan_describe(plan), integer_with_commas(seqlen), world_size, budget_bytes / (1 << 20));
  } else if (args.auto_plan) {
    if (args.budget_mib <= 0) throw ConfigError("--auto", "", "needs --budget-mib (the device memory to plan for)");
    for (const char* flag : {"--seqlen", "--checkpointing", "--checkpoint-offload", "--mlp-tiles", "--loss-tiles", "--sp", "--ring", "--zero",
                             "--offload-optimizer", "--offload-params", "--fpdt-chunk"})
      if (given.command->count(flag) > 0) throw ConfigError("--auto", "", std::string("chooses the plan and the length itself; drop ") + flag);
    // The planner's own search over what this executor runs (longseq plan --ranks --budget-mib
    // runs the same one): the longest sequence that fits, ties to the faster plan.
    const SearchResult searched = machine_plan_search(model, target, adapters);
    const SearchCandidate* winner = searched.winner();
    if (!winner) throw ConfigError("--budget-mib", "", "no plan fits: the model states alone exceed the budget");
    plan = winner->plan;
    seqlen = winner->max_seqlen;
    if (speaker)
      fmt::print("longseq run --auto: the planner chose {} for {} tokens, the longest that fits {:.0f} MiB per rank on {} rank(s) "
                 "(PREDICTION)\n", plan_describe(plan), integer_with_commas(seqlen), args.budget_mib, world_size);
  } else {
    seqlen = seqlen_parse(args.seqlen, "--seqlen");
    if (args.checkpoint_offload && !args.checkpointing) throw ConfigError("--checkpoint-offload", "", "needs --checkpointing");
    if (args.offload_optimizer && args.zero_stage < 1)
      throw ConfigError("--offload-optimizer", "", "offloads ZeRO's shards: add --zero 1, 2 or 3 (one rank is a ZeRO group of one)");
    if (args.offload_params && args.zero_stage != 3) throw ConfigError("--offload-params", "", "offloads ZeRO-3's weight shards: add --zero 3");
    TrainingOptions flags;
    flags.activation_checkpointing = args.checkpointing;
    flags.checkpoint_offload = args.checkpoint_offload;
    flags.mlp_tiles = args.mlp_tiles;
    flags.loss_tiles = args.loss_tiles;
    if (world_size % args.ring != 0)
      throw ConfigError("--ring", "", fmt::format("{} does not divide the {} rank(s) of this run", args.ring, world_size));
    const int64_t sp = args.sp > 0 ? args.sp : world_size / args.ring;
    plan = executor_plan(flags, sp, args.zero_stage, args.offload_optimizer, args.offload_params, args.ring);
    plan.lora_rank = adapters.lora_rank;
    plan.lora_all_linear = adapters.lora_all_linear;
    if (!args.fpdt_chunk.empty()) {
      if (args.mlp_tiles > 0 || args.loss_tiles > 0)
        throw ConfigError("--fpdt-chunk", "", "FPDT chunks the MLP and the loss itself; drop --mlp-tiles and --loss-tiles");
      plan.fpdt = true;
      plan.fpdt_chunk_tokens = seqlen_parse(args.fpdt_chunk, "--fpdt-chunk");
    }
  }
  if (seqlen > (int64_t{1} << 24)) throw ConfigError("--seqlen", "", "more than 16Mi tokens is beyond one run of this executor");
  if (given.command->count("--lora-alpha") > 0 && !plan.lora())
    throw ConfigError("--lora-alpha", "", "scales the adapters' product: this run trains no adapters (give --lora RANK)");
  std::vector<std::string> problems = plan_problems(model, cluster, plan);
  for (auto& problem : seqlen_problems(plan, seqlen)) problems.push_back(problem);
  for (auto& problem : executor_plan_problems(plan, args.device)) problems.push_back(problem);
  if (std::string problem = framework_unsupported(Framework::framework_longseq, model, plan); !problem.empty()) problems.push_back(problem);
  if (!problems.empty()) throw ConfigError(plan_file ? args.plan_file : "plan", "", problems.front());
  if (on_gpu && plan.zero_stage >= 1 && !ranks.mpi)
    throw ConfigError(plan_file ? args.plan_file : "--zero", "", "ZeRO on the GPU shards over NCCL ranks: run it under mpirun (longseq launch)");
  const int64_t sp = plan.sp;
  // A plan that cannot fit this machine fails here, by the prediction, not by the kernel's OOM
  // killer (CPU) or a CUDA error halfway through (GPU).
  const MemoryPrediction predicted = memory_predict(model, cluster, plan, profile, seqlen);
  const TrainingOptions options = executor_training_options(plan, predicted, args.attention_block);
  // On the CPU the host pool and the fp32 initial weights (read like a checkpoint) share the memory.
  const double needed_bytes =
      predicted.gpu_peak_bytes + (on_gpu ? 0.0 : predicted.host_bytes_per_node + 4.0 * static_cast<double>(llama_layout(model).total));
  if (needed_bytes > device_memory_bytes)
    throw ConfigError("--model", "", fmt::format("{} at {} tokens needs {:.1f} GiB (PREDICTION, runtime profile {}) and this machine's {} "
                                                 "has {:.1f} GiB free; try --layers, a shorter --seqlen or more ranks",
                                                 model.name, integer_with_commas(seqlen), needed_bytes / kBytesPerGib, profile.name,
                                                 on_gpu ? "GPU" : "memory", device_memory_bytes / kBytesPerGib));
  ranks_split(ranks, sp, plan.ring);
  const int64_t sequence_ranks = plan.sequence_ranks();
  const int64_t dp = world_size / sequence_ranks, dp_rank = ranks.world_rank / sequence_ranks, local_tokens = seqlen / sequence_ranks;
  if (args.compare_single_rank && dp > 1)
    throw ConfigErrorOnEveryRank("--compare-single-rank", "", fmt::format("compares one sequence's ranks with one unsharded rank; this run has {} "
                                                               "data-parallel groups (dp={}): give --sp x --ring = the rank count",
                                                               dp, dp));

  // Device memory: host memory on the CPU; on a GPU stream-ordered device memory and pinned host
  // memory for offloaded checkpoints (the backends outlive the arenas).
  MemoryBackend* device_backend = &host_memory_backend();
  MemoryBackend* host_backend = &host_memory_backend();
#ifdef LONGSEQ_HAVE_CUDA
  std::optional<CudaDeviceMemoryBackend> cuda_device_memory;
  std::optional<PinnedHostMemoryBackend> pinned_host_memory;
  if (on_gpu) {
    device_backend = &cuda_device_memory.emplace();
    host_backend = &pinned_host_memory.emplace();
  }
#endif
  Arena device("device", budget_bytes, *device_backend), host("host", std::numeric_limits<double>::infinity(), *host_backend);

  // The shape docs/json/run.schema.json documents (`run --json`, and a launch's OUTPUT/run.json).
  nlohmann::json report = {{"schema_version", 1}, {"command", "run"}, {"model", model.name}, {"seqlen", seqlen}, {"ranks", world_size}, {"sp", sp}, {"ring", plan.ring}, {"dp", dp},
                           {"plan", plan_describe(plan)}, {"scenario", args.scenario},
                           {"device", args.device}, {"layers", model.num_layers}, {"profile", profile.name},
                           {"measured_on", fmt::format("{} ({}), {} rank(s)", host_name(), device_description, world_size)},
                           {"steps", nlohmann::json::array()}};
  if (std::isfinite(budget_bytes)) report["budget_mib"] = budget_bytes / (1 << 20);
  if (plan_file) report["plan_file"] = args.plan_file;
  if (plan.lora())
    report["lora"] = {{"rank", plan.lora_rank}, {"alpha", args.lora_alpha}, {"targets", plan.lora_all_linear ? "all-linear" : "q,v"}};
  if (speaker) {
    fmt::print("longseq run: {}{} on this machine ({}), {} tokens per step, {} data; MEASURED\n", model.name,
               args.layers > 0 ? fmt::format(" (first {} decoder layers)", model.num_layers) : "", device_description,
               integer_with_commas(seqlen),
               args.data.empty() ? "synthetic long-range copy" : args.data);
    if (plan.lora())
      fmt::print("adapters: LoRA r={} alpha {:g} on {}; the base frozen, AdamW on the adapters alone\n", plan.lora_rank, args.lora_alpha,
                 plan.lora_all_linear ? "every linear (q, k, v, o, gate, up, down)" : "q_proj and v_proj");
    if (world_size > 1)
      fmt::print("ranks: {} (Ulysses sp={}{}, data parallel dp={}), {} tokens per rank\n", world_size, sp,
                 plan.ring > 1 ? fmt::format(" x ring {}", plan.ring) : "", dp, integer_with_commas(local_tokens));
  }
  double outside_arena_bytes = 0;  // measured on a GPU: what lives beside the arena
  // The process before the model exists (binary, libraries, MPI, the data text): the part of its
  // real memory no prediction covers, measured so that the rest can be compared.
  const double process_baseline_bytes = process_resident_bytes();
  try {
    // Every rank starts from the same weights (same seed): small normal weights, norms at 1. They
    // are made in ordinary host memory, as a checkpoint would be read, and loaded into the model.
    const std::vector<float> initial_weights = [&] {
      const LlamaLayout layout = llama_layout(model);
      std::vector<float> weights(static_cast<size_t>(layout.total));
      std::mt19937 generator(args.seed);
      std::normal_distribution<float> normal(0.0f, 0.02f);
      for (float& weight : weights) weight = normal(generator);
      auto norm_ones = [&](int64_t offset) { std::fill_n(weights.data() + offset, model.hidden_size, 1.0f); };
      for (const auto& layer : layout.layers) {
        norm_ones(layer.attention_norm);
        norm_ones(layer.mlp_norm);
      }
      norm_ones(layout.final_norm);
      return weights;
    }();
    const TrainLoop loop{args,  model,         ranks,  plan,      options,     device,  host,       initial_weights, text,
                         seqlen, dp,           dp_rank,      local_tokens, speaker, world_size, report};
#ifdef LONGSEQ_HAVE_CUDA
    if (on_gpu)
      outside_arena_bytes = model_train<CudaLlamaModel>(loop);
    else
#endif
      model_train<LlamaModel>(loop);
  } catch (const DeviceOutOfMemory& error) {
    std::string breakdown;
    for (const auto& [category, bytes] : bytes_by_category(error.live))
      breakdown += fmt::format("{}{} {:.2f} MiB", breakdown.empty() ? "" : ", ", category, bytes / (1 << 20));
    throw ConfigError("--budget-mib", "", fmt::format("{} (live: {})", error.what(), breakdown));
  }

  // Every rank's measured peak beside the planner's per-rank prediction for the same plan.
  std::vector<float> peaks(static_cast<size_t>(world_size));
  const auto own_peak = static_cast<float>(device.peak_bytes());
  ranks.world->all_gather(&own_peak, peaks.data(), 1);
  const auto measured_categories = bytes_by_category(device.peak_items());
  const auto predicted_categories = bytes_by_category(predicted.gpu_items);
  // The arena's peak is diffed against the prediction without its runtime terms (CUDA context,
  // cuBLAS workspace, NCCL buffers: zero in the CPU profile), which a GPU measures beside it.
  const double predicted_outside_bytes =
      predicted_categories.count(kCategoryRuntime) ? predicted_categories.at(kCategoryRuntime) : 0.0;
  const double predicted_arena_bytes = predicted.gpu_peak_bytes - predicted_outside_bytes;
  std::map<std::string, std::pair<double, double>> rows;
  for (const auto& [category, bytes] : measured_categories) rows[category].first = bytes;
  for (const auto& [category, bytes] : predicted_categories) rows[category].second = bytes;
  if (on_gpu) rows[kCategoryRuntime].first = outside_arena_bytes;
  double worst = 0;
  for (float peak : peaks) worst = std::max(worst, std::fabs(predicted_arena_bytes - peak) / peak);
  const double difference = (predicted_arena_bytes - device.peak_bytes()) / device.peak_bytes();
  report["measured_peak_mib"] = device.peak_bytes() / (1 << 20);
  std::vector<double> peaks_mib;
  for (float peak : peaks) peaks_mib.push_back(peak / (1 << 20));
  report["measured_peak_mib_per_rank"] = peaks_mib;
  report["measured_peak_moment"] = std::string(device.peak_moment());
  report["predicted_peak_mib"] = predicted_arena_bytes / (1 << 20);
  if (on_gpu) {
    report["measured_outside_arena_mib"] = outside_arena_bytes / (1 << 20);
    report["predicted_outside_arena_mib"] = predicted_outside_bytes / (1 << 20);
  }
  report["predicted_peak_moment"] = predicted.gpu_peak_phase + ", " + predicted.gpu_peak_moment;
  // The host pool per rank: the prediction is per node, every rank of this one-node run alike.
  const double predicted_host_per_rank_bytes = predicted.host_bytes_per_node / static_cast<double>(cluster.ranks_per_node());
  report["measured_host_peak_mib"] = host.peak_bytes() / (1 << 20);
  report["predicted_host_peak_mib"] = predicted_host_per_rank_bytes / (1 << 20);
  report["prediction_error"] = difference;
  report["prediction_worst_rank_error"] = worst;
  // The process's real high-water memory against what the prediction says this process holds: on
  // the CPU the arena, the host pool and the fp32 initial weights (read like a checkpoint), beside
  // the baseline measured before the model existed. What the replay cannot see shows here.
  const double process_high_water_bytes_measured = process_high_water_bytes();
  const double predicted_process_bytes =
      on_gpu ? predicted_host_per_rank_bytes + 4.0 * static_cast<double>(llama_layout(model).total)
             : predicted_arena_bytes + predicted_host_per_rank_bytes + 4.0 * static_cast<double>(llama_layout(model).total);
  if (process_high_water_bytes_measured > 0) {
    report["measured_process_high_water_mib"] = process_high_water_bytes_measured / (1 << 20);
    report["measured_process_baseline_mib"] = process_baseline_bytes / (1 << 20);
    report["predicted_process_mib"] = predicted_process_bytes / (1 << 20);
    report["process_unexplained_mib"] = (process_high_water_bytes_measured - process_baseline_bytes - predicted_process_bytes) / (1 << 20);
  }
  // The step's time against the time model, component by component, on the CPU: the model prices
  // this plan with the CPU card's rates measured here now (a GEMM, an attention block, a memcpy),
  // and the last step's measured split (the first step warms caches and allocations).
  std::string time_table;
  if (ranks.world_rank == 0 && !on_gpu && !report["steps"].empty() && report["steps"].back().contains("components_s")) {
    MeasuredCpuRates rates = cpu_rates_measure(local_tokens, model.hidden_size, model.intermediate_size, model.head_dim, args.attention_block);
    // Measured by this rank alone; during the step every rank of the node ran at once, taking
    // turns on the cores when their threads outnumber them.
    const double core_share = rank_core_share(ranks_on_this_node(ranks.world_size));
    rates.matmul_gflops *= core_share;
    rates.attention_gflops *= core_share;
    ClusterSpec measured_cluster = cluster;
    measured_cluster.hardware = cpu_card_with_rates(cluster.hardware, rates);
    const StepTime predicted_time = time_predict(model, measured_cluster, plan, profile, seqlen).time;
    const nlohmann::json& last = report["steps"].back();
    const nlohmann::json& measured = last["components_s"];
    struct Row { const char* name; const char* key; double predicted; };
    const Row rows_time[] = {
        {"matmul", "matmul", predicted_time.matmul_s},
        {"attention", "attention", predicted_time.attention_s},
        {"communication (MPI, waits included)", "communication",
         predicted_time.ulysses_all_to_all_s + predicted_time.ring_exposed_s + predicted_time.ring_final_hop_s +
             predicted_time.zero_communication_exposed_s},
        {"host copies (offload)", "host_copies", predicted_time.checkpoint_offload_s + predicted_time.gradient_offload_s +
                                                     predicted_time.fpdt_fetch_exposed_s},
        {"optimizer", "optimizer", predicted_time.optimizer_s},
        {"other (norms, element-wise, loss)", "other", predicted_time.elementwise_s},
    };
    nlohmann::json comparison = {{"rates_measured_here",
                                  {{"matmul_gflops", rates.matmul_gflops}, {"gemm_shape", {rates.gemm_m, rates.gemm_k, rates.gemm_n}},
                                   {"attention_gflops", rates.attention_gflops},
                                   {"memcpy_gbps", rates.memcpy_gbps}, {"elementwise_gbps", rates.elementwise_gbps},
                                   {"rank_core_share", core_share}}},
                                 {"step", last["step"]}, {"measured_s", last["seconds"]}, {"predicted_s", predicted_time.total_s()},
                                 {"components", nlohmann::json::array()}};
    time_table = fmt::format("\nstep time of rank 0, step {}: MEASURED (the kernels' and MPI's clocks) vs PREDICTED (the time model at "
                             "rates measured here now: GEMM {:.1f} GFLOP/s at {}x{}x{}, attention {:.1f} GFLOP/s, memcpy {:.1f} GB/s{}; collectives "
                             "at the cpu-device card's)\n  {:<38} {:>11} {:>12} {:>9}\n",
                             last["step"].get<int64_t>(), rates.matmul_gflops, rates.gemm_m, rates.gemm_k, rates.gemm_n, rates.attention_gflops,
                             rates.memcpy_gbps,
                             core_share < 1 ? fmt::format(", a rank's share of the cores: x{:.2f} of the rate measured alone", core_share) : "",
                             "component",
                             "measured s", "predicted s", "error");
    for (const Row& row : rows_time) {
      const double measured_s = measured[row.key].get<double>();
      const bool modelled = true;  // every component has a term (element-wise work by its measured rate)
      comparison["components"].push_back({{"component", row.key}, {"measured_s", measured_s}, {"predicted_s", row.predicted}});
      time_table += fmt::format("  {:<38} {:>11.3f} {:>12} {:>9}\n", row.name, measured_s, modelled ? fmt::format("{:.3f}", row.predicted) : "not modelled",
                                modelled && measured_s > 0 ? fmt::format("{:+.0f}%", 100.0 * (row.predicted - measured_s) / measured_s) : "");
    }
    const double measured_total = last["seconds"].get<double>();
    time_table += fmt::format("  {:<38} {:>11.3f} {:>12.3f} {:>9}\n", "total", measured_total, predicted_time.total_s(),
                              fmt::format("{:+.0f}%", 100.0 * (predicted_time.total_s() - measured_total) / measured_total));
    time_table += "  (the time model prices every GEMM at one rate, measured at the MLP's shape, and the element-wise work by the "
                  "bytes it moves at the rate its kernels were measured at: small GEMMs and per-call overheads, as FPDT's small chunks "
                  "make, are under-priced; MPI's time includes waiting for the slowest rank)\n";
    report["step_time_comparison"] = comparison;
  }
  if (ranks.world_rank != 0) return 0;
  if (json_out) output_file_write(*json_out, json_text(report) + "\n");
  if (args.json) {
    std::cout << json_text(report) << "\n";
    return 0;
  }
  fmt::print("\ndevice memory at the peak{}: MEASURED (this run's arena{}) vs PREDICTED (planner, runtime profile {})\n",
             world_size > 1 ? " of rank 0" : "", on_gpu ? "; runtime_overheads: cudaMemGetInfo beyond it, after the last step" : "",
             profile.name);
  fmt::print("  {:<26} {:>14} {:>15} {:>12}\n", "category", "measured MiB", "predicted MiB", "difference");
  for (const auto& [category, values] : rows)
    fmt::print("  {:<26} {:>14.3f} {:>15.3f} {:>12}\n", category, values.first / (1 << 20), values.second / (1 << 20),
               values.first > 0 ? fmt::format("{:+.1f}%", 100.0 * (values.second - values.first) / values.first) : "");
  fmt::print("  {:<26} {:>14.3f} {:>15.3f} {:>+11.1f}%\n", on_gpu ? "total in the arena" : "total", device.peak_bytes() / (1 << 20),
             predicted_arena_bytes / (1 << 20), 100.0 * difference);
  if (on_gpu)
    fmt::print("  {:<26} {:>14.3f} {:>15.3f}\n", "total with the runtime", (device.peak_bytes() + outside_arena_bytes) / (1 << 20),
               predicted.gpu_peak_bytes / (1 << 20));
  fmt::print("  peak moment: measured during '{}'; predicted in the {}, during '{}'\n", device.peak_moment(),
             predicted.gpu_peak_phase, predicted.gpu_peak_moment);
  if (world_size > 1) {
    std::string per_rank;
    for (float peak : peaks) per_rank += fmt::format("{}{:.2f}", per_rank.empty() ? "" : ", ", peak / (1 << 20));
    fmt::print("  every rank's measured peak (MiB): {}; the worst differs from the prediction by {:.2f}%\n", per_rank, 100.0 * worst);
  }
  if (host.peak_bytes() > 0 || predicted.host_bytes_per_node > 0)
    fmt::print("  host pool (offloaded states, checkpoints, FPDT chunks) of rank 0 at its peak: MEASURED {:.3f} MiB, PREDICTED {:.3f} "
               "MiB (per node / {} rank(s))\n",
               host.peak_bytes() / (1 << 20), predicted_host_per_rank_bytes / (1 << 20), cluster.ranks_per_node());
  if (process_high_water_bytes_measured > 0) {
    const double unexplained = process_high_water_bytes_measured - process_baseline_bytes - predicted_process_bytes;
    fmt::print("  process memory of rank 0 (VmHWM, this machine's kernel): MEASURED {:.1f} MiB high-water = {:.1f} MiB before the model "
               "existed (binary, libraries, MPI, data) + {:.1f} MiB; PREDICTED {:.1f} MiB ({}the host pool and the fp32 initial "
               "weights); {:+.1f} MiB that no prediction names (allocator slack, the sample, transient buffers of the kernels)\n",
               process_high_water_bytes_measured / (1 << 20), process_baseline_bytes / (1 << 20),
               (process_high_water_bytes_measured - process_baseline_bytes) / (1 << 20), predicted_process_bytes / (1 << 20),
               on_gpu ? "" : "the arena, ", unexplained / (1 << 20));
  }
  fmt::print("  what these prove: the arena rows hold the executor's allocations against the native replay of the same schedule "
             "(their agreement shows the schedule is modelled, not that a framework behaves so); the process line holds this "
             "process's real memory against the prediction with its runtime terms{}\n", on_gpu ? "; on a GPU the runtime "
             "row is cudaMemGetInfo beside the arena" : "");
  if (std::isfinite(budget_bytes)) {
    const double highest = *std::max_element(peaks.begin(), peaks.end());
    fmt::print("  budget {:.0f} MiB per rank: measured peak {} ({:.1f}% of it); prediction {} the measurement ({:+.2f}%, bar: 3%)\n",
               budget_bytes / (1 << 20), highest <= budget_bytes ? "within" : "OVER", 100.0 * highest / budget_bytes,
               worst <= 0.03 ? "matches" : "MISSES", 100.0 * (std::fabs(difference) > worst ? difference : worst));
  }
  fmt::print("{}", time_table);
  return 0;
}

}  // namespace

int run_command_run(const RunCommandArgs& given) {
  Ranks ranks;
  ranks_start(ranks);
  try {
    return run_on_ranks(given, ranks);
  } catch (const ConfigErrorOnEveryRank& error) {
    // Every rank found the same problem (a disagreement, a flag no rank can run): rank 0 says it
    // once, and all end normally.
    if (ranks.world_rank == 0) std::cerr << "longseq: error: " << error.what() << "\n";
    return 2;
  } catch (const std::exception& error) {
    if (!ranks.mpi || ranks.world_size == 1) throw;
#ifdef LONGSEQ_HAVE_MPI
    // The other ranks may be waiting in a collective this one will never join: say which rank
    // failed and why, then take the whole job down rather than let it hang.
    const bool input = dynamic_cast<const ConfigError*>(&error) != nullptr;
    std::cerr << fmt::format("longseq: error on rank {} of {}: {}\n", ranks.world_rank, ranks.world_size, error.what()) << std::flush;
    MPI_Abort(MPI_COMM_WORLD, input ? 2 : 1);
#endif
    throw;
  }
}

}  // namespace longseq
