#include "io/checked_input.hpp"

#include <charconv>
#include <cmath>
#include <fmt/format.h>

namespace longseq {

std::optional<double> decimal_parse(std::string_view text) {
  size_t i = 0;
  auto digits = [&] {
    const size_t start = i;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
    return i - start;
  };
  if (i < text.size() && (text[i] == '+' || text[i] == '-')) ++i;
  size_t mantissa_digits = digits();
  if (i < text.size() && text[i] == '.') {
    ++i;
    mantissa_digits += digits();
  }
  if (mantissa_digits == 0) return std::nullopt;
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    if (i < text.size() && (text[i] == '+' || text[i] == '-')) ++i;
    if (digits() == 0) return std::nullopt;
  }
  if (i != text.size()) return std::nullopt;
  // from_chars does not take a leading '+'; the pattern above already vetted the whole text.
  const std::string_view body = text[0] == '+' ? text.substr(1) : text;
  double value = 0;
  const auto [end, error] = std::from_chars(body.data(), body.data() + body.size(), value, std::chars_format::general);
  if (error != std::errc() || end != body.data() + body.size() || !std::isfinite(value)) return std::nullopt;
  return value;
}

std::optional<int64_t> whole_number(double value, int64_t minimum, int64_t maximum) {
  // 2^63 is exactly representable; every double below it converts to int64 without overflow.
  if (!std::isfinite(value) || value != std::floor(value) || value < -9223372036854775808.0 || value >= 9223372036854775808.0)
    return std::nullopt;
  const auto whole = static_cast<int64_t>(value);
  if (whole < minimum || whole > maximum) return std::nullopt;
  return whole;
}

std::optional<int64_t> integer_parse(std::string_view text, int64_t minimum, int64_t maximum) {
  const std::optional<double> value = decimal_parse(text);
  return value ? whole_number(*value, minimum, maximum) : std::nullopt;
}

nlohmann::json json_parse(const std::string& text, const std::string& source) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& error) {
    // parse_error (syntax), out_of_range (a number beyond double), type_error (invalid UTF-8).
    throw ConfigError(source, "", fmt::format("malformed JSON: {}", error.what()));
  }
}

std::string JsonView::child_path(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

void JsonView::fail(const std::string& reason) const { throw ConfigError(source_, path_, reason); }

namespace {

std::string kind_of(const nlohmann::json& value) {
  if (value.is_null()) return "null";
  if (value.is_string()) return "a string";
  if (value.is_boolean()) return "true/false";
  if (value.is_number()) return "a number";
  if (value.is_array()) return "a list";
  return "an object";
}

}  // namespace

bool JsonView::has(const std::string& key) const {
  return value_->is_object() && value_->contains(key) && !(*value_)[key].is_null();
}

JsonView JsonView::operator[](const std::string& key) const {
  if (!value_->is_object()) fail(fmt::format("expected an object with key '{}', got {}", key, kind_of(*value_)));
  const auto found = value_->find(key);
  if (found == value_->end()) throw ConfigError(source_, child_path(key), "required key is missing");
  return JsonView(*found, source_, child_path(key));
}

JsonView JsonView::operator[](size_t index) const {
  if (!value_->is_array()) fail(fmt::format("expected a list, got {}", kind_of(*value_)));
  const std::string element = fmt::format("{}[{}]", path_, index);
  if (index >= value_->size()) throw ConfigError(source_, element, "missing list element");
  return JsonView((*value_)[index], source_, element);
}

size_t JsonView::size() const {
  if (!value_->is_array()) fail(fmt::format("expected a list, got {}", kind_of(*value_)));
  return value_->size();
}

double JsonView::number() const {
  if (!value_->is_number()) fail(fmt::format("expected a number, got {}", kind_of(*value_)));
  const double value = value_->get<double>();
  if (!std::isfinite(value)) fail("expected a finite number");
  return value;
}

int64_t JsonView::integer(int64_t minimum, int64_t maximum) const {
  if (!value_->is_number()) fail(fmt::format("expected an integer, got {}", kind_of(*value_)));
  if (value_->is_number_unsigned() && value_->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    fail(fmt::format("{} is out of range [{}, {}]", value_->get<uint64_t>(), minimum, maximum));
  if (value_->is_number_integer()) {
    const int64_t value = value_->get<int64_t>();
    if (value < minimum || value > maximum) fail(fmt::format("{} is out of range [{}, {}]", value, minimum, maximum));
    return value;
  }
  const double value = value_->get<double>();
  const auto whole = whole_number(value, minimum, maximum);
  if (!whole) fail(fmt::format("expected a whole number in [{}, {}], got {}", minimum, maximum, value_->dump()));
  return *whole;
}

std::string JsonView::string() const {
  if (!value_->is_string()) fail(fmt::format("expected a string, got {}", kind_of(*value_)));
  return value_->get<std::string>();
}

bool JsonView::boolean() const {
  if (!value_->is_boolean()) fail(fmt::format("expected true or false, got {}", kind_of(*value_)));
  return value_->get<bool>();
}

double JsonView::number_or(const std::string& key, double default_value) const {
  return has(key) ? (*this)[key].number() : default_value;
}

int64_t JsonView::integer_or(const std::string& key, int64_t default_value) const {
  return has(key) ? (*this)[key].integer() : default_value;
}

std::string JsonView::string_or(const std::string& key, const std::string& default_value) const {
  return has(key) ? (*this)[key].string() : default_value;
}

}  // namespace longseq
