// bf16.hpp: bfloat16 as a bit pattern (uint16_t) and its conversions on the host, in plain C++ so
// the CPU build and tests use the same rounding the GPU path does. bf16 keeps float's 8-bit
// exponent and the top 7 mantissa bits; conversion rounds to nearest, ties to even (what
// __float2bfloat16_rn and PyTorch do), and keeps NaN a NaN.
#pragma once

#include <cstdint>
#include <cstring>

namespace longseq {

using Bf16 = uint16_t;

inline Bf16 bf16_from_float(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) return static_cast<Bf16>((bits >> 16) | 0x0040u);  // quiet NaN
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);  // ties go to the even neighbour
  return static_cast<Bf16>((bits + rounding) >> 16);
}

inline float bf16_to_float(Bf16 value) {
  const uint32_t bits = static_cast<uint32_t>(value) << 16;
  float result;
  std::memcpy(&result, &bits, sizeof result);
  return result;
}

}  // namespace longseq
