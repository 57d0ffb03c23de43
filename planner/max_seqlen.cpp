#include "planner/max_seqlen.hpp"

#include <stdexcept>

namespace longseq {

namespace {

std::string binding_constraint_describe(const MemoryPrediction& prediction) {
  if (!prediction.fits_gpu() && !prediction.fits_host()) return "GPU and host memory";
  if (!prediction.fits_gpu()) return "GPU memory";
  if (!prediction.fits_host()) return "host memory";
  return "search limit";
}

}  // namespace

MaxSeqlenResult max_seqlen_find(const ModelSpec& model, const ClusterSpec& cluster, const PlanOptions& plan,
                                const RuntimeProfile& profile, int64_t granularity) {
  if (granularity == 0) granularity = plan.sp;
  if (granularity < 1 || granularity % plan.sp != 0)
    throw std::invalid_argument("max_seqlen_find: granularity must be a positive multiple of sp");
  MaxSeqlenResult result;
  result.granularity = granularity;
  auto predict = [&](int64_t granules) { return memory_predict(model, cluster, plan, profile, granules * granularity); };

  MemoryPrediction smallest = predict(1);
  if (!smallest.fits()) {
    result.at_max = smallest;
    result.first_failure = smallest;
    result.binding_constraint = binding_constraint_describe(smallest);
    return result;
  }
  // Grow until a length fails (or the limit), then bisect between the last fit and that failure.
  const int64_t limit_granules = kSeqlenSearchLimit / granularity;
  int64_t fit = 1;
  MemoryPrediction fit_prediction = smallest;
  int64_t fail = 0;
  MemoryPrediction fail_prediction;
  for (int64_t probe = 2;; probe *= 2) {
    if (probe >= limit_granules) probe = limit_granules;
    MemoryPrediction prediction = predict(probe);
    if (!prediction.fits()) {
      fail = probe;
      fail_prediction = std::move(prediction);
      break;
    }
    fit = probe;
    fit_prediction = std::move(prediction);
    if (probe == limit_granules) break;
  }
  if (fail == 0) {
    result.max_seqlen = fit * granularity;
    result.at_max = fit_prediction;
    result.first_failure = fit_prediction;
    result.binding_constraint = "search limit";
    return result;
  }
  while (fail - fit > 1) {
    const int64_t middle = fit + (fail - fit) / 2;
    MemoryPrediction prediction = predict(middle);
    if (prediction.fits()) {
      fit = middle;
      fit_prediction = std::move(prediction);
    } else {
      fail = middle;
      fail_prediction = std::move(prediction);
    }
  }
  result.max_seqlen = fit * granularity;
  result.at_max = std::move(fit_prediction);
  result.binding_constraint = binding_constraint_describe(fail_prediction);
  result.first_failure = std::move(fail_prediction);
  return result;
}

}  // namespace longseq
