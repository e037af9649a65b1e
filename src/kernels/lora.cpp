#include "kernels/lora.h"

#include <cstring>

#include "common/fp16.h"
#include "kernels/matmul.h"
#include "kernels/x86/target.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace serval::kernels {

namespace {

// The body, written once for both element types (CVT16(src, dst): 16
// elements to floats; LD(p): one) and compiled for each target. Each chunk of
// 64 columns of A (16 ranks) and each 16-rank x 64-output block of B is put
// into a float buffer first, then the loops run on it: A in four partial
// sums over i mod 4 (independent chains), added as (s0 + s1) + (s2 + s3); B
// with 64 outputs held in registers while k runs in order. The F16 variant
// thus equals the F32 one on the widened values, bit for bit. Ranks past a
// multiple of 16 and outputs past a multiple of 64 go element by element.
#define SERVAL_LORA_ROW_BODY(CVT16, LD)                                          \
  constexpr int64_t IC = 64;                                                     \
  float buf[IC * 16];                                                            \
  int64_t kb = 0;                                                                \
  for (; kb + 16 <= rank; kb += 16) {                                            \
    float s0[16] = {0}, s1[16] = {0}, s2[16] = {0}, s3[16] = {0};                \
    for (int64_t i0 = 0; i0 < cols; i0 += IC) {                                  \
      const int64_t ni = cols - i0 < IC ? cols - i0 : IC;                        \
      for (int64_t ii = 0; ii < ni; ++ii) CVT16(at + (i0 + ii) * rank + kb, buf + ii * 16); \
      int64_t ii = 0;                                                            \
      for (; ii + 4 <= ni; ii += 4) {                                            \
        const float* a = buf + ii * 16;                                          \
        const float x0 = x[i0 + ii], x1 = x[i0 + ii + 1], x2 = x[i0 + ii + 2], x3 = x[i0 + ii + 3]; \
        for (int k = 0; k < 16; ++k) {                                           \
          s0[k] += a[k] * x0;                                                    \
          s1[k] += a[16 + k] * x1;                                               \
          s2[k] += a[32 + k] * x2;                                               \
          s3[k] += a[48 + k] * x3;                                               \
        }                                                                        \
      }                                                                          \
      for (; ii < ni; ++ii)                                                      \
        for (int k = 0; k < 16; ++k) s0[k] += buf[ii * 16 + k] * x[i0 + ii];     \
    }                                                                            \
    for (int k = 0; k < 16; ++k) t[kb + k] = ((s0[k] + s1[k]) + (s2[k] + s3[k])) * scale; \
  }                                                                              \
  for (int64_t k = kb; k < rank; ++k) {                                          \
    float acc = 0.0f;                                                            \
    for (int64_t i = 0; i < cols; ++i) acc += LD(at + i * rank + k) * x[i]; \
    t[k] = acc * scale;                                                          \
  }                                                                              \
  int64_t j0 = 0;                                                                \
  for (; j0 + 64 <= rows; j0 += 64) {                                            \
    float acc[64];                                                               \
    for (int jj = 0; jj < 64; ++jj) acc[jj] = y[j0 + jj];                        \
    for (int64_t k0 = 0; k0 < rank; k0 += 16) {                                  \
      const int64_t nk = rank - k0 < 16 ? rank - k0 : 16;                        \
      for (int64_t kk = 0; kk < nk; ++kk)                                        \
        for (int q = 0; q < 4; ++q) CVT16(bt + (k0 + kk) * rows + j0 + 16 * q, buf + kk * 64 + 16 * q); \
      for (int64_t kk = 0; kk < nk; ++kk) {                                      \
        const float tk = t[k0 + kk];                                             \
        const float* bk = buf + kk * 64;                                         \
        for (int jj = 0; jj < 64; ++jj) acc[jj] += bk[jj] * tk;                  \
      }                                                                          \
    }                                                                            \
    for (int jj = 0; jj < 64; ++jj) y[j0 + jj] = acc[jj];                        \
  }                                                                              \
  for (int64_t j = j0; j < rows; ++j) {                                          \
    float acc = y[j];                                                            \
    for (int64_t k = 0; k < rank; ++k) acc += LD(bt + k * rows + j) * t[k]; \
    y[j] = acc;                                                                  \
  }

#define SERVAL_CVT16_SCALAR(src, dst) \
  for (int e = 0; e < 16; ++e) (dst)[e] = fp16_to_fp32((src)[e])
#define SERVAL_LD_F16(p) fp16_to_fp32(*(p))
#define SERVAL_CVT16_F32(src, dst) std::memcpy((dst), (src), 16 * sizeof(float))
#define SERVAL_LD_F32(p) (*(p))

void lora_row_f16_base(const uint16_t* at, const uint16_t* bt, int64_t rank, int64_t cols, int64_t rows, float scale,
                       const float* x, float* y, float* t) {
  SERVAL_LORA_ROW_BODY(SERVAL_CVT16_SCALAR, SERVAL_LD_F16)
}

void lora_row_base(const float* at, const float* bt, int64_t rank, int64_t cols, int64_t rows, float scale,
                   const float* x, float* y, float* t) {
  SERVAL_LORA_ROW_BODY(SERVAL_CVT16_F32, SERVAL_LD_F32)
}

#if defined(__x86_64__)
SERVAL_TARGET_BEGIN("avx2,fma,f16c")
void lora_row_avx2(const float* at, const float* bt, int64_t rank, int64_t cols, int64_t rows, float scale,
                   const float* x, float* y, float* t) {
  SERVAL_LORA_ROW_BODY(SERVAL_CVT16_F32, SERVAL_LD_F32)
}
#define SERVAL_CVT16_AVX2(src, dst)                                                                  \
  do {                                                                                               \
    _mm256_storeu_ps((dst), _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)))); \
    _mm256_storeu_ps((dst) + 8,                                                                      \
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>((src) + 8))));  \
  } while (0)
