// The element type of the paged KV cache (--kv-type): how one K or V row of
// kv_dim floats is stored. Pure data and exact scalar conversions; thread-safe.
//
// Row layouts (n = kv_dim elements, each head's head_dim slice contiguous):
//   f32   n floats                         4     bytes/element
//   f16   n IEEE halves                    2
//   bf16  n bfloat16                       2
//   q8_0  n/32 block_q8_0 (quant_blocks.h) 34/32 (F16 scale + 32 x int8)
//   q4_0  n/32 block_q4_0                  18/32 (F16 scale + 32 x 4 bit)
//   fp8   n FP8 E4M3 bytes (OCP "fn": no inf, 0x7f/0xff NaN, max 448)  1
// The block types need head_dim % 32 == 0, so that no block straddles two
// heads (kv_type_check).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace serval {

enum class KvType : uint8_t { f32, f16, bf16, q8_0, q4_0, fp8 };

inline constexpr KvType kAllKvTypes[] = {KvType::f32, KvType::f16, KvType::bf16,
                                         KvType::q8_0, KvType::q4_0, KvType::fp8};

const char* kv_type_name(KvType t);
// "f32", "f16", "bf16", "q8_0", "q4_0", "fp8" (also "fp8_e4m3"); nullopt otherwise.
std::optional<KvType> parse_kv_type(std::string_view s);

// Elements per storage block (32 for q8_0/q4_0, else 1).
int64_t kv_type_block(KvType t);
// Bytes of a row of n elements; n must be a multiple of kv_type_block(t).
size_t kv_row_bytes(KvType t, int64_t n);
// Empty when rows of heads of head_dim elements can be stored as t; else a
// one-line reason.
std::string kv_type_check(KvType t, int64_t head_dim);

// FP8 E4M3 (bias 7, 3 mantissa bits, subnormals, no inf; S.1111.111 is NaN).
// Decoding is exact; encoding rounds to nearest even and saturates to +-448.
uint8_t fp32_to_fp8_e4m3(float f);

// All 256 FP8 E4M3 values as floats (the decoder kernels use it as a LUT).
struct Fp8E4m3Table {
  float v[256];
};
constexpr Fp8E4m3Table make_fp8_e4m3_table() {
  Fp8E4m3Table t{};
  for (int b = 0; b < 256; ++b) {
    const int e = (b >> 3) & 15, m = b & 7;
    float mag;
    if (e == 15 && m == 7) {
      mag = __builtin_nanf("");
    } else {
      float p = 1.0f;  // 2^(e - 10), or 2^-9 for subnormals
      for (int i = 0; i < (e == 0 ? 9 : 10 - e); ++i) p *= 0.5f;
      for (int i = 0; i < e - 10; ++i) p *= 2.0f;
      mag = (float)(e == 0 ? m : 8 + m) * p;
    }
    t.v[b] = (b & 0x80) ? -mag : mag;
  }
  return t;
}
inline constexpr Fp8E4m3Table kFp8E4m3 = make_fp8_e4m3_table();
inline float fp8_e4m3_to_fp32(uint8_t b) { return kFp8E4m3.v[b]; }

}  // namespace serval
