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
#include "tensor/quant_blocks.h"

#pragma GCC push_options
// GCC 12's AVX-512 headers build _mm512_undefined_*() from self-initialized
// locals, which -Wuninitialized reports at every inlined use.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl")

namespace serval::kernels::detail {
namespace {

#include "kernels/x86/simd_avx512.h"
using B = Avx512<false>;
#include "kernels/x86/vexp.inc"
#include "kernels/x86/attention_tmpl.inc"

}  // namespace
}  // namespace serval::kernels::detail

#pragma GCC diagnostic pop
#pragma GCC pop_options

namespace serval::kernels::detail {
AttentionTileFn attention_tile_avx512() { return attention_tile_tmpl<B>; }
}  // namespace serval::kernels::detail
