// Reference quantizers of the lattice-codebook types (IQ2_XXS, IQ2_XS, IQ2_S,
// IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) and the ternary TQ1_0 / TQ2_0. Layouts:
// tensor/quant_blocks.h; codebooks: tensor/iq_grids.h.
//
// A lattice type stores each group of 8 (or 4) elements as one codebook entry
// (a vector of small magnitudes) times a sub-block scale, with the signs kept
// apart (IQ2/IQ3) or inside the entry (IQ1, whose entries are -1/0/+1 plus a
// shift of +-1/8). Per super-block of 256:
//  1. element weights: imatrix * sqrt(mean x^2 + x^2), or mean x^2 + x^2
//     without an imatrix (quant_search.h);
//  2. signs: for the 7-bit sign fields (IQ2_XXS, IQ2_XS, IQ3_XXS) a group with
//     an odd number of negatives flips the sign of its least important
//     element (smallest w x^2), whose target magnitude becomes -|x|;
//  3. each sub-block searches its float scale: at each of 11 candidate scales
//     (0.6-1.4 times the top level at the largest |x|) every group takes the
//     best entry (weighted error) among the kCand entries
//     nearest to its rounded point; the scale of the best labelling is then
//     polished by least squares and relabelling;
//  4. the sub-block scales are quantized to odd multiples of an F16
//     super-scale (every format stores d * (2l + 1) up to a constant),
//     weighted by each sub-block's sum w g^2;
//  5. every sub-block is relabelled at its stored scale, trying the scale
//     codes l - 1, l, l + 1 and keeping the one with the least error.
//
// Nearest-entry tables are built once per codebook on first use (thread-safe
// function-local statics); everything else is pure.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "common/fp16.h"
#include "common/status.h"
#include "kernels/ref/quant_search.h"
#include "kernels/ref/quants_impl.h"
#include "tensor/iq_grids.h"

namespace serval::ref::detail {
namespace {

constexpr int kCand = 16;  // entries tried per group: the nearest to its rounded point

// A codebook prepared for search: the distinct element values ("levels"), each
// entry's values as floats, and for every point of the level lattice the
// kCand entries nearest to it (Euclidean, in value units).
class Lattice {
 public:
  template <typename Word>
  Lattice(const Word* grid, int n, int dim, bool is_signed) : dim_(dim) {
    std::vector<float> lev;
    val_.resize((size_t)n * dim);
    for (int e = 0; e < n; ++e)
      for (int j = 0; j < dim; ++j) {
        const uint8_t b = (uint8_t)(grid[e] >> (8 * j));
        const float v = is_signed ? (float)(int8_t)b : (float)b;
        val_[(size_t)e * dim + j] = v;
        if (std::find(lev.begin(), lev.end(), v) == lev.end()) lev.push_back(v);
      }
    std::sort(lev.begin(), lev.end());
    SERVAL_ASSERT(lev.size() >= 2 && lev.size() <= 8);
    nlev_ = (int)lev.size();
    std::copy(lev.begin(), lev.end(), lev_);
    for (int i = 0; i < 7; ++i)
      mid_[i] = i + 1 < nlev_ ? 0.5f * (lev_[i] + lev_[i + 1]) : std::numeric_limits<float>::infinity();
    int cells = 1;
    for (int j = 0; j < dim; ++j) cells *= nlev_;
    cand_.resize((size_t)cells * kCand);
    cval_.resize((size_t)cells * dim * kCand);
    std::vector<std::pair<float, uint16_t>> dist((size_t)n);
    for (int c = 0; c < cells; ++c) {
      float p[8];
      for (int j = 0, r = c; j < dim; ++j, r /= nlev_) p[j] = lev_[r % nlev_];
      for (int e = 0; e < n; ++e) {
        float d2 = 0;
        for (int j = 0; j < dim; ++j) d2 += (p[j] - val_[(size_t)e * dim + j]) * (p[j] - val_[(size_t)e * dim + j]);
        dist[(size_t)e] = {d2, (uint16_t)e};
      }
      std::partial_sort(dist.begin(), dist.begin() + kCand, dist.end());
      for (int k = 0; k < kCand; ++k) {
        const uint16_t e = dist[(size_t)k].second;
        cand_[(size_t)c * kCand + k] = e;
        for (int j = 0; j < dim; ++j) cval_[((size_t)c * dim + j) * kCand + k] = val_[(size_t)e * dim + j];
      }
    }
  }

