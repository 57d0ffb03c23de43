#include "io/yaml_reader.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
#include <fmt/format.h>
#include <map>
#include <sstream>
#include <yaml-cpp/eventhandler.h>

#include "io/text_escape.hpp"
#include "io/checked_input.hpp"

namespace longseq {

namespace {

// Notes the first alias (*name) of a document as the parser meets it. yaml-cpp's Load makes an
// aliased node one shared node, so 8 nested levels of `&a [*a, *a, ...]` are a few hundred bytes
// whose tree a walk visits exponentially often (the duplicate-key check below, any reader that lists
// a sequence): 6 s for 347 bytes, a day for the billion-laughs file. No card, profile or scenario
// needs an alias, so the events are read first (linear in the text) and an alias is refused.
class AliasFinder : public YAML::EventHandler {
 public:
  std::optional<YAML::Mark> first_alias;
  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override {
    if (!first_alias) first_alias = mark;
  }
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

}  // namespace

YamlReader::YamlReader(const std::string& text, std::string source_name)
    : source_name_(std::move(source_name)) {
  // YAML is UTF-8 text; a name that is not would stop every JSON and YAML file it reaches.
  if (const size_t bad = utf8_first_invalid_byte(text); bad != std::string::npos)
    throw ConfigError(source_name_, "", fmt::format("not UTF-8 text: byte {} (line {}) is not part of a UTF-8 character; save the file as UTF-8",
                                                    bad, 1 + std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(bad), '\n')));
  try {
    std::istringstream stream(text);
    YAML::Parser parser(stream);
    AliasFinder aliases;
    while (parser.HandleNextDocument(aliases)) {
    }
    if (aliases.first_alias)
      throw ConfigError(source_name_, "", fmt::format("an alias (*name) at line {}, column {}: longseq reads no YAML aliases; "
                                                      "write the value out", aliases.first_alias->line + 1, aliases.first_alias->column + 1));
    root_ = YAML::Load(text);
  } catch (const YAML::Exception& error) {
    throw ConfigError(source_name_, "",
                      fmt::format("malformed YAML at line {}, column {}: {}", error.mark.line + 1,
                                  error.mark.column + 1, error.msg));
  }
  if (!root_.IsMap()) throw ConfigError(source_name_, "", "expected a mapping of key: value at the top level");
  duplicate_keys_refuse(root_, "");
}

// YAML forbids a key twice in one mapping, but yaml-cpp keeps both and reads the first: a card
// with two `num_hidden_layers` lines would silently use one of them.
void YamlReader::duplicate_keys_refuse(const YAML::Node& node, const std::string& path) const {
  if (node.IsMap()) {
    std::map<std::string, int> first_line;
    for (const auto& entry : node) {
      const std::string key = entry.first.IsScalar() ? entry.first.Scalar() : std::string();
      const std::string name = path.empty() ? key : path + "." + key;
      const int line = entry.first.Mark().line + 1;
      if (!key.empty()) {
        const auto [found, inserted] = first_line.emplace(key, line);
        if (!inserted)
          throw ConfigError(source_name_, name, fmt::format("appears twice in one mapping (lines {} and {}); say it once", found->second, line));
      }
      duplicate_keys_refuse(entry.second, name);
    }
  } else if (node.IsSequence()) {
    for (size_t i = 0; i < node.size(); ++i) duplicate_keys_refuse(node[i], fmt::format("{}[{}]", path, i));
  }
}

YamlReader::YamlReader(YAML::Node mapping, std::string source_name, std::string key_prefix)
    : source_name_(std::move(source_name)), key_prefix_(std::move(key_prefix)), root_(std::move(mapping)) {
  if (!root_.IsMap()) throw ConfigError(source_name_, key_prefix_, "expected a mapping of key: value");
}

bool YamlReader::is_mapping(const std::string& key) const { return has(key) && root_[key].IsMap(); }

YamlReader YamlReader::get_section(const std::string& key) {
  read_keys_.insert(key);
  YAML::Node node = root_[key];
  if (!node) throw ConfigError(source_name_, key_name(key), "required section is missing");
  if (!node.IsMap()) throw ConfigError(source_name_, key_name(key), "expected a mapping of key: value");
  return YamlReader(node, source_name_, key_name(key));
}

std::vector<std::pair<YAML::Node, std::string>> YamlReader::get_sequence(const std::string& key) {
  read_keys_.insert(key);
  std::vector<std::pair<YAML::Node, std::string>> elements;
  YAML::Node node = root_[key];
  if (!node) return elements;
  if (!node.IsSequence()) throw ConfigError(source_name_, key_name(key), "expected a list ([a, b, ...])");
  for (size_t i = 0; i < node.size(); ++i) elements.emplace_back(node[i], fmt::format("{}[{}]", key_name(key), i));
  return elements;
}

std::string YamlReader::node_to_string(const YAML::Node& node, const std::string& name) const {
  if (!node.IsScalar()) throw ConfigError(source_name_, name, "expected a single value");
  return node.Scalar();
}

int64_t YamlReader::node_to_int(const YAML::Node& node, const std::string& name, int64_t minimum, int64_t maximum) const {
  const std::string text = node_to_string(node, name);
  const std::optional<int64_t> value = integer_parse(text);
  if (!value) throw ConfigError(source_name_, name, fmt::format("expected an integer, got '{}'", text));
  if (*value < minimum || *value > maximum)
    throw ConfigError(source_name_, name, fmt::format("{} is out of range [{}, {}]", *value, minimum, maximum));
  return *value;
}

std::string YamlReader::node_key(const YAML::Node& key) const {
  // `{[a, b]: 1}` or `? {x: 1}` make a key that is not text; name where it is, not a YAML exception.
  if (!key.IsScalar()) throw ConfigError(source_name_, key_prefix_, "a key is not plain text (a list or mapping used as a key)");
  return key.Scalar();
}

bool YamlReader::has(const std::string& key) const { return static_cast<bool>(root_[key]); }

YAML::Node YamlReader::require(const std::string& key) {
  read_keys_.insert(key);
  YAML::Node node = root_[key];
  if (!node) throw ConfigError(source_name_, key_name(key), "required key is missing");
  if (!node.IsScalar()) throw ConfigError(source_name_, key_name(key), "expected a single value");
  return node;
}

std::string YamlReader::get_string(const std::string& key) { return require(key).Scalar(); }

std::string YamlReader::get_string(const std::string& key, const std::string& default_value) {
  return has(key) ? get_string(key) : (read_keys_.insert(key), default_value);
}

// The whole scalar must be a finite decimal number; `what` names the expected kind in the message.
double YamlReader::get_number(const std::string& key, const char* what) {
  const std::string text = require(key).Scalar();
  const std::optional<double> value = decimal_parse(text);
  if (!value) throw ConfigError(source_name_, key_name(key), fmt::format("expected {}, got '{}'", what, text));
  return *value;
}

int64_t YamlReader::get_int(const std::string& key, int64_t minimum, int64_t maximum) {
  // Accept 1e5 and 5e8 as DeepSpeed configs write them, but only when the value is whole.
  const double value = get_number(key, "an integer");
  const std::optional<int64_t> whole = whole_number(value, INT64_MIN, INT64_MAX);
  if (!whole) throw ConfigError(source_name_, key_name(key), fmt::format("expected an integer, got {}", value));
  if (*whole < minimum || *whole > maximum)
    throw ConfigError(source_name_, key_name(key), fmt::format("{} is out of range [{}, {}]", *whole, minimum, maximum));
  return *whole;
}

int64_t YamlReader::get_int(const std::string& key, int64_t minimum, int64_t maximum, int64_t default_value) {
  return has(key) ? get_int(key, minimum, maximum) : (read_keys_.insert(key), default_value);
}

double YamlReader::get_double(const std::string& key, double minimum, double maximum) {
  const double value = get_number(key, "a number");
  if (value < minimum || value > maximum)
    throw ConfigError(source_name_, key_name(key), fmt::format("{} is out of range [{}, {}]", value, minimum, maximum));
  return value;
}

double YamlReader::get_double(const std::string& key, double minimum, double maximum, double default_value) {
  return has(key) ? get_double(key, minimum, maximum) : (read_keys_.insert(key), default_value);
}

bool YamlReader::get_bool(const std::string& key) {
  const std::string text = require(key).Scalar();
  if (text == "true") return true;
  if (text == "false") return false;
  throw ConfigError(source_name_, key_name(key), fmt::format("expected true or false, got '{}'", text));
}

bool YamlReader::get_bool(const std::string& key, bool default_value) {
  return has(key) ? get_bool(key) : (read_keys_.insert(key), default_value);
}

void YamlReader::reject_unknown_keys() const {
  for (const auto& entry : root_) {
    const std::string key = node_key(entry.first);
    if (!read_keys_.count(key)) throw ConfigError(source_name_, key_name(key), "unknown key");
  }
}

}  // namespace longseq
