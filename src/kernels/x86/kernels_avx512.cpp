// The avx512 kernel table: AVX-512 F/BW/VL (no VNNI: i8 dot products via vpmaddubsw + vpmaddwd).
// Everything ISA-specific sits between the target pragmas, in an anonymous
// namespace; only the table accessor is visible outside and it runs no SIMD code.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/act_quant.h"
#include "kernels/kernel_table.h"
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
#include "kernels/x86/matmul_tmpl.inc"

MatmulKernel matmul_kernel(DType t) { return matmul_kernel_tmpl<B>(t); }

}  // namespace
}  // namespace serval::kernels::detail

#pragma GCC diagnostic pop
#pragma GCC pop_options

namespace serval::kernels::detail {
namespace {
constexpr KernelTable kTable{Isa::avx512, matmul_kernel, attention_tmpl<B>, quantize_q8_32_tmpl<B>,
                            quantize_q8_k_tmpl<B>,
                            packed_kernel_tmpl<B>, quantize_q8_0p_tmpl<B>};
}  // namespace
const KernelTable* kernel_table_avx512() { return &kTable; }
}  // namespace serval::kernels::detail
