// The per-row kernel of a LoRA update (model/lora.h): for one activation row
// x ([cols]) and its output row y ([rows]),
//   t[k] = scale * sum over i of A[k][i] * x[i]  (four partial sums over
//          i mod 4, each in order, added as (s0 + s1) + (s2 + s3))
//   y[j] = y[j] + t[0] B[j][0] + t[1] B[j][1] + ...  (in k order)
// with A given transposed (at: [cols][rank]) and B in blocks of 64 outputs
// (bt: for each block of 64 rows of y, [rank][64]; the last rows % 64 as
// [rank][rows % 64]; lora_b_index), so both loops stream contiguous memory
// (the next block prefetched) with no reduction across lanes: each
// element's arithmetic is fixed, whatever the other rows of the batch (batch
// invariant), at every ISA level. Compiled for AVX-512 and AVX2 + FMA as well
// as the baseline, picked once at run time with the matmul's level
// (kernels::active_isa(), SERVAL_ISA). Thread-safe; `t` is the caller's
// scratch of rank floats.
#pragma once

#include <cstdint>

namespace serval::kernels {

// Where B[j][k] (output j, rank k) sits in bt.
inline int64_t lora_b_index(int64_t k, int64_t j, int64_t rank, int64_t rows) {
  const int64_t j0 = j / 64 * 64;
  const int64_t width = rows - j0 < 64 ? rows - j0 : 64;
  return j0 * rank + k * width + (j - j0);
}

void lora_row(const float* at, const float* bt, int64_t rank, int64_t cols, int64_t rows, float scale,
              const float* x, float* y, float* t);
// The same with A and B stored as F16 (half the bytes to read: an adapter's
// weights are read once per step): bit-identical to lora_row on the widened
// values (each block is widened into a buffer, then the same loops run).
void lora_row_f16(const uint16_t* at, const uint16_t* bt, int64_t rank, int64_t cols, int64_t rows, float scale,
                  const float* x, float* y, float* t);

// The rows of one adapter's update several at a time: x[r] and y[r] for
// r < n, each row's result bit for bit what lora_row (lora_row_f16) gives it
// alone; A and B are widened and read once per kLoraGroupRows rows (F16 at
// AVX-512; once per two rows where the generic body runs). `t`: the
// caller's scratch of kLoraGroupRows * rank floats.
inline constexpr int kLoraGroupRows = 4;
void lora_rows(const float* at, const float* bt, int64_t rank, int64_t cols, int64_t rows, float scale,
               const float* const* x, float* const* y, int n, float* t);
void lora_rows_f16(const uint16_t* at, const uint16_t* bt, int64_t rank, int64_t cols, int64_t rows, float scale,
                   const float* const* x, float* const* y, int n, float* t);

}  // namespace serval::kernels
