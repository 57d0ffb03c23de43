// max_seqlen.hpp: the longest sequence a fixed plan can train, by bisection over S.
//
// Memory (GPU and host) grows monotonically with S for a fixed plan — every activation term is
// linear in S/sp and the static terms do not depend on it — so the set of fitting lengths is an
// interval [granularity, S_max] and bisection finds its end.
#pragma once

#include <cstdint>
#include <string>

#include "planner/memory_model.hpp"

namespace longseq {

struct MaxSeqlenResult {
  int64_t max_seqlen = 0;            // 0: not even one granule fits
  int64_t granularity = 1;           // S is searched in multiples of this (sp, or the user's)
  std::string binding_constraint;    // "GPU memory", "host memory", "GPU and host memory", or "search limit"
  // When host memory binds: its largest term at the first failing length, e.g.
  // "hidden_states_checkpoints, 1,934 of 2,048 GiB per node"; empty otherwise.
  std::string binding_host_term;
  MemoryPrediction at_max;           // prediction at max_seqlen (at `granularity` when it is 0)
  MemoryPrediction first_failure;    // prediction at max_seqlen + granularity
};

// Upper end of the search: 10^12 tokens, beyond any memory the cards describe.
inline constexpr int64_t kSeqlenSearchLimit = 1'000'000'000'000;

// Precondition: plan_problems(...) is empty. `granularity` 0 means seqlen_granule(plan); otherwise
// it must be a multiple of it.
// With `with_breakdown` false the two reported predictions carry no per-tensor items (searches).
MaxSeqlenResult max_seqlen_find(const ModelSpec& model, const ClusterSpec& cluster, const PlanOptions& plan,
                                const RuntimeProfile& profile, int64_t granularity = 0, bool with_breakdown = true);

// How sure the maximum is: the maximum with every ranged term of the profile at its high end plus
// the calibrated reserve (`shortest`), and with the sourced terms alone at their low ends, no
// reserve (`longest`). The point prediction lies between them (it takes each term's central
// estimate and the reserve).
struct SeqlenBand {
  int64_t shortest = 0;
  int64_t longest = 0;
};
SeqlenBand max_seqlen_band(const ModelSpec& model, const ClusterSpec& cluster, const PlanOptions& plan,
                           const RuntimeProfile& profile, int64_t granularity = 0);

}  // namespace longseq
