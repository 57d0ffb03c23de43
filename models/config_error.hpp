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
    return message + reason;
  }
};

}  // namespace longseq
