// bench_command.cpp: `longseq bench` — how long the plan search takes. A benchmark, not a test:
// it prints figures and never fails on them.
#include <algorithm>
#include <fmt/format.h>
#include <memory>
#include <vector>

#include "cli/commands.hpp"
#include "models/model_loader.hpp"
#include "planner/search.hpp"
#include "planner/units.hpp"

namespace longseq {

struct BenchCommandArgs {
  std::string model = "llama-3.1-70b";
  std::string gpu = "h100-sxm-80gb";
  std::string profile = "deepspeed-hf";
  int64_t max_gpus = 1024;
  int64_t repeat = 5;
};

std::shared_ptr<BenchCommandArgs> bench_command_register(CLI::App& app) {
  auto args = std::make_shared<BenchCommandArgs>();
  CLI::App* command = app.add_subcommand("bench", "Time the plan search (max-seqlen objective) for 1, 2, 4, ... GPUs");
  command->add_option("--model", args->model, "model (default llama-3.1-70b)");
  command->add_option("--gpu", args->gpu, "hardware card (default h100-sxm-80gb)");
  command->add_option("--profile", args->profile, "runtime profile (default deepspeed-hf)");
  command->add_option("--max-gpus", args->max_gpus, "largest GPU count, doubling from 1 (default 1024)")->check(CLI::Range(1, 1 << 20));
  command->add_option("--repeat", args->repeat, "searches per GPU count; the median is reported (default 5)")->check(CLI::Range(1, 1000));
  return args;
}

int bench_command_run(const BenchCommandArgs& args) {
  const ModelSpec model = model_load(args.model);
  const HardwareCard hardware = hardware_card_load(args.gpu);
  const RuntimeProfile profile = runtime_profile_load(args.profile);
  fmt::print("plan search benchmark: {} on {}, runtime profile {}, median of {} run(s) per row, this machine\n",
             model.name, hardware.name, profile.name, args.repeat);
  fmt::print("{:>6} {:>7} {:>10} {:>10} {:>10}  {}\n", "GPUs", "plans", "predicted", "median ms", "min ms", "winner (max seqlen)");
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
    fmt::print("{:>6} {:>7} {:>10} {:>10.2f} {:>10.2f}  {}\n", gpus, result.candidates.size(), result.evaluated,
               times_ms[times_ms.size() / 2], times_ms.front(),
               winner ? fmt::format("{} ({})", plan_describe(winner->plan), seqlen_format(winner->max_seqlen)) : "none fits");
  }
  return 0;
}

}  // namespace longseq
