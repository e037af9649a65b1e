// Internal to kernels/x86: the 16-lane vector backend on AVX-512 (one zmm per
// value). Include only inside a SERVAL_TARGET_BEGIN region (target.h) that enables
// avx512f,avx512bw,avx512vl,avx2,fma,f16c (+ avx512vnni when kVnni), after all
// other headers, and inside an anonymous namespace (so nothing here is shared
// with code compiled for another ISA).
//
// Values are 16 f32 lanes (F) or 64 bytes (I: 16 i32 / 32 i16 / 64 i8 lanes, an
// i32 lane covering bytes 4k..4k+3). simd_avx2.h implements the same interface
// with the same results lane for lane; matmul_tmpl.inc uses it.

#define SERVAL_SIMD_INLINE inline __attribute__((always_inline))
// Tile shapes, overridable with -D for tuning experiments. The defaults were the
// fastest of 4x4 / 2x8 / 8x2 / 2x4 (32-blocks, floats) and 2x4 / 1x8 / 4x2 / 2x2
// (K-quants) in single-core CPU time on the 2-core Zen 5 dev box, n = 16.
#ifndef SERVAL_T_B32R
#define SERVAL_T_B32R 4
#define SERVAL_T_B32C 4
#define SERVAL_T_KR 2
#define SERVAL_T_KC 4
#define SERVAL_T_FR 4
#define SERVAL_T_FC 4
#endif
#ifndef SERVAL_T_X16C
#define SERVAL_T_X16C 8
#endif

template <bool kVnniT>
struct Avx512 {
  static constexpr bool kVnni = kVnniT;
  using F = __m512;   // 16 x f32
  using I = __m512i;  // 16 x i32 | 32 x i16 | 64 x i8 (lane groups of 4 bytes = one i32 lane)

  // GEMM tiles (weight rows x activation rows; C a power of two) per family,
  // and GEMV rows. The K-quants hold an integer and a float accumulator per pair.
  static constexpr int kB32R = SERVAL_T_B32R, kB32C = SERVAL_T_B32C;
  static constexpr int kKR = SERVAL_T_KR, kKC = SERVAL_T_KC;
  static constexpr int kFR = SERVAL_T_FR, kFC = SERVAL_T_FC;
  static constexpr int kGemvR = 4, kGemvRF = 8;
  // Query heads per pass of the attention tile kernel (32 zmm: 4 heads x 4 accumulators + 4 loads).
  static constexpr int kAttnHeads = 4;
  static constexpr int kX16C = SERVAL_T_X16C;  // activation rows per packed (X16) tile
  // Packed F16/BF16 tiles: row groups (n == 1 / n > 1) x activation rows.
#ifndef SERVAL_T_FX16CW  // tuning knob: F16/BF16 prefill tile width (packed_f.inc)
#define SERVAL_T_FX16CW 14
#endif
  static constexpr int kFX16RGV = 4, kFX16RG = 2, kFX16C = 8, kFX16CW = SERVAL_T_FX16CW;

