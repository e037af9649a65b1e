// The avx2 tile attention kernel (attention_tmpl.inc over simd_avx2.h):
// bit-identical in output to the AVX-512 one.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/fp16.h"
#include "kernels/attention_isa.h"
#include "kernels/x86/target.h"
#include "tensor/quant_blocks.h"

SERVAL_TARGET_BEGIN("avx2,fma,f16c")

namespace serval::kernels::detail {
namespace {

#include "kernels/x86/simd_avx2.h"
using B = Avx2<false>;
#include "kernels/x86/vexp.inc"
#include "kernels/x86/attention_tmpl.inc"

}  // namespace
}  // namespace serval::kernels::detail

SERVAL_TARGET_END

namespace serval::kernels::detail {
AttentionTileFn attention_tile_avx2() { return attention_tile_tmpl<B>; }
F16StoreFn f16_store_avx2() { return f16_store_row; }
}  // namespace serval::kernels::detail
