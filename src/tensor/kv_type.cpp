#include "tensor/kv_type.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "tensor/quant_blocks.h"

namespace serval {

const char* kv_type_name(KvType t) {
  switch (t) {
    case KvType::f32: return "f32";
    case KvType::f16: return "f16";
    case KvType::bf16: return "bf16";
    case KvType::q8_0: return "q8_0";
    case KvType::q4_0: return "q4_0";
    case KvType::fp8: return "fp8";
  }
  return "?";
}

std::optional<KvType> parse_kv_type(std::string_view s) {
  for (KvType t : kAllKvTypes)
    if (s == kv_type_name(t)) return t;
  if (s == "fp8_e4m3") return KvType::fp8;
  return std::nullopt;
}

int64_t kv_type_block(KvType t) { return t == KvType::q8_0 || t == KvType::q4_0 ? 32 : 1; }

size_t kv_row_bytes(KvType t, int64_t n) {
  switch (t) {
    case KvType::f32: return (size_t)n * 4;
    case KvType::f16:
    case KvType::bf16: return (size_t)n * 2;
    case KvType::q8_0: return (size_t)(n / 32) * sizeof(block_q8_0);
    case KvType::q4_0: return (size_t)(n / 32) * sizeof(block_q4_0);
    case KvType::fp8: return (size_t)n;
  }
  return 0;
}

std::string kv_type_check(KvType t, int64_t head_dim) {
  if (head_dim <= 0) return "head_dim must be positive";
  if (head_dim % kv_type_block(t) != 0)
    return std::string("--kv-type ") + kv_type_name(t) + " needs head_dim to be a multiple of " +
           std::to_string(kv_type_block(t)) + "; this model's head_dim is " + std::to_string(head_dim) +
           " (use f32, f16, bf16 or fp8)";
  return {};
}

uint8_t fp32_to_fp8_e4m3(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint8_t sign = (uint8_t)((x >> 24) & 0x80);
  if (std::isnan(f)) return (uint8_t)(sign | 0x7f);
  float a = std::fabs(f);
  if (a >= 448.0f) return (uint8_t)(sign | 0x7e);  // saturate (448 = 1.75 * 2^8)
  // Quantum of a's binade (2^-9 below 2^-6: subnormals), then round half to even.
  int e;
  std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1): binade exponent e - 1
  const int q = std::max(e - 1, -6) - 3;
  const float scaled = std::ldexp(a, -q);  // exact: a power-of-two scale
  float r = std::nearbyint(scaled);        // default rounding mode: half to even
  const int code_m = (int)r;               // value = code_m * 2^q, code_m in [0, 16]
  if (code_m == 0) return sign;
  // Normalize: code_m in [8, 16) for normals; 16 bumps the exponent.
  int mant = code_m, exp2 = q;
  if (mant == 16) { mant = 8; exp2 += 1; }
  if (mant < 8) return (uint8_t)(sign | mant);  // subnormal (q == -9)
  const int ebits = exp2 + 3 + 7;               // (mant/8) * 2^(exp2+3) -> biased exponent
  return (uint8_t)(sign | (ebits << 3) | (mant - 8));
}

}  // namespace serval