  // ---- float --------------------------------------------------------------
  static SERVAL_SIMD_INLINE F fzero() { return _mm512_setzero_ps(); }
  static SERVAL_SIMD_INLINE F fset1(float v) { return _mm512_set1_ps(v); }
  static SERVAL_SIMD_INLINE F fload(const void* p) { return _mm512_loadu_ps((const float*)p); }
  // n in [0, 16]; lanes >= n are zero.
  static SERVAL_SIMD_INLINE F fload_n(const float* p, int n) {
    return _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1u), p);
  }
  static SERVAL_SIMD_INLINE void fstore(float* p, F v) { _mm512_storeu_ps(p, v); }
  static SERVAL_SIMD_INLINE void fstore_n(float* p, F v, int n) {
    _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1u), v);
  }
  static SERVAL_SIMD_INLINE F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }   // a * b + c
  static SERVAL_SIMD_INLINE F fnma(F a, F b, F c) { return _mm512_fnmadd_ps(a, b, c); } // c - a * b
  static SERVAL_SIMD_INLINE F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static SERVAL_SIMD_INLINE F cvt(I v) { return _mm512_cvtepi32_ps(v); }

  // The canonical 16-lane sum: ((l[k] + l[k+8]) then + [k+4], + [k+2], + [k+1]).
  static SERVAL_SIMD_INLINE float hsum(F v) {
    const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    const __m256 h8 = _mm256_add_ps(_mm512_castps512_ps256(v), hi);
    const __m128 h4 = _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps(h8, 1));
    const __m128 h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
    return _mm_cvtss_f32(_mm_add_ss(h2, _mm_shuffle_ps(h2, h2, 1)));
  }

  // F16 -> F32 weight rows (16 elements), and their zero-filled tails.
  static SERVAL_SIMD_INLINE F load_f16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p));
  }
  static SERVAL_SIMD_INLINE F load_f16_n(const uint16_t* p, int n) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16((__mmask16)((1u << n) - 1u), p));
  }
  static SERVAL_SIMD_INLINE F load_bf16(const uint16_t* p) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
  static SERVAL_SIMD_INLINE F load_bf16_n(const uint16_t* p, int n) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16((__mmask16)((1u << n) - 1u), p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }

  // [h0 x 8, h1 x 8] (F16 bits), and [h0 x 8, 0 x 8].
  static SERVAL_SIMD_INLINE F f16_halves(uint16_t h0, uint16_t h1) {
    const __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16((short)h0)),
                                              _mm_set1_epi16((short)h1), 1);
    return _mm512_cvtph_ps(h);
  }
  // [d(p) x 8, d(p + kStride) x 8] for F16 scales at byte offsets 0 and kStride.
  template <int kStride>
  static SERVAL_SIMD_INLINE F f16_pair(const uint8_t* p) {
    if constexpr (kStride + 2 <= 32) {
      const __m256i idx = _mm256_setr_epi16(0, 0, 0, 0, 0, 0, 0, 0, kStride / 2, kStride / 2, kStride / 2, kStride / 2,
                                            kStride / 2, kStride / 2, kStride / 2, kStride / 2);
      return _mm512_cvtph_ps(_mm256_permutexvar_epi16(idx, _mm256_loadu_si256((const __m256i*)p)));
    } else {
      static_assert(kStride + 2 <= 64);
      const __m512i idx = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, kStride / 2, kStride / 2,
                                           kStride / 2, kStride / 2, kStride / 2, kStride / 2, kStride / 2, kStride / 2,
                                           0, 0, 0, 0, 0, 0, 0, 0);
      return _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi16(idx, _mm512_loadu_si512(p))));
    }
  }
  static SERVAL_SIMD_INLINE F fbcast(const float* p) { return _mm512_set1_ps(*p); }
  static SERVAL_SIMD_INLINE F f16_half0(uint16_t h0) {
    return _mm512_cvtph_ps(_mm256_zextsi128_si256(_mm_set1_epi16((short)h0)));
  }

  static SERVAL_SIMD_INLINE F fadd(F a, F b) { return _mm512_add_ps(a, b); }
  static SERVAL_SIMD_INLINE F fsub(F a, F b) { return _mm512_sub_ps(a, b); }
  // Round to the nearest integer (ties to even), as a float.
  static SERVAL_SIMD_INLINE F fround(F v) {
    return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  // 2^n for integer-valued n in [-126, 127].
  static SERVAL_SIMD_INLINE F pow2i(F n) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
  }
  // r[d] lane j <- r[j] lane d (a 16 x 16 transpose in registers: unpack
  // pairs of rows, then 4-element groups, then 128-bit lanes twice).
  static SERVAL_SIMD_INLINE void transpose16(F* r) {
    F t[16], u[16];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    // u[4g + c], 128-bit lane k: column 4k + c of rows 4g .. 4g + 3.
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) {
      u[4 * g + 0] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
      u[4 * g + 1] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], 0xEE);
      u[4 * g + 2] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
      u[4 * g + 3] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xEE);
    }
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      const F v0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88), v1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xDD);
      const F v2 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88), v3 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xDD);
      r[c] = _mm512_shuffle_f32x4(v0, v2, 0x88);
      r[8 + c] = _mm512_shuffle_f32x4(v0, v2, 0xDD);
      r[4 + c] = _mm512_shuffle_f32x4(v1, v3, 0x88);
      r[12 + c] = _mm512_shuffle_f32x4(v1, v3, 0xDD);
    }
  }
  static SERVAL_SIMD_INLINE F fabs(F v) { return _mm512_abs_ps(v); }
  static SERVAL_SIMD_INLINE F fmax(F a, F b) { return _mm512_max_ps(a, b); }
  // a < b ? a : b and a > b ? a : b lane by lane (minps/maxps: b where either is NaN).
  static SERVAL_SIMD_INLINE F fmin(F a, F b) { return _mm512_min_ps(a, b); }
  static SERVAL_SIMD_INLINE F fdiv(F a, F b) { return _mm512_div_ps(a, b); }
  // a < b ? x : y lane by lane (false where either of a, b is NaN).
  static SERVAL_SIMD_INLINE F fsel_lt(F a, F b, F x, F y) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_LT_OQ), y, x);
  }
  static SERVAL_SIMD_INLINE float hmax(F v) { return _mm512_reduce_max_ps(v); }
  // [a x 8, b x 8]
  static SERVAL_SIMD_INLINE F f_halves(float a, float b) {
    return _mm512_castpd_ps(
        _mm512_insertf64x4(_mm512_castps_pd(_mm512_set1_ps(a)), _mm256_castps_pd(_mm256_set1_ps(b)), 1));
  }

  // ---- integer ------------------------------------------------------------
  static SERVAL_SIMD_INLINE I izero() { return _mm512_setzero_si512(); }
  static SERVAL_SIMD_INLINE I iload(const void* p) { return _mm512_loadu_si512(p); }
  static SERVAL_SIMD_INLINE I iadd(I a, I b) { return _mm512_add_epi32(a, b); }
  // The 4 bytes at p in every i32 lane.
  static SERVAL_SIMD_INLINE I ibcast4(const void* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
  }
  // i32 lanes 0..3 = v, the rest 0.
  static SERVAL_SIMD_INLINE I from_i32x4(__m128i v) { return _mm512_zextsi128_si512(v); }
  // i32 lanes 0..7 = v, the rest 0.
  static SERVAL_SIMD_INLINE I from_i32x8(__m256i v) { return _mm512_zextsi256_si512(v); }

  static SERVAL_SIMD_INLINE void istore(void* p, I v) { _mm512_storeu_si512(p, v); }
  static SERVAL_SIMD_INLINE I imul(I v, int k) { return _mm512_mullo_epi32(v, _mm512_set1_epi32(k)); }
  static SERVAL_SIMD_INLINE I ones_u8() { return _mm512_set1_epi8(1); }
  // Round to nearest even (MXCSR default), as cvtss2si.
  static SERVAL_SIMD_INLINE I cvt_round(F v) { return _mm512_cvtps_epi32(v); }
  // 16 i32 lanes (each in [-128, 127]) -> 16 bytes.
  static SERVAL_SIMD_INLINE void store_i8x16(int8_t* p, I v) {
    _mm_storeu_si128((__m128i*)p, _mm512_cvtepi32_epi8(v));
  }
  static SERVAL_SIMD_INLINE int32_t hsum_i32(I v) { return _mm512_reduce_add_epi32(v); }

  // acc[k] + sum_{j<4} u[4k+j] * s[4k+j], u unsigned, s signed bytes. Without
  // VNNI the pair sums go through i16: callers keep |u| * 127 * 2 < 32768.
  static SERVAL_SIMD_INLINE I dot_u8s8(I acc, I u, I s) {
    if constexpr (kVnni) {
      return _mm512_dpbusd_epi32(acc, u, s);
    } else {
      return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)));
    }
  }
  // As dot_u8s8 with signed w (|w| <= 128): |w| * (s negated where w < 0).
  static SERVAL_SIMD_INLINE I dot_s8s8(I acc, I w, I s) {
    const __mmask64 neg = _mm512_movepi8_mask(w);
    const I sn = _mm512_mask_sub_epi8(s, neg, _mm512_setzero_si512(), s);
    return dot_u8s8(acc, _mm512_abs_epi8(w), sn);
  }
  // acc[k] + w16[2k] * (u[4k] s[4k] + u[4k+1] s[4k+1]) + w16[2k+1] * (the next pair).
  // As dot_u8s8_w16 with signed weights w (|w| <= 127): |w| against s * sign(w).
  static SERVAL_SIMD_INLINE I dot_s8s8_w16(I acc, I w, I s, I w16) {
    const __mmask64 neg = _mm512_movepi8_mask(w);
    return dot_u8s8_w16(acc, _mm512_abs_epi8(w), _mm512_mask_sub_epi8(s, neg, _mm512_setzero_si512(), s), w16);
  }
  static SERVAL_SIMD_INLINE I dot_u8s8_w16(I acc, I u, I s, I w16) {
    const I t = _mm512_maddubs_epi16(u, s);
    if constexpr (kVnni) {
      return _mm512_dpwssd_epi32(acc, t, w16);
    } else {
      return _mm512_add_epi32(acc, _mm512_madd_epi16(t, w16));
    }
  }

  // ---- weight decoders: 64 bytes = elements of two 32-blocks, natural order --
  static SERVAL_SIMD_INLINE I nib_0404() {
    const long long k4 = 0x0004000400040004LL;
    return _mm512_set_epi64(k4, k4, 0, 0, k4, k4, 0, 0);
  }
  // Nibbles of 16 bytes a (block b) and c (block b+1): [lo(a), hi(a), lo(c), hi(c)].
  static SERVAL_SIMD_INLINE I nibbles2(const uint8_t* a, const uint8_t* c) {
    const __m256i x = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)a));
    const __m256i y = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)c));
    const I z = _mm512_inserti64x4(_mm512_castsi256_si512(x), y, 1);
    return _mm512_and_si512(_mm512_srlv_epi16(z, nib_0404()), _mm512_set1_epi8(0x0F));
  }
  static SERVAL_SIMD_INLINE I nibbles1(const uint8_t* a) {
    const __m256i x = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)a));
    return _mm512_and_si512(_mm512_srlv_epi16(_mm512_zextsi256_si512(x), nib_0404()), _mm512_set1_epi8(0x0F));
  }
  // 32 + 32 bytes.
  static SERVAL_SIMD_INLINE I bytes2(const int8_t* a, const int8_t* c) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i*)a)),
                              _mm256_loadu_si256((const __m256i*)c), 1);
  }
  static SERVAL_SIMD_INLINE I bytes1(const int8_t* a) {
    return _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i*)a));
  }
  static SERVAL_SIMD_INLINE I xor80(I v) { return _mm512_xor_si512(v, _mm512_set1_epi8((char)0x80)); }
  static SERVAL_SIMD_INLINE I ior(I a, I b) { return _mm512_or_si512(a, b); }
  // Q5_0/Q5_1's fifth bits: the 32-bit little-endian words at a (block b) and
  // c (block b+1), bit j -> byte j (of that block's 32) = 0x10, else 0.
  static SERVAL_SIMD_INLINE I hbits2(const uint8_t* a, const uint8_t* c) {
    uint32_t x, y;
    std::memcpy(&x, a, 4);
    std::memcpy(&y, c, 4);
    return _mm512_maskz_mov_epi8((__mmask64)x | ((__mmask64)y << 32), _mm512_set1_epi8(0x10));
  }
  static SERVAL_SIMD_INLINE I hbits1(const uint8_t* a) {
    uint32_t x;
    std::memcpy(&x, a, 4);
    return _mm512_maskz_mov_epi8((__mmask64)x, _mm512_set1_epi8(0x10));
  }
  // Byte table lookup of nibbles v (0..15) in the 16-byte table t.
  static SERVAL_SIMD_INLINE I lookup16(const int8_t* t, I v) {
    return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i*)t)), v);
  }

  // ---- K-quant pieces (64-element chunks) ----------------------------------
  // 32 bytes q -> [lo(q), hi(q)] (elements of sub-blocks 2p and 2p+1 of Q4_K/Q5_K).
  static SERVAL_SIMD_INLINE I nibbles_lohi(const uint8_t* q) {
    const I z = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i*)q));
    const long long k4 = 0x0004000400040004LL;
    return _mm512_and_si512(_mm512_srlv_epi16(z, _mm512_set_epi64(k4, k4, k4, k4, 0, 0, 0, 0)),
                            _mm512_set1_epi8(0x0F));
  }
  // 32 bytes broadcast to both halves.
  static SERVAL_SIMD_INLINE I bcast32(const uint8_t* p) {
    return _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i*)p));
  }
  // 16-bit lanes of the lower / upper 32 bytes shifted left by kSh0 / kSh1
  // (right when negative; both must have the same sign or be 0).
  template <int kSh0, int kSh1>
  static SERVAL_SIMD_INLINE I shift_halves(I hb) {
    if constexpr (kSh0 >= 0 && kSh1 >= 0) {
      return _mm512_sllv_epi16(hb, _mm512_set_epi64(kSh1 * 0x0001000100010001LL, kSh1 * 0x0001000100010001LL,
                                                    kSh1 * 0x0001000100010001LL, kSh1 * 0x0001000100010001LL,
                                                    kSh0 * 0x0001000100010001LL, kSh0 * 0x0001000100010001LL,
                                                    kSh0 * 0x0001000100010001LL, kSh0 * 0x0001000100010001LL));
    } else {
      static_assert(kSh0 <= 0 && kSh1 <= 0);
      return _mm512_srlv_epi16(hb, _mm512_set_epi64(-kSh1 * 0x0001000100010001LL, -kSh1 * 0x0001000100010001LL,
                                                    -kSh1 * 0x0001000100010001LL, -kSh1 * 0x0001000100010001LL,
                                                    -kSh0 * 0x0001000100010001LL, -kSh0 * 0x0001000100010001LL,
                                                    -kSh0 * 0x0001000100010001LL, -kSh0 * 0x0001000100010001LL));
    }
  }
  // v | (h & mask) per byte.
  static SERVAL_SIMD_INLINE I or_masked(I v, I h, char mask) {
    return _mm512_ternarylogic_epi32(v, h, _mm512_set1_epi8(mask), 0xF8);
  }
  static SERVAL_SIMD_INLINE I and8(I v, char mask) { return _mm512_and_si512(v, _mm512_set1_epi8(mask)); }
  // Each byte minus 1 (TQ2_0's t - 1).
  static SERVAL_SIMD_INLINE I dec8(I v) { return _mm512_sub_epi8(v, _mm512_set1_epi8(1)); }
  static SERVAL_SIMD_INLINE I srl4(I v) { return _mm512_srli_epi16(v, 4); }
  // ---- lattice (IQ) grids: 64 bytes of grid entries, signs by bit mask -------
  // Eight 64-bit grid entries as one vector (matmul_tmpl.inc's iq_gather_*).
  static SERVAL_SIMD_INLINE I u64x8(long long e0, long long e1, long long e2, long long e3, long long e4,
                                    long long e5, long long e6, long long e7) {
    const __m256i lo = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set_epi64x(e1, e0)), _mm_set_epi64x(e3, e2), 1);
    const __m256i hi = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set_epi64x(e5, e4)), _mm_set_epi64x(e7, e6), 1);
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
  }
  static SERVAL_SIMD_INLINE I add8(I a, I b) { return _mm512_add_epi8(a, b); }
  // Byte j negated where bit j of m is set.
  static SERVAL_SIMD_INLINE I neg_bytes(I v, uint64_t m) {
    return _mm512_mask_sub_epi8(v, (__mmask64)m, _mm512_setzero_si512(), v);
  }

  // ---- packed K-quant (X16) pieces: one i32 lane per weight row ---------------
  static SERVAL_SIMD_INLINE I imul_lanes(I a, I b) { return _mm512_mullo_epi32(a, b); }
  // 16-bit lanes shifted right by a run-time count.
  static SERVAL_SIMD_INLINE I srl16(I v, int n) { return _mm512_srl_epi16(v, _mm_cvtsi32_si128(n)); }
  // i32 lanes of two i16 halves: lo (bits 0..15) and hi (16..31); both in [0, 2^15).
  static SERVAL_SIMD_INLINE I pair_i16(I lo, I hi) { return _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)); }
  // acc + a.lo16 * b.lo16 + a.hi16 * b.hi16 per i32 lane (signed i16, exact).
  static SERVAL_SIMD_INLINE I dot_i16(I acc, I a, I b) {
    if constexpr (kVnni) return _mm512_dpwssd_epi32(acc, a, b);
    else return _mm512_add_epi32(acc, _mm512_madd_epi16(a, b));
  }
  // Each i32 lane's low i16 alone (high half cleared).
  static SERVAL_SIMD_INLINE I lo16(I v) { return _mm512_and_si512(v, _mm512_set1_epi32(0xFFFF)); }
  static SERVAL_SIMD_INLINE I iset1(int32_t v) { return _mm512_set1_epi32(v); }
  // 16 bytes -> 16 i32 lanes.
  static SERVAL_SIMD_INLINE I u8x16_i32(const uint8_t* p) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p));
  }
  static SERVAL_SIMD_INLINE I s8x16_i32(const int8_t* p) {
    return _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p));
  }
  // 16-bit lanes shifted left by kSh (right when negative).
  template <int kSh>
  static SERVAL_SIMD_INLINE I shl16(I v) {
    if constexpr (kSh > 0) return _mm512_slli_epi16(v, kSh);
    else if constexpr (kSh < 0) return _mm512_srli_epi16(v, -kSh);
    else return v;
  }
  // 64 bytes (one Q6_K half of ql).
  static SERVAL_SIMD_INLINE I load64(const uint8_t* p) { return _mm512_loadu_si512(p); }

  // Scales as i16 per pair sum: [s[a] x 16, s[b] x 16] from 8 unsigned bytes s
  // (Q4_K/Q5_K chunk p: a = 2p, b = 2p + 1).
  // The same from 8 signed bytes (IQ4_XS).
  template <int kA, int kB>
  static SERVAL_SIMD_INLINE I scales_s8_2x16(uint64_t s8) {
    const __m256i b = _mm256_set1_epi64x((long long)s8);
    const __m256i ctrl = _mm256_setr_m128i(_mm_set1_epi8(kA), _mm_set1_epi8(kB));
    return _mm512_cvtepi8_epi16(_mm256_shuffle_epi8(b, ctrl));
  }
  template <int kA, int kB>
  static SERVAL_SIMD_INLINE I scales_u8_2x16(uint64_t s8) {
    const __m256i b = _mm256_set1_epi64x((long long)s8);
    const __m256i ctrl = _mm256_setr_m128i(_mm_set1_epi8(kA), _mm_set1_epi8(kB));
    return _mm512_cvtepu8_epi16(_mm256_shuffle_epi8(b, ctrl));
  }
  // [s[4c] x 8, s[4c+1] x 8, s[4c+2] x 8, s[4c+3] x 8] from 16 signed bytes (Q6_K chunk c).
  template <int kC>
  static SERVAL_SIMD_INLINE I scales_s8_4x8(__m128i s16) {
    const __m256i b = _mm256_broadcastsi128_si256(s16);
    const __m256i ctrl =
        _mm256_setr_m128i(_mm_setr_epi8(4 * kC, 4 * kC, 4 * kC, 4 * kC, 4 * kC, 4 * kC, 4 * kC, 4 * kC, 4 * kC + 1,
                                        4 * kC + 1, 4 * kC + 1, 4 * kC + 1, 4 * kC + 1, 4 * kC + 1, 4 * kC + 1, 4 * kC + 1),
                          _mm_setr_epi8(4 * kC + 2, 4 * kC + 2, 4 * kC + 2, 4 * kC + 2, 4 * kC + 2, 4 * kC + 2,
                                        4 * kC + 2, 4 * kC + 2, 4 * kC + 3, 4 * kC + 3, 4 * kC + 3, 4 * kC + 3,
                                        4 * kC + 3, 4 * kC + 3, 4 * kC + 3, 4 * kC + 3));
    return _mm512_cvtepi8_epi16(_mm256_shuffle_epi8(b, ctrl));
  }
};
