// run_command.cpp: `longseq run` — train a few steps with real kernels on this machine, measure,
// and set the planner's `native` prediction for the same plan beside the measurement.
#include <chrono>
#include <cstdio>
#include <fmt/format.h>
#include <cmath>
#include <iostream>
#include <limits>
#include <map>
#include <random>
#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "executor/trainer.hpp"
#include "models/config_error.hpp"
#include "models/layer_inventory.hpp"
#include "models/model_loader.hpp"
#include "planner/max_seqlen.hpp"
#include "planner/scenario.hpp"
#include "planner/memory_model.hpp"
#include "planner/units.hpp"
#include "reports/memory_report.hpp"

namespace longseq {

struct RunCommandArgs {
  std::string scenario;
  CLI::App* command = nullptr;  // to tell flags given from defaults when a scenario supplies values
  std::string model = "tiny-llama";
  std::string seqlen = "1Ki";
  int64_t steps = 5;
  bool checkpointing = false, checkpoint_offload = false;
  int64_t mlp_tiles = 0, loss_tiles = 0, attention_block = 64;
  std::string data;
  double budget_mib = 0;
  double lr = 3e-3;
  uint32_t seed = 1;
  bool auto_plan = false;
  bool json = false;
};

std::shared_ptr<RunCommandArgs> run_command_register(CLI::App& app) {
  auto args = std::make_shared<RunCommandArgs>();
  CLI::App* command = app.add_subcommand(
      "run", "Train a few steps on this machine's CPU with real kernels; print loss, step time, tokens/s and MEASURED peak "
             "memory, then the planner's native PREDICTION for the same plan beside it");
  args->command = command;
  command->add_option("scenario", args->scenario,
                      "a scenario with a run: section (scenarios/README.md); flags given as well override it");
  command->add_option("--model,-m", args->model, "model card or config.json (default tiny-llama)");
  command->add_option("--seqlen,-s", args->seqlen, "tokens per step (default 1Ki)");
  command->add_option("--steps", args->steps, "training steps (default 5)")->check(CLI::Range(1, 100000));
  command->add_flag("--checkpointing", args->checkpointing, "activation checkpointing per layer (recompute in backward)");
  command->add_flag("--checkpoint-offload", args->checkpoint_offload, "checkpoints to the host pool (needs --checkpointing)");
  command->add_option("--mlp-tiles", args->mlp_tiles, "tiled MLP with this many tiles (default: untiled)")->check(CLI::Range(0, 1 << 30));
  command->add_option("--loss-tiles", args->loss_tiles, "tiled logits+loss with this many tiles (default: untiled)")->check(CLI::Range(0, 1 << 30));
  command->add_option("--attention-block", args->attention_block, "attention block size in tokens (default 64)")->check(CLI::Range(1, 1 << 20));
  command->add_option("--data", args->data, "a text file, read as bytes (default: a synthetic long-range copy task)");
  command->add_option("--budget-mib", args->budget_mib, "device memory budget in MiB; exceeding it fails cleanly (default: none)");
  command->add_option("--lr", args->lr, "AdamW learning rate (default 3e-3)");
  command->add_option("--seed", args->seed, "data seed (default 1)");
  command->add_flag("--auto", args->auto_plan,
                    "let the planner choose checkpointing, offload and tile counts for the longest sequence that fits "
                    "--budget-mib, then run that plan at that length (the loop: plan, run, measure)");
  command->add_flag("--json", args->json, "print JSON");
  return args;
}

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

int run_command_run(const RunCommandArgs& given) {
  // A scenario supplies model, plan and run settings; a flag given on the command line wins.
  RunCommandArgs args = given;
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
    const PlanSettings& plan = scenario.plan;
    if (unset("--checkpointing") && plan.activation_checkpointing) args.checkpointing = *plan.activation_checkpointing;
    if (unset("--checkpoint-offload") && plan.checkpoint_offload) args.checkpoint_offload = *plan.checkpoint_offload;
    if (unset("--mlp-tiles") && plan.tiled_mlp.value_or(false)) args.mlp_tiles = plan.mlp_tiles.value_or(16);
    if (unset("--loss-tiles") && plan.tiled_loss.value_or(false)) args.loss_tiles = plan.loss_tiles.value_or(16);
    if (!args.json) fmt::print("scenario {}: {}\n", scenario.name, scenario.description);
  }
  const ModelSpec model = model_load(args.model);
  executor_model_check(model);
  int64_t seqlen = seqlen_parse(args.seqlen, "--seqlen");
  if (seqlen > (int64_t{1} << 24)) throw ConfigError("--seqlen", "", "more than 16Mi tokens is beyond a CPU run");
  if (args.checkpoint_offload && !args.checkpointing) throw ConfigError("--checkpoint-offload", "", "needs --checkpointing");
  if (args.budget_mib < 0) throw ConfigError("--budget-mib", "", "must be positive");
  if (!args.data.empty() && model.vocab_size < 256) throw ConfigError("--data", "", "byte-level text needs a vocabulary of at least 256");
  const std::string text = args.data.empty() ? std::string() : file_read_text(args.data);

