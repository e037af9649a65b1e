// The avx512 kernel table: AVX-512 F/BW/VL (no VNNI: i8 dot products via
// vpmaddubsw + vpmaddwd). The body is shared with avx512vnni.
#define SERVAL_AVX512_VNNI false
#define SERVAL_AVX512_TARGET "avx2,fma,f16c,avx512f,avx512bw,avx512vl"
#define SERVAL_AVX512_ISA Isa::avx512
#define SERVAL_AVX512_ACCESSOR kernel_table_avx512
#include "kernels/x86/kernels_avx512_table.inc"
