// Scenario files, sweeps, their outputs and the framework configs a plan is exported as.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <unistd.h>
#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include "models/config_error.hpp"
#include "models/model_loader.hpp"
#include "planner/scenario.hpp"
#include "reports/export.hpp"
#include "reports/report.hpp"
#include "reports/sweep_output.hpp"

using namespace longseq;
namespace fs = std::filesystem;

namespace {

const std::string kScenarios = LONGSEQ_SCENARIOS_DIR;
const std::string kData = LONGSEQ_TEST_DATA_DIR;

fs::path temp_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("longseq-test-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  return dir;
}

std::string error_of(const std::string& path) {
  try {
    scenario_load(path);
  } catch (const ConfigError& error) {
    return error.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("every scenario in scenarios/ parses, sweeps, and writes the expected columns") {
  int scenarios = 0;
  for (const auto& entry : fs::directory_iterator(kScenarios)) {
    if (entry.path().extension() != ".yaml") continue;
    ++scenarios;
    CAPTURE(entry.path().string());
    const Scenario scenario = scenario_load(entry.path().string());
    CHECK_FALSE(scenario.reproduces.empty());  // each names the paper table or figure
    const std::vector<SweepRow> rows = scenario_run(scenario);
    REQUIRE_FALSE(rows.empty());
    int predicted = 0;
    for (const auto& row : rows) predicted += row.error.empty();
    CHECK(predicted > 0);
    const fs::path out = temp_dir(scenario.name);
    sweep_results_write(scenario, rows, out.string());
    std::ifstream csv(out / "results.csv");
    std::string header;
    std::getline(csv, header);
    std::string expected;
    for (const auto& column : sweep_columns()) expected += (expected.empty() ? "" : ",") + column;
    CHECK(header == expected);
    size_t lines = 0;
    for (std::string line; std::getline(csv, line);) ++lines;
    CHECK(lines == rows.size());
    const auto json = nlohmann::json::parse(file_read_text((out / "results.json").string()));
    CHECK(json["rows"].size() == rows.size());
    CHECK(json["kind"] == "prediction");
    CHECK(fs::exists(out / "results.md"));
    fs::remove_all(out);
  }
  CHECK(scenarios >= 8);
}

TEST_CASE("the ALST scaling scenario predicts the three published points within 10%") {
  const Scenario scenario = scenario_load(kScenarios + "/alst-llama-3.1-8b-scaling.yaml");
  int compared = 0;
  for (const auto& row : scenario_run(scenario)) {
    if (!row.published) continue;
    ++compared;
    CAPTURE(row.gpus);
    CHECK(static_cast<double>(row.seqlen) == doctest::Approx(*row.published).epsilon(0.10));
  }
  CHECK(compared == 3);
}

TEST_CASE("bad scenario files name the file, the key and the reason") {
  const std::string unknown = error_of(kData + "/scenarios/unknown-key.yaml");
  CHECK(unknown.find("unknown-key.yaml: key 'plan.tiled_mpl': unknown key") != std::string::npos);
  const std::string wrong = error_of(kData + "/scenarios/wrong-type.yaml");
  CHECK(wrong.find("wrong-type.yaml: key 'sweep.gpus[1]': expected an integer, got 'eight'") != std::string::npos);
  const std::string missing = error_of(kData + "/scenarios/missing-model.yaml");
  CHECK(missing.find("missing-model.yaml: key 'model': required key is missing") != std::string::npos);
  const std::string empty = error_of(kData + "/scenarios/empty-sweep.yaml");
  CHECK(empty.find("empty-sweep.yaml: key 'sweep': is empty") != std::string::npos);
  CHECK(error_of(kData + "/scenarios/does-not-exist.yaml").find("cannot open file") != std::string::npos);
  CHECK_THROWS_WITH_AS(scenario_from_text("name: x\nmodel: m\ncluster: {gpu: g}\nsweep: {gpus: [1]}\noutput: {figures: [pie]}\n", "x.yaml"),
                       doctest::Contains("x.yaml: key 'output.figures[0]': unknown figure 'pie'"), ConfigError);
}

TEST_CASE("a failed sweep writes nothing; a rerun replaces the old results whole") {
  const Scenario bad = scenario_load(kData + "/scenarios/unknown-model.yaml");
  CHECK_THROWS_AS(scenario_run(bad), ConfigError);  // the model is resolved before any work
  const Scenario scenario = scenario_load(kScenarios + "/alst-ablation-8xh100.yaml");
  const fs::path out = temp_dir("replace");
  fs::create_directories(out);
  std::ofstream(out / "stale.txt") << "old";
  sweep_results_write(scenario, scenario_run(scenario), out.string());
  CHECK_FALSE(fs::exists(out / "stale.txt"));
  CHECK(fs::exists(out / "results.csv"));
  for (const auto& entry : fs::directory_iterator(out.parent_path()))
    CHECK(entry.path().filename().string().find(out.filename().string() + ".partial") == std::string::npos);
  fs::remove_all(out);
}

TEST_CASE("an exported DeepSpeed config is JSON carrying the plan's settings") {
  const ClusterSpec cluster = cluster_make(hardware_card_load("h100-sxm-80gb"), 16, 0, 0, 0);
  PlanOptions plan = PlanOptions::alst(8);
  plan.offload_params = true;
  const ExportedConfig exported = deepspeed_config_emit(plan, cluster, runtime_profile_load("deepspeed-hf"));
  const auto config = nlohmann::json::parse(exported.text);
  CHECK(config["zero_optimization"]["stage"] == 3);
  CHECK(config["zero_optimization"]["offload_optimizer"]["device"] == "cpu");
  CHECK(config["zero_optimization"]["offload_param"]["device"] == "cpu");
  CHECK(config["sequence_parallel_size"] == 8);
  CHECK(config["train_batch_size"] == 2);  // dp = 16 / 8
  CHECK(config["bf16"]["enabled"] == true);
  CHECK(config["activation_checkpointing"]["cpu_checkpointing"] == true);
  CHECK(exported.notes.size() == 4);  // checkpointing, its offload, tiled MLP, tiled loss live outside the file
}

TEST_CASE("an exported Accelerate config is YAML with the Ulysses parallelism_config keys") {
  const ClusterSpec cluster = cluster_make(hardware_card_load("h100-sxm-80gb"), 16, 0, 0, 0);
  PlanOptions plan = PlanOptions::alst(4);
  plan.fpdt = true;
  plan.tiled_mlp = plan.tiled_loss = false;
  const ExportedConfig exported = accelerate_config_emit(plan, cluster, runtime_profile_load("deepspeed-hf"));
  const YAML::Node config = YAML::Load(exported.text);
  CHECK(config["distributed_type"].as<std::string>() == "DEEPSPEED");
  CHECK(config["num_processes"].as<int>() == 16);
  CHECK(config["num_machines"].as<int>() == 2);
  CHECK(config["deepspeed_config"]["zero_stage"].as<int>() == 3);
  CHECK(config["deepspeed_config"]["offload_optimizer_device"].as<std::string>() == "cpu");
  CHECK(config["parallelism_config"]["parallelism_config_sp_size"].as<int>() == 4);
  CHECK(config["parallelism_config"]["parallelism_config_dp_shard_size"].as<int>() == 4);
  CHECK(config["parallelism_config"]["parallelism_config_sp_backend"].as<std::string>() == "deepspeed");
  CHECK(exported.text.find("# not expressible here: FPDT") != std::string::npos);
}

TEST_CASE("run report: a GPU run's profile and the memory outside its arena are reported beside the arena's peak") {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("longseq-run-report-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const nlohmann::json run = {{"model", "Llama-3.1-8B"}, {"seqlen", 32768}, {"ranks", 1}, {"sp", 1}, {"dp", 1}, {"plan", "sp=1"},
                              {"profile", "native-cuda"}, {"measured_on", "gpu-node (GPU NVIDIA H100, bf16), 1 rank(s)"},
                              {"steps", {{{"step", 1}, {"loss", 12.0}, {"seconds", 2.0}, {"tokens_per_s", 16384.0}}}},
                              {"measured_peak_mib", 1000.0}, {"predicted_peak_mib", 1010.0}, {"predicted_peak_moment", "backward"},
                              {"measured_outside_arena_mib", 1500.0}, {"predicted_outside_arena_mib", 1056.0}};
  std::ofstream(dir / "run.json") << run.dump();
  report_write(dir.string(), "true");  // a gnuplot that draws nothing: the report's text is under test
  std::ifstream stream(dir / "report.md");
  const std::string report((std::istreambuf_iterator<char>(stream)), std::istreambuf_iterator<char>());
  CHECK(report.find("runtime profile `native-cuda`") != std::string::npos);
  CHECK(report.find("| 0 | 1000.000 | +1.00% |") != std::string::npos);
  CHECK(report.find("MEASURED 1500.0 MiB (cudaMemGetInfo after the last step, rank 0), PREDICTED 1056.0 MiB") != std::string::npos);
  std::filesystem::remove_all(dir);
}
