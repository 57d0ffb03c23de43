#include "planner/units.hpp"

#include <cctype>
#include <cmath>
#include <fmt/format.h>

#include "io/checked_input.hpp"
#include "io/config_error.hpp"

namespace longseq {

namespace {
// Exact products of up to 20 digits with a unit of up to 2^30 (GCC and Clang; __extension__
// marks the non-ISO type as intended under -Wpedantic).
__extension__ typedef __int128 WideInteger;
}  // namespace

int64_t seqlen_parse(const std::string& text, const std::string& flag) {
  auto fail = [&](const std::string& why) -> int64_t {
    throw ConfigError(flag, "", fmt::format("'{}' is not a sequence length: {} (examples: 32768, 32K, 1.5M, 128Ki)", text, why));
  };
  // The number ends where the unit letters begin; it must be a plain decimal (no hex, no inf).
  size_t unit_start = text.size();
  while (unit_start > 0 && std::isalpha(static_cast<unsigned char>(text[unit_start - 1]))) --unit_start;
  const std::string number_text = text.substr(0, unit_start);
  std::string suffix = text.substr(unit_start);
  for (auto& c : suffix) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  // An exponent such as 1e20 ends in digits, so its 'e' stays with the number above.
  if (!decimal_parse(number_text)) return fail(number_text.empty() ? "no number" : "not a plain decimal number");
  struct Unit { const char* name; int decimal_power; int binary_power; };
  static constexpr Unit kUnits[] = {{"", 0, 0}, {"k", 3, 0}, {"m", 6, 0}, {"g", 9, 0}, {"ki", 0, 10}, {"mi", 0, 20}, {"gi", 0, 30}};
  const Unit* unit = nullptr;
  for (const Unit& candidate : kUnits)
    if (suffix == candidate.name) unit = &candidate;
  if (!unit) return fail(fmt::format("unknown suffix '{}'", text.substr(unit_start)));

  // Exact decimal arithmetic (digits x 10^exponent x unit), so 32.212G is whole where the same
  // product in double (32211999999.999996) is not.
  if (number_text[0] == '-') return fail("must be at least 1 token");
  WideInteger digits = 0;
  int exponent = 0, significant = 0;
  bool after_point = false;
  size_t i = number_text[0] == '+' ? 1 : 0;
  for (; i < number_text.size() && number_text[i] != 'e' && number_text[i] != 'E'; ++i) {
    if (number_text[i] == '.') {
      after_point = true;
      continue;
    }
    const int digit = number_text[i] - '0';
    if (significant > 0 || digit != 0) ++significant;
    if (significant > 20) return fail("more than 20 significant digits");
    digits = digits * 10 + digit;
    if (after_point) --exponent;
  }
  if (i < number_text.size()) {
    const std::optional<double> written = decimal_parse(number_text.substr(i + 1));
    if (!written || *written > 100) return fail("larger than 10^13 tokens");
    if (*written < -100) return fail("must be at least 1 token");
    exponent += static_cast<int>(*written);
  }
  if (digits == 0) return fail("must be at least 1 token");
  while (digits % 10 == 0) {
    digits /= 10;
    ++exponent;
  }
  exponent += unit->decimal_power;
  // 10^13 tokens is far beyond any memory in existence; larger values are typos.
  constexpr WideInteger kLimit = 10'000'000'000'000;
  WideInteger value = digits << unit->binary_power;  // digits < 10^20 < 2^67, times 2^30: inside 2^127
  for (; exponent > 0; --exponent) {
    value *= 10;
    if (value > kLimit) return fail("larger than 10^13 tokens");
  }
  for (; exponent < 0; ++exponent) {
    if (value % 10 != 0) return fail("not a whole number of tokens");
    value /= 10;
  }
  if (value > kLimit) return fail("larger than 10^13 tokens");
  if (value < 1) return fail("must be at least 1 token");
  return static_cast<int64_t>(value);
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
    int64_t step = unit.size;  // what one unit of the last decimal is worth, in tokens
    for (int decimals = 0; decimals <= 3; ++decimals, step /= 10)
      if (tokens % step == 0)
        return fmt::format("{:.{}f}{}", static_cast<double>(tokens) / static_cast<double>(unit.size), decimals, unit.name);
    return fmt::format("{:.3f}{}", static_cast<double>(tokens) / static_cast<double>(unit.size), unit.name);
  }
  return fmt::format("{}", tokens);
}

}  // namespace longseq
