#include "kernels/ref/quant_search.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/status.h"
#include "tensor/quant_blocks.h"

namespace serval::ref::detail {
namespace {

constexpr int kMaxGroup = 256;  // largest group any caller passes

inline double weight_at(const float* w, int i) { return w ? (double)w[i] : 1.0; }

// Score of a symmetric labelling: the optimal d for fixed L is sumlx / suml2 and
// the error is sum w x^2 - sumlx^2 / suml2, so a larger sumlx^2 / suml2 is better.
struct SymSums {
  double sumlx = 0, suml2 = 0;
  bool valid() const { return suml2 > 0; }
  double score() const { return sumlx * sumlx / suml2; }
  float d() const { return (float)(sumlx / suml2); }
};

SymSums label_symmetric(int n, int nmax, const float* x, const float* w, float iscale, int8_t* L) {
  SymSums s;
  for (int i = 0; i < n; ++i) {
    const int l = round_clamp(iscale * x[i], -nmax, nmax - 1);
    L[i] = (int8_t)l;
    const double wi = weight_at(w, i);
    s.sumlx += wi * x[i] * l;
    s.suml2 += wi * (double)l * l;
  }
  return s;
}

}  // namespace

float search_symmetric(int n, int nmax, const float* x, const float* w, int8_t* L, int ntry) {
  SERVAL_ASSERT(n > 0 && n <= kMaxGroup);
  float amax = 0, max = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) { amax = ax; max = x[i]; }
  }
  if (!(amax >= kGroupEps)) {
    std::memset(L, 0, (size_t)n);
    return 0;
  }
  int8_t tmp[kMaxGroup];
  double best_score = -1;
  float best_d = 0;
  // k = 0 first (the plain max-to-edge mapping), then its neighbours.
  for (int t = 0; t <= 2 * ntry; ++t) {
    const int k = t == 0 ? 0 : (t <= ntry ? -t : t - ntry);
    const float iscale = -((float)nmax + 0.1f * (float)k) / max;
    const SymSums s = label_symmetric(n, nmax, x, w, iscale, tmp);
    if (s.valid() && s.score() > best_score) {
      best_score = s.score();
      best_d = s.d();
      std::memcpy(L, tmp, (size_t)n);
    }
  }
  if (best_score < 0 || best_d == 0) {
    // Every weight was zero: fall back to the unweighted edge mapping.
    best_d = -max / (float)nmax;
    label_symmetric(n, nmax, x, nullptr, 1.0f / best_d, L);
    return best_d;
  }
  for (int iter = 0; iter < 4; ++iter) {  // alternate relabel / least-squares d
    const SymSums s = label_symmetric(n, nmax, x, w, 1.0f / best_d, tmp);
    if (!s.valid() || !(s.score() > best_score) || s.d() == 0) break;
    best_score = s.score();
    best_d = s.d();
    std::memcpy(L, tmp, (size_t)n);
  }
  return best_d;
}

Affine search_affine(int n, int nmax, const float* x, const float* w, uint8_t* L,
                     bool allow_positive_offset, float rmin, float rdelta, int nstep) {
  SERVAL_ASSERT(n > 0 && n <= kMaxGroup);
  float mn = x[0], mx = x[0];
  double sw = 0, sx = 0;
  for (int i = 0; i < n; ++i) {
    mn = std::min(mn, x[i]);
    mx = std::max(mx, x[i]);
    sw += weight_at(w, i);
    sx += weight_at(w, i) * x[i];
  }
  if (!allow_positive_offset && mn > 0) mn = 0;
  if (!(mx > mn)) {  // constant group (or non-finite input)
    std::memset(L, 0, (size_t)n);
    return {0, (mn == mn) ? mn : 0.f};
  }

  auto error = [&](const Affine& a, const uint8_t* l) {
    double e = 0;
    for (int i = 0; i < n; ++i) {
      const double diff = (double)a.scale * l[i] + a.offset - x[i];
      e += weight_at(w, i) * diff * diff;
    }
    return e;
  };
  auto label = [&](float iscale, float offset, uint8_t* l) {
    for (int i = 0; i < n; ++i) l[i] = (uint8_t)round_clamp(iscale * (x[i] - offset), 0, nmax);
  };
  // Weighted least-squares (scale, offset) for fixed labels.
  auto fit = [&](const uint8_t* l, Affine& a) {
    double sl = 0, sl2 = 0, sxl = 0;
    for (int i = 0; i < n; ++i) {
      const double wi = weight_at(w, i);
      sl += wi * l[i];
      sl2 += wi * l[i] * l[i];
      sxl += wi * l[i] * x[i];
    }
    const double D = sw * sl2 - sl * sl;
    if (!(D > 0)) return false;
    double scale = (sw * sxl - sx * sl) / D;
    double offset = (sl2 * sx - sl * sxl) / D;
    if (!allow_positive_offset && offset > 0) {
      offset = 0;
      scale = sxl / sl2;
    }
    if (!(scale > 0)) return false;
    a = {(float)scale, (float)offset};
    return true;
  };

  Affine best{(mx - mn) / (float)nmax, mn};
  label((float)nmax / (mx - mn), mn, L);
  double best_err = error(best, L);

  uint8_t tmp[kMaxGroup];
  for (int k = 0; k <= nstep; ++k) {
    const float iscale = ((float)nmax + rmin + rdelta * (float)k) / (mx - mn);
    label(iscale, mn, tmp);
    Affine a;
    if (!fit(tmp, a)) continue;
    const double e = error(a, tmp);
    if (e < best_err) {
      best_err = e;
      best = a;
      std::memcpy(L, tmp, (size_t)n);
    }
  }
  for (int iter = 0; iter < 4; ++iter) {
    label(1.0f / best.scale, best.offset, tmp);
    Affine a;
    if (!fit(tmp, a)) break;
    const double e = error(a, tmp);
    if (!(e < best_err)) break;
    best_err = e;
    best = a;
    std::memcpy(L, tmp, (size_t)n);
  }
  return best;
}

