// The per-row kernel of a LoRA update (model/lora.h): for one activation row
// x ([cols]) and its output row y ([rows]),
//   t[k] = scale * sum over i of A[k][i] * x[i]  (four partial sums over
//          i mod 4, each in order, added as (s0 + s1) + (s2 + s3))
//   y[j] = y[j] + t[0] B[j][0] + t[1] B[j][1] + ...  (in k order)
// with A and B given transposed (at: [cols][rank], bt: [rank][rows]), so both
// loops run over contiguous memory with no reduction across lanes: each
// element's arithmetic is fixed, whatever the other rows of the batch (batch
// invariant), at every ISA level. Compiled for AVX-512 and AVX2 + FMA as well
// as the baseline, picked once at run time with the matmul's level
// (kernels::active_isa(), SERVAL_ISA). Thread-safe; `t` is the caller's
// scratch of rank floats.
#pragma once

#include <cstdint>

namespace serval::kernels {

void lora_row(const float* at, const float* bt, int64_t rank, int64_t cols, int64_t rows, float scale,
              const float* x, float* y, float* t);
// The same with A and B stored as F16 (half the bytes to read: an adapter's
// weights are read once per step): bit-identical to lora_row on the widened
// values (each block is widened into a buffer, then the same loops run).
void lora_row_f16(const uint16_t* at, const uint16_t* bt, int64_t rank, int64_t cols, int64_t rows, float scale,
                  const float* x, float* y, float* t);

}  // namespace serval::kernels
