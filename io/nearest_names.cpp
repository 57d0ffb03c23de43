#include "io/nearest_names.hpp"

#include <algorithm>
#include <utility>

namespace longseq {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::vector<std::string> nearest_names(const std::string& word, const std::vector<std::string>& known, size_t count, size_t max_distance) {
  std::vector<std::pair<size_t, size_t>> ranked;  // (distance, index in `known`)
  for (size_t i = 0; i < known.size(); ++i)
    if (const size_t distance = edit_distance(word, known[i]); distance <= max_distance) ranked.emplace_back(distance, i);
  std::stable_sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> nearest;
  for (const auto& [distance, index] : ranked)
    if (nearest.size() < count && std::find(nearest.begin(), nearest.end(), known[index]) == nearest.end()) nearest.push_back(known[index]);
  return nearest;
}

std::string names_listed(const std::vector<std::string>& names) {
  std::string said;
  for (size_t i = 0; i < names.size(); ++i) said += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return said;
}

}  // namespace longseq
