// Internal to kernels/: one row's super-block in and out of PackedMatrix's
// K-quant layouts (kernel_table.h: Q4_Kx16, Q6_Kx16). Scalar; the packing is
// lossless (get returns the stored block byte for byte).
#pragma once

#include <cstddef>
#include <cstdint>

#include "tensor/dtype.h"

namespace serval::kernels::detail {

// Bytes of one 16-row super-block of t's layout; 0 when t has none.
size_t kx16_sb_bytes(DType t);
// Row l (< 16) of the 16-row super-block sb16 <-> its stored block.
void kx16_put(DType t, uint8_t* sb16, int l, const uint8_t* blk);
void kx16_get(DType t, const uint8_t* sb16, int l, uint8_t* blk);

}  // namespace serval::kernels::detail
