// The avx2 kernel table: AVX2 + FMA + F16C (i8 dot products via vpmaddubsw +
// vpmaddwd), bit-identical in output to the AVX-512 tables.
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
#pragma GCC target("avx2,fma,f16c")

namespace serval::kernels::detail {
namespace {

#include "kernels/x86/simd_avx2.h"
using B = Avx2;
#include "kernels/x86/vexp.inc"
#include "kernels/x86/matmul_tmpl.inc"

MatmulKernel matmul_kernel(DType t) { return matmul_kernel_tmpl<B>(t); }

}  // namespace
}  // namespace serval::kernels::detail

#pragma GCC pop_options

namespace serval::kernels::detail {
namespace {
constexpr KernelTable kTable{Isa::avx2, matmul_kernel, attention_tmpl<B>, quantize_q8_32_tmpl<B>,
                            quantize_q8_k_tmpl<B>,
                            packed_kernel_tmpl<B>, quantize_q8_0p_tmpl<B>};
}  // namespace
const KernelTable* kernel_table_avx2() { return &kTable; }
}  // namespace serval::kernels::detail
