// Reading published points and scoring predictions against them.
#include <doctest/doctest.h>

#include <string>

#include "models/config_error.hpp"
#include "models/model_loader.hpp"
#include "planner/validation.hpp"

using namespace longseq;

namespace {
const std::string kHeader =
    "# a comment\nsource,model,gpus,gpu_type,gpu_mem_gib,nodes,gpus_per_node,host_mem_gb,features,sp,seqlen,seqlen_fail,"
    "peak_mem_gib,iter_time_s,tflops,mfu,notes\n";
}

TEST_CASE("the project's copy of published_points.csv parses completely") {
  const auto points = published_points_parse(file_read_text(std::string(LONGSEQ_TEST_DATA_DIR) + "/published_points.csv"), "p.csv");
  CHECK(points.size() == 36);
  CHECK(points.front().model == "Llama-3.1-8B-Instruct");
  CHECK(points.front().iter_time_s.value() == 26);
  CHECK(points.front().line > 1);  // after the comment header
}

TEST_CASE("a malformed row names the file, the line and the column") {
  const std::string bad_number = kHeader + "x,Llama-3.1-8B,eight,H100-SXM,80,1,8,1900,zero3,1,32000,,,,,,\n";
  CHECK_THROWS_WITH_AS(published_points_parse(bad_number, "p.csv"), doctest::Contains("p.csv:3: key 'gpus'"), ConfigError);
  const std::string short_row = kHeader + "x,Llama-3.1-8B,8,H100-SXM,80\n";
  CHECK_THROWS_WITH_AS(published_points_parse(short_row, "p.csv"), doctest::Contains("p.csv:3: 5 fields"), ConfigError);
  const std::string unterminated = kHeader + "x,\"Llama,8,H100-SXM,80,1,8,1900,zero3,1,32000,,,,,,\n";
  CHECK_THROWS_WITH_AS(published_points_parse(unterminated, "p.csv"), doctest::Contains("unterminated"), ConfigError);
  CHECK_THROWS_WITH_AS(published_points_parse("a,b\n1,2\n", "p.csv"), doctest::Contains("header lacks"), ConfigError);
  // Quoted commas are one field.
  const auto quoted = published_points_parse(kHeader + "x,Llama-3.1-8B,8,H100-SXM,80,1,8,1900,zero3,1,32000,,,,,,\"a, b\"\n", "p.csv");
  CHECK(quoted.at(0).notes == "a, b");
}

TEST_CASE("a predicted maximum inside the published bracket has zero error, outside it the nearer bound counts") {
  const std::string profile = "deepspeed-hf";
  auto row = [&](const std::string& seqlen, const std::string& fail) {
    return published_points_parse(kHeader + "x,Llama-3.1-8B,8,H100-SXM,80,1,8,1900,"
                                            "zero3+ac+fa2+opt_offload+tiled_loss+ulysses+tiled_mlp+ckpt_offload,8," +
                                      seqlen + "," + fail + ",,,,,\n",
                                  "p.csv")
        .at(0);
  };
  const PointValidation wide = point_validate(row("1000000", "100000000"), profile);
  REQUIRE(wide.figures.size() == 1);
  CHECK(wide.figures[0].predicted > 1'000'000);
  CHECK(wide.figures[0].relative_error == 0);
  const PointValidation below = point_validate(row("100000000", "200000000"), profile);
  CHECK(below.figures[0].relative_error == doctest::Approx(below.figures[0].predicted / 1e8 - 1));
  const PointValidation above = point_validate(row("1000", "2000"), profile);
  CHECK(above.figures[0].relative_error == doctest::Approx(above.figures[0].predicted / 2000 - 1));
}

TEST_CASE("rows the model cannot express are skipped with the reason") {
  const std::string profile;  // per row
  auto reason = [&](const std::string& model, const std::string& gpu, const std::string& features, const std::string& sp) {
    const auto point = published_points_parse(kHeader + "x," + model + ",8," + gpu + ",80,2,4,1000," + features + "," + sp +
                                                  ",32768,,,,,,\n",
                                              "p.csv")
                           .at(0);
    return point_validate(point, profile).skipped_reason;
  };
  CHECK(reason("Llama-3-8B", "A100", "tp+ac", "1").find("tensor parallelism") != std::string::npos);
  CHECK(reason("Llama-3-8B", "A100", "zero3+warp_drive", "1").find("unknown feature 'warp_drive'") != std::string::npos);
  CHECK(reason("Mystery-9B", "A100", "zero3", "1").find("no model card") != std::string::npos);
  CHECK(reason("Llama-3-8B", "TPU", "zero3", "1").find("no hardware card") != std::string::npos);
  CHECK(reason("Llama-3-8B", "A100", "zero3+ac", "8").find("without the ulysses feature") != std::string::npos);
  CHECK(reason("Llama-3-8B", "A100", "zero3+ac+ulysses", "8").empty());
}

TEST_CASE("the summary reports the median and the worst absolute error per figure") {
  std::vector<PointValidation> validations(3);
  const double errors[] = {-0.10, 0.30, 0.05};
  for (int i = 0; i < 3; ++i) {
    validations[i].point.line = 10 + i;
    validations[i].figures.push_back({FigureKind::figure_iteration_time, 1, 0, 1 + errors[i], errors[i]});
  }
  const auto summary = validation_summarize(validations);
  REQUIRE(summary.size() == 1);
  CHECK(summary[0].count == 3);
  CHECK(summary[0].median_abs_error == doctest::Approx(0.10));
  CHECK(summary[0].worst_abs_error == doctest::Approx(0.30));
  CHECK(summary[0].worst_line == 11);
}
