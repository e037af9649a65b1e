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

// Asks for the cache lines of [p, p + bytes) ahead of their use (a hint: past
// the end of an array it fetches nothing that faults). The update streams
// each adapter's A and B from memory once per step; the hardware prefetcher
// alone kept one thread at about 12 GB/s.
inline void serval_lora_prefetch(const void* p, size_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch(c + o, 0, 3);
}

#ifndef SERVAL_LORA_AHEAD
#define SERVAL_LORA_AHEAD 2
#endif
constexpr int64_t kLoraAhead = SERVAL_LORA_AHEAD;  // blocks of A or B prefetched ahead

// The body, written once for both element types (CVT16(src, dst): 16
// elements to floats; LD(p): one) and compiled for each target, for R rows
// of one adapter at once (a template parameter, so that the accumulators stay
// in registers): each chunk of A and B is widened once and used for all R
// rows (widening F16 costs more than the arithmetic). Each chunk of 64 columns
// of A (16 ranks) and each 16-rank x 64-output block of B is put into a float
// buffer first, then the loops run on it: A in four partial sums over i mod 4
// (independent chains), added as (s0 + s1) + (s2 + s3); B with 64 outputs
// held in registers while k runs in order. Every row's arithmetic is the same
// whatever R is and whichever rows share the call, and the F16 variant equals
// the F32 one on the widened values, bit for bit. Ranks past a multiple of 16
// and outputs past a multiple of 64 go element by element.
#define SERVAL_LORA_ROWS_BODY(CVT16, LD)                                         \
  constexpr int64_t IC = 64;                                                     \
  float buf[IC * 16];                                                            \
  int64_t kb = 0;                                                                \
  for (; kb + 16 <= rank; kb += 16) {                                            \
    float s0[R][16] = {}, s1[R][16] = {}, s2[R][16] = {}, s3[R][16] = {};        \
    for (int64_t i0 = 0; i0 < cols; i0 += IC) {                                  \
      const int64_t ni = cols - i0 < IC ? cols - i0 : IC;                        \
      if (rank == 16) serval_lora_prefetch(at + (i0 + kLoraAhead * IC) * 16, IC * 16 * sizeof(*at)); \
      for (int64_t ii = 0; ii < ni; ++ii) CVT16(at + (i0 + ii) * rank + kb, buf + ii * 16); \
      int64_t ii = 0;                                                            \
      for (; ii + 4 <= ni; ii += 4) {                                            \
        const float* a = buf + ii * 16;                                          \
        for (int r = 0; r < R; ++r) {                                            \
          const float* xr = x[r] + i0 + ii;                                      \
          const float x0 = xr[0], x1 = xr[1], x2 = xr[2], x3 = xr[3];            \
          for (int k = 0; k < 16; ++k) {                                         \
            s0[r][k] += a[k] * x0;                                               \
            s1[r][k] += a[16 + k] * x1;                                          \
            s2[r][k] += a[32 + k] * x2;                                          \
            s3[r][k] += a[48 + k] * x3;                                          \
          }                                                                      \
        }                                                                        \
      }                                                                          \
      for (; ii < ni; ++ii)                                                      \
        for (int r = 0; r < R; ++r)                                              \
          for (int k = 0; k < 16; ++k) s0[r][k] += buf[ii * 16 + k] * x[r][i0 + ii]; \
    }                                                                            \
    for (int r = 0; r < R; ++r)                                                  \
      for (int k = 0; k < 16; ++k)                                               \
        t[r * rank + kb + k] = ((s0[r][k] + s1[r][k]) + (s2[r][k] + s3[r][k])) * scale; \
  }                                                                              \
  for (int64_t k = kb; k < rank; ++k)                                            \
    for (int r = 0; r < R; ++r) {                                                \
      float acc = 0.0f;                                                          \
      for (int64_t i = 0; i < cols; ++i) acc += LD(at + i * rank + k) * x[r][i]; \
      t[r * rank + k] = acc * scale;                                             \
    }                                                                            \
  int64_t j0 = 0;                                                                \
  for (; j0 + 64 <= rows; j0 += 64) {                                            \
    float acc[R][64];                                                            \
    const auto* pb = bt + j0 * rank; /* this block: [rank][64] */                \
    serval_lora_prefetch(pb + kLoraAhead * 64 * rank, 64 * rank * sizeof(*bt));  \
    for (int r = 0; r < R; ++r)                                                  \
      for (int jj = 0; jj < 64; ++jj) acc[r][jj] = y[r][j0 + jj];                \
    for (int64_t k0 = 0; k0 < rank; k0 += 16) {                                  \
      const int64_t nk = rank - k0 < 16 ? rank - k0 : 16;                        \
      for (int64_t kk = 0; kk < nk; ++kk)                                        \
        for (int q = 0; q < 4; ++q) CVT16(pb + (k0 + kk) * 64 + 16 * q, buf + kk * 64 + 16 * q); \
      for (int64_t kk = 0; kk < nk; ++kk) {                                      \
        const float* bk = buf + kk * 64;                                         \
        for (int r = 0; r < R; ++r) {                                            \
          const float tk = t[r * rank + k0 + kk];                                \
          for (int jj = 0; jj < 64; ++jj) acc[r][jj] += bk[jj] * tk;             \
        }                                                                        \
      }                                                                          \
    }                                                                            \
    for (int r = 0; r < R; ++r)                                                  \
      for (int jj = 0; jj < 64; ++jj) y[r][j0 + jj] = acc[r][jj];                \
  }                                                                              \
  for (int64_t j = j0; j < rows; ++j) /* the tail block: [rank][rows - j0] */    \
    for (int r = 0; r < R; ++r) {                                                \
      float acc = y[r][j];                                                       \
      for (int64_t k = 0; k < rank; ++k) acc += LD(bt + j0 * rank + k * (rows - j0) + (j - j0)) * t[r * rank + k]; \
      y[r][j] = acc;                                                             \
    }