namespace {

// Shared by the two scale quantizers: evaluates F16-rounded candidates d and
// polishes the best by least squares. Label(d, q) writes labels and returns
// nothing; the error is sum imp (v - d q)^2.
template <typename Q, typename LabelFn>
float search_scale_grid(int n, const float* v, const float* imp, Q* q, const float* cands, int n_cands,
                        LabelFn label) {
  Q tmp[kMaxGroup];
  auto error = [&](float d, const Q* l) {
    double e = 0;
    for (int j = 0; j < n; ++j) {
      const double diff = (double)v[j] - (double)d * l[j];
      e += weight_at(imp, j) * diff * diff;
    }
    return e;
  };
  double best_err = -1;
  float best_d = 0;
  for (int c = 0; c < n_cands; ++c) {
    // The candidate as F16 and its two F16 neighbours: for small scales (F16
    // subnormals, a few significant bits) the neighbours are far apart and
    // one of them often pairs with better integer sub-scales.
    const uint16_t h = fp16_scale_bits(cands[c]);
    const int mag = h & 0x7fff;
    for (int delta : {0, -1, 1}) {
      const int m = mag + delta;
      if (m < 1 || m > 0x7bff) continue;  // not zero, not inf
      const float d = fp16_to_fp32((uint16_t)((h & 0x8000) | m));
      label(d, tmp);
      const double e = error(d, tmp);
      if (best_err < 0 || e < best_err) {
        best_err = e;
        best_d = d;
        std::memcpy(q, tmp, sizeof(Q) * (size_t)n);
      }
    }
  }
  if (best_err < 0) {  // no candidate (NaN input)
    std::memset(q, 0, sizeof(Q) * (size_t)n);
    return 0;
  }
  // A tiny subnormal d (k * 2^-24 with k < 64) is too coarse for the candidate
  // grid above: scan every k up to 4x the best one.
  const uint16_t best_h = fp16_scale_bits(best_d);
  if ((best_h & 0x7fff) < 64) {
    const int kmax = 4 * (best_h & 0x7fff);
    for (int k = 1; k <= kmax; ++k) {
      const float d = fp16_to_fp32((uint16_t)((best_h & 0x8000) | k));
      label(d, tmp);
      const double e = error(d, tmp);
      if (e < best_err) {
        best_err = e;
        best_d = d;
        std::memcpy(q, tmp, sizeof(Q) * (size_t)n);
      }
    }
  }
  for (int iter = 0; iter < 4; ++iter) {
    double num = 0, den = 0;
    for (int j = 0; j < n; ++j) {
      num += weight_at(imp, j) * v[j] * q[j];
      den += weight_at(imp, j) * (double)q[j] * q[j];
    }
    if (!(den > 0)) break;
    const float d = fp16_round((float)(num / den));
    if (d == 0 || d == best_d) break;
    label(d, tmp);
    const double e = error(d, tmp);
    if (!(e < best_err)) break;
    best_err = e;
    best_d = d;
    std::memcpy(q, tmp, sizeof(Q) * (size_t)n);
  }
  return best_d;
}

}  // namespace

float quantize_scales_unsigned(int n, int qmax, const float* v, const float* imp, uint8_t* q) {
  SERVAL_ASSERT(n > 0 && n <= kMaxGroup);
  float max = 0;
  for (int j = 0; j < n; ++j) max = std::max(max, v[j]);
  if (!(max > 0)) {
    std::memset(q, 0, (size_t)n);
    return 0;
  }
  float cands[11];
  int nc = 0;
  for (int k : {0, 1, 2, 3, 4, 5, -1, -2, -3, -4, -5}) cands[nc++] = max / ((float)qmax + 0.1f * (float)k);
  return search_scale_grid<uint8_t>(n, v, imp, q, cands, nc, [&](float d, uint8_t* l) {
    const float id = 1.0f / d;
    for (int j = 0; j < n; ++j) l[j] = (uint8_t)round_clamp(v[j] * id, 0, qmax);
  });
}

