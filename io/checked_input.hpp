// checked_input.hpp: reading numbers and JSON that a user (or a user's file) supplied, where every
// problem becomes a ConfigError naming the file or flag, the key and the reason.
//
// Why one place: the CLI catches ConfigError once and exits 2 with its one-line message. Any
// other exception escaping a reader (nlohmann's type_error on a wrong type, its out_of_range on
// 1e400, std::stod's on garbage) used to abort the program, and `get<int64_t>()` on a value of the
// wrong kind or size is silent nonsense. Readers go through these helpers, never through raw
// `get<T>()`, `value()`, std::stod or casts from double.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "io/config_error.hpp"

namespace longseq {

// A plain decimal number as people type it: [+-]digits[.digits][e[+-]digits] (".5" and "5." too).
// Refuses hex (0x10), inf/nan, empty text and surrounding whitespace, which std::stod accepts.
// nullopt when `text` is not such a number or is not finite in double (1e400).
std::optional<double> decimal_parse(std::string_view text);

// `value` as an int64 when it is a whole number inside [minimum, maximum]; nullopt otherwise
// (NaN, fractions and values beyond int64 included, where a static_cast is undefined).
std::optional<int64_t> whole_number(double value, int64_t minimum, int64_t maximum);

// A decimal (as decimal_parse) that is a whole number inside [minimum, maximum]: "1e3" is 1000;
// nullopt otherwise.
std::optional<int64_t> integer_parse(std::string_view text, int64_t minimum = INT64_MIN, int64_t maximum = INT64_MAX);

// Parses JSON; malformed text, numbers beyond double (1e400) and invalid UTF-8 throw
// ConfigError(source, "", reason).
nlohmann::json json_parse(const std::string& text, const std::string& source);

// A value inside a JSON document with the file and the dotted key path it came from, so that a
// missing key or a wrong type is reported as "FILE: key 'steps[2].loss': expected a number".
class JsonView {
 public:
  JsonView(const nlohmann::json& value, std::string source, std::string path = "")
      : value_(&value), source_(std::move(source)), path_(std::move(path)) {}

  const nlohmann::json& raw() const { return *value_; }
  const std::string& path() const { return path_; }
  const std::string& source() const { return source_; }
  bool is_object() const { return value_->is_object(); }
  // True when this is an object holding `key` with a non-null value.
  bool has(const std::string& key) const;
  // The member `key` of an object (it must be there).
  JsonView operator[](const std::string& key) const;
  // Element `index` of an array (it must be there).
  JsonView operator[](size_t index) const;
  size_t size() const;  // of an array; throws for anything else

  double number() const;  // finite
  int64_t integer(int64_t minimum = INT64_MIN, int64_t maximum = INT64_MAX) const;
  std::string string() const;
  bool boolean() const;
  // Optional members: the default when absent or null, else the member checked as above.
  double number_or(const std::string& key, double default_value) const;
  int64_t integer_or(const std::string& key, int64_t default_value) const;
  std::string string_or(const std::string& key, const std::string& default_value) const;

  // ConfigError naming this value's file and key path.
  [[noreturn]] void fail(const std::string& reason) const;

 private:
  std::string child_path(const std::string& key) const;
  const nlohmann::json* value_;
  std::string source_, path_;
};

}  // namespace longseq