void lora_row_f16_avx2(const uint16_t* at, const uint16_t* bt, int64_t rank, int64_t cols, int64_t rows, float scale,
                       const float* x, float* y, float* t) {
  SERVAL_LORA_ROW_BODY(SERVAL_CVT16_AVX2, SERVAL_LD_F16)
}
SERVAL_TARGET_END

SERVAL_AVX512_DIAGNOSTICS_BEGIN
SERVAL_TARGET_BEGIN("avx2,fma,f16c,avx512f,avx512vl,avx512bw")
void lora_row_avx512(const float* at, const float* bt, int64_t rank, int64_t cols, int64_t rows, float scale,
                     const float* x, float* y, float* t) {
  SERVAL_LORA_ROW_BODY(SERVAL_CVT16_F32, SERVAL_LD_F32)
}
#define SERVAL_CVT16_AVX512(src, dst) \
  _mm512_storeu_ps((dst), _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src))))
void lora_row_f16_avx512(const uint16_t* at, const uint16_t* bt, int64_t rank, int64_t cols, int64_t rows,
                         float scale, const float* x, float* y, float* t) {
  SERVAL_LORA_ROW_BODY(SERVAL_CVT16_AVX512, SERVAL_LD_F16)
}
SERVAL_TARGET_END
SERVAL_AVX512_DIAGNOSTICS_END
#endif

#undef SERVAL_LORA_ROW_BODY

using RowFn = void (*)(const float*, const float*, int64_t, int64_t, int64_t, float, const float*, float*, float*);

using RowF16Fn = void (*)(const uint16_t*, const uint16_t*, int64_t, int64_t, int64_t, float, const float*, float*,
                          float*);

// The level, as the matmul picks it (SERVAL_ISA): 2 AVX-512, 1 AVX2, 0 the baseline.
int level() {
#if defined(__x86_64__)
  const Isa isa = active_isa();
  if (isa == Isa::avx512 || isa == Isa::avx512vnni) return 2;
  if (isa == Isa::avx2 || isa == Isa::avx2vnni) return 1;
#endif
  return 0;
}

RowFn pick() {
#if defined(__x86_64__)
  if (level() == 2) return lora_row_avx512;
  if (level() == 1) return lora_row_avx2;
#endif
  return lora_row_base;
}

RowF16Fn pick_f16() {
#if defined(__x86_64__)
  if (level() == 2) return lora_row_f16_avx512;
  if (level() == 1) return lora_row_f16_avx2;
#endif
  return lora_row_f16_base;
}

}  // namespace

void lora_row_f16(const uint16_t* at, const uint16_t* bt, int64_t rank, int64_t cols, int64_t rows, float scale,
                  const float* x, float* y, float* t) {
  static const RowF16Fn fn = pick_f16();
  fn(at, bt, rank, cols, rows, scale, x, y, t);
}

void lora_row(const float* at, const float* bt, int64_t rank, int64_t cols, int64_t rows, float scale,
              const float* x, float* y, float* t) {
  static const RowFn fn = pick();
  fn(at, bt, rank, cols, rows, scale, x, y, t);
}

}  // namespace serval::kernels
