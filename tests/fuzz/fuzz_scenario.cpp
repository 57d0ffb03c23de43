// Scenario files (planner/scenario.cpp): model, cluster, plan, sweep axes, published points.
#include "planner/scenario.hpp"
#include "tests/fuzz/fuzz_harness.hpp"

LONGSEQ_FUZZ_TARGET({ (void)longseq::scenario_from_text(text, "scenario.yaml"); })
