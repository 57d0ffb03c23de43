// export_structure.hpp: whether an export made from hostile input text has exactly the statements
// and keys of the same export made from benign text, each file read as its framework reads it:
// - JSON (DeepSpeed): parsed; the same document once every string value is blanked.
// - YAML (ArcticTraining, Accelerate): parsed; the same mappings, keys and sequence lengths (every
//   scalar value may differ), and the same '#' header lines before the first key.
// - Python (the HF Trainer, Unsloth), TOML (torchtitan): line by line; a comment line where the
//   benign file has one, else the same line once each "..." string literal is blanked.
// - shell (Megatron-DeepSpeed): line by line; a comment where the benign file has one, else the
//   same words as a POSIX shell reads them (tests/support/shell_words.hpp), a word differing only
//   where the benign word is a placeholder path.
// And for every kind: UTF-8, no carriage return, no Unicode line break (U+0085, U+2028, U+2029),
// no control character but the newline. Used by the export fuzz harness (tests/fuzz/fuzz_export.cpp)
// and the hostile-name tests (tests/reports/test_export_hostile.cpp).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>
#include <yaml-cpp/yaml.h>

#include "io/text_escape.hpp"
#include "reports/export.hpp"
#include "tests/support/shell_words.hpp"

namespace longseq::test {

enum class ExportFileKind { json, yaml, python, toml, shell };

inline ExportFileKind export_file_kind(const std::string& target, const std::string& suffix) {
  if (suffix == ".train.py") return ExportFileKind::python;  // the TRL script beside Accelerate's FSDP2 YAML
  if (!suffix.empty() || target == "deepspeed" || target == "usp") return ExportFileKind::json;
  if (target == "hf-trainer" || target == "unsloth") return ExportFileKind::python;
  if (target == "torchtitan") return ExportFileKind::toml;
  if (target == "megatron-deepspeed") return ExportFileKind::shell;
  return ExportFileKind::yaml;
}

// Empty when the text holds only UTF-8 (where `utf8_required`) and no character that ends or
// controls a line but '\n' (Unicode's line breaks only where `line_breaks_checked`). A shell script
// may hold any bytes inside a quoted word: a path that is not UTF-8 is still the path. A JSON
// string may hold U+2028 as it is (RFC 8259); JSON is checked by its parse.
inline std::string export_text_problem(const std::string& text, bool utf8_required = true, bool line_breaks_checked = true) {
  if (utf8_required && !utf8_valid(text)) return "not UTF-8";
  for (size_t i = 0; i < text.size(); ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if ((byte < 0x20 && byte != '\n') || byte == 0x7F) return "a control character (byte " + std::to_string(byte) + ") at offset " + std::to_string(i);
    if (!line_breaks_checked) continue;
    if (byte == 0xC2 && i + 1 < text.size() && static_cast<unsigned char>(text[i + 1]) >= 0x80 && static_cast<unsigned char>(text[i + 1]) <= 0x9F)
      return "a C1 control character at offset " + std::to_string(i);
    if (byte == 0xE2 && i + 2 < text.size() && static_cast<unsigned char>(text[i + 1]) == 0x80 &&
        (static_cast<unsigned char>(text[i + 2]) == 0xA8 || static_cast<unsigned char>(text[i + 2]) == 0xA9))
      return "a Unicode line or paragraph separator at offset " + std::to_string(i);
  }
  return "";
}

// A JSON document with every string value blanked (keys kept).
inline nlohmann::json json_strings_blanked(const nlohmann::json& value) {
  if (value.is_string()) return "";
  nlohmann::json result = value;
  if (value.is_object())
    for (auto& [key, member] : result.items()) member = json_strings_blanked(member);
  if (value.is_array())
    for (auto& element : result) element = json_strings_blanked(element);
  return result;
}

// The shape of a YAML node: mappings with their keys, sequences with their lengths; scalars as "s".
inline std::string yaml_shape(const YAML::Node& node) {
  if (node.IsMap()) {
    std::string shape = "{";
    for (const auto& entry : node) shape += entry.first.Scalar() + ":" + yaml_shape(entry.second) + ",";
    return shape + "}";
  }
  if (node.IsSequence()) {
    std::string shape = "[";
    for (const auto& element : node) shape += yaml_shape(element) + ",";
    return shape + "]";
  }
  return "s";
}

inline size_t leading_comment_lines(const std::vector<std::string>& lines) {
  size_t count = 0;
  while (count < lines.size() && !lines[count].empty() && lines[count][0] == '#') ++count;
  return count;
}

// The line with the content of each "..." literal (backslash escapes inside) removed.
inline std::string string_literals_blanked(const std::string& line) {
  std::string blanked;
  for (size_t i = 0; i < line.size(); ++i) {
    blanked.push_back(line[i]);
    if (line[i] != '"') continue;
    for (++i; i < line.size() && line[i] != '"'; ++i)
      if (line[i] == '\\') ++i;
    if (i < line.size()) blanked.push_back('"');
  }
  return blanked;
}

inline std::string file_structure_difference(ExportFileKind kind, const std::string& benign, const std::string& hostile) {
  if (const std::string problem = export_text_problem(hostile, kind != ExportFileKind::shell, kind != ExportFileKind::json); !problem.empty()) return problem;
  const std::vector<std::string> benign_lines = text_lines(benign), hostile_lines = text_lines(hostile);
  if (kind == ExportFileKind::json) {
    try {
      if (json_strings_blanked(nlohmann::json::parse(hostile)) != json_strings_blanked(nlohmann::json::parse(benign)))
        return "the JSON holds other keys or values than the benign file's";
    } catch (const nlohmann::json::exception& error) {
      return std::string("the JSON does not parse: ") + error.what();
    }
    return "";
  }
  if (kind == ExportFileKind::yaml) {
    try {
      if (yaml_shape(YAML::Load(hostile)) != yaml_shape(YAML::Load(benign))) return "the YAML holds other keys than the benign file's";
    } catch (const YAML::Exception& error) {
      return std::string("the YAML does not parse: ") + error.what();
    }
    if (leading_comment_lines(hostile_lines) != leading_comment_lines(benign_lines)) return "the YAML's comment header has other lines";
    return "";
  }
  if (hostile_lines.size() != benign_lines.size())
    return "the file has " + std::to_string(hostile_lines.size()) + " lines, the benign file " + std::to_string(benign_lines.size());
  for (size_t i = 0; i < hostile_lines.size(); ++i) {
    const std::string &line = hostile_lines[i], &expected = benign_lines[i];
    const std::string where = "line " + std::to_string(i + 1) + ": ";
    const bool comment = !expected.empty() && expected[0] == '#';
    if (comment) {
      if (line.empty() || line[0] != '#') return where + "a comment in the benign file is a statement here: " + line.substr(0, 80);
      if (!utf8_valid(line)) return where + "a comment that is not UTF-8";
      continue;
    }
    if (kind != ExportFileKind::shell) {
      if (string_literals_blanked(line) != string_literals_blanked(expected)) return where + "another statement: " + line.substr(0, 80);
      continue;
    }
    auto without_continuation = [](std::string text) {
      if (text.size() >= 2 && text.compare(text.size() - 2, 2, " \\") == 0) text.resize(text.size() - 2);
      return text;
    };
    std::string problem;
    const auto words = shell_words(without_continuation(line), &problem);
    const auto expected_words = shell_words(without_continuation(expected), &problem);
    if (!words || !expected_words) return where + problem;
    if (words->size() != expected_words->size()) return where + "another number of shell words: " + line.substr(0, 80);
    for (size_t w = 0; w < words->size(); ++w)
      if ((*words)[w] != (*expected_words)[w] && (*expected_words)[w].rfind("/b e/", 0) != 0 && (*expected_words)[w] != "ds_config.deepspeed.json")
        return where + "the shell word '" + (*words)[w].substr(0, 40) + "' differs from the benign file's";
  }
  return "";
}

// Empty when every file of `hostile` has the structure of the same file of `benign`.
inline std::string export_structure_difference(const std::string& target, const ExportedConfig& benign, const ExportedConfig& hostile) {
  if (benign.files.size() != hostile.files.size()) return "another number of files";
  for (size_t f = 0; f < hostile.files.size(); ++f) {
    const ExportFileKind kind = export_file_kind(target, hostile.files[f].suffix);
    if (std::string problem = file_structure_difference(kind, benign.files[f].text, hostile.files[f].text); !problem.empty())
      return (hostile.files[f].suffix.empty() ? "the main file: " : hostile.files[f].suffix + ": ") + problem;
  }
  return "";
}

}  // namespace longseq::test
