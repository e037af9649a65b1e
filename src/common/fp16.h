// IEEE half (F16) and bfloat16 (BF16) <-> float conversions, exact and portable
// (no F16C required). Free functions; thread-safe.
#pragma once

#include <cstdint>
#include <cstring>

namespace serval {

inline float fp32_from_bits(uint32_t w) { float f; std::memcpy(&f, &w, 4); return f; }
inline uint32_t fp32_to_bits(float f) { uint32_t w; std::memcpy(&w, &f, 4); return w; }

// F16 -> F32, exact for every input including subnormals, inf and NaN.
inline float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  if (exp == 0x1f) return fp32_from_bits(sign | 0x7f800000u | (mant << 13));  // inf/nan
  if (exp == 0) {
    if (mant == 0) return fp32_from_bits(sign);
    // subnormal: normalize
    int e = -1;
    do { mant <<= 1; ++e; } while ((mant & 0x400) == 0);
    mant &= 0x3ff;
    return fp32_from_bits(sign | ((uint32_t)(127 - 15 - e) << 23) | (mant << 13));
  }
  return fp32_from_bits(sign | ((exp + 127 - 15) << 23) | (mant << 13));
}

// F32 -> F16 with round-to-nearest-even; overflow gives inf, NaN stays NaN.
inline uint16_t fp32_to_fp16(float f) {
  const uint32_t x = fp32_to_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) return (uint16_t)(sign | 0x7c00 | (abs > 0x7f800000u ? 0x200 : 0));
  if (abs >= 0x477ff000u) return (uint16_t)(sign | 0x7c00);  // rounds to >= 65520 -> inf
  if (abs < 0x38800000u) {
    // result is subnormal (or zero): value = abs_float / 2^-24, rounded to nearest even
    if (abs < 0x33000000u) return (uint16_t)sign;  // < 2^-25 rounds to 0
    const uint32_t e = abs >> 23;
    const uint32_t m = (abs & 0x7fffff) | 0x800000;
    const uint32_t shift = 126 - e;  // 14 + (113 - e) ... yields mantissa of subnormal
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1))) ++r;
    return (uint16_t)(sign | r);
  }
  uint32_t r = ((abs >> 13) - ((127 - 15) << 10));
  const uint32_t rem = abs & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) ++r;
  return (uint16_t)(sign | r);
}

inline float bf16_to_fp32(uint16_t b) { return fp32_from_bits((uint32_t)b << 16); }

// F32 -> BF16 with round-to-nearest-even; NaN stays a (quiet) NaN.
inline uint16_t fp32_to_bf16(float f) {
  uint32_t x = fp32_to_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);
  x += 0x7fff + ((x >> 16) & 1);
  return (uint16_t)(x >> 16);
}

}  // namespace serval
