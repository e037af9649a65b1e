// Internal to kernels/: the per-ISA SwiGLU kernels behind silu_mul()
// (x86/activation_avx2.cpp, x86/activation_avx512.cpp). Not a public API;
// callers must check the ISA is supported before calling one.
#pragma once

#include <cstdint>

namespace serval::kernels::detail {

// The same bits as activation.cpp's scalar loop for every input: each lane
// takes the same IEEE operations in the same order (the files are compiled
// without FMA contraction).
using SiluMulFn = void (*)(float* out, const float* gate, const float* up, int64_t n);
SiluMulFn silu_mul_avx2();
SiluMulFn silu_mul_avx512();

}  // namespace serval::kernels::detail