float quantize_scales_signed(int n, int qneg, int qpos, const float* v, const float* imp, int8_t* q) {
  SERVAL_ASSERT(n > 0 && n <= kMaxGroup);
  float amax = 0, max = 0;
  for (int j = 0; j < n; ++j) {
    if (std::fabs(v[j]) > amax) { amax = std::fabs(v[j]); max = v[j]; }
  }
  if (!(amax > 0)) {
    std::memset(q, 0, (size_t)n);
    return 0;
  }
  float cands[22];
  int nc = 0;
  for (int k : {0, 1, 2, 3, 4, 5, -1, -2, -3, -4, -5}) {
    cands[nc++] = -max / ((float)qneg + 0.1f * (float)k);  // largest magnitude -> -qneg
    cands[nc++] = max / ((float)qpos + 0.1f * (float)k);   // largest magnitude -> +qpos
  }
  return search_scale_grid<int8_t>(n, v, imp, q, cands, nc, [&](float d, int8_t* l) {
    const float id = 1.0f / d;
    for (int j = 0; j < n; ++j) l[j] = (int8_t)round_clamp(v[j] * id, -qneg, qpos);
  });
}

Codebook16::Codebook16(const int8_t* values) : values_(values) {
  for (int i = 0; i + 1 < 16; ++i) SERVAL_ASSERT(values[i] < values[i + 1]);
  int i = 0;
  for (int k = -128; k < 128; ++k) {
    while (i + 1 < 16 && values[i + 1] <= k) ++i;
    floor_index_[k + 128] = (uint8_t)i;
  }
}

float search_codebook(int n, const Codebook16& cb, const float* x, const float* w, uint8_t* L, int ntry) {
  SERVAL_ASSERT(n > 0 && n <= kMaxGroup);
  const int nv = 16;
  const int8_t* values = cb.values();
  float amax = 0, max = 0;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) { amax = std::fabs(x[i]); max = x[i]; }
  }
  if (!(amax >= kGroupEps)) {
    std::memset(L, (uint8_t)cb.nearest(0.f), (size_t)n);
    return 0;
  }
  uint8_t tmp[kMaxGroup];
  auto label = [n, x, w, values, cb](float id, uint8_t* l) {
    // Labels go to a local array first: a store through uint8_t* may alias
    // anything and would force every operand to be reloaded.
    uint8_t k[kMaxGroup];
    SymSums s;
    for (int i = 0; i < n; ++i) {
      const int ki = cb.nearest(id * x[i]);
      k[i] = (uint8_t)ki;
      const double q = values[ki];
      s.sumlx += weight_at(w, i) * q * x[i];
      s.suml2 += weight_at(w, i) * q * q;
    }
    std::memcpy(l, k, (size_t)n);
    return s;
  };
  double best_score = -1;
  float best_d = 0;
  // Map the largest-magnitude element near either end of the codebook.
  for (int edge : {0, nv - 1}) {
    for (int t = 0; t <= 2 * ntry; ++t) {
      const int k = t == 0 ? 0 : (t <= ntry ? -t : t - ntry);
      const float id = ((float)values[edge] + (float)k) / max;
      const SymSums s = label(id, tmp);
      if (s.valid() && s.score() > best_score && s.d() != 0) {
        best_score = s.score();
        best_d = s.d();
        std::memcpy(L, tmp, (size_t)n);
      }
    }
  }
  if (best_score < 0) {  // all weights zero
    best_d = max / (float)values[0];
    label(1.0f / best_d, L);
    return best_d;
  }
  for (int iter = 0; iter < 4; ++iter) {
    const SymSums s = label(1.0f / best_d, tmp);
    if (!s.valid() || !(s.score() > best_score) || s.d() == 0) break;
    best_score = s.score();
    best_d = s.d();
    std::memcpy(L, tmp, (size_t)n);
  }
  return best_d;
}

void super_block_weights(const float* x, const float* imatrix, DefaultWeights mode, int sub, float* w) {
  if (imatrix) {
    double s2 = 0;
    for (int i = 0; i < QK_K; ++i) s2 += (double)x[i] * x[i];
    const float sigma2 = (float)(s2 / QK_K);
    for (int i = 0; i < QK_K; ++i) w[i] = imatrix[i] * std::sqrt(sigma2 + x[i] * x[i]);
    return;
  }
  switch (mode) {
    case DefaultWeights::square:
      for (int i = 0; i < QK_K; ++i) w[i] = x[i] * x[i];
      break;
    case DefaultWeights::abs:
      for (int i = 0; i < QK_K; ++i) w[i] = std::fabs(x[i]);
      break;
    case DefaultWeights::mean_square_plus_square: {
      double s2 = 0;
      for (int i = 0; i < QK_K; ++i) s2 += (double)x[i] * x[i];
      const float ms = (float)(s2 / QK_K);
      for (int i = 0; i < QK_K; ++i) w[i] = ms + x[i] * x[i];
      break;
    }
    case DefaultWeights::rms_plus_abs:
      for (int j = 0; j < QK_K; j += sub) {
        double s2 = 0;
        for (int i = j; i < j + sub; ++i) s2 += (double)x[i] * x[i];
        const float rms = (float)std::sqrt(s2 / sub);
        for (int i = j; i < j + sub; ++i) w[i] = rms + std::fabs(x[i]);
      }
      break;
  }
}

}  // namespace serval::ref::detail
