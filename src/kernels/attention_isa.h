// Internal to kernels/: the per-ISA tile attention kernels behind
// attention_tile() (x86/attention_avx2.cpp, x86/attention_avx512.cpp). Not a
// public API; callers must check the ISA is supported before calling one.
#pragma once

#include "kernels/attention.h"

namespace serval::kernels::detail {

using AttentionTileFn = void (*)(const AttentionTile& t);
AttentionTileFn attention_tile_avx2();
AttentionTileFn attention_tile_avx512();

}  // namespace serval::kernels::detail
