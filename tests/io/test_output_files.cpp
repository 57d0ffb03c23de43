// The output rules (io/output_files.hpp): every single-file output against an existing file,
// a FIFO, a character device, a symlink, a dangling link, a user's FILE.partial and the input it
// reads; every output directory against a user's files, files named like longseq's that its
// manifest does not list, and paths through "..".
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "io/config_error.hpp"
#include "io/output_files.hpp"

using namespace longseq;
namespace fs = std::filesystem;

namespace {

std::string file_text(const fs::path& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

// A fresh, empty directory for one test.
fs::path fresh_directory(const std::string& name) {
  const fs::path root = fs::temp_directory_path() / ("longseq-test-" + name + "-" + std::to_string(getpid()));
  fs::remove_all(root);
  fs::create_directories(root);
  return root;
}

}  // namespace

TEST_CASE("a new output file is written whole, and an existing one is refused without --overwrite") {
  const fs::path root = fresh_directory("output-file");
  const std::string path = (root / "plan.json").string();
  output_file_write(output_file_check(path, "--plan-out", false), "first\n");
  CHECK(file_text(path) == "first\n");
  CHECK_THROWS_WITH_AS(output_file_check(path, "--plan-out", false),
                       doctest::Contains(("--plan-out: " + path + " exists; give --overwrite to replace it (nothing was written)").c_str()), ConfigError);
  output_file_write(output_file_check(path, "--plan-out", true), "second\n");
  CHECK(file_text(path) == "second\n");
  // Nothing is left beside it: the temporary is hidden, exclusive, and gone after the move.
  CHECK(std::distance(fs::directory_iterator(root), fs::directory_iterator()) == 1);
  // A file that appears between the check and the write is kept, not replaced.
  const OutputFileTarget late = output_file_check((root / "late.json").string(), "--json-out", false);
  std::ofstream(root / "late.json") << "someone's";
  CHECK_THROWS_WITH_AS(output_file_write(late, "mine"), doctest::Contains("appeared while longseq worked; it was kept"), ConfigError);
  CHECK(file_text(root / "late.json") == "someone's");
  fs::remove_all(root);
}

TEST_CASE("a user's FILE.partial is never touched, even when it is a symlink into another file") {
  const fs::path root = fresh_directory("output-partial");
  std::ofstream(root / "victim") << "precious";
  fs::create_symlink(root / "victim", root / "out.json.partial");
  output_file_write(output_file_check((root / "out.json").string(), "--json-out", false), "{}\n");
  CHECK(file_text(root / "out.json") == "{}\n");
  CHECK(file_text(root / "victim") == "precious");
  CHECK(fs::is_symlink(root / "out.json.partial"));
  fs::remove_all(root);
}

TEST_CASE("a FIFO and a character device are written directly, never replaced by a regular file") {
  const fs::path root = fresh_directory("output-fifo");
  const fs::path fifo = root / "pipe";
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  std::string received;
  std::thread reader([&] { received = file_text(fifo); });
  const OutputFileTarget target = output_file_check(fifo.string(), "--emit-out", false);
  CHECK(target.kind == OutputFileKind::output_file_device);
  output_file_write(target, "through the pipe\n");
  reader.join();
  CHECK(received == "through the pipe\n");
  CHECK(fs::is_fifo(fifo));
  // /dev/null takes the bytes and stays a device; /dev/full reports the failed write by name.
  output_file_write(output_file_check("/dev/null", "--emit-out", false), "discarded");
  CHECK(fs::is_character_file("/dev/null"));
  if (fs::exists("/dev/full")) {
    CHECK_THROWS_WITH_AS(output_file_write(output_file_check("/dev/full", "--emit-out", false), "x"),
                         doctest::Contains("--emit-out: cannot write /dev/full: No space left on device"), ConfigError);
    CHECK(fs::is_character_file("/dev/full"));
  }
  fs::remove_all(root);
}

TEST_CASE("symlinks: to a file, the link stays and its target is replaced only with --overwrite, a dangling one is refused") {
  const fs::path root = fresh_directory("output-symlink");
  std::ofstream(root / "real.json") << "old";
  fs::create_symlink(root / "real.json", root / "link.json");
  CHECK_THROWS_AS(output_file_check((root / "link.json").string(), "--json-out", false), ConfigError);
  output_file_write(output_file_check((root / "link.json").string(), "--json-out", true), "new");
  CHECK(fs::is_symlink(root / "link.json"));
  CHECK(file_text(root / "real.json") == "new");
  fs::create_symlink(root / "missing", root / "dangling");
  CHECK_THROWS_WITH_AS(output_file_check((root / "dangling").string(), "--plan-out", true),
                       doctest::Contains("is a symbolic link to a missing file"), ConfigError);
  CHECK(!fs::exists(root / "missing"));
  fs::remove_all(root);
}

TEST_CASE("standard output under another name is written to the stream itself") {
  // /proc/self/fd/1 and /dev/stdout name whatever stdout is; the test's stdout is not replaced.
  struct stat before = {};
  REQUIRE(fstat(STDOUT_FILENO, &before) == 0);
  const OutputFileTarget target = output_file_check("/proc/self/fd/1", "--emit-out", false);
  CHECK(target.kind == OutputFileKind::output_file_standard_stream);
  CHECK(target.stream_fd == STDOUT_FILENO);
  output_file_write(target, "");
  struct stat after = {};
  REQUIRE(fstat(STDOUT_FILENO, &after) == 0);
  CHECK(before.st_ino == after.st_ino);
}

TEST_CASE("refused: empty text, a directory, a missing directory, and the input file itself even with --overwrite") {
  const fs::path root = fresh_directory("output-refused");
  CHECK_THROWS_WITH_AS(output_file_check("", "--emit-out", true), "--emit-out: is empty text; give a file path", ConfigError);
  CHECK_THROWS_WITH_AS(output_file_check(root.string(), "--emit-out", true), doctest::Contains("is a directory, not a file"), ConfigError);
  CHECK_THROWS_WITH_AS(output_file_check((root / "no" / "x.json").string(), "--emit-out", true),
                       doctest::Contains(("directory " + (root / "no").string() + " does not exist").c_str()), ConfigError);
  std::ofstream(root / "config.json") << "{\"model_type\": \"llama\"}";
  fs::create_symlink(root / "config.json", root / "alias.json");
  CHECK_THROWS_WITH_AS(output_file_check((root / "alias.json").string(), "--emit-out", true, {(root / "config.json").string()}),
                       doctest::Contains("which this command reads; longseq never writes over its input"), ConfigError);
  CHECK(file_text(root / "config.json") == "{\"model_type\": \"llama\"}");
  fs::remove_all(root);
}

TEST_CASE("output directories: a user's files, even ones named like longseq's, are refused, a manifest-listed rerun is not") {
  const fs::path root = fresh_directory("output-dirs");
  fs::create_directories(root / "full");
  std::ofstream(root / "full" / "notes.txt") << "mine";
  std::ofstream(root / "a-file") << "mine";
  const std::vector<std::string> own = {"results.json", "slurm-*"};
  CHECK_NOTHROW(output_directory_check((root / "new").string(), false, "--out", own));
  CHECK(!fs::exists(root / "new"));  // checking creates nothing
  CHECK_THROWS_WITH_AS(output_directory_check((root / "a-file").string(), true, "--out", own), doctest::Contains("is a file"), ConfigError);
  CHECK_THROWS_WITH_AS(output_directory_check((root / "full").string(), false, "--out", own),
                       doctest::Contains("holds files that longseq did not write (notes.txt); give --overwrite"), ConfigError);
  CHECK_NOTHROW(output_directory_check((root / "full").string(), true, "--out", own));
  // A user's results.json (no manifest lists it) is theirs, though longseq writes that name.
  fs::create_directories(root / "users");
  std::ofstream(root / "users" / "results.json") << "{\"mine\": 1}";
  CHECK_THROWS_WITH_AS(output_directory_check((root / "users").string(), false, "--out", own),
                       doctest::Contains("holds a file named like longseq's that longseq did not write (results.json)"), ConfigError);
  // What staging commits is listed in the manifest: a rerun replaces it without --overwrite.
  fs::path staging = staging_directory_create(root / "earlier");
  std::ofstream(staging / "results.json") << "{}";
  staging_directory_commit(staging, root / "earlier");
  output_directory_record(root / "earlier", {"slurm-*"});
  std::ofstream(root / "earlier" / "slurm-42.out") << "";
  CHECK_NOTHROW(output_directory_check((root / "earlier").string(), false, "--out", own));
  // --overwrite replaces longseq's names only; a user's file beside them is kept.
  staging = staging_directory_create(root / "full");
  CHECK(staging.parent_path() == fs::absolute(root));
  std::ofstream(staging / "results.json") << "{}";
  staging_directory_commit(staging, root / "full");
  CHECK(!fs::exists(staging));
  CHECK(fs::exists(root / "full" / "results.json"));
  CHECK(file_text(root / "full" / "notes.txt") == "mine");
  fs::remove_all(root);
}

TEST_CASE("output directories through '..' are checked where they are written") {
  // "x/.." is the directory above x: the check must read the directory the write will use.
  const fs::path root = fresh_directory("output-dotdot");
  std::ofstream(root / "results.json") << "{\"mine\": 1}";
  const std::string through = (root / "x" / "..").string();
  CHECK(output_directory_resolve(through) == root);
  CHECK_THROWS_WITH_AS(output_directory_check(through, false, "--out", {"results.json"}),
                       doctest::Contains(("(that is, " + root.string() + ") holds a file named like longseq's").c_str()), ConfigError);
  CHECK(file_text(root / "results.json") == "{\"mine\": 1}");
  // report's own names beside a user's files: a report.md the manifest does not list is refused.
  std::ofstream(root / "report.md") << "my notes";
  CHECK_THROWS_WITH_AS(output_names_check(root.string(), {"report.md", "figures"}, false, "report"),
                       doctest::Contains("holds report.md, which longseq did not write"), ConfigError);
  output_directory_record(root, {"report.md"});
  CHECK_NOTHROW(output_names_check(root.string(), {"report.md", "figures"}, false, "report"));
  fs::remove_all(root);
}