  TrainingOptions options;
  options.activation_checkpointing = args.checkpointing;
  options.checkpoint_offload = args.checkpoint_offload;
  options.mlp_tiles = args.mlp_tiles;
  options.loss_tiles = args.loss_tiles;
  options.attention_block = args.attention_block;
  const double budget_bytes = args.budget_mib > 0 ? args.budget_mib * 1024 * 1024 : std::numeric_limits<double>::infinity();
  const RuntimeProfile native = runtime_profile_load("native");
  if (args.auto_plan) {
    if (args.budget_mib <= 0) throw ConfigError("--auto", "", "needs --budget-mib (the device memory to plan for)");
    if (args.checkpointing || args.checkpoint_offload || args.mlp_tiles > 0 || args.loss_tiles > 0)
      throw ConfigError("--auto", "", "chooses checkpointing, offload and tiles itself; drop those flags");
    // The planner's choice among the executor's options: the longest sequence (in steps of 64
    // tokens) that fits the budget; on a tie, the plan with fewer techniques (it runs faster).
    int64_t best = 0, best_techniques = 0;
    for (bool checkpointing : {false, true})
      for (bool offload : {false, true}) {
        if (offload && !checkpointing) continue;
        for (int64_t mlp_tiles : {0, 4, 16, 64})
          for (int64_t loss_tiles : {0, 4, 16, 64}) {
            TrainingOptions candidate = options;
            candidate.activation_checkpointing = checkpointing;
            candidate.checkpoint_offload = offload;
            candidate.mlp_tiles = mlp_tiles;
            candidate.loss_tiles = loss_tiles;
            const int64_t length = max_seqlen_find(model, executor_cluster(budget_bytes), executor_plan(candidate), native, 64,
                                                   /*with_breakdown=*/false).max_seqlen;
            const int64_t techniques = checkpointing + offload + (mlp_tiles > 0) + (loss_tiles > 0);
            if (length > best || (length == best && techniques < best_techniques)) {
              best = length;
              best_techniques = techniques;
              options = candidate;
            }
          }
      }
    if (best == 0) throw ConfigError("--budget-mib", "", "not even 64 tokens fit: the model states alone exceed the budget");
    seqlen = best;
    if (!args.json)
      fmt::print("longseq run --auto: the planner chose {} for {} tokens, the longest that fits {:.0f} MiB (PREDICTION)\n",
                 plan_describe(executor_plan(options)), integer_with_commas(seqlen), args.budget_mib);
  }
  Arena device("device", budget_bytes), host("host");

