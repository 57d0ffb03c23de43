// config_error.hpp: the one error type for bad user input (cards, config.json, plan flags).
//
// Invariant: every message names where the problem is (file, then key) and why, on one line,
// so the CLI can print it as-is and exit non-zero. Bugs are not ConfigErrors.
#pragma once

#include <stdexcept>
#include <string>

namespace longseq {

class ConfigError : public std::runtime_error {
 public:
  // source: a file path or a flag name ("--sp"); key: the key inside it, may be empty.
  ConfigError(const std::string& source, const std::string& key, const std::string& reason)
      : std::runtime_error(format_message(source, key, reason)) {}

 private:
  static std::string format_message(const std::string& source, const std::string& key,
                                    const std::string& reason) {
    std::string message = source;
    if (!key.empty()) message += (message.empty() ? "" : ": ") + std::string("key '") + key + "'";
    if (!message.empty()) message += ": ";
    return printable(message + reason);
  }

  // The message as one line of text whatever the input held: control characters (a newline from
  // a file, a terminal escape) and bytes that are not UTF-8 are written as \xNN.
  static std::string printable(const std::string& text) {
    static const char* const hex = "0123456789abcdef";
    std::string out;
    auto escape = [&](unsigned char c) {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    };
    for (size_t i = 0; i < text.size();) {
      const auto c = static_cast<unsigned char>(text[i]);
      if (c < 0x20 || c == 0x7f) {
        escape(c);
        ++i;
        continue;
      }
      if (c < 0x80) {
        out.push_back(static_cast<char>(c));
        ++i;
        continue;
      }
      // A well-formed UTF-8 sequence (no overlong forms, no surrogates, at most U+10FFFF) is kept.
      const size_t length = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
      bool valid = length > 0 && i + length <= text.size();
      for (size_t k = 1; valid && k < length; ++k) valid = (static_cast<unsigned char>(text[i + k]) & 0xc0) == 0x80;
      if (valid && length >= 3) {
        const auto second = static_cast<unsigned char>(text[i + 1]);
        valid = !(c == 0xe0 && second < 0xa0) && !(c == 0xed && second >= 0xa0) && !(c == 0xf0 && second < 0x90) &&
                !(c == 0xf4 && second >= 0x90);
      }
      if (!valid) {
        escape(c);
        ++i;
        continue;
      }
      out.append(text, i, length);
      i += length;
    }
    return out;
  }
};

}  // namespace longseq
