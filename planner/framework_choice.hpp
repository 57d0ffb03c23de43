// framework_choice.hpp: every framework's own search on one cluster, and the framework that serves
// a model best there: what `longseq plan` prints beside its answer and picks when no framework is
// named, and what a scenario's search without a framework picks, so that a sweep point is plan's
// answer for the same inputs.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "planner/frameworks.hpp"
#include "planner/search.hpp"

namespace longseq {

struct FrameworkWinner {
  Framework framework;
  RuntimeProfile profile;
  const SearchCandidate* winner = nullptr;  // null: no plan of it fits
  std::string why_none;                     // then why, when no plan was valid
};

// How a framework's best ranks: its maximum length (by_length) or its tokens/s at the length; -1
// where nothing of it fits.
double framework_winner_score(const FrameworkWinner& w, bool by_length);

// The framework that serves the model best: the longest maximum (or the most tokens/s at the
// length), `kept` kept unless another is ahead by more than the search resolves
// (kSearchLengthResolution). Null where none fits.
const FrameworkWinner* framework_best(const std::vector<FrameworkWinner>& winners, Framework kept, bool by_length);

// Why a framework has no winner where it refused every plan it was offered ("" otherwise).
std::string framework_refused_every_plan(const SearchResult& search, Framework framework);

// Searches and their winners; the winners point into `results`, reserved for every framework so
// that adding never moves them.
struct FrameworkSearches {
  std::vector<SearchResult> results;
  std::vector<FrameworkWinner> winners;
  FrameworkSearches() { results.reserve(frameworks_all().size()); }
  FrameworkSearches(const FrameworkSearches&) = delete;
  FrameworkSearches& operator=(const FrameworkSearches&) = delete;
};

// Adds each framework's own search but `skip`'s (and longseq's executor's: a research executor,
// not a framework to rent a cluster for), each with the lengths it feeds (search_options_for_
// framework over `options`) and priced with its own runtime profile, or `profile_name` where one
// is given, and its own attention kernel; where the user named a kernel (`attention_named`), a
// framework whose own kernel cannot run on the card is left out.
void framework_searches_add(FrameworkSearches& searches, const ModelSpec& model, const ClusterSpec& cluster, const SearchOptions& options,
                            const std::string& profile_name, bool attention_named, std::optional<Framework> skip);

}  // namespace longseq
