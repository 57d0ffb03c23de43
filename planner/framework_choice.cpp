// framework_choice.cpp: every framework's own search, and the one that serves a model best.
#include "planner/framework_choice.hpp"

#include <fmt/format.h>
#include <algorithm>

#include "planner/time_model.hpp"

namespace longseq {

double framework_winner_score(const FrameworkWinner& w, bool by_length) {
  if (!w.winner || !w.winner->fits) return -1.0;
  return by_length ? static_cast<double>(w.winner->max_seqlen) : w.winner->time.tokens_per_s;
}

const FrameworkWinner* framework_best(const std::vector<FrameworkWinner>& winners, Framework kept, bool by_length) {
  auto score = [&](const FrameworkWinner& w) { return framework_winner_score(w, by_length); };
  const FrameworkWinner* kept_winner = nullptr;
  const FrameworkWinner* best = nullptr;
  for (const FrameworkWinner& w : winners) {
    if (w.framework == kept && score(w) >= 0) kept_winner = &w;
    if (score(w) >= 0 && (!best || score(w) > score(*best))) best = &w;
  }
  if (kept_winner && best && score(*best) <= score(*kept_winner) * (1 + kSearchLengthResolution)) return kept_winner;
  return best;
}

std::string framework_refused_every_plan(const SearchResult& search, Framework framework) {
  const std::vector<SearchCandidate>& tried = search.candidates;
  const bool all_refused = std::all_of(tried.begin(), tried.end(), [](const SearchCandidate& c) { return !c.problems.empty(); });
  return all_refused ? fmt::format("it refuses every plan: --framework {} lists why", framework_name(framework)) : std::string();
}

void framework_searches_add(FrameworkSearches& searches, const ModelSpec& model, const ClusterSpec& cluster, const SearchOptions& options,
                            const std::string& profile_name, bool attention_named, std::optional<Framework> skip) {
  for (Framework framework : frameworks_all()) {
    if (framework == skip || framework == Framework::framework_longseq) continue;
    const RuntimeProfile profile =
        framework_profile(framework, runtime_profile_load(!profile_name.empty() ? profile_name : framework_facts(framework).runtime_profile));
    // Each is priced with its own kernel (the one named may be one it cannot run: FlashAttention-3
    // under SDPA's context parallelism); where a kernel was named, one whose own cannot run on the
    // card is left out.
    if (attention_named && !attention_kernel_problem(profile, cluster.hardware).empty()) continue;
    SearchOptions framework_options = options;
    search_options_for_framework(framework_options, framework, model, cluster);
    searches.results.push_back(plan_search(model, cluster, profile, framework_options));
    searches.winners.push_back(
        {framework, profile, searches.results.back().winner(), framework_refused_every_plan(searches.results.back(), framework)});
  }
}

}  // namespace longseq