#define SERVAL_CVT16_SCALAR(src, dst) \
  for (int e = 0; e < 16; ++e) (dst)[e] = fp16_to_fp32((src)[e])
#define SERVAL_LD_F16(p) fp16_to_fp32(*(p))
#define SERVAL_CVT16_F32(src, dst) std::memcpy((dst), (src), 16 * sizeof(float))
#define SERVAL_LD_F32(p) (*(p))

template <int R>
void lora_rows_f16_base(const uint16_t* at, const uint16_t* bt, int64_t rank, int64_t cols, int64_t rows, float scale,
            const float* const* x, float* const* y, float* t) {
  SERVAL_LORA_ROWS_BODY(SERVAL_CVT16_SCALAR, SERVAL_LD_F16)
}

template <int R>
void lora_rows_base(const float* at, const float* bt, int64_t rank, int64_t cols, int64_t rows, float scale,
            const float* const* x, float* const* y, float* t) {
  SERVAL_LORA_ROWS_BODY(SERVAL_CVT16_F32, SERVAL_LD_F32)
}

#if defined(__x86_64__)
SERVAL_TARGET_BEGIN("avx2,fma,f16c")
template <int R>
void lora_rows_avx2(const float* at, const float* bt, int64_t rank, int64_t cols, int64_t rows, float scale,
            const float* const* x, float* const* y, float* t) {
  SERVAL_LORA_ROWS_BODY(SERVAL_CVT16_F32, SERVAL_LD_F32)
}
#define SERVAL_CVT16_AVX2(src, dst)                                                                  \
  do {                                                                                               \
    _mm256_storeu_ps((dst), _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)))); \
    _mm256_storeu_ps((dst) + 8,                                                                      \
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>((src) + 8))));  \
  } while (0)
template <int R>
void lora_rows_f16_avx2(const uint16_t* at, const uint16_t* bt, int64_t rank, int64_t cols, int64_t rows, float scale,
            const float* const* x, float* const* y, float* t) {
  SERVAL_LORA_ROWS_BODY(SERVAL_CVT16_AVX2, SERVAL_LD_F16)
}
SERVAL_TARGET_END

SERVAL_AVX512_DIAGNOSTICS_BEGIN
SERVAL_TARGET_BEGIN("avx2,fma,f16c,avx512f,avx512vl,avx512bw")
template <int R>
void lora_rows_avx512(const float* at, const float* bt, int64_t rank, int64_t cols, int64_t rows, float scale,
            const float* const* x, float* const* y, float* t) {
  SERVAL_LORA_ROWS_BODY(SERVAL_CVT16_F32, SERVAL_LD_F32)
}
#define SERVAL_CVT16_AVX512(src, dst) \
  _mm512_storeu_ps((dst), _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src))))