  nlohmann::json report = {{"model", model.name}, {"seqlen", seqlen}, {"steps", nlohmann::json::array()}};
  if (!args.json)
    fmt::print("longseq run: {} on this machine's CPU (fp32), {} tokens per step, {} data; MEASURED\n", model.name,
               integer_with_commas(seqlen), args.data.empty() ? "synthetic long-range copy" : args.data);
  try {
    LlamaModel llama(model, device);
    // Small random weights (normal, std 0.02), norms at 1, as Llama initialises.
    std::mt19937 generator(args.seed);
    std::normal_distribution<float> normal(0.0f, 0.02f);
    for (int64_t i = 0; i < llama.parameter_count(); ++i) llama.parameters()[i] = normal(generator);
    auto norm_ones = [&](int64_t offset) { std::fill_n(llama.parameters() + offset, model.hidden_size, 1.0f); };
    for (const auto& layer : llama.layout().layers) {
      norm_ones(layer.attention_norm);
      norm_ones(layer.mlp_norm);
    }
    norm_ones(llama.layout().final_norm);
    if (!args.json) fmt::print("{:>5} {:>9} {:>9} {:>10} {:>16} {:>14}\n", "step", "loss", "seconds", "tokens/s", "device peak MiB", "host peak MiB");
    for (int64_t step = 1; step <= args.steps; ++step) {
      const Sample sample = args.data.empty() ? sample_synthetic(seqlen, model.vocab_size, args.seed + static_cast<uint32_t>(step))
                                              : sample_from_text(text, seqlen, (step - 1) * seqlen);
      const auto start = std::chrono::steady_clock::now();
      const StepResult result = llama.forward_backward(sample.tokens.data(), sample.labels.data(), sample.positions.data(), seqlen,
                                                       options, device, host);
      llama.adamw_step(static_cast<float>(args.lr), 0.9f, 0.95f, 1e-8f, 0.0f);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      report["steps"].push_back({{"step", step}, {"loss", result.loss}, {"seconds", seconds},
                                 {"tokens_per_s", static_cast<double>(seqlen) / seconds},
                                 {"device_peak_mib", device.peak_bytes() / (1 << 20)}, {"host_peak_mib", host.peak_bytes() / (1 << 20)}});
      if (!args.json)
        fmt::print("{:>5} {:>9.4f} {:>9.3f} {:>10.0f} {:>16.2f} {:>14.2f}\n", step, result.loss, seconds,
                   static_cast<double>(seqlen) / seconds, device.peak_bytes() / (1 << 20), host.peak_bytes() / (1 << 20));
    }
  } catch (const DeviceOutOfMemory& error) {
    std::string breakdown;
    for (const auto& [category, bytes] : bytes_by_category(error.live))
      breakdown += fmt::format("{}{} {:.2f} MiB", breakdown.empty() ? "" : ", ", category, bytes / (1 << 20));
    throw ConfigError("--budget-mib", "", fmt::format("{} (live: {})", error.what(), breakdown));
  }

  // The planner's prediction for the same plan on a "device" of the run's budget.
  const MemoryPrediction predicted = memory_predict(model, executor_cluster(budget_bytes), executor_plan(options), native, seqlen);
  const auto measured_categories = bytes_by_category(device.peak_items());
  const auto predicted_categories = bytes_by_category(predicted.gpu_items);
  std::map<std::string, std::pair<double, double>> rows;
  for (const auto& [category, bytes] : measured_categories) rows[category].first = bytes;
  for (const auto& [category, bytes] : predicted_categories) rows[category].second = bytes;
  const double difference = (predicted.gpu_peak_bytes - device.peak_bytes()) / device.peak_bytes();
  report["measured_peak_mib"] = device.peak_bytes() / (1 << 20);
  report["measured_peak_moment"] = std::string(device.peak_moment());
  report["predicted_peak_mib"] = predicted.gpu_peak_bytes / (1 << 20);
  report["predicted_peak_moment"] = predicted.gpu_peak_phase + ", " + predicted.gpu_peak_moment;
  report["prediction_error"] = difference;
  if (args.json) {
    std::cout << report.dump(2) << "\n";
    return 0;
  }
  fmt::print("\ndevice memory at the peak: MEASURED (this run's arena) vs PREDICTED (planner, runtime profile native)\n");
  fmt::print("  {:<26} {:>14} {:>15} {:>12}\n", "category", "measured MiB", "predicted MiB", "difference");
  for (const auto& [category, values] : rows)
    fmt::print("  {:<26} {:>14.3f} {:>15.3f} {:>12}\n", category, values.first / (1 << 20), values.second / (1 << 20),
               values.first > 0 ? fmt::format("{:+.1f}%", 100.0 * (values.second - values.first) / values.first) : "");
  fmt::print("  {:<26} {:>14.3f} {:>15.3f} {:>+11.1f}%\n", "total", device.peak_bytes() / (1 << 20),
             predicted.gpu_peak_bytes / (1 << 20), 100.0 * difference);
  fmt::print("  peak moment: measured during '{}'; predicted in the {}, during '{}'\n", device.peak_moment(),
             predicted.gpu_peak_phase, predicted.gpu_peak_moment);
  if (std::isfinite(budget_bytes))
    fmt::print("  budget {:.0f} MiB: measured peak {} ({:.1f}% of it); prediction {} the measurement ({:+.2f}%, bar: 3%)\n",
               args.budget_mib, device.peak_bytes() <= budget_bytes ? "within" : "OVER", 100.0 * device.peak_bytes() / budget_bytes,
               std::fabs(difference) <= 0.03 ? "matches" : "MISSES", 100.0 * difference);
  return 0;
}

}  // namespace longseq
