// The avx2vnni kernel table: AVX2 + FMA + F16C + AVX-VNNI (VEX-encoded
// vpdpbusd / vpdpwssd on ymm, for CPUs without AVX-512). The body is shared
// with avx2.
#define SERVAL_AVX2_VNNI true
#define SERVAL_AVX2_TARGET "avx2,fma,f16c,avxvnni"
#define SERVAL_AVX2_ISA Isa::avx2vnni
#define SERVAL_AVX2_ACCESSOR kernel_table_avx2vnni
#include "kernels/x86/kernels_avx2_table.inc"
