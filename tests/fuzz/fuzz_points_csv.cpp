// Published-measurement CSV files for `longseq validate` (planner/validation.cpp).
#include "planner/validation.hpp"
#include "tests/fuzz/fuzz_harness.hpp"

LONGSEQ_FUZZ_TARGET({ (void)longseq::published_points_parse(text, "points.csv"); })
