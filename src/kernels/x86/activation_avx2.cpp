// The avx2 SwiGLU kernel (activation_tmpl.inc over simd_avx2.h). Compiled
// with -ffp-contract=off (src/CMakeLists.txt): the same bits as the scalar loop.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/activation_isa.h"
#include "kernels/x86/target.h"

SERVAL_TARGET_BEGIN("avx2,fma,f16c")

namespace serval::kernels::detail {
namespace {

#include "kernels/x86/simd_avx2.h"
using B = Avx2<false>;
#include "kernels/x86/activation_tmpl.inc"

}  // namespace
}  // namespace serval::kernels::detail

SERVAL_TARGET_END

namespace serval::kernels::detail {
SiluMulFn silu_mul_avx2() { return silu_mul_tmpl<B>; }
}  // namespace serval::kernels::detail
