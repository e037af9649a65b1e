// Internal to kernels/: the per-ISA tile attention kernels behind
// attention_tile() and the F16 row store behind kv_store_row() (x86/attention_avx2.cpp, x86/attention_avx512.cpp). Not a
// public API; callers must check the ISA is supported before calling one.
#pragma once

#include "kernels/attention.h"

namespace serval::kernels::detail {

using AttentionTileFn = void (*)(const AttentionTile& t);
AttentionTileFn attention_tile_avx2();
AttentionTileFn attention_tile_avx512();

// kv_store_row for F16 at the SIMD levels (F16C): the same bits as the scalar
// fp32_to_fp16 for every input (round to nearest even; NaN -> sign | 0x7e00).
using F16StoreFn = void (*)(const float* x, int64_t n, uint16_t* dst);
F16StoreFn f16_store_avx2();
F16StoreFn f16_store_avx512();

}  // namespace serval::kernels::detail
