// Internal to kernels/ref: the scale searches shared by the reference
// quantizers (quantize_legacy.cpp, quantize_k.cpp). Not a public API.
//
// Every search minimizes a weighted squared error sum_i w[i] * (x[i] - q(x[i]))^2
// over a family of candidate grids, then polishes the winner with a few
// alternating steps (relabel with the current scale, re-solve the scale by least
// squares). Sums are kept in double so that huge magnitudes cannot overflow.
// All functions are pure; thread-safe.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/fp16.h"

namespace serval::ref::detail {

// Groups whose largest |x| is below this are stored as all zeros.
constexpr float kGroupEps = 1e-15f;

// Round to nearest (ties to even) and clamp to [lo, hi]; NaN gives lo.
inline int round_clamp(float v, int lo, int hi) {
  if (!(v >= (float)lo)) return lo;
  if (!(v <= (float)hi)) return hi;
  return (int)std::nearbyint(v);
}

// The float an F16 field will hold for v, saturating at +-65504 (a scale that
// overflows F16 would turn 0 * inf into NaN on dequantization); NaN gives 0.
inline uint16_t fp16_scale_bits(float v) {
  if (!(v == v)) return 0;
  if (v > 65504.f) v = 65504.f;
  if (v < -65504.f) v = -65504.f;
  return fp32_to_fp16(v);
}
inline float fp16_round(float v) { return fp16_to_fp32(fp16_scale_bits(v)); }

// Symmetric grid: x[i] ~= d * L[i] with integer L[i] in [-nmax, nmax - 1].
// Candidates map the largest-magnitude element to -(nmax + 0.1 k), k in
// [-ntry, ntry]. Returns d (0 for an all-(near-)zero group, with L = 0).
// w == nullptr means unit weights.
float search_symmetric(int n, int nmax, const float* x, const float* w, int8_t* L, int ntry);

// Affine grid: x[i] ~= scale * L[i] + offset with L[i] in [0, nmax].
// When allow_positive_offset is false the offset is forced <= 0 (the K-quants
// store -offset as an unsigned min). Candidate inverse scales are
// (nmax + rmin + rdelta * k) / (max - min), k in [0, nstep].
struct Affine {
  float scale = 0;
  float offset = 0;
};
Affine search_affine(int n, int nmax, const float* x, const float* w, uint8_t* L,
                     bool allow_positive_offset, float rmin, float rdelta, int nstep);

// Quantizes n non-negative values v[j] to d * q[j], q[j] in [0, qmax], d an
// F16-representable value >= 0, minimizing sum imp[j] (v[j] - d q[j])^2
// (imp == nullptr: unit). Returns d; writes q.
float quantize_scales_unsigned(int n, int qmax, const float* v, const float* imp, uint8_t* q);

// Signed values v[j] to d * q[j], q[j] in [-qneg, qpos], d F16-representable.
float quantize_scales_signed(int n, int qneg, int qpos, const float* v, const float* imp, int8_t* q);

// Element weights used when no imatrix is given, per format. Q2_K, Q4_K,
// Q5_K and Q6_K use the weightings ggml's reference quantizers use (tuned on
// real models for perplexity, not just RMSE); Q3_K blends ggml's x^2 with
// unit weights, which on the mini model weights beats llama.cpp's Q3_K under
// both plain and x^2-weighted error (ggml's x^2 alone loses on plain RMSE).
enum class DefaultWeights {
  square,                   // x^2: favours the large elements (Q6_K)
  abs,                      // |x| (Q2_K)
  rms_plus_abs,             // rms(sub-block) + |x| (Q4_K, Q5_K)
  mean_square_plus_square,  // mean(x^2 over the super-block) + x^2 (Q3_K, IQ types)
};

// Fills w[0..256) for one 256-element super-block. With an imatrix:
// imatrix[i] * sqrt(sigma2 + x^2), sigma2 = mean square of the super-block;
// without, the format's default (sub = its sub-block length, for rms_plus_abs).
void super_block_weights(const float* x, const float* imatrix, DefaultWeights mode, int sub, float* w);

// A 16-entry ascending codebook of integer levels (IQ4_NL's) with a lookup
// table for the nearest entry: O(1) per element.
class Codebook16 {
 public:
  explicit Codebook16(const int8_t* values);
  const int8_t* values() const { return values_; }
  // Index of the entry nearest to v (ties to the lower index; NaN gives 0).
  int nearest(float v) const {
    if (!(v > (float)values_[0])) return 0;
    if (v >= (float)values_[15]) return 15;
    // v + 128 > 0 here, so truncation is floor, and values[i] <= v <
    // values[i + 1] except that v + 128 may round up onto the next integer;
    // then v lies within an ulp of values[i] (i may be 15).
    const int i = floor_index_[(int)(v + 128.0f)];
    if (i == 15) return 15;
    return (v - (float)values_[i] <= (float)values_[i + 1] - v) ? i : i + 1;
  }

 private:
  const int8_t* values_;
  uint8_t floor_index_[256];  // [k + 128]: the largest i with values[i] <= k
};

// Non-linear codebook grid: x[i] ~= d * values[L[i]]. Searches d over
// candidates that put the largest-magnitude element near either end of the
// codebook (2 * (2 ntry + 1) of them), polishes it; returns d (not yet
// F16-rounded).
float search_codebook(int n, const Codebook16& cb, const float* x, const float* w, uint8_t* L, int ntry);

}  // namespace serval::ref::detail
