// internal.hpp: what the files of `longseq plan` share (cli/plan/): its flags as typed, where its
// outputs go, how its report is made. plan_command.cpp runs the command; options.cpp registers and
// reads the flags; report.cpp renders the answer (tables and JSON); emit.cpp writes the files.
#pragma once

#include <fmt/format.h>
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>
#include <numeric>
#include <optional>

#include "io/text_escape.hpp"
#include "io/checked_input.hpp"
#include "io/config_error.hpp"
#include "executor/trainer.hpp"
#include "models/model_loader.hpp"
#include "io/output_files.hpp"
#include "io/process.hpp"
#include "executor/job_launch.hpp"
#include "planner/max_seqlen.hpp"
#include "planner/frameworks.hpp"
#include "planner/framework_choice.hpp"
#include "planner/plan_file.hpp"
#include "planner/search.hpp"
#include "planner/time_model.hpp"
#include "planner/units.hpp"
#include "reports/export.hpp"
#include "reports/memory_report.hpp"
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <CLI/CLI.hpp>

namespace longseq {

// Flags as typed; "not given" is kept apart from a value so that defaults come from the plan base
// (the ALST feature set, or --baseline).
struct PlanCommandArgs {
  std::string model;
  int64_t layers = 0;  // 0: the card's
  std::string gpu = "h100-sxm-80gb";
  std::string profile;  // empty: the target framework's (deepspeed-hf, megatron-deepspeed, native-cuda)
  std::string attention;  // empty: the profile's kernel, else the card's default
  std::optional<std::string> framework;
  // Set where the search chose the framework (none named): why, for the header and the JSON.
  std::string framework_chosen_because;
  // nullopt: not given (a given 0 or negative value is an error, never "not given").
  std::optional<int64_t> gpus, nodes, gpus_per_node;
  std::optional<double> host_memory_gib;
  std::optional<double> gpu_memory_gib;  // --gpu-mem-gib: the card's memory, overridden
  std::optional<std::string> seqlen;
  std::optional<int64_t> sp, ring, tp, pp, vpp, ep, offload_activations, recompute_block_layers;
  std::optional<std::string> recompute_modules;
  std::optional<int> zero_stage;
  bool baseline = false;
  bool alst = false;
  bool search = false;
  std::string objective;
  // Each switch is a pair; the count of each side says whether it was given.
  int64_t offload_optimizer_on = 0, offload_optimizer_off = 0;
  int64_t offload_params_on = 0, offload_params_off = 0;
  int64_t checkpointing_on = 0, checkpointing_off = 0;
  int64_t checkpoint_offload_on = 0, checkpoint_offload_off = 0;
  int64_t tiled_mlp_on = 0, tiled_mlp_off = 0;
  int64_t tiled_loss_on = 0, tiled_loss_off = 0;
  std::optional<int64_t> mlp_tiles, loss_tiles;
  std::optional<int64_t> checkpoint_every;  // checkpoint one decoder layer in every N (torchtitan's layer SAC)
  bool checkpoint_ops = false;              // checkpoint every layer under torchtitan's op-level SAC
  bool fpdt = false;
  std::optional<std::string> fpdt_chunk;
  // Samples per rank per micro-step: a count, or searched at --seqlen: "max" (the largest that fits)
  // or "fastest" (the most tokens/s).
  std::string micro_batch = "1";
  // Samples per optimizer step (gradient accumulation beside the micro batch), or tokens per step.
  std::optional<int64_t> global_batch;
  std::optional<std::string> global_batch_tokens;
  // LoRA / QLoRA: adapters of this rank on a frozen base, on these linears; held by a search.
  std::optional<int64_t> lora_rank;
  std::optional<std::string> lora_targets;  // absent: all-linear
  bool qlora = false;
  bool adam_8bit = false;
  bool fp8 = false;
  bool cp_all_gather = false;
  bool moe_aux_loss = false;
  bool trl_activation_offload = false;
  std::string cp_rotate = "allgather";
  std::optional<int64_t> dp_replicate;
  bool json = false;
  bool tensors = false;
  std::string emit;      // "deepspeed" or "accelerate"
  std::optional<std::string> emit_out;  // file for the emitted config (not given: stdout)
  std::string emit_length = "safe";     // a searched maximum: the band's low end ("safe") or the point estimate
  bool overwrite = false;  // --emit-out / --plan-out may replace an existing regular file
  std::optional<std::string> max_step_time;  // the longest length whose step takes at most this
  std::optional<double> gpu_hour_cost;       // the price of one GPU-hour, for the cost of a billion tokens
  // This machine as the target (what `longseq run` executes): ranks, a device budget per rank.
  std::optional<int64_t> ranks;
  std::optional<double> budget_mib;
  std::string device = "cpu";
  std::optional<std::string> plan_out;  // the chosen plan as a plan file for `longseq run --plan`
};

// Where --emit-out, its DeepSpeed JSON and --plan-out go, decided before the search.
struct PlanOutputs {
  std::optional<OutputFileTarget> emit_main, emit_companion, plan_out;
};

// What a plan's report needs beside the plan: the lengths the target framework feeds
// (FrameworkFacts, the grid of the maximum), the step-time limit, the price of a GPU-hour.
struct ReportContext {
  int64_t length_multiple = 1;
  double max_step_s = 0;  // 0: no limit
  TimeContext time;
  bool tensors = false;  // --tensors: the tensor inventory beside the breakdown
};

// The choices the flags hold in every plan: adapters (none without --lora), 8-bit Adam, the CP
// rotation, HSDP.
void held_choices_apply(const PlanCommandArgs& args, HeldChoices& held);

// --micro-batch: a count (the returned value), or 0 for a searched one (micro_batch_objective says which).
int64_t micro_batch_fixed(const PlanCommandArgs& args);
std::optional<MicroBatchObjective> micro_batch_objective(const PlanCommandArgs& args);

// --global-batch in samples, or --global-batch-tokens over the planned length; 0: not given.
int64_t global_batch_samples(const PlanCommandArgs& args, std::optional<int64_t> seqlen);

bool plan_flags_given(const PlanCommandArgs& args);

// The fixed plan the flags describe: the ALST feature set (or the paper's baseline), then each flag.
PlanOptions plan_from_flags(const PlanCommandArgs& args, const ModelSpec& model, const ClusterSpec& cluster);

// The fixed plan starts from the ALST set; a named framework keeps of it what it runs. An option
// the user did not give is turned off when it is what the framework refuses (turning it off
// changes the refusal), one at a time; what the user gave stays, and is refused by name.
void plan_defaults_fit(const PlanCommandArgs& args, PlanOptions& plan, Framework framework, const ModelSpec& model);

// --search with plan flags: each flag given holds that option fixed in every plan searched.
std::function<bool(const PlanOptions&)> search_constraints(const PlanCommandArgs& args);

std::string problems_join(const std::vector<std::string>& problems);

nlohmann::json plan_to_json(const PlanOptions& plan, const ClusterSpec& cluster);

// What runs out when `plan` fails at `seqlen`: the largest term that grows with the length (the
// reserve or the model states, constant in S, explain nothing about the length), e.g.
// "largest growing with the length: layer_working_set/attention.q 4.3 GiB"; or, where nothing
// grows (a plan that fails at its first tokens), the largest term, said to be constant.
std::string largest_component_describe(const ModelSpec& model, const ClusterSpec& cluster, const PlanOptions& plan,
                                       const RuntimeProfile& profile, int64_t seqlen);

// "1 token", "32.768K tokens": a length in a sentence.
std::string tokens_text(int64_t tokens);

// How a plan spreads one sequence, named as the frameworks name it.
std::string sequence_parallelism_describe(const PlanOptions& plan, const RuntimeProfile& profile);

// Every framework's best plan on this cluster, best first, each from its own search and runtime
// profile: the side-by-side answer to "Ulysses, USP's ring or PyTorch CP?".
std::string frameworks_compared_render(std::vector<FrameworkWinner> winners, Framework searched, bool by_length, nlohmann::json& report);

// Other GPU counts than the one asked about, where they change the answer: the fewest GPUs that
// reach the same length (the rest only add data parallelism), a count of these GPUs that reaches
// further, and the first larger one that does. The length is set by the ranks on one sequence,
// which the heads bound (a Ulysses degree divides them): the counts tried are each valid degree
// on whole nodes (the degree itself inside one node, else its least common multiple with a node).
std::string gpu_count_advice(const ModelSpec& model, const ClusterSpec& cluster, const RuntimeProfile& profile,
                             const SearchOptions& options, const SearchCandidate& winner, nlohmann::json& report);

// When nothing fits: what binds the closest plan (the resource, its need against its capacity)
// and what would fit: the longest length on these GPUs (a fixed length's search only), and the
// fewest GPUs (doubling, whole nodes, up to 64 times as many) on which the same search finds a
// plan. The same in the JSON's "no_fit" object.
std::string no_fit_advice(const ModelSpec& model, const ClusterSpec& cluster, const RuntimeProfile& profile, const SearchOptions& options,
                          const SearchCandidate& closest, nlohmann::json& report);

// --tensors: what one decoder layer saves for backward (as the plan's runtime runs it, without
// checkpointing), tensor by tensor; the JSON's "tensors" object (docs/memory-model.md: "The tensor inventory").
std::string tensor_inventory_render(const ModelSpec& model, const ClusterSpec& cluster, const PlanOptions& plan,
                                    const RuntimeProfile& profile, int64_t seqlen, nlohmann::json& report);

// `plan --json`'s shape (docs/json/plan.schema.json): its version, and every key the schema lists
// made present, null or empty where this answer has none, so that the shape is the same whether
// or not a plan fits and whatever was asked.
inline constexpr int kPlanJsonSchemaVersion = 1;
void plan_json_complete(nlohmann::json& report);

// What an answer rests on where no published run supports it: said beside the answer, so that no
// unvalidated figure passes for a validated one (reports/validation.md holds the record).
// `predicted_step_s`: the plan's predicted step (0: none), which says whether it is shorter than any
// step the record validates.
std::vector<std::string> plan_caveats(const ModelSpec& model, const ClusterSpec& cluster, const PlanOptions& plan,
                                      const RuntimeProfile& profile, int64_t seqlen, double predicted_step_s);

// One plan's full report: headline, memory breakdown, time. Fills `report` for --json.
std::string plan_report(const ModelSpec& model, const ClusterSpec& cluster, const PlanOptions& plan,
                        const RuntimeProfile& profile, std::optional<int64_t> seqlen, const ReportContext& context, nlohmann::json& report);

int plan_emit(const PlanCommandArgs& args, const PlanOutputs& outputs, const ModelSpec& model, const PlanOptions& plan,
              const ClusterSpec& cluster, const RuntimeProfile& profile, int64_t seqlen, bool seqlen_given, int64_t grid);

// --emit-out (and the DeepSpeed JSON beside it) and --plan-out, checked before any work: an
// existing file is refused without --overwrite, the model file read is never written over.
PlanOutputs plan_outputs_check(const PlanCommandArgs& args);

// The sequence length a plan is for: the given one, or the longest that fits.
int64_t plan_seqlen(const ModelSpec& model, const ClusterSpec& cluster, const PlanOptions& plan, const RuntimeProfile& profile,
                    std::optional<int64_t> seqlen, const ReportContext& context);

// A duration as --max-step-time takes it: a number of seconds, or with a unit (s, min, h, d).
double duration_parse(const std::string& text, const std::string& flag);

// --plan-out: the plan with what it was made for, written whole.
void plan_out_write(const PlanCommandArgs& args, const OutputFileTarget& target, const ModelSpec& model, const ClusterSpec& cluster,
                    const RuntimeProfile& profile, const PlanOptions& plan, int64_t seqlen, bool machine);

// The flag's value, 0 when not given; a value below 1 is refused naming the flag.
int64_t positive_or_default(const std::optional<int64_t>& value, const char* flag);

}  // namespace longseq
