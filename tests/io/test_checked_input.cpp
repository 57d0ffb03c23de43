// Checked reading of numbers and JSON (io/checked_input.hpp), the shell-free process runner
// (io/process.hpp), and sequence lengths at the edges.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "io/checked_input.hpp"
#include "io/process.hpp"
#include "planner/units.hpp"

using namespace longseq;
namespace fs = std::filesystem;

TEST_CASE("decimal_parse takes plain decimals only") {
  CHECK(decimal_parse("42") == 42.0);
  CHECK(decimal_parse("-1.5e3") == -1500.0);
  CHECK(decimal_parse("+.5") == 0.5);
  CHECK(decimal_parse("5.") == 5.0);
  for (const char* text : {"", " 1", "1 ", "0x10", "inf", "nan", "1e", "1e400", "--1", ".", "1.2.3", "e5", "1,5"})
    CHECK_MESSAGE(!decimal_parse(text), text);
}

TEST_CASE("whole_number refuses what a cast would get wrong") {
  CHECK(whole_number(3.0, 1, 10) == 3);
  CHECK(!whole_number(3.5, 1, 10));
  CHECK(!whole_number(std::nan(""), INT64_MIN, INT64_MAX));
  CHECK(!whole_number(9.3e18, INT64_MIN, INT64_MAX));  // beyond int64: a static_cast is undefined
  CHECK(whole_number(-9223372036854775808.0, INT64_MIN, INT64_MAX) == INT64_MIN);
  CHECK(!whole_number(11.0, 1, 10));
}

TEST_CASE("JsonView names the file and the key path of what is wrong") {
  const nlohmann::json document = json_parse(R"({"steps": [{"step": "one"}], "vocab": 18446744073709551615, "x": 2.5})", "run.json");
  const JsonView run(document, "run.json");
  CHECK_THROWS_WITH_AS(run["steps"][0]["step"].integer(), "run.json: key 'steps[0].step': expected an integer, got a string", ConfigError);
  CHECK_THROWS_WITH_AS(run["steps"][0]["loss"], "run.json: key 'steps[0].loss': required key is missing", ConfigError);
  CHECK_THROWS_WITH_AS(run["steps"][3], "run.json: key 'steps[3]': missing list element", ConfigError);
  CHECK_THROWS_WITH_AS(run["vocab"].integer(), doctest::Contains("18446744073709551615 is out of range"), ConfigError);
  CHECK_THROWS_WITH_AS(run["x"].integer(), doctest::Contains("expected a whole number"), ConfigError);
  CHECK(run["x"].number() == 2.5);
  CHECK(run.number_or("absent", 7.0) == 7.0);
  CHECK_THROWS_WITH_AS(json_parse("[1e400]", "f.json"), doctest::Contains("f.json: malformed JSON"), ConfigError);
  CHECK_THROWS_AS(json_parse("\"\xff\"", "f.json"), ConfigError);  // invalid UTF-8
}

TEST_CASE("sequence lengths: exact decimal arithmetic, and what is printed parses back") {
  CHECK(seqlen_parse("32.212G", "--seqlen") == 32'212'000'000);  // 32.212 * 1e9 is not whole in double
  CHECK(seqlen_parse("8.623G", "--seqlen") == 8'623'000'000);
  CHECK(seqlen_parse("1.5e3K", "--seqlen") == 1'500'000);
  CHECK(seqlen_parse("0.5Ki", "--seqlen") == 512);
  CHECK(seqlen_parse("10000000000000", "--seqlen") == 10'000'000'000'000);
  CHECK_THROWS_WITH_AS(seqlen_parse("0x10000", "--seqlen"), doctest::Contains("not a plain decimal"), ConfigError);
  CHECK_THROWS_WITH_AS(seqlen_parse("", "--seqlen"), doctest::Contains("no number"), ConfigError);
  CHECK_THROWS_WITH_AS(seqlen_parse("10000000000001", "--seqlen"), doctest::Contains("10^13"), ConfigError);
  CHECK_THROWS_WITH_AS(seqlen_parse("0.3Ki", "--seqlen"), doctest::Contains("whole number"), ConfigError);  // 307.2
  std::mt19937_64 generator(7);
  std::uniform_real_distribution<double> log_tokens(0.0, 13.0);
  for (int i = 0; i < 20000; ++i) {
    const auto tokens = static_cast<int64_t>(std::pow(10.0, log_tokens(generator)));
    if (tokens < 1) continue;
    const std::string text = seqlen_format(tokens);
    const int64_t again = seqlen_parse(text, "formatted");  // throws if it does not parse
    REQUIRE_MESSAGE(std::fabs(static_cast<double>(again - tokens)) <= 5e-4 * static_cast<double>(tokens) + 1, text);
  }
}

TEST_CASE("process_run passes arguments as they are: no shell") {
  const fs::path root = fs::temp_directory_path() / "longseq-test-process";
  fs::remove_all(root);
  fs::create_directories(root);
  std::string out;
  ProcessOptions options;
  options.captured_stdout = &out;
  options.working_directory = root.string();
  const ProcessResult result = process_run({"echo", "$(touch pwned)", "`touch pwned`", "a b"}, options);
  CHECK(result.exit_code == 0);
  CHECK(out == "$(touch pwned) `touch pwned` a b\n");
  CHECK(!fs::exists(root / "pwned"));
  CHECK(process_run({"false"}).exit_code == 1);
  CHECK(process_run({"/no/such/program"}).exit_code == 127);
  fs::remove_all(root);
}
