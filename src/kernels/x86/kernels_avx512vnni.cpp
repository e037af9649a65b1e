// The avx512vnni kernel table: AVX-512 F/BW/VL + VNNI (vpdpbusd / vpdpwssd).
// The body is shared with avx512.
#define SERVAL_AVX512_VNNI true
#define SERVAL_AVX512_TARGET "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"
#define SERVAL_AVX512_ISA Isa::avx512vnni
#define SERVAL_AVX512_ACCESSOR kernel_table_avx512vnni
#include "kernels/x86/kernels_avx512_table.inc"
