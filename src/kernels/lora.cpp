#include "kernels/lora.h"

#include "kernels/matmul.h"
#include "kernels/x86/target.h"

namespace serval::kernels {

namespace {

// The body, written once and compiled for each target. A: 16 ranks at a time,
// in four partial sums over i mod 4 (independent FMA chains), added as
// (s0 + s1) + (s2 + s3). B: 64 outputs at a time held in registers while k
// runs in order, so y[j] + ts[0] b[0][j] + ts[1] b[1][j] + ... in k order.
#define SERVAL_LORA_ROW_BODY                                                     \
  int64_t kb = 0;                                                                \
  for (; kb + 16 <= rank; kb += 16) {                                            \
    float s0[16] = {0}, s1[16] = {0}, s2[16] = {0}, s3[16] = {0};                \
    int64_t i = 0;                                                               \
    for (; i + 4 <= cols; i += 4) {                                              \
      const float* a = at + i * rank + kb;                                       \
      const float x0 = x[i], x1 = x[i + 1], x2 = x[i + 2], x3 = x[i + 3];        \
      for (int k = 0; k < 16; ++k) {                                             \
        s0[k] += a[k] * x0;                                                      \
        s1[k] += a[rank + k] * x1;                                               \
        s2[k] += a[2 * rank + k] * x2;                                           \
        s3[k] += a[3 * rank + k] * x3;                                           \
      }                                                                          \
    }                                                                            \
    for (; i < cols; ++i)                                                        \
      for (int k = 0; k < 16; ++k) s0[k] += at[i * rank + kb + k] * x[i];        \
    for (int k = 0; k < 16; ++k) t[kb + k] = ((s0[k] + s1[k]) + (s2[k] + s3[k])) * scale; \
  }                                                                              \
  for (int64_t k = kb; k < rank; ++k) {                                          \
    float acc = 0.0f;                                                            \
    for (int64_t i = 0; i < cols; ++i) acc += at[i * rank + k] * x[i];           \
    t[k] = acc * scale;                                                          \
  }                                                                              \
  int64_t j0 = 0;                                                                \
  for (; j0 + 64 <= rows; j0 += 64) {                                            \
    float acc[64];                                                               \
    for (int jj = 0; jj < 64; ++jj) acc[jj] = y[j0 + jj];                        \
    for (int64_t k = 0; k < rank; ++k) {                                         \
      const float tk = t[k];                                                     \
      const float* bk = bt + k * rows + j0;                                      \
      for (int jj = 0; jj < 64; ++jj) acc[jj] += bk[jj] * tk;                    \
    }                                                                            \
    for (int jj = 0; jj < 64; ++jj) y[j0 + jj] = acc[jj];                        \
  }                                                                              \
  for (int64_t j = j0; j < rows; ++j) {                                          \
    float acc = y[j];                                                            \
    for (int64_t k = 0; k < rank; ++k) acc += bt[k * rows + j] * t[k];           \
    y[j] = acc;                                                                  \
  }

void lora_row_base(const float* at, const float* bt, int64_t rank, int64_t cols, int64_t rows, float scale,
                   const float* x, float* y, float* t) {
  SERVAL_LORA_ROW_BODY
}

#if defined(__x86_64__)
SERVAL_TARGET_BEGIN("avx2,fma")
void lora_row_avx2(const float* at, const float* bt, int64_t rank, int64_t cols, int64_t rows, float scale,
                   const float* x, float* y, float* t) {
  SERVAL_LORA_ROW_BODY
}
SERVAL_TARGET_END

SERVAL_TARGET_BEGIN("avx2,fma,avx512f,avx512vl,avx512bw")
void lora_row_avx512(const float* at, const float* bt, int64_t rank, int64_t cols, int64_t rows, float scale,
                     const float* x, float* y, float* t) {
  SERVAL_LORA_ROW_BODY
}
SERVAL_TARGET_END
#endif

#undef SERVAL_LORA_ROW_BODY

using RowFn = void (*)(const float*, const float*, int64_t, int64_t, int64_t, float, const float*, float*, float*);

RowFn pick() {
#if defined(__x86_64__)
  const Isa isa = active_isa();
  if (isa == Isa::avx512 || isa == Isa::avx512vnni) return lora_row_avx512;
  if (isa == Isa::avx2 || isa == Isa::avx2vnni) return lora_row_avx2;
#endif
  return lora_row_base;
}

}  // namespace

void lora_row(const float* at, const float* bt, int64_t rank, int64_t cols, int64_t rows, float scale,
              const float* x, float* y, float* t) {
  static const RowFn fn = pick();
  fn(at, bt, rank, cols, rows, scale, x, y, t);
}

}  // namespace serval::kernels
