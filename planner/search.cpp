#include "planner/search.hpp"

#include <algorithm>
#include <chrono>
#include <functional>
#include <numeric>
#include <cmath>
#include <fmt/format.h>

#include "planner/pipeline.hpp"

namespace longseq {

namespace {

std::vector<PlanOptions> plans_enumerate(const ModelSpec& model, const ClusterSpec& cluster, const SearchOptions& options) {
  // The checkpointing a plan can have, in the enumeration's order: none; every layer kept, or one
  // layer in every N kept (each N the framework offers); every layer offloaded.
  struct Checkpointing {
    bool on, offload;
    int64_t every;
    bool ops = false;
    int64_t offloaded_layers = 0;  // TE's layer-wise activation offloading, without recompute
    double block_share = 0;        // Megatron's block recompute: this share of a model chunk's layers
    bool selective = false;        // Megatron's selective recompute of SearchOptions::recompute_modules, without checkpointing
  };
  std::vector<Checkpointing> checkpointing_modes;
  for (int64_t offloaded : options.offload_activation_layers) checkpointing_modes.push_back({false, false, 1, false, offloaded});
  for (int64_t every : options.checkpoint_every) checkpointing_modes.push_back({true, false, every});
  if (options.checkpoint_ops) checkpointing_modes.push_back({true, false, 1, true});
  for (double share : options.recompute_block_shares) checkpointing_modes.push_back({true, false, 1, false, 0, share});
  if (options.recompute_modules.any()) checkpointing_modes.push_back({false, false, 1, false, 0, 0, true});
  checkpointing_modes.push_back({true, true, 1});
  // Megatron's model parallelism (tensor parallelism, pipeline stages, their interleaving) where the
  // framework runs it; {1, 1, 1} alone elsewhere.
  struct ModelParallel {
    int64_t tp, pp, vpp, ep;
  };
  std::vector<ModelParallel> model_parallel_layouts;
  for (int64_t tp : options.tensor_parallel)
    for (int64_t pp : options.pipeline_parallel)
      for (int64_t vpp : pp > 1 ? options.virtual_pipeline : std::vector<int64_t>{1})
        for (int64_t ep : options.expert_parallel)
          if (tp >= 1 && pp >= 1 && ep >= 1 && cluster.gpus % (tp * pp) == 0 && (cluster.gpus / pp) % ep == 0)
            model_parallel_layouts.push_back({tp, pp, vpp, ep});
  std::vector<PlanOptions> plans;
  for (const auto& [tp, pp, vpp, ep] : model_parallel_layouts) {
    // Megatron's model parallelism is planned as Megatron runs it (plan_problems): its distributed
    // optimizer (ZeRO-1's layout) or none, no offload, no ALST tiling or FPDT.
    const bool megatron = tp > 1 || pp > 1 || ep > 1;
    for (int64_t sequence_ranks = 1; sequence_ranks * tp * pp <= cluster.gpus; ++sequence_ranks) {
      if (cluster.gpus % (sequence_ranks * tp * pp) != 0) continue;  // world = dp x tp x sp x ring x pp: only divisors are plans at all
      for (int64_t ring = 1; ring <= (options.explore_ring ? sequence_ranks : 1); ++ring) {
        if (sequence_ranks % ring != 0) continue;
        const int64_t sp = sequence_ranks / ring;
        for (int zero = 0; zero <= 3; ++zero) {
          if (megatron && zero > 1) continue;
          for (bool offload_optimizer : {false, true}) {
            if (offload_optimizer && zero == 0) continue;  // ZeRO-Offload needs a ZeRO stage
            if (offload_optimizer && megatron) continue;
            for (bool offload_params : {false, true}) {
              if (offload_params && zero != 3) continue;  // offload_param is a ZeRO-3 feature
              for (const Checkpointing& checkpointing : checkpointing_modes) {
                if (megatron && (checkpointing.offload || checkpointing.every > 1 || checkpointing.ops)) continue;
                PlanOptions plan;
                plan.tp = tp;
                plan.pp = pp;
                plan.vpp = vpp;
                plan.ep = ep;
                plan.sp = sp;
                plan.ring = ring;
                plan.zero_stage = zero;
                plan.offload_optimizer = offload_optimizer;
                plan.offload_params = offload_params;
                plan.activation_checkpointing = checkpointing.on;
                plan.checkpoint_offload = checkpointing.offload;
                plan.checkpoint_every = checkpointing.every;
                plan.checkpoint_ops = checkpointing.ops;
                plan.offload_activation_layers = checkpointing.offloaded_layers;
                if (checkpointing.selective) {
                  // MLA's up-projections are planned without context parallelism (plan_problems).
                  plan.recompute_modules = options.recompute_modules;
                  if (sequence_ranks > 1) plan.recompute_modules.mla_up_proj = false;
                  if (!plan.recompute_modules.any()) continue;
                }
                if (checkpointing.block_share > 0) {
                  // The first share of each model chunk's layers; none, or all of them, is no block plan.
                  const int64_t chunk_layers = model_chunk_layers(model, plan);
                  plan.recompute_block_layers = static_cast<int64_t>(checkpointing.block_share * static_cast<double>(chunk_layers));
                  if (plan.recompute_block_layers < 1 || plan.recompute_block_layers >= chunk_layers) continue;
                }
                static_cast<HeldChoices&>(plan) = options.held;
                for (bool tiled_mlp : {false, true}) {
                  for (bool tiled_loss : {false, true}) {
                    plan.tiled_mlp = tiled_mlp;
                    plan.tiled_loss = tiled_loss;
                    if (checkpointing.ops && tiled_mlp) continue;  // not modelled together (plan_problems)
                    if (megatron && (tiled_mlp || tiled_loss)) continue;
                    if (!options.admits || options.admits(plan)) plans.push_back(plan);
                  }
                }
                // FPDT runs with every layer checkpointed, and without the ring.
                if (!checkpointing.on || checkpointing.every > 1 || checkpointing.ops || ring > 1 || megatron) continue;
                plan.tiled_mlp = plan.tiled_loss = false;
                plan.fpdt = true;
                for (int64_t chunk : options.fpdt_chunks) {
                  if (chunk % sp != 0) continue;
                  plan.fpdt_chunk_tokens = chunk;
                  if (!options.admits || options.admits(plan)) plans.push_back(plan);
                }
              }
            }
          }
        }
      }
    }
  }
  return plans;
}

// A step time to three significant digits: times that differ by less (0.1%, far inside what the
// time model can resolve) compare equal, and the plans' placement decides.
double time_resolved_s(double seconds) {
  if (!(seconds > 0) || !std::isfinite(seconds)) return seconds;
  const double unit = std::pow(10.0, std::floor(std::log10(seconds)) - 2.0);
  return std::round(seconds / unit) * unit;
}

// A maximum length in steps of 0.1%: lengths closer than that (a few staging buffers' worth, or
// two plans' length granules) are a tie the time and placement decide, since no memory model
// resolves them (the band of issue-14's uncertainty is percent-wide).
int64_t length_resolved(int64_t tokens) {
  return tokens > 0 ? static_cast<int64_t>(std::floor(std::log(static_cast<double>(tokens)) / std::log1p(kSearchLengthResolution))) : 0;
}

}  // namespace

namespace {

// Plans equal except in one field. Fields: 0 the model-parallel layout (tp, pp, vpp, ep, sp and ring), 1 zero, 2 optimizer offload, 3 param
// offload, 4 checkpointing/offload, 5 tiling/FPDT.
constexpr int kPlanFields = 6;
// Which layers a checkpointing plan recomputes, in the "why not" list's words.
std::string checkpointing_describe(const PlanOptions& p) {
  if (p.checkpoint_ops) return "op-level selective checkpointing";
  if (p.checkpoint_every > 1) return fmt::format("checkpointing 1 layer in {}", p.checkpoint_every);
  if (p.recompute_block_layers > 0) return fmt::format("recomputing the first {} layers of a stage (block)", p.recompute_block_layers);
  return "checkpointing every layer";
}

bool same_except(const PlanOptions& a, const PlanOptions& b, int field) {
  if (field != 0 && (a.sp != b.sp || a.ring != b.ring || a.tp != b.tp || a.pp != b.pp || a.vpp != b.vpp || a.ep != b.ep)) return false;
  if (field != 1 && a.zero_stage != b.zero_stage) return false;
  if (field != 2 && a.offload_optimizer != b.offload_optimizer) return false;
  if (field != 3 && a.offload_params != b.offload_params) return false;
  if (field != 4 && (a.activation_checkpointing != b.activation_checkpointing || a.checkpoint_offload != b.checkpoint_offload ||
                     a.checkpoint_every != b.checkpoint_every || a.checkpoint_ops != b.checkpoint_ops ||
                     a.offload_activation_layers != b.offload_activation_layers || a.recompute_block_layers != b.recompute_block_layers ||
                     !(a.recompute_modules == b.recompute_modules)))
    return false;
  if (field != 5 && (a.tiled_mlp != b.tiled_mlp || a.tiled_loss != b.tiled_loss || a.fpdt != b.fpdt ||
                     (a.fpdt && a.fpdt_chunk_tokens != b.fpdt_chunk_tokens)))
    return false;
  return true;
}

bool one_field_from(const PlanOptions& a, const PlanOptions& b) {
  for (int field = 0; field < kPlanFields; ++field)
    if (same_except(a, b, field)) return true;
  return false;
}

}  // namespace

int64_t plan_complexity(const PlanOptions& plan) {
  return plan.zero_stage + plan.offload_optimizer + plan.offload_params + plan.activation_checkpointing + plan.checkpoint_offload +
         plan.tiled_mlp + plan.tiled_loss + plan.fpdt;
}

namespace {

// How far over its binding memory a plan is at the given length: its need over its capacity,
// GPU or host, whichever is further (below 1: it fits).
double memory_overshoot(const MemoryPrediction& memory) {
  const double gpu = memory.gpu_capacity_bytes > 0 ? memory.gpu_peak_bytes / memory.gpu_capacity_bytes : 0.0;
  const double host = memory.host_capacity_bytes > 0 ? memory.host_bytes_per_node / memory.host_capacity_bytes : 0.0;
  return std::max(gpu, host);
}

bool better(const SearchCandidate& a, const SearchCandidate& b, SearchObjective objective) {
  if (a.problems.empty() != b.problems.empty()) return a.problems.empty();
  if (a.fits != b.fits) return a.fits;
  // At a given length a plan that fits with margin beats one that fits by the point estimate only
  // (issue 41: Llama-3.1-70B at 1Mi on 16 H100 chose a plan at 2036.8 of 2048 GiB of host memory).
  if (objective == SearchObjective::objective_throughput && a.fits && a.fits_with_margin != b.fits_with_margin)
    return a.fits_with_margin;
  // Neither fits at the given length: the closer to fitting first (the closest plan a refusal
  // names is then the one that needs the least more memory, not the simplest).
  if (!a.fits && objective == SearchObjective::objective_throughput && a.problems.empty()) {
    const double a_over = memory_overshoot(a.memory), b_over = memory_overshoot(b.memory);
    if (a_over != b_over) return a_over < b_over;
  }
  if (objective == SearchObjective::objective_max_seqlen) {
    const int64_t a_length = length_resolved(a.max_seqlen), b_length = length_resolved(b.max_seqlen);
    if (a_length != b_length) return a_length > b_length;
    // Equal lengths: the faster plan; at times the model cannot tell apart, Ulysses inside a node
    // and as large as fits (its all-to-all on the node's links, the ring's point-to-point passing
    // across nodes, as USP and LoongTrain place them: a ring inside a node only adds steps); then
    // the one with more GPU memory to spare.
    const double a_s = time_resolved_s(a.time.time.total_s()), b_s = time_resolved_s(b.time.time.total_s());
    if (a_s != b_s) return a_s < b_s;
    if (a.ulysses_in_node != b.ulysses_in_node) return a.ulysses_in_node > b.ulysses_in_node;
    if (plan_complexity(a.plan) != plan_complexity(b.plan)) return plan_complexity(a.plan) < plan_complexity(b.plan);
    return a.memory.gpu_peak_bytes < b.memory.gpu_peak_bytes;
  }
  if (a.score != b.score) return a.score > b.score;
  if (plan_complexity(a.plan) != plan_complexity(b.plan)) return plan_complexity(a.plan) < plan_complexity(b.plan);
  return a.memory.gpu_peak_bytes < b.memory.gpu_peak_bytes;
}

}  // namespace

const SearchCandidate* SearchResult::winner() const {
  return !candidates.empty() && candidates.front().fits ? &candidates.front() : nullptr;
}

int64_t seqlen_grid(const PlanOptions& plan, int64_t length_multiple) {
  return std::lcm(seqlen_granule(plan), std::max<int64_t>(1, length_multiple));
}

int64_t max_seqlen_within_step_time(const ModelSpec& model, const ClusterSpec& cluster, const PlanOptions& plan,
                                    const RuntimeProfile& profile, int64_t grid, int64_t longest, double max_step_s) {
  auto within = [&](int64_t granules) {
    return time_predict(model, cluster, plan, profile, granules * grid).time.total_s() <= max_step_s;
  };
  int64_t low = 0, high = longest / grid;  // invariant: `low` granules are within (0: none known), above `high` none is
  if (high >= 1 && within(high)) return high * grid;
  while (high - low > 1) {
    const int64_t middle = low + (high - low) / 2;
    if (within(middle)) low = middle;
    else high = middle;
  }
  return low * grid;
}

std::vector<std::string> plan_search_problems(const ModelSpec& model, const ClusterSpec& cluster, const PlanOptions& plan,
                                              const SearchOptions& options) {
  std::vector<std::string> problems = plan_problems(model, cluster, plan);
  if (options.unsupported && problems.empty()) {
    std::string reason = options.unsupported(plan);
    if (!reason.empty()) problems.push_back(std::move(reason));
  }
  if (options.objective != SearchObjective::objective_max_seqlen) {
    for (auto& problem : seqlen_problems(plan, options.seqlen)) problems.push_back(problem);
    if (options.length_multiple > 1 && options.seqlen % options.length_multiple != 0)
      problems.push_back(fmt::format("sequence length {} is not a multiple of {}, the lengths the framework feeds (it pads to the next "
                                     "one)", options.seqlen, options.length_multiple));
  }
  return problems;
}

SearchResult plan_search(const ModelSpec& model, const ClusterSpec& cluster, const RuntimeProfile& profile,
                         const SearchOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  SearchResult result;
  const bool by_length = options.objective == SearchObjective::objective_max_seqlen;
  const std::vector<PlanOptions> plans = plans_enumerate(model, cluster, options);
  result.candidates.reserve(plans.size());
  for (const PlanOptions& plan : plans) {
    SearchCandidate candidate;
    candidate.plan = plan;
    candidate.ulysses_in_node = plan.sp <= cluster.gpus_per_node ? plan.sp : 0;
    candidate.enumeration_index = result.candidates.size();
    candidate.problems = plan_search_problems(model, cluster, plan, options);
    result.candidates.push_back(std::move(candidate));
  }

  // Every estimate at its high end: the profile a candidate must fit with to fit with margin.
  const RuntimeProfile high_estimates = runtime_profile_bounded(profile, EstimateBound::estimate_high_memory);
  auto evaluate = [&](SearchCandidate& candidate) {
    const PlanOptions& plan = candidate.plan;
    candidate.pruned = false;
    ++result.evaluated;
    if (by_length) {
      const int64_t grid = seqlen_grid(plan, options.length_multiple);
      const MaxSeqlenResult found = max_seqlen_find(model, cluster, plan, profile, grid, /*with_breakdown=*/false);
      candidate.fits = found.max_seqlen > 0;
      candidate.max_seqlen = found.max_seqlen;
      candidate.binding_constraint = found.binding_constraint;
      candidate.memory = candidate.fits ? found.at_max : found.first_failure;
      if (candidate.fits && options.max_step_s > 0 &&
          time_predict(model, cluster, plan, profile, found.max_seqlen).time.total_s() > options.max_step_s) {
        candidate.max_seqlen = max_seqlen_within_step_time(model, cluster, plan, profile, grid, found.max_seqlen, options.max_step_s);
        candidate.fits = candidate.max_seqlen > 0;
        candidate.binding_constraint = kStepTimeLimit;
        if (candidate.fits) candidate.memory = memory_predict(model, cluster, plan, profile, candidate.max_seqlen, /*with_breakdown=*/false);
      }
      if (candidate.fits) candidate.time = time_predict(model, cluster, plan, profile, candidate.max_seqlen);
      candidate.score = static_cast<double>(candidate.max_seqlen);
    } else {
      candidate.memory = memory_predict(model, cluster, plan, profile, options.seqlen, /*with_breakdown=*/false);
      candidate.fits = candidate.memory.fits();
      candidate.binding_constraint = !candidate.memory.fits_gpu() ? "GPU memory" : !candidate.memory.fits_host() ? "host memory" : "";
      if (candidate.fits) {
        candidate.time = time_predict(model, cluster, plan, profile, options.seqlen);
        candidate.score = candidate.time.tokens_per_s;
        candidate.fits_with_margin =
            memory_predict(model, cluster, plan, high_estimates, options.seqlen, /*with_breakdown=*/false).fits();
      }
    }
  };

  // The longest searches first (the enumeration ends with the most ranks and memory savings), so
  // that the best lengths are known early; a plan that cannot reach the kSearchShownPlans-th best
  // length found so far (memory only grows with the length) is ruled out by one probe.
  std::vector<int64_t> best_lengths;  // the longest maxima found, longest first, at most kSearchShownPlans
  for (auto candidate = result.candidates.rbegin(); candidate != result.candidates.rend(); ++candidate) {
    if (!candidate->problems.empty()) continue;
    if (by_length && options.prune && best_lengths.size() == kSearchShownPlans) {
      const int64_t grid = seqlen_grid(candidate->plan, options.length_multiple);
      const int64_t probe = static_cast<int64_t>(static_cast<double>(best_lengths.back()) * kSearchPrunedBelow) / grid * grid;
      if (probe >= grid) {
        MemoryPrediction at_probe = memory_predict_until_over(model, cluster, candidate->plan, profile, probe);
        if (!at_probe.fits()) {
          candidate->pruned = true;
          candidate->binding_constraint = !at_probe.fits_gpu() ? "GPU memory" : "host memory";
          candidate->memory = std::move(at_probe);
          ++result.pruned;
          continue;
        }
      }
    }
    evaluate(*candidate);
    if (by_length && candidate->fits) {
      best_lengths.insert(std::upper_bound(best_lengths.begin(), best_lengths.end(), candidate->max_seqlen, std::greater<int64_t>()),
                          candidate->max_seqlen);
      if (best_lengths.size() > kSearchShownPlans) best_lengths.pop_back();
    }
  }
  auto sort_candidates = [&] {
    // Sorted as indices, then moved once (a candidate is a large object). better() puts every
    // invalid plan after the valid ones and ties them (enumeration order decides); a pruned plan
    // fits nowhere near the best (it is shown nowhere, and one that could be a why-not line was
    // predicted in full): both keep their enumeration order after the predicted ones, and only
    // those, a hundred or so of thousands, are compared.
    std::vector<size_t> order(result.candidates.size());
    std::iota(order.begin(), order.end(), size_t{0});
    const auto valid_end =
        std::stable_partition(order.begin(), order.end(), [&](size_t index) { return result.candidates[index].problems.empty(); });
    const auto predicted_end =
        std::stable_partition(order.begin(), valid_end, [&](size_t index) { return !result.candidates[index].pruned; });
    std::sort(order.begin(), predicted_end, [&](size_t a_index, size_t b_index) {
      const SearchCandidate& a = result.candidates[a_index];
      const SearchCandidate& b = result.candidates[b_index];
      if (better(a, b, options.objective)) return true;
      return !better(b, a, options.objective) && a.enumeration_index < b.enumeration_index;
    });
    // The permutation applied in place, cycle by cycle (a second array of candidates would be
    // megabytes of fresh pages every search): position i takes the candidate at order[i].
    std::vector<bool> placed(order.size(), false);
    for (size_t cycle_start = 0; cycle_start < order.size(); ++cycle_start) {
      if (placed[cycle_start]) continue;
      placed[cycle_start] = true;
      if (order[cycle_start] == cycle_start) continue;
      SearchCandidate held = std::move(result.candidates[cycle_start]);
      for (size_t at = cycle_start;;) {
        const size_t from = order[at];
        placed[at] = true;
        if (from == cycle_start) {
          result.candidates[at] = std::move(held);
          break;
        }
        result.candidates[at] = std::move(result.candidates[from]);
        at = from;
      }
    }
  };
  sort_candidates();
  // The winner's one-field alternatives are reported ("why not"): predict the pruned ones in full.
  if (result.pruned > 0 && result.winner()) {
    const PlanOptions winner = result.winner()->plan;
    bool any = false;
    for (SearchCandidate& candidate : result.candidates)
      if (candidate.pruned && one_field_from(candidate.plan, winner)) {
        evaluate(candidate);
        --result.pruned;
        any = true;
      }
    if (any) sort_candidates();
  }
  result.elapsed_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return result;
}

std::vector<SearchAlternative> search_notable_alternatives(const SearchResult& result) {
  std::vector<SearchAlternative> alternatives;
  const SearchCandidate* winner = result.winner();
  if (!winner) return alternatives;
  const PlanOptions& w = winner->plan;
  // Candidates equal to the winner except in one field (the first of each kind, best first).
  auto describe = [&](const PlanOptions& p, int field) -> std::string {
    switch (field) {
      case 0:
        if (p.ep != w.ep || p.ep > 1)
          return fmt::format("tp={} pp={} ep={} sp={} ring={} instead of tp={} pp={} ep={} sp={} ring={}", p.tp, p.pp, p.ep, p.sp, p.ring, w.tp,
                             w.pp, w.ep, w.sp, w.ring);
        if (p.pp != w.pp || p.vpp != w.vpp || p.pp > 1)
          return fmt::format("tp={} pp={} vpp={} sp={} ring={} instead of tp={} pp={} vpp={} sp={} ring={}", p.tp, p.pp, p.vpp, p.sp, p.ring,
                             w.tp, w.pp, w.vpp, w.sp, w.ring);
        if (p.tp != w.tp || p.tp > 1)
          return fmt::format("tp={} sp={} ring={} instead of tp={} sp={} ring={}", p.tp, p.sp, p.ring, w.tp, w.sp, w.ring);
        if (p.ring != w.ring || p.ring > 1)
          return fmt::format("sp={} ring={} instead of sp={} ring={}", p.sp, p.ring, w.sp, w.ring);
        return fmt::format("sp={} instead of {}", p.sp, w.sp);
      case 1: return fmt::format("ZeRO-{} instead of ZeRO-{}", p.zero_stage, w.zero_stage);
      case 2: return p.offload_optimizer ? "with optimizer offload" : "without optimizer offload";
      case 3: return p.offload_params ? "with parameter offload" : "without parameter offload";
      case 4: return !p.activation_checkpointing
                         ? (p.offload_activation_layers > 0
                                ? fmt::format("without recompute, {} layers' activations offloaded", p.offload_activation_layers)
                            : p.recompute_modules.any()
                                ? fmt::format("recomputing {} only (selective)", megatron_recompute_modules_describe(p.recompute_modules, ", "))
                                : "without activation checkpointing")
                     : !w.activation_checkpointing  // the winner recomputes nothing: say which checkpointing this is
                         ? (p.checkpoint_offload ? std::string("checkpointing every layer, offloaded") : checkpointing_describe(p))
                     : p.checkpoint_ops != w.checkpoint_ops
                         ? (p.checkpoint_ops ? "op-level selective checkpointing" : "checkpointing whole layers")
                     : p.checkpoint_every != w.checkpoint_every || p.recompute_block_layers != w.recompute_block_layers
                         ? checkpointing_describe(p)
                     : p.checkpoint_offload ? "with checkpoint offload"
                                            : "without checkpoint offload";
      default:
        if (p.fpdt) return fmt::format("FPDT with {}-token chunks", p.fpdt_chunk_tokens);
        return fmt::format("{} tiled MLP, {} tiled loss{}", p.tiled_mlp ? "with" : "without", p.tiled_loss ? "with" : "without",
                           w.fpdt ? ", no FPDT" : "");
    }
  };
  for (int field = 0; field < kPlanFields; ++field) {
    std::vector<std::string> seen;
    for (const auto& candidate : result.candidates) {
      if (&candidate == winner || !same_except(candidate.plan, w, field)) continue;
      // One thing changed in the layout: the TP degree, the pipeline stages, the expert ranks, or the
      // sequence's spread (sp and ring), each alone (the rest of a layout's combinations are in the full list).
      const PlanOptions& c = candidate.plan;
      const int layout_changes = (c.tp != w.tp) + (c.pp != w.pp || c.vpp != w.vpp) + (c.ep != w.ep) + (c.sp != w.sp || c.ring != w.ring);
      if (field == 0 && layout_changes > 1) continue;
      const std::string change = describe(candidate.plan, field);
      if (std::find(seen.begin(), seen.end(), change) != seen.end()) continue;
      seen.push_back(change);
      alternatives.push_back({change, &candidate});
    }
  }
  return alternatives;
}

MicroBatchSearch micro_batch_search(const ModelSpec& model, const ClusterSpec& cluster, const RuntimeProfile& profile,
                                    SearchOptions options, MicroBatchObjective objective, int64_t largest_candidate) {
  options.objective = SearchObjective::objective_throughput;
  MicroBatchSearch search;
  std::vector<std::pair<int64_t, SearchResult>> results;  // kept for the chosen one's candidates
  auto evaluate = [&](int64_t micro_batch) -> const MicroBatchTried& {
    options.held.micro_batch = micro_batch;
    results.emplace_back(micro_batch, plan_search(model, cluster, profile, options));
    const SearchResult& result = results.back().second;
    MicroBatchTried tried;
    tried.micro_batch = micro_batch;
    if (const SearchCandidate* winner = result.winner()) {
      tried.fits = true;
      tried.tokens_per_s = winner->time.tokens_per_s;
      tried.gpu_peak_bytes = winner->memory.gpu_peak_bytes;
    } else if (!result.candidates.empty() && result.candidates.front().problems.empty()) {
      tried.gpu_peak_bytes = result.candidates.front().memory.gpu_peak_bytes;
      tried.binding_constraint = result.candidates.front().binding_constraint;
    } else {
      tried.binding_constraint = result.candidates.empty() ? "no plan" : result.candidates.front().problems.front();
    }
    search.tried.push_back(tried);
    return search.tried.back();
  };
  if (options.held.global_batch > 0) {
    // Only a divisor of the global batch gives whole accumulation steps; the peak grows with the
    // micro batch, so the first that fits nowhere ends the ladder.
    for (int64_t micro_batch = 1; micro_batch <= std::min(options.held.global_batch, largest_candidate); ++micro_batch) {
      if (options.held.global_batch % micro_batch != 0) continue;
      const MicroBatchTried& tried = evaluate(micro_batch);
      const bool invalid_only = !tried.fits && tried.gpu_peak_bytes == 0;  // no dp divides: a larger divisor may still
      if (!tried.fits && !invalid_only) break;
    }
  } else {
    int64_t fits = 0, fails = 0;
    for (int64_t micro_batch = 1; micro_batch <= largest_candidate; micro_batch *= 2) {
      if (evaluate(micro_batch).fits) fits = micro_batch;
      else {
        fails = micro_batch;
        break;
      }
    }
    while (fits > 0 && fails > fits + 1) {
      const int64_t middle = fits + (fails - fits) / 2;
      (evaluate(middle).fits ? fits : fails) = middle;
    }
    std::sort(search.tried.begin(), search.tried.end(),
              [](const MicroBatchTried& a, const MicroBatchTried& b) { return a.micro_batch < b.micro_batch; });
  }
  const MicroBatchTried* chosen = nullptr;
  for (const MicroBatchTried& tried : search.tried) {
    if (!tried.fits) continue;
    const bool faster = chosen && tried.tokens_per_s > chosen->tokens_per_s * (1 + kSearchLengthResolution);
    if (!chosen || objective == MicroBatchObjective::micro_batch_largest || faster) chosen = &tried;
  }
  search.micro_batch = chosen ? chosen->micro_batch : 0;
  const int64_t reported = chosen ? chosen->micro_batch : search.tried.front().micro_batch;
  for (auto& [micro_batch, result] : results)
    if (micro_batch == reported) search.result = std::move(result);
  return search;
}

}  // namespace longseq
