// The avx2 kernel table: AVX2 + FMA + F16C (i8 dot products via vpmaddubsw +
// vpmaddwd), bit-identical in output to the other tables. The body is shared
// with avx2vnni.
#define SERVAL_AVX2_VNNI false
#define SERVAL_AVX2_TARGET "avx2,fma,f16c"
#define SERVAL_AVX2_ISA Isa::avx2
#define SERVAL_AVX2_ACCESSOR kernel_table_avx2
#include "kernels/x86/kernels_avx2_table.inc"
