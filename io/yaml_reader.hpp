// yaml_reader.hpp: strict reading of a YAML mapping into a plain struct.
//
// Invariants: a key the struct does not know is an error (typos must not silently fall back to
// defaults); a missing required key, a wrong type or an out-of-range number is an error naming
// the file and the key. Used by model cards, hardware cards and runtime profiles.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "io/config_error.hpp"

namespace longseq {

class YamlReader {
 public:
  // Parses `text` (the content of `source_name`); throws ConfigError on malformed YAML.
  YamlReader(const std::string& text, std::string source_name);
  // A nested mapping; its keys are reported as "prefix.key".
  YamlReader(YAML::Node mapping, std::string source_name, std::string key_prefix);

  const std::string& source_name() const { return source_name_; }
  bool has(const std::string& key) const;
  bool is_mapping(const std::string& key) const;

  std::string get_string(const std::string& key);
  std::string get_string(const std::string& key, const std::string& default_value);
  // Integers must be whole numbers within [minimum, maximum].
  int64_t get_int(const std::string& key, int64_t minimum, int64_t maximum);
  int64_t get_int(const std::string& key, int64_t minimum, int64_t maximum, int64_t default_value);
  double get_double(const std::string& key, double minimum, double maximum);
  double get_double(const std::string& key, double minimum, double maximum, double default_value);
  bool get_bool(const std::string& key);
  bool get_bool(const std::string& key, bool default_value);

  // The mapping under `key` (which must be a mapping).
  YamlReader get_section(const std::string& key);
  // The sequence under `key`: empty when absent; each element handed back as a node together
  // with its dotted name ("sweep.gpus[2]") for messages.
  std::vector<std::pair<YAML::Node, std::string>> get_sequence(const std::string& key);
  // Whole-token conversions for list elements and scalars given as nodes.
  int64_t node_to_int(const YAML::Node& node, const std::string& name, int64_t minimum, int64_t maximum) const;
  std::string node_to_string(const YAML::Node& node, const std::string& name) const;
  // The text of a mapping key; throws ConfigError for a key that is a list or a mapping.
  std::string node_key(const YAML::Node& key) const;
  std::string key_name(const std::string& key) const { return key_prefix_.empty() ? key : key_prefix_ + "." + key; }

  // Call after reading every field: throws on any key that was never read.
  void reject_unknown_keys() const;

 private:
  // Throws ConfigError naming the first key that appears twice in one mapping, anywhere under `node`.
  void duplicate_keys_refuse(const YAML::Node& node, const std::string& path) const;
  YAML::Node require(const std::string& key);
  double get_number(const std::string& key, const char* what);
  std::string source_name_;
  std::string key_prefix_;
  YAML::Node root_;
  std::set<std::string> read_keys_;
};

}  // namespace longseq
