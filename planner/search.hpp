// search.hpp: the plan search — enumerate plans, predict each, pick the best by an objective,
// and keep every loser's reason.
//
// Enumerated: Ulysses degree u and ring degree r (u x r divides the GPU count), ZeRO stage 0-3, optimizer offload,
// parameter offload (ZeRO-3), activation checkpointing and checkpoint offload, tiled MLP, tiled
// loss, FPDT off or on with a chunk from a ladder. Plans that break a rule (head divisibility,
// option combinations) are kept with their reason; plans that fit nothing say which memory ran
// out and which component was largest.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "planner/max_seqlen.hpp"
#include "planner/time_model.hpp"

namespace longseq {

enum class SearchObjective {
  objective_max_seqlen,  // the longest sequence that fits (ties: less time per token)
  objective_throughput,  // the most tokens/s at a given sequence length
};

struct SearchOptions {
  SearchObjective objective = SearchObjective::objective_max_seqlen;
  int64_t seqlen = 0;  // the length for objective_throughput
  std::vector<int64_t> fpdt_chunks = {16384, 32768, 65536, 131072, 262144};
  // Ring attention degrees beside Ulysses (u x r ranks on one sequence).
  bool explore_ring = true;
  // A runner's limits: a non-empty reason makes the plan invalid with it (e.g. an option the
  // executor cannot run on its device), so the search never picks what cannot be run.
  std::function<std::string(const PlanOptions&)> unsupported;
  // Lengths are multiples of this beside each plan's own granule (the target framework's
  // FrameworkFacts::length_multiple): a longest length found is one the framework trains as is.
  int64_t length_multiple = 1;
  // The max-length objective under a step-time limit (seconds; 0: none): the longest length whose
  // predicted step is at most this ("the longest sequence whose step takes under an hour").
  double max_step_s = 0;
  // The user's constraints ("search, but ZeRO-2 only"): plans it does not admit are not searched
  // (nor listed as invalid); empty admits every plan.
  std::function<bool(const PlanOptions&)> admits;
  // Rule out by one probe the plans that cannot reach the best shown ones (SearchCandidate::pruned);
  // false predicts every plan in full (the tests compare the two).
  bool prune = true;
  // What every plan carries (the user's choices, held, not searched): adapters, 8-bit Adam, the
  // CP rotation, HSDP.
  HeldChoices held;
  // Checkpointing one decoder layer in every N: the N tried beside full checkpointing (1), where
  // the framework runs it (FrameworkDescription::selective_checkpointing).
  std::vector<int64_t> checkpoint_every = {1};
  // Op-level selective checkpointing (PlanOptions::checkpoint_ops) tried beside them, likewise.
  bool checkpoint_ops = false;
  // Layers whose saved activations Transformer Engine offloads without recompute, tried beside no
  // checkpointing where the framework runs it (PlanOptions::offload_activation_layers; 0 alone elsewhere).
  std::vector<int64_t> offload_activation_layers = {0};
  // Megatron's block recompute where the framework runs it: the shares of a model chunk's layers
  // checkpointed (PlanOptions::recompute_block_layers = share x the chunk's layers); empty elsewhere.
  std::vector<double> recompute_block_shares;
  // Megatron's selective recompute where the framework runs it: every module the model has (the
  // search's one selective mode beside none; none elsewhere).
  MegatronRecomputeModules recompute_modules;
  // Tensor-parallel degrees and pipeline stages tried (PlanOptions::tp, pp), where the framework runs them.
  std::vector<int64_t> tensor_parallel = {1};
  std::vector<int64_t> pipeline_parallel = {1};
  std::vector<int64_t> virtual_pipeline = {1};  // virtual stages per rank tried with pp > 1 (PlanOptions::vpp)
  std::vector<int64_t> expert_parallel = {1};   // expert-parallel degrees tried for a MoE model (PlanOptions::ep)
};

// How many memory-saving features a plan turns on (offloads, checkpointing, tiling, FPDT, the ZeRO
// stage): among plans of the same length and time the simpler one wins, an unneeded offload loses.
int64_t plan_complexity(const PlanOptions& plan);

// The longest length on `grid`, at most `longest`, whose predicted step takes at most `max_step_s`
// (the step only grows with the length); 0 when even `grid` tokens take longer.
int64_t max_seqlen_within_step_time(const ModelSpec& model, const ClusterSpec& cluster, const PlanOptions& plan,
                                    const RuntimeProfile& profile, int64_t grid, int64_t longest, double max_step_s);

// What binds a maximum cut by the step-time limit.
inline constexpr const char* kStepTimeLimit = "the step time limit";

// The grid a plan's lengths lie on for a framework feeding multiples of `length_multiple`: the
// least common multiple of that and the plan's own granule (seqlen_granule).
int64_t seqlen_grid(const PlanOptions& plan, int64_t length_multiple);

// Maximum lengths within this fraction of each other tie in the max-length search (then the faster
// plan wins, then Ulysses inside a node): the memory model cannot tell them apart.
inline constexpr double kSearchLengthResolution = 0.001;
// The plans a search reports in full (the winner and five runner-ups), and the share of the last
// one's length below which a plan is pruned: two resolutions down, so that no pruned plan can tie.
inline constexpr size_t kSearchShownPlans = 6;
inline constexpr double kSearchPrunedBelow = 1.0 - 2.0 * kSearchLengthResolution;

struct SearchCandidate {
  PlanOptions plan;
  std::vector<std::string> problems;  // non-empty: invalid, nothing predicted
  bool fits = false;                  // max-seqlen: something fits; throughput: the given length fits
  // Throughput: the given length fits with every estimate at its high end and the calibrated
  // reserve (the band's low end, GPU and host memory alike), not by the point estimate only.
  bool fits_with_margin = false;
  int64_t max_seqlen = 0;             // max-seqlen objective
  std::string binding_constraint;     // what ran out first
  std::string largest_component;      // the largest GPU component when it ran out
  MemoryPrediction memory;            // at max_seqlen (or the given length), without breakdown
  TimePrediction time;                // at the same length, when it fits
  double score = 0;                   // higher is better
  // Where Ulysses' all-to-all runs: its degree when the group fits in a node, 0 when it crosses
  // nodes. Between plans of equal length and indistinguishable time the higher wins (Ulysses
  // inside a node as large as fits, the ring's passing across nodes).
  int64_t ulysses_in_node = 0;
  // Valid but not predicted in full: one probe showed it cannot reach the best few plans' length
  // (its maximum is below kSearchPrunedBelow of the kSearchShownPlans-th best), so it can neither
  // win nor be shown among them; `memory` is that probe. The winner's one-field alternatives are
  // always predicted in full.
  bool pruned = false;
  size_t enumeration_index = 0;  // order among equals: the enumeration's (whatever order plans were predicted in)
};

struct SearchResult {
  std::vector<SearchCandidate> candidates;  // valid ones best first, then the invalid ones
  int64_t evaluated = 0;                    // valid plans predicted
  int64_t pruned = 0;                       // valid plans one probe ruled out (SearchCandidate::pruned)
  double elapsed_ms = 0;
  const SearchCandidate* winner() const;    // nullptr when no plan fits
};

// Why `plan` is invalid in a search with `options`, as plan_search records it: plan_problems, then
// the framework's refusal (options.unsupported), then the given length's problems. Empty: valid.
std::vector<std::string> plan_search_problems(const ModelSpec& model, const ClusterSpec& cluster, const PlanOptions& plan,
                                              const SearchOptions& options);

SearchResult plan_search(const ModelSpec& model, const ClusterSpec& cluster, const RuntimeProfile& profile,
                         const SearchOptions& options);

// The micro batch searched at one length ("what micro batch fits at 32K?"): each micro batch's
// own plan search (the throughput objective), then the largest micro batch whose best plan fits,
// or the micro batch whose best plan runs the most tokens/s (ties within 0.1%: the smaller).
enum class MicroBatchObjective { micro_batch_largest, micro_batch_fastest };

struct MicroBatchTried {
  int64_t micro_batch = 0;
  bool fits = false;               // some plan of this micro batch fits at the length
  double tokens_per_s = 0;         // its best plan's, when it fits
  double gpu_peak_bytes = 0;       // its best plan's (the closest plan's when none fits)
  std::string binding_constraint;  // what the closest plan runs out of, when none fits
};

struct MicroBatchSearch {
  int64_t micro_batch = 0;              // the chosen one; 0: not even one sample a rank fits
  SearchResult result;                  // its plan search (micro batch 1's when none fits)
  std::vector<MicroBatchTried> tried;   // ascending micro batch
};

// Candidates: with a global batch (options.held.global_batch), its divisors (no other micro batch
// gives whole accumulation steps); else doubling from 1 while the best plan fits, then bisection
// between the last that fits and the first that does not (the peak only grows with the micro
// batch), at most `largest_candidate`. The fastest objective reads the same candidates.
MicroBatchSearch micro_batch_search(const ModelSpec& model, const ClusterSpec& cluster, const RuntimeProfile& profile,
                                    SearchOptions options, MicroBatchObjective objective, int64_t largest_candidate = 1 << 16);

// The best candidate that differs from the winner in one named way (e.g. "without checkpoint
// offload", "sp=4"), for explaining why the winner won.
struct SearchAlternative {
  std::string change;
  const SearchCandidate* candidate = nullptr;
};
std::vector<SearchAlternative> search_notable_alternatives(const SearchResult& result);

}  // namespace longseq
