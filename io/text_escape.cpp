#include "io/text_escape.hpp"

#include <cstdint>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace longseq {

namespace {

constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";  // U+FFFD

// The length of the well-formed UTF-8 sequence at text[at] (1-4), or 0 when the bytes there are
// not one (Unicode 15, table 3-7: the exact ranges of each byte).
size_t utf8_sequence_length(std::string_view text, size_t at) {
  auto byte = [&](size_t i) { return at + i < text.size() ? static_cast<uint8_t>(text[at + i]) : uint8_t{0}; };
  auto continuation = [&](size_t i, uint8_t low = 0x80, uint8_t high = 0xBF) { return byte(i) >= low && byte(i) <= high; };
  const uint8_t lead = byte(0);
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return continuation(1) ? 2 : 0;
  if (lead == 0xE0) return continuation(1, 0xA0) && continuation(2) ? 3 : 0;
  if ((lead >= 0xE1 && lead <= 0xEC) || lead == 0xEE || lead == 0xEF) return continuation(1) && continuation(2) ? 3 : 0;
  if (lead == 0xED) return continuation(1, 0x80, 0x9F) && continuation(2) ? 3 : 0;  // no surrogates
  if (lead == 0xF0) return continuation(1, 0x90) && continuation(2) && continuation(3) ? 4 : 0;
  if (lead >= 0xF1 && lead <= 0xF3) return continuation(1) && continuation(2) && continuation(3) ? 4 : 0;
  if (lead == 0xF4) return continuation(1, 0x80, 0x8F) && continuation(2) && continuation(3) ? 4 : 0;
  return 0;
}

uint32_t code_point(std::string_view sequence) {
  const auto byte = [&](size_t i) { return static_cast<uint32_t>(static_cast<uint8_t>(sequence[i])); };
  switch (sequence.size()) {
    case 1: return byte(0);
    case 2: return (byte(0) & 0x1Fu) << 6 | (byte(1) & 0x3Fu);
    case 3: return (byte(0) & 0x0Fu) << 12 | (byte(1) & 0x3Fu) << 6 | (byte(2) & 0x3Fu);
    default: return (byte(0) & 0x07u) << 18 | (byte(1) & 0x3Fu) << 12 | (byte(2) & 0x3Fu) << 6 | (byte(3) & 0x3Fu);
  }
}

// Calls visit(sequence, code point) for each code point of utf8_repaired(text).
template <typename Visit>
void code_points_visit(std::string_view text, Visit visit) {
  for (size_t at = 0; at < text.size();) {
    const size_t length = utf8_sequence_length(text, at);
    if (length == 0) {
      visit(kReplacementCharacter, uint32_t{0xFFFD});
      ++at;
    } else {
      const std::string_view sequence = text.substr(at, length);
      visit(sequence, code_point(sequence));
      at += length;
    }
  }
}

// Characters a line-oriented reader may take as the end of a line or a control: C0, DEL, C1 (U+0085
// NEL among them) and the Unicode line and paragraph separators (YAML 1.1 breaks lines at both).
bool is_control_or_line_break(uint32_t point) { return point < 0x20 || (point >= 0x7F && point <= 0x9F) || point == 0x2028 || point == 0x2029; }

}  // namespace

size_t utf8_first_invalid_byte(std::string_view text) {
  for (size_t at = 0; at < text.size();) {
    const size_t length = utf8_sequence_length(text, at);
    if (length == 0) return at;
    at += length;
  }
  return std::string_view::npos;
}

bool utf8_valid(std::string_view text) { return utf8_first_invalid_byte(text) == std::string_view::npos; }

std::string utf8_repaired(std::string_view text) {
  std::string repaired;
  repaired.reserve(text.size());
  code_points_visit(text, [&](std::string_view sequence, uint32_t) { repaired.append(sequence); });
  return repaired;
}

std::string one_line_text(std::string_view text) {
  std::string line;
  line.reserve(text.size());
  code_points_visit(text, [&](std::string_view sequence, uint32_t point) {
    if (!is_control_or_line_break(point)) line.append(sequence);
    else if (point == '\n') line.append("\\n");
    else if (point == '\r') line.append("\\r");
    else if (point == '\t') line.append("\\t");
    else if (point < 0x100) line.append(fmt::format("\\x{:02x}", point));
    else line.append(fmt::format("\\u{:04x}", point));
  });
  return line;
}

std::string python_string_literal(std::string_view text) {
  // Not JSON's escaping: Python keeps a JSON surrogate pair as two code points, so a point past
  // U+FFFF is written \UXXXXXXXX. Everything outside printable ASCII is escaped, so the literal is
  // one line of ASCII whatever the source file's encoding declaration says.
  std::string literal = "\"";
  code_points_visit(text, [&](std::string_view sequence, uint32_t point) {
    if (point == '"') literal.append("\\\"");
    else if (point == '\\') literal.append("\\\\");
    else if (point >= 0x20 && point < 0x7F) literal.append(sequence);
    else if (point < 0x100) literal.append(fmt::format("\\x{:02x}", point));
    else if (point < 0x10000) literal.append(fmt::format("\\u{:04x}", point));
    else literal.append(fmt::format("\\U{:08x}", point));
  });
  literal.push_back('"');
  return literal;
}

std::string toml_basic_string(std::string_view text) {
  // TOML 1.0 basic strings: any Unicode but '"', '\' and the control characters other than tab,
  // which must be escaped; \uXXXX is a scalar value. The line breaks YAML knows are escaped too, so
  // the file reads as one line per key in any editor.
  std::string literal = "\"";
  code_points_visit(text, [&](std::string_view sequence, uint32_t point) {
    if (point == '"') literal.append("\\\"");
    else if (point == '\\') literal.append("\\\\");
    else if (is_control_or_line_break(point)) literal.append(fmt::format("\\u{:04X}", point));
    else literal.append(sequence);
  });
  literal.push_back('"');
  return literal;
}

std::string shell_quote(std::string_view word) {
  if (!word.empty() && word.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=:,+%@") == std::string::npos)
    return std::string(word);
  std::string quoted = "'";
  for (char c : word) {
    if (c == '\'') quoted.append("'\\''");  // close the quote, an escaped quote, reopen
    else quoted.push_back(c);
  }
  quoted.push_back('\'');
  return quoted;
}

std::string json_text(const nlohmann::json& document, int indent) {
  return document.dump(indent, ' ', /*ensure_ascii=*/false, nlohmann::json::error_handler_t::replace);
}

}  // namespace longseq