// F16 A and B at AVX-512, written out with intrinsics so that the R rows'
// accumulators stay in registers (the generic body kept them in memory and ran
// at a fifth of the FP peak): the same operations in the same order as
// SERVAL_LORA_ROWS_BODY (a multiply, then an add: ISO C++ contracts nothing
// into an FMA), so the same bits.
inline __m512 lora_cvt16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
template <int R>
void lora_rows_f16_avx512(const uint16_t* at, const uint16_t* bt, int64_t rank, int64_t cols, int64_t rows,
                          float scale, const float* const* x, float* const* y, float* t) {
  constexpr int64_t IC = 64;
  const __m512 vscale = _mm512_set1_ps(scale);
  int64_t kb = 0;
  for (; kb + 16 <= rank; kb += 16) {
    __m512 s0[R], s1[R], s2[R], s3[R];
    for (int r = 0; r < R; ++r) s0[r] = s1[r] = s2[r] = s3[r] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 4 <= cols; i += 4) {
      if (rank == 16 && i % IC == 0) serval_lora_prefetch(at + (i + kLoraAhead * IC) * 16, IC * 16 * sizeof(*at));
      const __m512 a0 = lora_cvt16(at + i * rank + kb), a1 = lora_cvt16(at + (i + 1) * rank + kb),
                   a2 = lora_cvt16(at + (i + 2) * rank + kb), a3 = lora_cvt16(at + (i + 3) * rank + kb);
      for (int r = 0; r < R; ++r) {
        const float* xr = x[r] + i;
        s0[r] = _mm512_add_ps(s0[r], _mm512_mul_ps(a0, _mm512_set1_ps(xr[0])));
        s1[r] = _mm512_add_ps(s1[r], _mm512_mul_ps(a1, _mm512_set1_ps(xr[1])));
        s2[r] = _mm512_add_ps(s2[r], _mm512_mul_ps(a2, _mm512_set1_ps(xr[2])));
        s3[r] = _mm512_add_ps(s3[r], _mm512_mul_ps(a3, _mm512_set1_ps(xr[3])));
      }
    }
    for (; i < cols; ++i) {  // the generic body's leftover columns (cols % 4) go to s0
      const __m512 a = lora_cvt16(at + i * rank + kb);
      for (int r = 0; r < R; ++r) s0[r] = _mm512_add_ps(s0[r], _mm512_mul_ps(a, _mm512_set1_ps(x[r][i])));
    }
    for (int r = 0; r < R; ++r)
      _mm512_storeu_ps(t + r * rank + kb,
                       _mm512_mul_ps(_mm512_add_ps(_mm512_add_ps(s0[r], s1[r]), _mm512_add_ps(s2[r], s3[r])), vscale));
  }
  for (int64_t k = kb; k < rank; ++k)
    for (int r = 0; r < R; ++r) {
      float acc = 0.0f;
      for (int64_t i = 0; i < cols; ++i) acc += fp16_to_fp32(at[i * rank + k]) * x[r][i];
      t[r * rank + k] = acc * scale;
    }
  int64_t j0 = 0;
  for (; j0 + 64 <= rows; j0 += 64) {
    const uint16_t* pb = bt + j0 * rank;  // this block: [rank][64]
    serval_lora_prefetch(pb + kLoraAhead * 64 * rank, 64 * rank * sizeof(*bt));
    __m512 acc[R][4];
    for (int r = 0; r < R; ++r)
      for (int q = 0; q < 4; ++q) acc[r][q] = _mm512_loadu_ps(y[r] + j0 + 16 * q);
    for (int64_t k = 0; k < rank; ++k) {
      const __m512 b0 = lora_cvt16(pb + k * 64), b1 = lora_cvt16(pb + k * 64 + 16), b2 = lora_cvt16(pb + k * 64 + 32),
                   b3 = lora_cvt16(pb + k * 64 + 48);
      for (int r = 0; r < R; ++r) {
        const __m512 tk = _mm512_set1_ps(t[r * rank + k]);
        acc[r][0] = _mm512_add_ps(acc[r][0], _mm512_mul_ps(b0, tk));
        acc[r][1] = _mm512_add_ps(acc[r][1], _mm512_mul_ps(b1, tk));
        acc[r][2] = _mm512_add_ps(acc[r][2], _mm512_mul_ps(b2, tk));
        acc[r][3] = _mm512_add_ps(acc[r][3], _mm512_mul_ps(b3, tk));
      }
    }
    for (int r = 0; r < R; ++r)
      for (int q = 0; q < 4; ++q) _mm512_storeu_ps(y[r] + j0 + 16 * q, acc[r][q]);
  }
  for (int64_t j = j0; j < rows; ++j)  // the tail block: [rank][rows - j0]
    for (int r = 0; r < R; ++r) {
      float acc = y[r][j];
      for (int64_t k = 0; k < rank; ++k) acc += fp16_to_fp32(bt[j0 * rank + k * (rows - j0) + (j - j0)]) * t[r * rank + k];
      y[r][j] = acc;
    }
}
SERVAL_TARGET_END
SERVAL_AVX512_DIAGNOSTICS_END
#endif

