// Tensor element types, numbered as GGUF/ggml numbers them (ggml_type), with
// their block geometry. Pure data; thread-safe.
//
// A row of `n` elements of type t occupies row_size(t, n) bytes and n must be a
// multiple of block_size(t). Block layouts are in quant_blocks.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace serval {

enum class DType : uint32_t {
  f32 = 0,
  f16 = 1,
  q4_0 = 2,
  q4_1 = 3,
  // 4, 5: removed Q4_2 / Q4_3
  q5_0 = 6,
  q5_1 = 7,
  q8_0 = 8,
  q8_1 = 9,
  q2_k = 10,
  q3_k = 11,
  q4_k = 12,
  q5_k = 13,
  q6_k = 14,
  q8_k = 15,
  iq2_xxs = 16,
  iq2_xs = 17,
  iq3_xxs = 18,
  iq1_s = 19,
  iq4_nl = 20,
  iq3_s = 21,
  iq2_s = 22,
  iq4_xs = 23,
  i8 = 24,
  i16 = 25,
  i32 = 26,
  i64 = 27,
  f64 = 28,
  iq1_m = 29,
  bf16 = 30,
  tq1_0 = 34,  // ternary, 5 trits per byte
  tq2_0 = 35,  // ternary, 2 bits per element
  mxfp4 = 39,  // OCP microscaling FP4 (E2M1 values, E8M0 block scale; gpt-oss experts)
};

constexpr uint32_t kDTypeCount = 40;  // ids >= this are rejected outright

struct DTypeTraits {
  std::string_view name;  // as ggml prints it: "f32", "q4_K", ...
  uint32_t block_size;    // elements per block (1 for scalar types)
  uint32_t type_size;     // bytes per block
  bool supported;         // serval can dequantize it
};

// Traits for a raw GGUF type id; nullopt for ids that name no type.
std::optional<DTypeTraits> dtype_traits(uint32_t raw_type);
inline std::optional<DTypeTraits> dtype_traits(DType t) { return dtype_traits((uint32_t)t); }

// A GGUF type id that ggml forks give types serval does not know (the ARM
// repacked Q4_0 variants, BitNet's I2_S, ik_llama.cpp's IQ*_K / *_KS / *_KT
// and their run-time repacked _R4/_R8 forms): "ik_llama.cpp's IQ5_K";
// empty for ids no known fork uses. For error messages only.
std::string foreign_type_name(uint32_t raw_type);

std::string_view dtype_name(DType t);
// Parses "f16", "Q4_K", "q8_0", ... (case-insensitive); nullopt when unknown.
std::optional<DType> dtype_from_name(std::string_view name);

// Bytes of a row of n elements; n must be a multiple of the block size.
inline size_t row_size(DType t, int64_t n) {
  auto tr = dtype_traits(t);
  return tr ? (size_t)(n / tr->block_size) * tr->type_size : 0;
}

}  // namespace serval
