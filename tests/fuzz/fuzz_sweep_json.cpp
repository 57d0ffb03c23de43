// A sweep's result, results.json, as `longseq report` reads it (reports/report.cpp).
#include "reports/report.hpp"
#include "tests/fuzz/fuzz_harness.hpp"

LONGSEQ_FUZZ_TARGET({ longseq::sweep_result_check(text, "results.json"); })