#undef SERVAL_LORA_ROWS_BODY

template <class T>
using RowsFn = void (*)(const T*, const T*, int64_t, int64_t, int64_t, float, const float* const*, float* const*,
                        float*);
template <class T>
struct RowsTable {
  RowsFn<T> fn[kLoraGroupRows];
};

// Rows 0..NA-1 through A, the rest through B: for the generic body, whose
// accumulators (R x 64 outputs) outgrow the registers past two rows (AVX2,
// 4 rows: 2.7x the time of 2 rows, against 1.3x from 1 to 2).
template <class T, RowsFn<T> A, RowsFn<T> B, int NA>
void rows_split(const T* at, const T* bt, int64_t rank, int64_t cols, int64_t rows, float scale,
                const float* const* x, float* const* y, float* t) {
  A(at, bt, rank, cols, rows, scale, x, y, t);
  B(at, bt, rank, cols, rows, scale, x + NA, y + NA, t);
}
template <class T, RowsFn<T> R1, RowsFn<T> R2>
constexpr RowsTable<T> two_at_most() {
  return {{R1, R2, rows_split<T, R2, R1, 2>, rows_split<T, R2, R2, 2>}};
}

// The level, as the matmul picks it (SERVAL_ISA): 2 AVX-512, 1 AVX2, 0 the baseline.
int level() {
#if defined(__x86_64__)
  const Isa isa = active_isa();
  if (isa == Isa::avx512 || isa == Isa::avx512vnni) return 2;
  if (isa == Isa::avx2 || isa == Isa::avx2vnni) return 1;
#endif
  return 0;
}

RowsTable<float> pick() {
#if defined(__x86_64__)
  if (level() == 2) return two_at_most<float, lora_rows_avx512<1>, lora_rows_avx512<2>>();
  if (level() == 1) return two_at_most<float, lora_rows_avx2<1>, lora_rows_avx2<2>>();
#endif
  return two_at_most<float, lora_rows_base<1>, lora_rows_base<2>>();
}

RowsTable<uint16_t> pick_f16() {
#if defined(__x86_64__)
  if (level() == 2)
    return {{lora_rows_f16_avx512<1>, lora_rows_f16_avx512<2>, lora_rows_f16_avx512<3>, lora_rows_f16_avx512<4>}};
  if (level() == 1) return two_at_most<uint16_t, lora_rows_f16_avx2<1>, lora_rows_f16_avx2<2>>();
#endif
  return two_at_most<uint16_t, lora_rows_f16_base<1>, lora_rows_f16_base<2>>();
}

template <class T>
void run_rows(const RowsTable<T>& tab, const T* at, const T* bt, int64_t rank, int64_t cols, int64_t rows,
              float scale, const float* const* x, float* const* y, int n, float* t) {
  for (int r0 = 0; r0 < n; r0 += kLoraGroupRows) {
    const int m = n - r0 < kLoraGroupRows ? n - r0 : kLoraGroupRows;
    tab.fn[m - 1](at, bt, rank, cols, rows, scale, x + r0, y + r0, t);
  }
}

}  // namespace

void lora_rows(const float* at, const float* bt, int64_t rank, int64_t cols, int64_t rows, float scale,
               const float* const* x, float* const* y, int n, float* t) {
  static const RowsTable<float> tab = pick();
  run_rows(tab, at, bt, rank, cols, rows, scale, x, y, n, t);
}

void lora_rows_f16(const uint16_t* at, const uint16_t* bt, int64_t rank, int64_t cols, int64_t rows, float scale,
                   const float* const* x, float* const* y, int n, float* t) {
  static const RowsTable<uint16_t> tab = pick_f16();
  run_rows(tab, at, bt, rank, cols, rows, scale, x, y, n, t);
}

void lora_row(const float* at, const float* bt, int64_t rank, int64_t cols, int64_t rows, float scale,
              const float* x, float* y, float* t) {
  lora_rows(at, bt, rank, cols, rows, scale, &x, &y, 1, t);
}

void lora_row_f16(const uint16_t* at, const uint16_t* bt, int64_t rank, int64_t cols, int64_t rows, float scale,
                  const float* x, float* y, float* t) {
  lora_rows_f16(at, bt, rank, cols, rows, scale, &x, &y, 1, t);
}

}  // namespace serval::kernels
