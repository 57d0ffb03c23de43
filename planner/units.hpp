// units.hpp: parsing and printing of sizes the user types and reads.
//
// Sequence lengths: plain integers, or a number with K (10^3), M (10^6), G (10^9) as the ALST
// paper writes them (3.7M = 3,700,000), or Ki/Mi (2^10, 2^20) as the FPDT paper's powers of two
// (128Ki = 131,072). Case-insensitive. The result must be a whole number of tokens.
#pragma once

#include <cstdint>
#include <string>

namespace longseq {

constexpr double kBytesPerGib = 1024.0 * 1024.0 * 1024.0;

// Throws ConfigError(flag, "", reason) when `text` is not a positive whole token count.
int64_t seqlen_parse(const std::string& text, const std::string& flag);

// 3700000 -> "3.7M", 131072 -> "128Ki", 1000 -> "1K", 12345 -> "12345".
std::string seqlen_format(int64_t tokens);

inline double bytes_to_gib(double bytes) { return bytes / kBytesPerGib; }

}  // namespace longseq
