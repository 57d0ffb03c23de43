// Sequence lengths as typed on the command line and in scenarios (planner/units.cpp).
#include <cmath>

#include "planner/units.hpp"
#include "tests/fuzz/fuzz_harness.hpp"

LONGSEQ_FUZZ_TARGET({
  const int64_t tokens = longseq::seqlen_parse(text, "--seqlen");
  if (tokens < 1 || tokens > 10'000'000'000'000) std::abort();
  // What longseq prints parses back, to the printed precision (3 decimals of K/M/G).
  const int64_t again = longseq::seqlen_parse(longseq::seqlen_format(tokens), "formatted");
  if (std::fabs(static_cast<double>(again - tokens)) > 5e-4 * static_cast<double>(tokens) + 1) std::abort();
})
