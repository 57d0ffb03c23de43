// scenario.hpp: experiments as files — a model on a cluster with plan settings, swept over
// axes, with the published measurements they reproduce. The format is documented in
// scenarios/README.md; the executor issues extend it (a scenario names what to run).
//
// Invariant: scenario_load either returns a complete, checked Scenario or throws ConfigError
// naming the file, the dotted key and the reason; nothing is evaluated before that.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "planner/plan.hpp"

namespace longseq {

// Plan settings as a scenario writes them: only what is given is set.
struct PlanSettings {
  std::optional<std::string> preset;  // "alst" or "baseline"
  std::optional<std::string> search;  // "max-seqlen" or "throughput": the plan is searched
  // Set when no plan: section was given: the scenario searches unless a ladder step fixes a plan
  // (a preset or any plan key), as `longseq plan` does without plan flags.
  bool search_by_default = false;
  // The framework the plan is for (planner/frameworks.hpp): a search explores only what it runs,
  // at the lengths it feeds, as `longseq plan --framework` does; a fixed plan is checked against
  // it. Absent: a search is for the default framework (as `longseq plan`), a fixed plan unchecked.
  std::optional<std::string> framework;
  std::optional<int64_t> sp;          // absent or "auto": the largest valid degree
  // Ring attention degree (USP's Ulysses x ring): a fixed plan uses it (sp "auto" then takes the
  // largest degree valid on gpus / ring); a search explores ring degrees unless it is 1.
  std::optional<int64_t> ring;
  // Megatron-Core's tensor parallelism and pipeline stages (PlanOptions::tp, pp): a fixed plan uses
  // them; a search holds each one given (--framework megatron-core's search tries them otherwise).
  std::optional<int64_t> tp, pp, ep;
  // Megatron-Core's layer-wise activation offloading, block recompute and selective recompute
  // (PlanOptions::offload_activation_layers, recompute_block_layers, recompute_modules: "layernorm,
  // moe_act, mla_up_proj" as --recompute-modules spells them): part of a fixed plan, held by a search.
  std::optional<int64_t> offload_activation_layers, recompute_block_layers;
  std::optional<MegatronRecomputeModules> recompute_modules;
  std::optional<int> zero_stage;
  std::optional<bool> offload_optimizer, offload_params, activation_checkpointing, checkpoint_offload, tiled_mlp,
      tiled_loss, fpdt;
  std::optional<int64_t> mlp_tiles, loss_tiles, fpdt_chunk_tokens;
  // Adapters (PlanOptions' LoRA fields): held by a search, part of a fixed plan.
  std::optional<int64_t> lora_rank;
  std::optional<bool> lora_all_linear, qlora;
  // Megatron-Core's TE FP8 and all_gather context parallelism (PlanOptions::fp8, cp_all_gather): held by
  // a search, part of a fixed plan, as --fp8 and --cp-all-gather.
  std::optional<bool> fp8, cp_all_gather;
  // Batches (held by a search, part of a fixed plan, as --micro-batch and --global-batch), and one
  // decoder layer in every N checkpointed (a plan option, as --checkpoint-every).
  std::optional<int64_t> micro_batch, global_batch, checkpoint_every;
  std::optional<bool> checkpoint_ops;  // torchtitan's op-level SAC, as --checkpoint-ops
  // Later settings win, field by field; a later preset or plan key ends a search that was only the
  // default (a ladder step "baseline" runs the baseline, not the search).
  void override_with(const PlanSettings& later);
  bool fixes_a_plan() const;  // a preset or any plan option is set
};

struct LadderStep {
  std::string name;
  PlanSettings settings;
};


// A measurement to overlay and score: where it applies (axis values) and what it says.
struct ScenarioPublishedPoint {
  std::vector<std::pair<std::string, std::string>> where;  // axis name -> value as written, e.g. {"gpus", "8"}
  double value = 0;
  double value_fail = 0;  // max_seqlen: the smallest length known to fail (0: none)
};

struct Scenario {
  std::string path;  // the file it came from
  std::string name, description, reproduces;
  std::string model;  // card name or a path (relative paths resolved against the file)
  std::string gpu;
  std::optional<int64_t> gpus, nodes, gpus_per_node;
  std::optional<double> host_memory_gib;
  // The runtime profile every point is priced with; absent from the file, each point's framework's
  // own (as `longseq plan` does), and deepspeed-hf for a fixed plan without a framework.
  std::string runtime_profile = "deepspeed-hf";
  bool runtime_profile_given = false;
  std::string attention_kernel;  // attention_kernel_ids(true); empty: the profile's, else the card's default
  double gpu_hour_cost = 0;      // the price of one GPU-hour, for each point's cost of a billion tokens (0: not priced)
  PlanSettings plan;
  // Sweep axes, crossed in this order; an empty axis is not swept.
  std::vector<std::string> sweep_model, sweep_gpu;
  std::vector<int64_t> sweep_gpus, sweep_seqlen, sweep_sp, sweep_mlp_tiles, sweep_loss_tiles, sweep_fpdt_chunk_tokens;
  std::vector<LadderStep> sweep_ladder;
  std::string published_source;
  std::string published_figure;  // "max_seqlen", "peak_memory_gib" or "iteration_time_s"
  std::vector<ScenarioPublishedPoint> published_points;
  // What to write: the default output directory of `longseq sweep` and the figures `longseq
  // report` draws (empty: every figure that applies).
  std::string output_directory;
  std::vector<std::string> output_figures;
  // What `longseq run` does with this scenario on this machine's CPU (absent: not a run scenario).
  struct Run {
    std::optional<int64_t> seqlen;  // absent with auto_plan: the planner picks it
    int64_t steps = 5;
    std::optional<double> budget_mib;
    bool auto_plan = false;         // the planner picks checkpointing, offload, tiles and the length
    std::string data;               // a text file (bytes); empty: the synthetic copy task
  };
  std::optional<Run> run;
};

// The figures `longseq report` knows how to draw.
const std::vector<std::string>& report_figure_names();

// What `longseq run` trains from a scenario's plan: section, as run's options (absent: run's own
// default). A tile count alone tiles and tiling without one takes 16 tiles; fpdt takes its chunk
// (DeepSpeed's 64Ki by default). A key run cannot honour (a preset, a search, a framework, QLoRA's
// 4-bit base, a runtime profile other than native's, an attention kernel, a cluster, a sweep)
// throws ConfigError naming it: no key of a run scenario is dropped.
struct ScenarioRunOptions {
  std::optional<bool> checkpointing, checkpoint_offload, offload_optimizer, offload_params, lora_all_linear;
  std::optional<int64_t> mlp_tiles, loss_tiles, sp, ring, fpdt_chunk_tokens, lora_rank;
  std::optional<int> zero_stage;
};
ScenarioRunOptions scenario_run_options(const Scenario& scenario);

Scenario scenario_load(const std::string& path);
Scenario scenario_from_text(const std::string& yaml_text, const std::string& path);

// One evaluated point of a sweep.
struct SweepRow {
  std::vector<std::pair<std::string, std::string>> axes;  // the swept values that made this row
  std::string model, gpu, step;
  std::string framework;  // the framework the plan is for; empty: a fixed plan not checked against one
  int64_t gpus = 0, nodes = 0;
  std::optional<PlanOptions> plan;  // absent when the search found nothing or the plan is invalid
  std::string mode;                 // "max_seqlen" or "at_seqlen"
  int64_t seqlen = 0;               // the maximum found, or the length evaluated
  int64_t seqlen_shortest = 0, seqlen_longest = 0;  // max mode: the band around it (max_seqlen_band)
  bool fits = false;
  std::string binding_constraint;
  double gpu_peak_gib = 0, gpu_capacity_gib = 0, host_per_node_gib = 0, host_capacity_gib = 0;
  std::vector<std::pair<std::string, double>> gpu_category_gib;  // the breakdown by category, at the peak
  double step_s = 0, tflops_hardware = 0, tflops_megatron = 0, mfu = 0, tokens_per_s = 0;
  double cost_per_billion_tokens = 0;  // at the scenario's gpu_hour_cost (0: not priced)
  std::optional<double> published;
  double published_fail = 0;
  std::string error;  // why nothing was predicted
};

// Evaluates every point; `progress` (may be empty) is called after each with (done, total).
std::vector<SweepRow> scenario_run(const Scenario& scenario,
                                   const std::function<void(size_t, size_t)>& progress = {});

}  // namespace longseq
