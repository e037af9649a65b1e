// The AVX-512 SwiGLU kernel (activation_tmpl.inc over simd_avx512.h), used at
// the avx512 and avx512vnni levels. Compiled with -ffp-contract=off
// (src/CMakeLists.txt): the same bits as the scalar loop.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/activation_isa.h"
#include "kernels/x86/target.h"

SERVAL_AVX512_DIAGNOSTICS_BEGIN
SERVAL_TARGET_BEGIN("avx2,fma,f16c,avx512f,avx512bw,avx512vl")

namespace serval::kernels::detail {
namespace {

#include "kernels/x86/simd_avx512.h"
using B = Avx512<false>;
#include "kernels/x86/activation_tmpl.inc"

}  // namespace
}  // namespace serval::kernels::detail

SERVAL_TARGET_END
SERVAL_AVX512_DIAGNOSTICS_END

namespace serval::kernels::detail {
SiluMulFn silu_mul_avx512() { return silu_mul_tmpl<B>; }
}  // namespace serval::kernels::detail
