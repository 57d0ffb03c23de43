#include "planner/max_seqlen.hpp"

#include "planner/units.hpp"

#include <algorithm>
#include <fmt/format.h>
#include <stdexcept>

namespace longseq {

namespace {

std::string binding_constraint_describe(const MemoryPrediction& prediction) {
  if (!prediction.fits_gpu() && !prediction.fits_host()) return "GPU and host memory";
  if (!prediction.fits_gpu()) return "GPU memory";
  if (!prediction.fits_host()) return "host memory";
  return "search limit";
}

// Worst of GPU and host memory as a fraction of capacity: fits when <= 1. Monotone in S.
double usage_fraction(const MemoryPrediction& prediction) {
  return std::max(prediction.gpu_peak_bytes / prediction.gpu_capacity_bytes,
                  prediction.host_bytes_per_node / prediction.host_capacity_bytes);
}

}  // namespace

MaxSeqlenResult max_seqlen_find(const ModelSpec& model, const ClusterSpec& cluster, const PlanOptions& plan,
                                const RuntimeProfile& profile, int64_t granularity, bool with_breakdown) {
  if (granularity == 0) granularity = seqlen_granule(plan);
  if (granularity < 1 || granularity % seqlen_granule(plan) != 0)
    throw std::invalid_argument("max_seqlen_find: granularity must be a positive multiple of sp");
  MaxSeqlenResult result;
  result.granularity = granularity;
  auto usage = [&](int64_t granules) {
    return usage_fraction(memory_predict(model, cluster, plan, profile, granules * granularity, /*with_breakdown=*/false));
  };
  // The shortest length the plan can take: a fixed tile count needs a token per tile on each rank
  // (seqlen_problems), so shorter lengths are no plan at all, not lengths that fit.
  const int64_t tiles = std::max(plan.mlp_tiles, plan.loss_tiles);
  const int64_t shortest = std::max<int64_t>(1, (tiles * plan.sequence_ranks() + granularity - 1) / granularity);
  auto finish = [&](int64_t fit_granules, int64_t fail_granules) {
    result.max_seqlen = fit_granules * granularity;
    result.at_max = memory_predict(model, cluster, plan, profile, std::max(fit_granules, shortest) * granularity, with_breakdown);
    result.first_failure = fail_granules > 0
                               ? memory_predict(model, cluster, plan, profile, fail_granules * granularity, with_breakdown)
                               : result.at_max;
    result.binding_constraint = fail_granules > 0 ? binding_constraint_describe(result.first_failure) : "search limit";
    if (fail_granules > 0 && !result.first_failure.fits_host()) {
      const auto& items = result.first_failure.host_items;
      const auto largest = std::max_element(items.begin(), items.end(), [](const auto& a, const auto& b) { return a.bytes < b.bytes; });
      if (largest != items.end())
        result.binding_host_term = fmt::format("{}, {:.0f} of {:.0f} GiB per node", largest->name, largest->bytes / kBytesPerGib,
                                               result.first_failure.host_capacity_bytes / kBytesPerGib);
    }
    return result;
  };

  // Invariant from here on: `low` granules fit (usage <= 1), `high` granules do not.
  int64_t low = shortest;
  double low_usage = usage(low);
  if (low_usage > 1) return finish(0, low);
  const int64_t limit = kSeqlenSearchLimit / granularity;

  // Bracket. Memory is close to linear in S (every activation term is), so extrapolating the
  // line through the last two fitting points lands near the limit; probing 5% past it usually
  // fails at once. Growth is at least 2x per step, so absurd extrapolations cannot stall it.
  int64_t previous = 0;
  double previous_usage = 0;
  int64_t high = 0;
  double high_usage = 0;
  int64_t probe = std::min<int64_t>(limit, std::max<int64_t>(1024, 2 * low));
  while (true) {
    const double probe_usage = usage(probe);
    if (probe_usage > 1) {
      high = probe;
      high_usage = probe_usage;
      break;
    }
    previous = low;
    previous_usage = low_usage;
    low = probe;
    low_usage = probe_usage;
    if (probe == limit) return finish(limit, 0);
    const double slope = (low_usage - previous_usage) / static_cast<double>(low - previous);
    double next = slope > 0 ? static_cast<double>(low) + (1.0 - low_usage) / slope * 1.05 : 2.0 * static_cast<double>(low);
    next = std::max(next, 2.0 * static_cast<double>(low));
    probe = static_cast<int64_t>(std::min(next, static_cast<double>(limit)));
  }

  // Evaluates one length and moves the bracket end it belongs to.
  auto probe_bracket = [&](int64_t granules) {
    const double granules_usage = usage(granules);
    if (granules_usage > 1) {
      high = granules;
      high_usage = granules_usage;
    } else {
      low = granules;
      low_usage = granules_usage;
    }
    return granules_usage <= 1;
  };
  // Shrink the bracket: a secant step between (low, high) to the crossing, then a check one
  // granule above it; where the secant does not halve the bracket, bisect instead.
  while (high - low > 1) {
    const double span = static_cast<double>(high - low);
    const int64_t guess = low + static_cast<int64_t>((1.0 - low_usage) / (high_usage - low_usage) * span);
    if (probe_bracket(std::clamp<int64_t>(guess, low + 1, high - 1)) && high - low > 1) probe_bracket(low + 1);
    if (static_cast<double>(high - low) > span / 2 && high - low > 1) probe_bracket(low + (high - low) / 2);
  }
  return finish(low, high);
}

SeqlenBand max_seqlen_band(const ModelSpec& model, const ClusterSpec& cluster, const PlanOptions& plan,
                           const RuntimeProfile& profile, int64_t granularity) {
  auto at = [&](EstimateBound bound) {
    return max_seqlen_find(model, cluster, plan, runtime_profile_bounded(profile, bound), granularity, /*with_breakdown=*/false)
        .max_seqlen;
  };
  return {at(EstimateBound::estimate_high_memory), at(EstimateBound::estimate_low_memory)};
}

}  // namespace longseq
