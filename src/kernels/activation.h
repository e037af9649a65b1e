// Element-wise activations of the forward pass, in forms the compiler
// vectorizes at any x86-64 level (no libm calls in the loop): the scalar
// references are in ref/ops.h (ref::gelu), which these match to a few ulp
// (tests/kernels/activation_test.cpp). Element-wise, so batch invariant.
// Thread-safe (no state).
#pragma once

#include <cstdint>

namespace serval::kernels {

// x[i] = gelu(x[i]) in its tanh form (ggml_gelu; BERT's FFN), written as
// x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3), with exp from a range
// reduction to [-ln2/2, ln2/2] and a degree-6 polynomial (error about 2e-7
// relative to |x|); -0 below x = -10, where |gelu(x)| < 1e-22. In place.
void gelu(float* x, int64_t n);

}  // namespace serval::kernels
