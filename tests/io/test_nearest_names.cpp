// "Did you mean ...?": edit distance by hand, and the nearest names within a typo's reach.
#include <doctest/doctest.h>

#include "io/nearest_names.hpp"

using namespace longseq;

TEST_CASE("edit distance counts insertions, deletions and substitutions, a transposition as two") {
  CHECK(edit_distance("plan", "plan") == 0);
  CHECK(edit_distance("pln", "plan") == 1);       // one insertion
  CHECK(edit_distance("--modle", "--model") == 2);  // a transposition: two substitutions
  CHECK(edit_distance("kitten", "sitting") == 3);
  CHECK(edit_distance("", "run") == 3);
}

TEST_CASE("nearest names: within the distance, nearest first, ties in the order given, at most the count asked") {
  const std::vector<std::string> commands = {"plan", "validate", "bench", "sweep", "report", "run", "launch"};
  CHECK(nearest_names("pln", commands, 2, 1) == std::vector<std::string>{"plan"});
  CHECK(nearest_names("pln", commands, 2, 2) == std::vector<std::string>{"plan", "run"});
  CHECK(nearest_names("xyzzy", commands, 2, 2).empty());
  CHECK(names_listed({"a"}) == "a");
  CHECK(names_listed({"a", "b", "c"}) == "a, b or c");
  CHECK(names_listed({}).empty());
}
