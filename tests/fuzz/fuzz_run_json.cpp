// A run's result, run.json, as `longseq report` reads it (reports/report.cpp).
#include "reports/report.hpp"
#include "tests/fuzz/fuzz_harness.hpp"

LONGSEQ_FUZZ_TARGET({ longseq::run_result_check(text, "run.json"); })
