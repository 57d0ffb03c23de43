// Job layout, mpirun command lines and Slurm batch scripts for `longseq launch`, against text
// written out by hand for several plans, and the bad layouts refused before anything runs.
#include <doctest/doctest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "executor/job_launch.hpp"
#include "models/config_error.hpp"

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
        "mpirun -np 4 --map-by ppr:4:node /bin/longseq run /s/tiny.yaml --sp 2 --json-out /out/run.json");
}

TEST_CASE("GPU ranks: the run goes to --device cuda and the batch script asks for a GPU per rank") {
  LaunchRequest request = request_for(8, 4, 4);
  request.device = "cuda";
  const JobLayout layout = job_layout(request);
  CHECK(mpirun_command(request, layout) ==
        "mpirun -np 8 --map-by ppr:4:node /bin/longseq run /s/tiny.yaml --sp 4 --device cuda --json-out /out/run.json");
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
        "mpirun -np 8 --map-by ppr:4:node /bin/longseq run /s/tiny.yaml --sp 4 --json-out /out/run.json\n");
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
        "/bin/longseq run /s/tiny.yaml --sp 4 --json-out /out/run.json");
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
  CHECK(mpirun_command(request, layout) == "mpirun -np 2 --map-by ppr:2:node /bin/longseq run /s/tiny.yaml --json-out /out/run.json");
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

TEST_CASE("shell quoting keeps safe words and quotes the rest") {
  CHECK(shell_quote("/a/b-c_d.yaml") == "/a/b-c_d.yaml");
  CHECK(shell_quote("with space") == "'with space'");
  CHECK(shell_quote("it's") == "'it'\\''s'");
  CHECK(shell_quote("") == "''");
  CHECK(shell_quote("$HOME") == "'$HOME'");
}
