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

// out[i] = silu(gate[i]) * up[i] = gate / (1 + e^-gate) * up (SwiGLU; the
// reference is ref::swiglu, with std::exp), with the exp above: within about
// 4e-7 of |gate * up|; exactly gate * up above gate = 80, (-)0 * up below
// gate = -80 (|silu| < 2e-33 there). out may alias gate or up. The FFN of
// llama-style models runs this over [tokens, ffn] once per layer: the scalar
// std::exp loop took 4 % of a 16-sequence decode step.
void silu_mul(float* out, const float* gate, const float* up, int64_t n);

}  // namespace serval::kernels
