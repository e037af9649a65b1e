// The AVX-512 tile attention kernel (attention_tmpl.inc over simd_avx512.h),
// used at the avx512 and avx512vnni levels (it has no integer dot products).
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

SERVAL_AVX512_DIAGNOSTICS_BEGIN
SERVAL_TARGET_BEGIN("avx2,fma,f16c,avx512f,avx512bw,avx512vl")

namespace serval::kernels::detail {
namespace {

#include "kernels/x86/simd_avx512.h"
using B = Avx512<false>;
#include "kernels/x86/vexp.inc"
#include "kernels/x86/attention_tmpl.inc"

}  // namespace
}  // namespace serval::kernels::detail

SERVAL_TARGET_END
SERVAL_AVX512_DIAGNOSTICS_END

namespace serval::kernels::detail {
AttentionTileFn attention_tile_avx512() { return attention_tile_tmpl<B>; }
F16StoreFn f16_store_avx512() { return f16_store_row; }
}  // namespace serval::kernels::detail
