// Job layout, mpirun command lines and Slurm batch scripts for `longseq launch`, against text
// written out by hand for several plans, and the bad layouts refused before anything runs.
#include <doctest/doctest.h>

#include <cstdio>
#include <functional>
#include <fstream>
#include <string>

#include "executor/job_launch.hpp"
#include "io/config_error.hpp"
#include "tests/support/launch_script_check.hpp"

using namespace longseq;

namespace {
LaunchRequest request_for(int64_t ranks, int64_t ranks_per_node, int64_t sp) {
  LaunchRequest request;
  request.scenario_path = "/s/tiny.yaml";
  request.scenario_name = "tiny";
  request.ranks = ranks;
  request.ranks_per_node = ranks_per_node;
  request.sp = sp;
  request.output_directory = "/out";
  request.longseq_binary = "/bin/longseq";
  return request;
}
std::string temporary_file(const std::string& name, const std::string& text) {
  const std::string path = "/tmp/longseq_test_" + name;
  std::ofstream(path) << text;
  return path;
}
}  // namespace

TEST_CASE("one node: Ulysses groups inside it, data parallel across them") {
  const LaunchRequest request = request_for(4, 4, 2);
  const JobLayout layout = job_layout(request);
  CHECK(layout.nodes == 1);
  CHECK(layout.sp == 2);
  CHECK(layout.dp == 2);
  CHECK_FALSE(layout.sp_spans_nodes);
  CHECK(mpirun_command(request, layout) ==
        "mpirun -np 4 --map-by ppr:4:node /bin/longseq run /s/tiny.yaml --sp 2 --json-out /out/run.json --overwrite");
}

TEST_CASE("GPU ranks: the run goes to --device cuda and the batch script asks for a GPU per rank") {
  LaunchRequest request = request_for(8, 4, 4);
  request.device = "cuda";
  const JobLayout layout = job_layout(request);
  CHECK(mpirun_command(request, layout) ==
        "mpirun -np 8 --map-by ppr:4:node /bin/longseq run /s/tiny.yaml --sp 4 --device cuda --json-out /out/run.json --overwrite");
  const std::string script = sbatch_script(request, layout);
  CHECK(script.find("#SBATCH --cpus-per-task=1\n#SBATCH --gpus-per-node=4\n") != std::string::npos);
  CHECK(sbatch_script(request_for(8, 4, 4), layout).find("gpus") == std::string::npos);  // CPU ranks ask for none
}

TEST_CASE("two nodes, a group per node, as a Slurm batch script") {
  LaunchRequest request = request_for(8, 4, 4);
  request.partition = "gpu";
  request.time_limit = "01:00:00";
  const JobLayout layout = job_layout(request);
  CHECK(layout.nodes == 2);
  CHECK(layout.dp == 2);
  CHECK_FALSE(layout.sp_spans_nodes);
  CHECK(sbatch_script(request, layout) ==
        "#!/bin/bash\n"
        "# Written by longseq launch for /s/tiny.yaml: 8 rank(s) (Ulysses sp=4, data parallel dp=2) on 2 node(s) of 4.\n"
        "#SBATCH --job-name=longseq-tiny\n"
        "#SBATCH --nodes=2\n"
        "#SBATCH --ntasks-per-node=4\n"
        "#SBATCH --cpus-per-task=1\n"
        "#SBATCH --time=01:00:00\n"
        "#SBATCH --output=/out/slurm-%j.out\n"
        "#SBATCH --partition=gpu\n"
        "set -euo pipefail\n"
        "export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}\n"
        "mpirun -np 8 --map-by ppr:4:node /bin/longseq run /s/tiny.yaml --sp 4 --json-out /out/run.json --overwrite\n");
}

TEST_CASE("a Ulysses group spanning two nodes, over a hostfile, with extra mpirun arguments") {
  LaunchRequest request = request_for(4, 2, 4);
  request.hostfile = temporary_file("hosts", "# two machines\nnode-a slots=2\nnode-b slots=2  # the second\n");
  request.mpirun_extra = {"--allow-run-as-root", "--mca", "btl_tcp_if_include", "eth0"};
  const JobLayout layout = job_layout(request);
  CHECK(layout.nodes == 2);
  CHECK(layout.sp_spans_nodes);
  CHECK(mpirun_command(request, layout) ==
        "mpirun -np 4 --map-by ppr:2:node --hostfile /tmp/longseq_test_hosts --allow-run-as-root --mca btl_tcp_if_include eth0 "
        "/bin/longseq run /s/tiny.yaml --sp 4 --json-out /out/run.json --overwrite");
  // The batch script leaves the hostfile out (Slurm's allocation decides) and says the groups span nodes.
  const std::string script = sbatch_script(request, layout);
  CHECK(script.find("--hostfile") == std::string::npos);
  CHECK(script.find("# The Ulysses groups span nodes") != std::string::npos);
  std::remove(request.hostfile.c_str());
}

TEST_CASE("without a plan sp the run decides, and the command passes no --sp") {
  const LaunchRequest request = request_for(2, 2, 0);
  const JobLayout layout = job_layout(request);
  CHECK(layout.sp == 2);
  CHECK(mpirun_command(request, layout) == "mpirun -np 2 --map-by ppr:2:node /bin/longseq run /s/tiny.yaml --json-out /out/run.json --overwrite");
}

