// A plan file, as `longseq run --plan` / `longseq launch --plan` read it (planner/plan_file.cpp).
#include "planner/plan_file.hpp"
#include "tests/fuzz/fuzz_harness.hpp"

LONGSEQ_FUZZ_TARGET({ longseq::plan_file_parse(text, "plan.json"); })