  int dim() const { return dim_; }
  float top() const { return lev_[nlev_ - 1]; }

  // The entry minimizing sum w (t - s (g + off))^2 for one group's targets t
  // among the candidates of the point t / s - off rounds to. Adds the winner's
  // sum w t (g + off) and sum w (g + off)^2 to *A and *B; returns the entry and
  // its cost s^2 B - 2 s A.
  int best(const float* t, const float* w, float s, float off, double* A, double* B, double* cost) const {
    const float inv = 1.0f / s;
    int cell = 0;
    for (int j = dim_ - 1; j >= 0; --j) cell = cell * nlev_ + level_of(t[j] * inv - off);
    // The candidates' sums side by side (kCand lanes: the loops vectorize).
    float a[kCand] = {}, b[kCand] = {};
    const float* g = &cval_[(size_t)cell * dim_ * kCand];
    for (int j = 0; j < dim_; ++j, g += kCand) {
      const float wt = w[j] * t[j], ww = w[j];
      for (int k = 0; k < kCand; ++k) {
        const float gj = g[k] + off;
        a[k] += wt * gj;
        b[k] += ww * gj * gj;
      }
    }
    const float s2 = s * s, s_2 = 2.0f * s;
    int bk = 0;
    float best_cost = s2 * b[0] - s_2 * a[0];
    for (int k = 1; k < kCand; ++k) {
      const float cst = s2 * b[k] - s_2 * a[k];
      if (cst < best_cost) {
        best_cost = cst;
        bk = k;
      }
    }
    *A += a[bk];
    *B += b[bk];
    *cost = best_cost;
    return cand_[(size_t)cell * kCand + bk];
  }

 private:
  // The nearest level: how many midpoints lie below v (branch-free; the
  // unused midpoints are +inf; NaN gives 0).
  int level_of(float v) const {
    int i = 0;
    for (int k = 0; k < 7; ++k) i += v > mid_[k];
    return i;
  }

