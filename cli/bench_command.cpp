// bench_command.cpp: `longseq bench` — how long the plan search takes. A benchmark, not a test:
// it prints figures and never fails on them.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <fmt/format.h>
#include <memory>
#include <vector>

#include "cli/commands.hpp"
#include "io/config_error.hpp"
#include "models/model_loader.hpp"
#include "io/process.hpp"
#include "io/yaml_reader.hpp"
#include "planner/plan.hpp"
#include "executor/trainer.hpp"
#include "executor/component_seconds.hpp"
#include "kernels/cpu/dense.hpp"
#include "planner/compute_model.hpp"
#include "planner/memory_model.hpp"
#include "planner/search.hpp"
#include "planner/time_model.hpp"
#include "planner/units.hpp"

namespace longseq {

struct BenchCommandArgs {
  bool executor = false;
  bool machine = false;
  bool yaml_aliases = false;
  std::vector<std::string> seqlens = {"4Ki", "16Ki"};
  std::string model = "llama-3.1-70b";
  std::string gpu = "h100-sxm-80gb";
  std::string profile = "deepspeed-hf";
  std::string attention;  // empty: the profile's, else the card's default
  int64_t max_gpus = 1024;
  int64_t repeat = 5;
};

std::shared_ptr<BenchCommandArgs> bench_command_register(CLI::App& app) {
  auto args = std::make_shared<BenchCommandArgs>();
  CLI::App* command = app.add_subcommand(
      "bench", "Time the plan search (max-seqlen objective) for 1, 2, 4, ... GPUs; with --executor, time training steps of the "
               "CPU executor instead");
  command->add_flag("--executor", args->executor,
                    "benchmark the executor: tokens/s and GFLOP/s per step beside this machine's matmul rate, and peak "
                    "memory with and without each technique (model default tiny-llama)");
  command->add_flag("--machine", args->machine,
                    "time the search for this machine's executor (`plan --ranks N --budget-mib B`, `run --auto`) at its worst "
                    "case: budgets up to the largest accepted (1 TiB per rank), 1 to 8 ranks, CPU and GPU profiles (model "
                    "default: tiny-llama and llama-3.1-8b)");
  command->add_flag("--yaml-aliases", args->yaml_aliases,
                    "time the YAML reader (cards, profiles, scenarios) on the worst alias nesting (the billion laughs) and on "
                    "alias-free documents of growing size: the work must stay linear in the text");
  command->add_option("--seqlens", args->seqlens, "lengths for --executor (default 4Ki 16Ki)");
  command->add_option("--model", args->model, "model (default llama-3.1-70b)");
  command->add_option("--gpu", args->gpu, "hardware card (default h100-sxm-80gb)");
  command->add_option("--profile", args->profile, "runtime profile (default deepspeed-hf)");
  command->add_option("--attention", args->attention,
                      "attention kernel: " + attention_kernel_choices(true) +
                          " (default: the profile's, else the card's; FPDT and USP's ring run fa2)")
      ->check(CLI::IsMember(attention_kernel_ids(true)));
  command->add_option("--max-gpus", args->max_gpus, "largest GPU count, doubling from 1 (default 1024)")->check(CLI::Range(1, 1 << 20));
  command->add_option("--repeat", args->repeat, "searches per GPU count; the median is reported (default 5)")->check(CLI::Range(1, 1000));
  return args;
}

namespace {

// The shortest multiple of the plan's length granule, up to `longest`, at which its ring passing
// is wholly hidden (the exposure only falls with the length); `longest` when it never is.
int64_t ring_hidden_from(const ModelSpec& model, const ClusterSpec& cluster, const PlanOptions& plan, const RuntimeProfile& profile,
                         int64_t longest) {
  const int64_t granule = seqlen_granule(plan);
  auto hidden = [&](int64_t granules) {
    return time_predict(model, cluster, plan, profile, granules * granule).time.ring_exposed_s <= 0;
  };
  int64_t low = 1, high = std::max<int64_t>(1, longest / granule);
  if (!hidden(high)) return longest;
  while (low < high) {
    const int64_t middle = low + (high - low) / 2;
    if (hidden(middle)) high = middle;
    else low = middle + 1;
  }
  return low * granule;
}

int executor_bench(const BenchCommandArgs& args) {
  const ModelSpec model = model_load(args.model == "llama-3.1-70b" ? "tiny-llama" : args.model);
  // The lengths are read (and refused) before the matmul warm-up, not after it.
  std::vector<int64_t> seqlens;
  for (const auto& text : args.seqlens) seqlens.push_back(seqlen_parse(text, "--seqlens"));
  const ClusterSpec cluster = executor_cluster(std::numeric_limits<double>::infinity());
  const RuntimeProfile native = runtime_profile_load("native");
  struct Technique {
    const char* name;
    TrainingOptions options;
    int64_t fpdt_chunks = 0;  // FPDT over this many chunks of the sequence (its MLP and loss chunks too)
  };
  std::vector<Technique> techniques;
  techniques.push_back({"none", {}});
  TrainingOptions o;
  o.activation_checkpointing = true;
  techniques.push_back({"checkpointing", o});
  o.checkpoint_offload = true;
  techniques.push_back({"checkpointing + offload", o});
  TrainingOptions mlp;
  mlp.mlp_tiles = 16;
  techniques.push_back({"tiled MLP (16)", mlp});
  TrainingOptions loss;
  loss.loss_tiles = 16;
  techniques.push_back({"tiled loss (16)", loss});
  TrainingOptions all = o;
  all.mlp_tiles = all.loss_tiles = 16;
  techniques.push_back({"all of them", all});
  TrainingOptions checkpointed;
  checkpointed.activation_checkpointing = true;
  techniques.push_back({"FPDT (8 chunks)", checkpointed, 8});
  techniques.push_back({"FPDT (32 chunks)", checkpointed, 32});
  auto technique_plan = [&](const Technique& technique, int64_t seqlen) {
    PlanOptions plan = executor_plan(technique.options);
    if (technique.fpdt_chunks > 0) {
      plan.fpdt = true;
      plan.fpdt_chunk_tokens = seqlen / technique.fpdt_chunks;
    }
    return plan;
  };
  // Every row must fit this machine: its predicted device and host peaks, and the sample, within
  // the memory available now (the benchmark runs one row at a time). A length none fits is refused.
  const double available_bytes = machine_memory_available_bytes();
  for (const int64_t seqlen : seqlens) {
    double smallest_bytes = std::numeric_limits<double>::infinity();
    for (const auto& technique : techniques) {
      const PlanOptions plan = technique_plan(technique, seqlen);
      if (!plan_problems(model, cluster, plan).empty() || !seqlen_problems(plan, seqlen).empty()) continue;
      const MemoryPrediction memory = memory_predict(model, cluster, plan, native, seqlen, /*with_breakdown=*/false);
      smallest_bytes = std::min(smallest_bytes, memory.gpu_peak_bytes + memory.host_bytes_per_node + 12.0 * static_cast<double>(seqlen));
    }
    if (!(smallest_bytes <= available_bytes))
      throw ConfigError("--seqlens", "", fmt::format("{} tokens: every technique needs more than this machine's {:.1f} GiB of available "
                                                     "memory (the smallest needs {:.1f} GiB, PREDICTED); give shorter lengths",
                                                     seqlen, available_bytes / kBytesPerGib, smallest_bytes / kBytesPerGib));
  }
  // This machine's float matrix-multiply rate through Eigen (the executor's GEMM path): the best
  // of five 1024^3 products.
  const double matmul_gflops = gemm_gflops_measure(1024, 1024, 1024, 5);
  fmt::print("executor benchmark: {} on this machine's CPU (fp32), one training step per row, MEASURED; "
             "float matmul rate here: {:.1f} GFLOP/s (Eigen, 1024^3, best of 5)\n", model.name, matmul_gflops);
  fmt::print("{:>8} {:<26} {:>9} {:>10} {:>9} {:>10} {:>12} {:>8} {:>15} {:>8} {:>9} {:>8} {:>17} {:>17}\n", "tokens", "technique",
             "seconds", "tokens/s", "GFLOP/s", "of matmul", "peak MiB", "vs none", "predicted MiB", "error", "pred. s", "error",
             "matmul s (m/p)", "attention s (m/p)");
  std::vector<double> time_errors;
  for (const int64_t seqlen : seqlens) {
    const Sample sample = sample_synthetic(seqlen, model.vocab_size, 1);
    double baseline_peak = 0;
    // The time model at rates measured here for this length's shapes (run's comparison, per row).
    const MeasuredCpuRates rates = cpu_rates_measure(seqlen, model.hidden_size, model.intermediate_size, model.head_dim, 64);
    ClusterSpec timed_cluster = cluster;
    timed_cluster.hardware = cpu_card_with_rates(cluster.hardware, rates);
    for (const auto& technique : techniques) {
      const PlanOptions plan = technique_plan(technique, seqlen);
      TrainingOptions options = technique.options;
      if (technique.fpdt_chunks > 0)  // the chunk's MLP and loss tiles as the plan predicts them
        options = executor_training_options(plan, memory_predict(model, cluster, plan, native, seqlen, /*with_breakdown=*/false));
      const MemoryPrediction row_memory = memory_predict(model, cluster, plan, native, seqlen, /*with_breakdown=*/false);
      if (row_memory.gpu_peak_bytes + row_memory.host_bytes_per_node > available_bytes) {
        fmt::print("{:>8} {:<26} skipped: needs {:.1f} GiB (PREDICTED), more than the {:.1f} GiB available\n", seqlen, technique.name,
                   (row_memory.gpu_peak_bytes + row_memory.host_bytes_per_node) / kBytesPerGib, available_bytes / kBytesPerGib);
        continue;
      }
      {
        // One untimed step first, as every benchmark warms up: the first step pays for the
        // process's heap growing into fresh pages, which the steps after it reuse.
        Arena warm_device("device"), warm_host("host");
        LlamaModel warm(model, warm_device);
        std::fill_n(warm.parameters(), warm.parameter_count(), 0.01f);
        warm.forward_backward(sample.tokens.data(), sample.labels.data(), sample.positions.data(), seqlen, options, warm_device, warm_host);
      }
      Arena device("device"), host("host");
      LlamaModel llama(model, device);
      std::fill_n(llama.parameters(), llama.parameter_count(), 0.01f);
      const ComponentSeconds before = component_seconds();
      const auto start = std::chrono::steady_clock::now();
      llama.forward_backward(sample.tokens.data(), sample.labels.data(), sample.positions.data(), seqlen, options, device, host);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const ComponentSeconds spent = component_seconds() - before;
      // The GEMM rate at the MLP's rows as this plan runs them (a TiledMLP tile's or an FPDT chunk's
      // tokens, when fewer than the rows the rate was measured at): the time model prices every GEMM
      // at one rate, and the MLP's are most of them.
      ClusterSpec row_cluster = timed_cluster;
      const int64_t mlp_rows = row_memory.local_tokens / std::max<int64_t>(1, row_memory.mlp_tiles);
      if (mlp_rows < rates.gemm_m) {
        MeasuredCpuRates row_rates = rates;
        row_rates.matmul_gflops = gemm_gflops_measure(mlp_rows, model.hidden_size, model.intermediate_size, 3);
        row_cluster.hardware = cpu_card_with_rates(cluster.hardware, row_rates);
      }
      // The step here is forward and backward without the optimizer: the prediction likewise.
      StepTime predicted_time = time_predict(model, row_cluster, plan, native, seqlen).time;
      predicted_time.optimizer_s = 0;
      const double predicted_s = predicted_time.total_s();
      time_errors.push_back((predicted_s - seconds) / seconds);
      const double gflops = step_flops_executed(model, plan, seqlen).total() / seconds / 1e9;
      const double predicted = memory_predict(model, cluster, plan, native, seqlen, /*with_breakdown=*/false).gpu_peak_bytes;
      if (baseline_peak == 0) baseline_peak = device.peak_bytes();
      fmt::print("{:>8} {:<26} {:>9.3f} {:>10.0f} {:>9.2f} {:>9.1f}% {:>12.2f} {:>7.1f}% {:>15.2f} {:>+7.2f}% {:>9.3f} {:>+7.0f}% {:>17} {:>17}\n",
                 seqlen, technique.name, seconds, static_cast<double>(seqlen) / seconds, gflops, 100.0 * gflops / matmul_gflops,
                 device.peak_bytes() / (1 << 20), 100.0 * device.peak_bytes() / baseline_peak, predicted / (1 << 20),
                 100.0 * (predicted - device.peak_bytes()) / device.peak_bytes(), predicted_s, 100.0 * (predicted_s - seconds) / seconds,
                 fmt::format("{:.3f}/{:.3f}", spent.matmul, predicted_time.matmul_s),
                 fmt::format("{:.3f}/{:.3f}", spent.attention, predicted_time.attention_s));
      std::fflush(stdout);  // a long benchmark shows each row as it is measured
    }
  }
  fmt::print("GFLOP/s counts the planner's compute model (recompute included), not a profiler; 'predicted' is the planner's\n"
             "native PREDICTION for the same plan, 'peak' the arena's MEASUREMENT. 'pred. s' is the time model's step (forward and\n"
             "backward) at rates measured here for each length (a GEMM at the MLP's shape as the row tiles it, an attention block,\n"
             "the element-wise kernels, a memcpy); m/p are\n"
             "the kernels' measured seconds beside the predicted; element-wise work (norms, RoPE, SwiGLU, loss) is priced by\n"
             "the bytes it moves at the rate its kernels were measured at.\n"
             "Each row's step is timed after one untimed step of the same row (the warm-up).\n");
  if (!time_errors.empty()) {
    std::vector<double> magnitudes;
    for (double error : time_errors) magnitudes.push_back(std::fabs(error));
    std::sort(magnitudes.begin(), magnitudes.end());
    fmt::print("time model against the measured steps: median |error| {:.0f}%, worst {:.0f}% over {} rows\n",
               100.0 * magnitudes[magnitudes.size() / 2], 100.0 * magnitudes.back(), magnitudes.size());
  }
  return 0;
}

}  // namespace

// The search `plan --ranks` and `run --auto` run, timed where it is slowest: the largest budget
// accepted sends the length search to billions of tokens, where the executor's replay used to walk
// every tile (issue 24); the replay is O(1) in the tile count now.
int machine_search_bench(const BenchCommandArgs& args) {
  std::vector<std::string> models = {"tiny-llama", "llama-3.1-8b"};
  if (args.model != "llama-3.1-70b") models = {args.model};
  fmt::print("machine search benchmark (plan --ranks N --budget-mib B, run --auto): median of {} run(s) per row, this machine\n", args.repeat);
  fmt::print("{:<14} {:>6} {:>5} {:>14} {:>7} {:>10} {:>10}  {}\n", "model", "device", "ranks", "budget MiB", "plans", "median ms",
             "max ms", "longest (PREDICTION)");
  for (const std::string& name : models) {
    const ModelSpec model = model_load(name);
    for (const std::string device : {"cpu", "cuda"})
      for (const double budget_mib : {1024.0, 80.0 * 1024, kMostBudgetMib})
        for (int64_t ranks = 1; ranks <= 8; ranks *= 2) {
          const MachineTarget target{device, ranks, budget_mib * 1024 * 1024};
          std::vector<double> times_ms;
          SearchResult result;
          for (int64_t run = 0; run < args.repeat; ++run) {
            const auto start = std::chrono::steady_clock::now();
            result = machine_plan_search(model, target);
            times_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
          }
          std::sort(times_ms.begin(), times_ms.end());
          const SearchCandidate* winner = result.winner();
          fmt::print("{:<14} {:>6} {:>5} {:>14.0f} {:>7} {:>10.1f} {:>10.1f}  {}\n", model.name, device, ranks, budget_mib,
                     result.candidates.size(), times_ms[times_ms.size() / 2], times_ms.back(),
                     winner ? seqlen_format(winner->max_seqlen) : "none fits");
          std::fflush(stdout);
        }
  }
  return 0;
}

// The YAML reader on documents built to be slow: `levels` of nine aliases of the level below (the
// billion laughs: 9^levels scalars in the tree), and alias-free mappings of growing size.
int yaml_alias_bench() {
  fmt::print("YAML reader benchmark (this machine): each document read once; aliases are refused at the first one, so the time "
             "follows the text's size, not its tree's\n");
  fmt::print("{:<34} {:>10} {:>12} {:>10}  {}\n", "document", "bytes", "tree nodes", "ms", "outcome");
  auto time_read = [](const std::string& label, const std::string& text, double tree_nodes) {
    const auto start = std::chrono::steady_clock::now();
    std::string outcome = "read";
    try {
      YamlReader reader(text, "bench.yaml");
    } catch (const ConfigError& error) {
      outcome = std::string(error.what()).substr(0, 60);
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    fmt::print("{:<34} {:>10} {:>12.3g} {:>10.3f}  {}\n", label, text.size(), tree_nodes, ms, outcome);
  };
  for (int levels : {1, 4, 8, 12}) {
    std::string text = "l0: &l0 [x, x, x, x, x, x, x, x, x]\n";
    for (int level = 1; level <= levels; ++level) {
      text += fmt::format("l{}: &l{} [", level, level);
      for (int i = 0; i < 9; ++i) text += fmt::format("{}*l{}", i ? ", " : "", level - 1);
      text += "]\n";
    }
    time_read(fmt::format("billion laughs, {} levels", levels), text, std::pow(9.0, levels + 1));
  }
  for (int keys : {1000, 10000, 100000}) {
    std::string text;
    for (int i = 0; i < keys; ++i) text += fmt::format("key_{}: [1, 2, {{a: 3}}]\n", i);
    time_read(fmt::format("{} keys, no alias", keys), text, 5.0 * keys);
  }
  return 0;
}

int bench_command_run(const BenchCommandArgs& args) {
  if (args.executor + args.machine + args.yaml_aliases > 1)
    throw ConfigError("--machine", "", "one benchmark at a time: give one of --executor, --machine, --yaml-aliases");
  if (args.yaml_aliases) return yaml_alias_bench();
  if (args.executor) return executor_bench(args);
  if (args.machine) return machine_search_bench(args);
  const ModelSpec model = model_load(args.model);
  const HardwareCard hardware = hardware_card_load(args.gpu);
  RuntimeProfile profile = runtime_profile_load(args.profile);
  if (!args.attention.empty()) profile.attention_kernel = args.attention;
  if (const std::string problem = attention_kernel_problem(profile, hardware, model.head_dim); !problem.empty())
    throw ConfigError("--attention", "", problem);
  fmt::print("plan search benchmark: {} on {}, runtime profile {}, attention {} (ring plans fa2), median of {} run(s) per row, this machine\n",
             model.name, hardware.name, profile.name, stack_attention_kernel(profile, hardware), args.repeat);
  fmt::print("{:>6} {:>7} {:>10} {:>10} {:>10} {:>11} {:>9} {:>12}  {}\n", "GPUs", "plans", "predicted", "median ms", "min ms",
             "step s", "ring s", "ring hidden", "winner (max seqlen)");
  for (int64_t gpus = 1; gpus <= args.max_gpus; gpus *= 2) {
    const ClusterSpec cluster = cluster_make(hardware, gpus, 0, 0, 0);
    std::vector<double> times_ms;
    SearchResult result;
    for (int64_t run = 0; run < args.repeat; ++run) {
      result = plan_search(model, cluster, profile, {});
      times_ms.push_back(result.elapsed_ms);
    }
    std::sort(times_ms.begin(), times_ms.end());
    const SearchCandidate* winner = result.winner();
    // The winner's predicted step at its maximum, the ring passing left exposed there, and the
    // shortest length from which the passing hides behind attention (compute per ring step grows
    // with the square of the length, a key/value block only linearly).
    std::string step_s = "-", ring_s = "-", ring_hidden = "-";
    if (winner) {
      step_s = fmt::format("{:.1f}", winner->time.time.total_s());
      if (winner->plan.ring > 1) {
        ring_s = fmt::format("{:.2f}", winner->time.time.ring_exposed_s);
        ring_hidden = seqlen_format(ring_hidden_from(model, cluster, winner->plan, profile, winner->max_seqlen));
        if (winner->time.time.ring_exposed_s > 0) ring_hidden = "exposed";
      }
    }
    fmt::print("{:>6} {:>7} {:>10} {:>10.2f} {:>10.2f} {:>11} {:>9} {:>12}  {}\n", gpus, result.candidates.size(), result.evaluated,
               times_ms[times_ms.size() / 2], times_ms.front(), step_s, ring_s, ring_hidden,
               winner ? fmt::format("{} ({})", plan_describe(winner->plan), seqlen_format(winner->max_seqlen)) : "none fits");
  }
  fmt::print("step s: the winner's predicted step at its maximum; ring s: its ring passing not hidden behind attention there;\n"
             "ring hidden: the shortest length from which that plan's ring passing is hidden (all PREDICTIONS)\n");
  return 0;
}

}  // namespace longseq
