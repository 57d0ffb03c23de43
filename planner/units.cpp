#include "planner/units.hpp"

#include <cctype>
#include <cmath>
#include <fmt/format.h>

#include "models/config_error.hpp"

namespace longseq {

int64_t seqlen_parse(const std::string& text, const std::string& flag) {
  auto fail = [&](const std::string& why) -> int64_t {
    throw ConfigError(flag, "", fmt::format("'{}' is not a sequence length: {} (examples: 32768, 32K, 1.5M, 128Ki)", text, why));
  };
  size_t used = 0;
  double number = 0;
  try {
    number = std::stod(text, &used);
  } catch (const std::exception&) {
    return fail("no number");
  }
  std::string suffix = text.substr(used);
  for (auto& c : suffix) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double scale = 1;
  if (suffix.empty()) scale = 1;
  else if (suffix == "k") scale = 1e3;
  else if (suffix == "m") scale = 1e6;
  else if (suffix == "g") scale = 1e9;
  else if (suffix == "ki") scale = 1024.0;
  else if (suffix == "mi") scale = 1024.0 * 1024.0;
  else if (suffix == "gi") scale = 1024.0 * 1024.0 * 1024.0;
  else return fail(fmt::format("unknown suffix '{}'", text.substr(used)));
  const double tokens = number * scale;
  if (!std::isfinite(tokens) || tokens < 1) return fail("must be at least 1 token");
  // 10^13 tokens is far beyond any memory in existence; larger values are typos.
  if (tokens > 1e13) return fail("larger than 10^13 tokens");
  if (std::fabs(tokens - std::round(tokens)) > 1e-6) return fail("not a whole number of tokens");
  return static_cast<int64_t>(std::llround(tokens));
}

std::string seqlen_format(int64_t tokens) {
  struct Unit { int64_t size; const char* name; };
  // Binary units only where they read as a round number (128Ki, 4Mi), as the FPDT paper writes
  // its powers of two; everything else in decimal K/M/G as the ALST paper does.
  for (Unit unit : {Unit{1024 * 1024, "Mi"}, Unit{1024, "Ki"}}) {
    if (tokens >= unit.size && tokens % unit.size == 0 && tokens / unit.size < 1000 && tokens % 1000 != 0)
      return fmt::format("{}{}", tokens / unit.size, unit.name);
  }
  for (Unit unit : {Unit{1000000000, "G"}, Unit{1000000, "M"}, Unit{1000, "K"}}) {
    if (tokens < unit.size) continue;
    // Up to three decimals, trailing zeros dropped: 3700000 -> 3.7M; keep exact values exact.
    for (int decimals = 0; decimals <= 3; ++decimals) {
      const double value = static_cast<double>(tokens) / static_cast<double>(unit.size);
      const std::string text = fmt::format("{:.{}f}", value, decimals);
      if (std::llround(std::stod(text) * static_cast<double>(unit.size)) == tokens) return text + unit.name;
    }
    return fmt::format("{:.3f}{}", static_cast<double>(tokens) / static_cast<double>(unit.size), unit.name);
  }
  return fmt::format("{}", tokens);
}

}  // namespace longseq