  int dim_, nlev_ = 0;
  float lev_[8] = {}, mid_[8] = {};
  std::vector<float> val_;     // [entry][dim]
  std::vector<uint16_t> cand_;  // [cell][kCand]: entries, nearest first
  std::vector<float> cval_;     // [cell][dim][kCand]: their values, transposed
};

const Lattice& lattice_iq2xxs() { static const Lattice l(iq2xxs_grid(), 256, 8, false); return l; }
const Lattice& lattice_iq2xs() { static const Lattice l(iq2xs_grid(), 512, 8, false); return l; }
const Lattice& lattice_iq2s() { static const Lattice l(iq2s_grid(), 1024, 8, false); return l; }
const Lattice& lattice_iq3xxs() { static const Lattice l(iq3xxs_grid(), 256, 4, false); return l; }
const Lattice& lattice_iq3s() { static const Lattice l(iq3s_grid(), 512, 4, false); return l; }
const Lattice& lattice_iq1s() { static const Lattice l(iq1s_grid(), 2048, 8, true); return l; }

enum class Signs { parity7, full, none };
// IQ1 shift: none (IQ2/IQ3), one per sub-block (IQ1_S) or one per group (IQ1_M).
enum class Shift { none, per_sub, per_group };
constexpr float kShift = 0.125f;

struct Spec {
  const Lattice* lat;
  int sub;        // elements per sub-block scale
  int lmax;       // scale codes 0..lmax
  Signs signs;
  Shift shift;
  float (*scale)(float d, int l);  // the stored scale, in the dequantizer's float order
  float c;                         // scale(d, l) == d * c * (2l + 1)
};

// One super-block's labels.
struct IqBlock {
  float d = 0;               // F16-representable
  uint8_t l[16] = {};        // scale code per sub-block
  uint16_t idx[64] = {};     // entry per group of dim
  uint8_t sign[32] = {};     // sign byte per 8 elements (even parity for parity7)
  uint8_t neg_shift[32] = {};// per group of 8: the shift is -1/8
};

// Labels of one sub-block at scale s.
struct SubLabels {
  uint16_t idx[8];
  uint8_t neg[8];
  double A = 0, B = 0, cost = 0;
};

SubLabels label_sub(const Spec& sp, const float* t, const float* w, float s, int shift_mode) {
  // shift_mode: 0 = none, 1 = +1/8 for all, 2 = -1/8 for all, 3 = free per group
  const Lattice& L = *sp.lat;
  const int dim = L.dim(), m = sp.sub / dim;
  SubLabels r;
  for (int u = 0; u < m; ++u) {
    const float* tu = t + u * dim;
    const float* wu = w + u * dim;
    if (shift_mode == 3) {
      double a1 = 0, b1 = 0, c1, a2 = 0, b2 = 0, c2;
      const int e1 = L.best(tu, wu, s, kShift, &a1, &b1, &c1);
      const int e2 = L.best(tu, wu, s, -kShift, &a2, &b2, &c2);
      const bool second = c2 < c1;
      r.idx[u] = (uint16_t)(second ? e2 : e1);
      r.neg[u] = second;
      r.A += second ? a2 : a1;
      r.B += second ? b2 : b1;
      r.cost += second ? c2 : c1;
    } else {
      const float off = shift_mode == 1 ? kShift : shift_mode == 2 ? -kShift : 0.0f;
      double c;
      r.idx[u] = (uint16_t)L.best(tu, wu, s, off, &r.A, &r.B, &c);
      r.neg[u] = shift_mode == 2;
      r.cost += c;
    }
  }
  return r;
}

// The best float scale of one sub-block and its labels: candidates put the
// largest |t| at 0.6-1.4 times the top level, then least squares and
// relabelling polish the winner. Returns 0 for an all-zero sub-block.
float search_sub(const Spec& sp, const float* t, const float* w, SubLabels* out) {
  float amax = 0;
  for (int i = 0; i < sp.sub; ++i) amax = std::max(amax, std::fabs(t[i]));
  const int n_modes = sp.shift == Shift::per_sub ? 2 : 1;
  const int mode0 = sp.shift == Shift::none ? 0 : sp.shift == Shift::per_sub ? 1 : 3;
  if (!(amax > kGroupEps)) {
    *out = label_sub(sp, t, w, 1.0f, mode0);
    return 0;
  }
  const float top = sp.lat->top() + (sp.shift == Shift::none ? 0.0f : kShift);
  double best_score = -1;
  float best_s = 0;
  for (int mi = 0; mi < n_modes; ++mi) {
    const int mode = mode0 + mi;
    double mode_score = -1;
    float mode_s = 0;
    SubLabels mode_lab;
    for (int k = -5; k <= 5; ++k) {
      const float s = amax / (top * (1.0f + 0.08f * (float)k));
      SubLabels lab = label_sub(sp, t, w, s, mode);
      if (!(lab.A > 0 && lab.B > 0)) continue;
      const double score = lab.A * lab.A / lab.B;
      if (score > mode_score) {
        mode_score = score;
        mode_s = (float)(lab.A / lab.B);
        mode_lab = lab;
      }
    }
    for (int it = 0; it < 3 && mode_score > 0; ++it) {
      SubLabels lab = label_sub(sp, t, w, mode_s, mode);
      if (!(lab.A > 0 && lab.B > 0)) break;
      const double score = lab.A * lab.A / lab.B;
      if (score <= mode_score) break;
      mode_score = score;
      mode_s = (float)(lab.A / lab.B);
      mode_lab = lab;
    }
    if (mode_score > best_score) {
      best_score = mode_score;
      best_s = mode_s;
      *out = mode_lab;
    }
  }
  if (best_score <= 0) {  // no labelling correlates with t (all weights zero)
    *out = label_sub(sp, t, w, amax / top, mode0);
    return 0;
  }
  return best_s;
}

// v[i] >= 0 to D (2 l[i] + 1), l in [0, lmax], minimizing sum imp (v - D(2l+1))^2.
float quantize_odd_scales(int n, int lmax, const float* v, const float* imp, uint8_t* l) {
  float vmax = 0;
  for (int i = 0; i < n; ++i) vmax = std::max(vmax, v[i]);
  std::memset(l, 0, (size_t)n);
  if (!(vmax > 0)) return 0;
  auto label = [&](float D, uint8_t* out) {
    double err = 0, num = 0, den = 0;
    for (int i = 0; i < n; ++i) {
      const int q = round_clamp((v[i] / D - 1.0f) * 0.5f, 0, lmax);
      out[i] = (uint8_t)q;
      const double g = 2 * q + 1, e = v[i] - D * g;
      err += imp[i] * e * e;
      num += imp[i] * v[i] * g;
      den += imp[i] * g * g;
    }
    return std::pair<double, double>(err, den > 0 ? num / den : D);
  };
  double best = std::numeric_limits<double>::infinity();
  float best_D = vmax / (float)(2 * lmax + 1);
  uint8_t tmp[16];
  for (int k = -8; k <= 8; ++k) {
    float D = vmax / ((float)(2 * lmax + 1) * (1.0f + 0.03f * (float)k));
    for (int it = 0; it < 2; ++it) {
      const auto [err, ls] = label(D, tmp);
      if (err < best) {
        best = err;
        best_D = D;
        std::memcpy(l, tmp, (size_t)n);
      }
      if (!(ls > 0)) break;
      D = (float)ls;
    }
  }
  return best_D;
}

void quantize_iq_block(const Spec& sp, const float* x, const float* imatrix, IqBlock& r) {
  float w[QK_K], t[QK_K];
  super_block_weights(x, imatrix, DefaultWeights::mean_square_plus_square, sp.sub, w);
  // 2. signs
  if (sp.signs == Signs::none) {
    std::memcpy(t, x, sizeof(t));
  } else {
    for (int g = 0; g < QK_K / 8; ++g) {
      uint8_t s = 0;
      for (int j = 0; j < 8; ++j) {
        const int i = 8 * g + j;
        if (x[i] < 0) s |= (uint8_t)(1u << j);
        t[i] = std::fabs(x[i]);
      }
      if (sp.signs == Signs::parity7 && (__builtin_popcount(s) & 1)) {
        int jmin = 0;
        float vmin = std::numeric_limits<float>::infinity();
        for (int j = 0; j < 8; ++j) {
          const float v = w[8 * g + j] * x[8 * g + j] * x[8 * g + j];
          if (v < vmin) { vmin = v; jmin = j; }
        }
        s ^= (uint8_t)(1u << jmin);
        t[8 * g + jmin] = -t[8 * g + jmin];
      }
      r.sign[g] = s;
    }
  }
  // 3. sub-block scales
  const int nsub = QK_K / sp.sub, dim = sp.lat->dim(), m = sp.sub / dim;
  float sc[16], imp[16];
  for (int ib = 0; ib < nsub; ++ib) {
    SubLabels lab;
    sc[ib] = search_sub(sp, t + ib * sp.sub, w + ib * sp.sub, &lab);
    imp[ib] = (float)lab.B;
  }
  // 4. the scales against the super-scale
  const float D = quantize_odd_scales(nsub, sp.lmax, sc, imp, r.l);
  r.d = fp16_round(D / sp.c);
  // 5. relabel at the stored scales
  const int mode0 = sp.shift == Shift::none ? 0 : sp.shift == Shift::per_sub ? 1 : 3;
  const int n_modes = sp.shift == Shift::per_sub ? 2 : 1;
  for (int ib = 0; ib < nsub; ++ib) {
    const float* tb = t + ib * sp.sub;
    const float* wb = w + ib * sp.sub;
    double best = std::numeric_limits<double>::infinity();
    SubLabels best_lab;
    int best_l = r.l[ib];
    for (int dl : {0, -1, 1}) {  // ties keep the code step 4 chose
      const int l = r.l[ib] + dl;
      if (l < 0 || l > sp.lmax) continue;
      const float s = sp.scale(r.d, l);
      if (!(s > 0)) {  // d == 0: every value decodes to 0
        best_lab = label_sub(sp, tb, wb, 1.0f, mode0);
        best_l = 0;
        break;
      }
      for (int mi = 0; mi < n_modes; ++mi) {
        const SubLabels lab = label_sub(sp, tb, wb, s, mode0 + mi);
        if (lab.cost < best) {
          best = lab.cost;
          best_lab = lab;
          best_l = l;
        }
      }
    }
    r.l[ib] = (uint8_t)best_l;
    for (int u = 0; u < m; ++u) {
      r.idx[ib * m + u] = best_lab.idx[u];
      if (dim == 8) r.neg_shift[ib * m + u] = best_lab.neg[u];
    }
  }
}

float scale_q8(float d, int l) { return d * (0.5f + (float)l) * 0.25f; }
float scale_q4(float d, int l) { return d * (0.5f + (float)l) * 0.5f; }
float scale_odd(float d, int l) { return d * (float)(2 * l + 1); }

inline void store_u32(uint16_t* p, uint32_t v) {
  p[0] = (uint16_t)v;
  p[1] = (uint16_t)(v >> 16);
}

}  // namespace

void quantize_iq2_xxs(const float* x, block_iq2_xxs* y, int64_t nb, const float* imatrix) {
  const Spec sp{&lattice_iq2xxs(), 32, 15, Signs::parity7, Shift::none, scale_q8, 0.125f};
  for (int64_t b = 0; b < nb; ++b, x += QK_K) {
    IqBlock r;
    quantize_iq_block(sp, x, imatrix ? imatrix + b * QK_K : nullptr, r);
    y[b].d = fp32_to_fp16(r.d);
    for (int ib = 0; ib < 8; ++ib) {
      uint32_t a = 0, s = 0;
      for (int l = 0; l < 4; ++l) {
        a |= (uint32_t)r.idx[4 * ib + l] << (8 * l);
        s |= (uint32_t)(r.sign[4 * ib + l] & 127) << (7 * l);
      }
      store_u32(y[b].qs + 4 * ib, a);
      store_u32(y[b].qs + 4 * ib + 2, s | (uint32_t)r.l[ib] << 28);
    }
  }
}

void quantize_iq2_xs(const float* x, block_iq2_xs* y, int64_t nb, const float* imatrix) {
  const Spec sp{&lattice_iq2xs(), 16, 15, Signs::parity7, Shift::none, scale_q8, 0.125f};
  for (int64_t b = 0; b < nb; ++b, x += QK_K) {
    IqBlock r;
    quantize_iq_block(sp, x, imatrix ? imatrix + b * QK_K : nullptr, r);
    y[b].d = fp32_to_fp16(r.d);
    for (int g = 0; g < 32; ++g) y[b].qs[g] = (uint16_t)(r.idx[g] | (r.sign[g] & 127) << 9);
    for (int ib = 0; ib < 8; ++ib) y[b].scales[ib] = (uint8_t)(r.l[2 * ib] | r.l[2 * ib + 1] << 4);
  }
}

void quantize_iq2_s(const float* x, block_iq2_s* y, int64_t nb, const float* imatrix) {
  const Spec sp{&lattice_iq2s(), 16, 15, Signs::full, Shift::none, scale_q8, 0.125f};
  for (int64_t b = 0; b < nb; ++b, x += QK_K) {
    IqBlock r;
    quantize_iq_block(sp, x, imatrix ? imatrix + b * QK_K : nullptr, r);
    y[b].d = fp32_to_fp16(r.d);
    std::memset(y[b].qh, 0, sizeof(y[b].qh));
    for (int g = 0; g < 32; ++g) {
      y[b].qs[g] = (uint8_t)r.idx[g];
      y[b].qs[32 + g] = r.sign[g];
      y[b].qh[g / 4] |= (uint8_t)((r.idx[g] >> 8) << (2 * (g % 4)));
    }
    for (int ib = 0; ib < 8; ++ib) y[b].scales[ib] = (uint8_t)(r.l[2 * ib] | r.l[2 * ib + 1] << 4);
  }
}

void quantize_iq3_xxs(const float* x, block_iq3_xxs* y, int64_t nb, const float* imatrix) {
  const Spec sp{&lattice_iq3xxs(), 32, 15, Signs::parity7, Shift::none, scale_q4, 0.25f};
  for (int64_t b = 0; b < nb; ++b, x += QK_K) {
    IqBlock r;
    quantize_iq_block(sp, x, imatrix ? imatrix + b * QK_K : nullptr, r);
    y[b].d = fp32_to_fp16(r.d);
    for (int u = 0; u < 64; ++u) y[b].qs[u] = (uint8_t)r.idx[u];
    for (int ib = 0; ib < 8; ++ib) {
      uint32_t s = (uint32_t)r.l[ib] << 28;
      for (int l = 0; l < 4; ++l) s |= (uint32_t)(r.sign[4 * ib + l] & 127) << (7 * l);
      std::memcpy(y[b].qs + 64 + 4 * ib, &s, 4);
    }
  }
}

void quantize_iq3_s(const float* x, block_iq3_s* y, int64_t nb, const float* imatrix) {
  const Spec sp{&lattice_iq3s(), 32, 15, Signs::full, Shift::none, scale_odd, 1.0f};
  for (int64_t b = 0; b < nb; ++b, x += QK_K) {
    IqBlock r;
    quantize_iq_block(sp, x, imatrix ? imatrix + b * QK_K : nullptr, r);
    y[b].d = fp32_to_fp16(r.d);
    std::memset(y[b].qh, 0, sizeof(y[b].qh));
    std::memset(y[b].scales, 0, sizeof(y[b].scales));
    for (int u = 0; u < 64; ++u) {
      y[b].qs[u] = (uint8_t)r.idx[u];
      y[b].qh[u / 8] |= (uint8_t)((r.idx[u] >> 8) << (u % 8));
    }
    std::memcpy(y[b].signs, r.sign, 32);
    for (int ib = 0; ib < 8; ++ib) y[b].scales[ib / 2] |= (uint8_t)(r.l[ib] << (4 * (ib % 2)));
  }
}

void quantize_iq1_s(const float* x, block_iq1_s* y, int64_t nb, const float* imatrix) {
  const Spec sp{&lattice_iq1s(), 32, 7, Signs::none, Shift::per_sub, scale_odd, 1.0f};
  for (int64_t b = 0; b < nb; ++b, x += QK_K) {
    IqBlock r;
    quantize_iq_block(sp, x, imatrix ? imatrix + b * QK_K : nullptr, r);
    y[b].d = fp32_to_fp16(r.d);
    for (int ib = 0; ib < 8; ++ib) {
      uint16_t qh = (uint16_t)(r.l[ib] << 12 | (r.neg_shift[4 * ib] ? 0x8000 : 0));
      for (int l = 0; l < 4; ++l) {
        const uint16_t e = r.idx[4 * ib + l];
        y[b].qs[4 * ib + l] = (uint8_t)e;
        qh |= (uint16_t)((e >> 8) << (3 * l));
      }
      y[b].qh[ib] = qh;
    }
  }
}

void quantize_iq1_m(const float* x, block_iq1_m* y, int64_t nb, const float* imatrix) {
  const Spec sp{&lattice_iq1s(), 16, 7, Signs::none, Shift::per_group, scale_odd, 1.0f};
  for (int64_t b = 0; b < nb; ++b, x += QK_K) {
    IqBlock r;
    quantize_iq_block(sp, x, imatrix ? imatrix + b * QK_K : nullptr, r);
    const uint16_t dbits = fp32_to_fp16(r.d);
    std::memset(y[b].qh, 0, sizeof(y[b].qh));
    uint16_t sw[4] = {};
    for (int g = 0; g < 32; ++g) {
      const uint16_t e = r.idx[g];
      y[b].qs[g] = (uint8_t)e;
      y[b].qh[g / 2] |= (uint8_t)((((e >> 8) & 7) | (r.neg_shift[g] ? 8 : 0)) << (4 * (g % 2)));
    }
    for (int ib = 0; ib < 8; ++ib)
      sw[ib / 2] |= (uint16_t)((r.l[2 * ib] | r.l[2 * ib + 1] << 3) << (6 * (ib % 2)));
    for (int k = 0; k < 4; ++k) sw[k] |= (uint16_t)(((dbits >> (4 * k)) & 15) << 12);
    std::memcpy(y[b].scales, sw, 8);
  }
}

namespace {

// Ternary: x ~= d * q, q in {-1, 0, 1}, d chosen by weighted least squares
// over candidates d = amax / (1 + 0.25 k); q[] holds q + 1.
float ternary_block(const float* x, const float* imatrix, uint8_t* q) {
  float w[QK_K];
  super_block_weights(x, imatrix, DefaultWeights::mean_square_plus_square, QK_K, w);
  float amax = 0;
  for (int i = 0; i < QK_K; ++i) amax = std::max(amax, std::fabs(x[i]));
  if (!(amax > kGroupEps)) {
    std::memset(q, 1, QK_K);
    return 0;
  }
  auto fit = [&](float d) {
    double a = 0, b = 0;
    for (int i = 0; i < QK_K; ++i) {
      const int l = round_clamp(x[i] / d, -1, 1);
      a += (double)w[i] * x[i] * l;
      b += (double)w[i] * l * l;
    }
    return std::pair<double, double>(a, b);
  };
  double best = -1;
  float best_d = amax;
  for (int k = 0; k <= 24; ++k) {
    float d = amax / (1.0f + 0.25f * (float)k);
    for (int it = 0; it < 2; ++it) {
      const auto [a, b] = fit(d);
      if (!(a > 0 && b > 0)) break;
      if (a * a / b > best) {
        best = a * a / b;
        best_d = (float)(a / b);
      }
      d = (float)(a / b);
    }
  }
  const float ds = fp16_round(best_d);
  for (int i = 0; i < QK_K; ++i) q[i] = (uint8_t)(round_clamp(ds > 0 ? x[i] / ds : 0.0f, -1, 1) + 1);
  return ds;
}

// A byte holding 5 trits as a base-3 fraction, most significant first: the
// byte TQ1_0's decoder (tq1_trit) reads back as v's digits.
uint8_t pack_trits(int v) { return (uint8_t)((v * 256 + 242) / 243); }

}  // namespace

void quantize_tq1_0(const float* x, block_tq1_0* y, int64_t nb, const float* imatrix) {
  for (int64_t b = 0; b < nb; ++b, x += QK_K) {
    uint8_t q[QK_K];
    y[b].d = fp32_to_fp16(ternary_block(x, imatrix ? imatrix + b * QK_K : nullptr, q));
    for (int m = 0; m < 32; ++m) {
      int v = 0;
      for (int n = 0; n < 5; ++n) v = 3 * v + q[32 * n + m];
      y[b].qs[m] = pack_trits(v);
    }
    for (int m = 0; m < 16; ++m) {
      int v = 0;
      for (int n = 0; n < 5; ++n) v = 3 * v + q[160 + 16 * n + m];
      y[b].qs[32 + m] = pack_trits(v);
    }
    for (int j = 0; j < 4; ++j) {
      int v = 0;
      for (int n = 0; n < 4; ++n) v = 3 * v + q[240 + 4 * n + j];
      y[b].qh[j] = pack_trits(3 * v);
    }
  }
}

void quantize_tq2_0(const float* x, block_tq2_0* y, int64_t nb, const float* imatrix) {
  for (int64_t b = 0; b < nb; ++b, x += QK_K) {
    uint8_t q[QK_K];
    y[b].d = fp32_to_fp16(ternary_block(x, imatrix ? imatrix + b * QK_K : nullptr, q));
    std::memset(y[b].qs, 0, sizeof(y[b].qs));
    for (int h = 0; h < 2; ++h)
      for (int k = 0; k < 4; ++k)
        for (int m = 0; m < 32; ++m) y[b].qs[32 * h + m] |= (uint8_t)(q[128 * h + 32 * k + m] << (2 * k));
  }
}

}  // namespace serval::ref::detail