TEST_CASE("bad layouts are refused with the flag and the reason") {
  CHECK_THROWS_WITH_AS(job_layout(request_for(4, 4, 3)), "--ranks: 4 ranks do not split into Ulysses groups of sp=3", ConfigError);
  CHECK_THROWS_WITH_AS(job_layout(request_for(6, 3, 2)), doctest::Contains("sp=2 would straddle nodes of 3 ranks"), ConfigError);
  CHECK_THROWS_WITH_AS(job_layout(request_for(12, 4, 6)), doctest::Contains("sp=6 would cover part of a node of 4 ranks"), ConfigError);
  CHECK_THROWS_WITH_AS(job_layout(request_for(6, 4, 2)), doctest::Contains("6 ranks do not fill nodes of 4 evenly"), ConfigError);
  LaunchRequest missing = request_for(2, 2, 2);
  missing.hostfile = "/nonexistent/hosts";
  CHECK_THROWS_WITH_AS(job_layout(missing), "/nonexistent/hosts: cannot open the hostfile", ConfigError);
  LaunchRequest small = request_for(4, 2, 2);
  small.hostfile = temporary_file("small_hosts", "node-a slots=2\nnode-b\n");
  CHECK_THROWS_WITH_AS(job_layout(small), doctest::Contains("3 slot(s) for 4 ranks: more ranks than the hostfile's GPUs"), ConfigError);
  std::remove(small.hostfile.c_str());
  const std::string malformed = temporary_file("bad_hosts", "node-a slots=two\n");
  CHECK_THROWS_WITH_AS(hostfile_slots(malformed), doctest::Contains("bad_hosts:1: 'slots=two' is not a positive slot count"), ConfigError);
  std::remove(malformed.c_str());
}

TEST_CASE("hostile text never becomes a shell line: a scenario name, paths, partition and time with newlines and shell syntax") {
  // The case: a scenario named "job\ntouch${IFS}pwned-slurm" made a line of its own in the
  // batch script. Every field that reaches the script or the command line, with a newline, is refused.
  const std::string hostile = "job\ntouch${IFS}pwned-slurm";
  auto refused = [](LaunchRequest request, const std::string& expected) {
    CHECK_THROWS_WITH_AS(job_layout(request), doctest::Contains(expected.c_str()), ConfigError);
    CHECK_THROWS_WITH_AS(sbatch_script(request, JobLayout{}), doctest::Contains(expected.c_str()), ConfigError);
  };
  // Each field with hostile text, on an otherwise good request, and what the refusal says.
  const std::vector<std::pair<std::function<void(LaunchRequest&)>, std::string>> hostile_fields = {
      {[&](LaunchRequest& r) { r.scenario_name = hostile; }, "/s/tiny.yaml: key 'name': the scenario's name holds a control character (byte 0x0a)"},
      {[](LaunchRequest& r) { r.scenario_path = "/s/x\ntouch pwned.yaml"; }, "the scenario's path holds a control character"},
      {[](LaunchRequest& r) { r.plan_path = "/p/x\rplan.json"; }, "the plan file's path holds a control character (byte 0x0d)"},
      {[](LaunchRequest& r) { r.output_directory = "/out\n#SBATCH --wrap=id"; }, "--output: the output directory holds a control character"},
      {[](LaunchRequest& r) { r.partition = "gpu\ntouch pwned"; }, "--partition"},
      {[](LaunchRequest& r) { r.partition = "gpu;id"; }, "--partition: 'gpu;id' is not a Slurm partition name"},
      {[](LaunchRequest& r) { r.time_limit = "1:00 --wrap=id"; }, "--time: '1:00 --wrap=id' is not a Slurm time limit"},
      {[](LaunchRequest& r) { r.mpirun_extra = {"--mca", "x\ny"}; }, "--mpirun-arg: an mpirun argument holds a control character"},
  };
  for (const auto& [make_hostile, expected] : hostile_fields) {
    LaunchRequest request = request_for(2, 2, 2);
    make_hostile(request);
    refused(request, expected);
  }
  // Slurm reads #SBATCH --output without a shell and expands '%': such a directory is refused for Slurm only.
  LaunchRequest request = request_for(2, 2, 2);
  request.output_directory = "/out dir/%u";
  const JobLayout layout = job_layout(request);  // mpirun quotes it
  CHECK(test::launch_script_problem(request_for(2, 2, 2), layout).empty());
  CHECK_THROWS_WITH_AS(sbatch_script(request, layout), doctest::Contains("--output: /out dir/%u: a Slurm job's log goes to #SBATCH --output"),
                       ConfigError);
}

TEST_CASE("text a shell would read otherwise is quoted: every line reads back as the arguments meant") {
  LaunchRequest request = request_for(4, 2, 2);
  request.scenario_path = "/s/it's $(id) `id` ; & | > *.yaml";
  request.scenario_name = "odd name; $(id)";
  request.output_directory = "/out/$HOME";
  request.longseq_binary = "/opt/long seq/longseq";
  request.mpirun_extra = {"--mca", "a b", "'"};
  const JobLayout layout = job_layout(request);
  CHECK(test::launch_script_problem(request, layout).empty());
  const auto words = test::shell_words(mpirun_command(request, layout));
  REQUIRE(words);
  CHECK((*words)[8] == "/opt/long seq/longseq");
  CHECK((*words)[10] == "/s/it's $(id) `id` ; & | > *.yaml");
  // The job name is made of Slurm-safe characters whatever the scenario's name.
  CHECK(slurm_job_name("odd name; $(id)") == "longseq-odd_name____id_");
  CHECK(sbatch_script(request, layout).find("#SBATCH --job-name=longseq-odd_name____id_\n") != std::string::npos);
  // The checker itself fails on what the fix prevents: an unquoted construct or a bare newline.
  std::string problem;
  CHECK_FALSE(test::shell_words("mpirun x; touch pwned", &problem));
  CHECK(problem == "an unquoted shell character ';' at column 9");
  CHECK_FALSE(test::shell_words("a 'unterminated"));
  CHECK(test::shell_words("a 'b c' d\\ e")->size() == 3);
}
