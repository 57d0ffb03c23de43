// The mpirun command line and the Slurm batch script `longseq launch` writes (executor/job_launch),
// from requests made of arbitrary text: its first five bytes choose ranks, ranks per node, sp, the
// device and whether a plan file is run; the rest is split at NUL bytes into the scenario name, its
// path, a plan path, the output directory, the partition, the time limit, the binary's path and
// mpirun arguments. Either the
// request is refused (ConfigError) or every line reads back as exactly what was meant
// (tests/support/launch_script_check.hpp): no input yields an unescaped shell line.
#include "executor/job_launch.hpp"
#include "tests/fuzz/fuzz_harness.hpp"
#include "tests/support/launch_script_check.hpp"

LONGSEQ_FUZZ_TARGET({
  const std::string body = text.size() > 5 ? text.substr(5) : std::string();
  std::vector<std::string> fields;
  size_t start = 0;
  for (size_t i = 0; i <= body.size(); ++i)
    if (i == body.size() || body[i] == '\0') {
      fields.push_back(body.substr(start, i - start));
      start = i + 1;
    }
  auto field = [&](size_t index) { return index < fields.size() ? fields[index] : std::string(); };
  auto byte = [&](size_t index) { return index < text.size() ? static_cast<unsigned char>(text[index]) : 0; };
  longseq::LaunchRequest request;
  request.ranks = 1 + byte(0) % 16;
  request.ranks_per_node = 1 + byte(1) % 8;
  request.sp = byte(2) % 9;
  request.device = byte(3) % 2 ? "cuda" : "cpu";
  request.scenario_name = field(0);
  request.scenario_path = field(1);
  if (byte(4) % 2) request.plan_path = field(2);
  request.output_directory = field(3);
  request.partition = field(4);
  request.time_limit = fields.size() > 5 ? field(5) : "00:30:00";
  request.longseq_binary = fields.size() > 6 ? field(6) : "/usr/bin/longseq";
  for (size_t i = 7; i < fields.size(); ++i) request.mpirun_extra.push_back(fields[i]);
  const longseq::JobLayout layout = longseq::job_layout(request);
  const std::string problem = longseq::test::launch_script_problem(request, layout);
  if (!problem.empty()) {
    std::fprintf(stderr, "fuzz: %s\n", problem.c_str());
    std::abort();
  }
})
