// nearest_names.hpp: "did you mean ...?" for a word that names nothing known (a subcommand, a flag,
// a framework, a card), by edit distance.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace longseq {

// Levenshtein distance: insertions, deletions and substitutions, each 1.
size_t edit_distance(const std::string& a, const std::string& b);

// The known words nearest to `word`, nearest first (ties in the order given), at most `count` of
// them and only those within `max_distance` edits (a typo, not an unrelated word).
std::vector<std::string> nearest_names(const std::string& word, const std::vector<std::string>& known, size_t count, size_t max_distance);

// "a", "a or b", "a, b or c".
std::string names_listed(const std::vector<std::string>& names);

}  // namespace longseq
