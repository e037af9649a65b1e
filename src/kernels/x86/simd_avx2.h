// Internal to kernels/x86: the 16-lane vector backend on AVX2 + FMA + F16C, each
// value a pair of ymm (lo = lanes 0..7 / bytes 0..31, hi = lanes 8..15 / bytes
// 32..63). Same interface and the same lane-for-lane results as simd_avx512.h,
// so the kernels of matmul_tmpl.inc give bit-identical output on both. Include
// only inside a SERVAL_TARGET_BEGIN("avx2,fma,f16c") region (target.h), after all other
// headers, inside an anonymous namespace.

#define SERVAL_SIMD_INLINE inline __attribute__((always_inline))

// kVnniT: AVX-VNNI (VEX vpdpbusd / vpdpwssd on ymm; the region must enable
// avxvnni) instead of vpmaddubsw + vpmaddwd; the same results.
template <bool kVnniT>
struct Avx2 {
  static constexpr bool kVnni = kVnniT;
  struct F {
    __m256 lo, hi;
  };
  struct I {
    __m256i lo, hi;
  };

  // 16 ymm registers: two per accumulator, so smaller tiles than AVX-512.
  static constexpr int kB32R = 1, kB32C = 4;
  static constexpr int kKR = 1, kKC = 2;
  static constexpr int kFR = 1, kFC = 4;
  static constexpr int kGemvR = 2, kGemvRF = 4;
  // Query heads per pass of the attention tile kernel (16 ymm: one head (4 accumulators + 4 loads, two ymm each)).
  static constexpr int kAttnHeads = 1;
  static constexpr int kX16C = 2;
  // Packed F16/BF16 tiles: row groups (n == 1 / n > 1) x activation rows.
  static constexpr int kFX16RGV = 2, kFX16RG = 1, kFX16C = 4, kFX16CW = 4;

  // First m (0..8) i32 lanes set.
  static SERVAL_SIMD_INLINE __m256i lane_mask(int m) {
    alignas(32) static constexpr int32_t kTbl[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    return _mm256_loadu_si256((const __m256i*)(kTbl + 8 - m));
  }
  static SERVAL_SIMD_INLINE int lo_n(int n) { return n < 8 ? n : 8; }
  static SERVAL_SIMD_INLINE int hi_n(int n) { return n > 8 ? n - 8 : 0; }

  // ---- float --------------------------------------------------------------
  static SERVAL_SIMD_INLINE F fzero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static SERVAL_SIMD_INLINE F fset1(float v) { return {_mm256_set1_ps(v), _mm256_set1_ps(v)}; }
  static SERVAL_SIMD_INLINE F fload(const void* p) {
    const float* f = (const float*)p;
    return {_mm256_loadu_ps(f), _mm256_loadu_ps(f + 8)};
  }
  static SERVAL_SIMD_INLINE F fload_n(const float* p, int n) {
    return {_mm256_maskload_ps(p, lane_mask(lo_n(n))), _mm256_maskload_ps(p + 8, lane_mask(hi_n(n)))};
  }
  static SERVAL_SIMD_INLINE void fstore(float* p, F v) {
    _mm256_storeu_ps(p, v.lo);
    _mm256_storeu_ps(p + 8, v.hi);
  }
  static SERVAL_SIMD_INLINE void fstore_n(float* p, F v, int n) {
    _mm256_maskstore_ps(p, lane_mask(lo_n(n)), v.lo);
    _mm256_maskstore_ps(p + 8, lane_mask(hi_n(n)), v.hi);
  }
  static SERVAL_SIMD_INLINE F fma(F a, F b, F c) {
    return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
  }
  static SERVAL_SIMD_INLINE F fnma(F a, F b, F c) {
    return {_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi)};
  }
  static SERVAL_SIMD_INLINE F mul(F a, F b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
  static SERVAL_SIMD_INLINE F cvt(I v) { return {_mm256_cvtepi32_ps(v.lo), _mm256_cvtepi32_ps(v.hi)}; }

  static SERVAL_SIMD_INLINE float hsum(F v) {
    const __m256 h8 = _mm256_add_ps(v.lo, v.hi);
    const __m128 h4 = _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps(h8, 1));
    const __m128 h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
    return _mm_cvtss_f32(_mm_add_ss(h2, _mm_shuffle_ps(h2, h2, 1)));
  }

  static SERVAL_SIMD_INLINE F load_f16(const uint16_t* p) {
    return {_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p + 8)))};
  }
  static SERVAL_SIMD_INLINE F load_f16_n(const uint16_t* p, int n) {
    alignas(32) uint16_t buf[16] = {};
    for (int j = 0; j < n; ++j) buf[j] = p[j];
    return load_f16(buf);
  }
  static SERVAL_SIMD_INLINE __m256 bf16x8(const uint16_t* p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
  }
  static SERVAL_SIMD_INLINE F load_bf16(const uint16_t* p) { return {bf16x8(p), bf16x8(p + 8)}; }
  static SERVAL_SIMD_INLINE F load_bf16_n(const uint16_t* p, int n) {
    alignas(32) uint16_t buf[16] = {};
    for (int j = 0; j < n; ++j) buf[j] = p[j];
    return load_bf16(buf);
  }

  static SERVAL_SIMD_INLINE F f16_halves(uint16_t h0, uint16_t h1) {
    return {_mm256_set1_ps(_cvtsh_ss(h0)), _mm256_set1_ps(_cvtsh_ss(h1))};
  }
  template <int kStride>
  static SERVAL_SIMD_INLINE F f16_pair(const uint8_t* p) {
    uint16_t h0, h1;
    std::memcpy(&h0, p, 2);
    std::memcpy(&h1, p + kStride, 2);
    return f16_halves(h0, h1);
  }
  static SERVAL_SIMD_INLINE F fbcast(const float* p) {
    const __m256 v = _mm256_broadcast_ss(p);
    return {v, v};
  }
  static SERVAL_SIMD_INLINE F f16_half0(uint16_t h0) { return {_mm256_set1_ps(_cvtsh_ss(h0)), _mm256_setzero_ps()}; }

  static SERVAL_SIMD_INLINE F fadd(F a, F b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
  static SERVAL_SIMD_INLINE F fsub(F a, F b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
  static SERVAL_SIMD_INLINE F fround(F v) {
    constexpr int kMode = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    return {_mm256_round_ps(v.lo, kMode), _mm256_round_ps(v.hi, kMode)};
  }
  static SERVAL_SIMD_INLINE __m256 pow2i8(__m256 n) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
  }
  static SERVAL_SIMD_INLINE F pow2i(F n) { return {pow2i8(n.lo), pow2i8(n.hi)}; }
  static SERVAL_SIMD_INLINE F fabs(F v) {
    const __m256 m = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    return {_mm256_and_ps(v.lo, m), _mm256_and_ps(v.hi, m)};
  }
  // r[d] lane j <- r[j] lane d (through memory: 16 ymm hold only half the rows).
  static SERVAL_SIMD_INLINE void transpose16(F* r) {
    alignas(32) float m[16][16];
    for (int j = 0; j < 16; ++j) fstore(m[j], r[j]);
    alignas(32) float o[16][16];
    for (int d = 0; d < 16; ++d)
      for (int j = 0; j < 16; ++j) o[d][j] = m[j][d];
    for (int d = 0; d < 16; ++d) r[d] = fload(o[d]);
  }
  static SERVAL_SIMD_INLINE F fmax(F a, F b) { return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
  static SERVAL_SIMD_INLINE F fmin(F a, F b) { return {_mm256_min_ps(a.lo, b.lo), _mm256_min_ps(a.hi, b.hi)}; }
  static SERVAL_SIMD_INLINE F fdiv(F a, F b) { return {_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)}; }
  static SERVAL_SIMD_INLINE F fsel_lt(F a, F b, F x, F y) {
    return {_mm256_blendv_ps(y.lo, x.lo, _mm256_cmp_ps(a.lo, b.lo, _CMP_LT_OQ)),
            _mm256_blendv_ps(y.hi, x.hi, _mm256_cmp_ps(a.hi, b.hi, _CMP_LT_OQ))};
  }
  static SERVAL_SIMD_INLINE float hmax(F v) {
    const __m256 m8 = _mm256_max_ps(v.lo, v.hi);
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    return _mm_cvtss_f32(_mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1)));
  }
  static SERVAL_SIMD_INLINE F f_halves(float a, float b) { return {_mm256_set1_ps(a), _mm256_set1_ps(b)}; }

  // ---- integer ------------------------------------------------------------
  static SERVAL_SIMD_INLINE I izero() { return {_mm256_setzero_si256(), _mm256_setzero_si256()}; }
  static SERVAL_SIMD_INLINE I iload(const void* p) {
    const __m256i* q = (const __m256i*)p;
    return {_mm256_loadu_si256(q), _mm256_loadu_si256(q + 1)};
  }
  static SERVAL_SIMD_INLINE I ibcast4(const void* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    const __m256i y = _mm256_set1_epi32(v);
    return {y, y};
  }
  static SERVAL_SIMD_INLINE I iadd(I a, I b) { return {_mm256_add_epi32(a.lo, b.lo), _mm256_add_epi32(a.hi, b.hi)}; }
  static SERVAL_SIMD_INLINE I from_i32x4(__m128i v) { return {_mm256_zextsi128_si256(v), _mm256_setzero_si256()}; }
  static SERVAL_SIMD_INLINE I from_i32x8(__m256i v) { return {v, _mm256_setzero_si256()}; }

  static SERVAL_SIMD_INLINE void istore(void* p, I v) {
    _mm256_storeu_si256((__m256i*)p, v.lo);
    _mm256_storeu_si256((__m256i*)p + 1, v.hi);
  }
  static SERVAL_SIMD_INLINE I imul(I v, int k) {
    const __m256i m = _mm256_set1_epi32(k);
    return {_mm256_mullo_epi32(v.lo, m), _mm256_mullo_epi32(v.hi, m)};
  }
  static SERVAL_SIMD_INLINE I ones_u8() { return {_mm256_set1_epi8(1), _mm256_set1_epi8(1)}; }
  static SERVAL_SIMD_INLINE I cvt_round(F v) { return {_mm256_cvtps_epi32(v.lo), _mm256_cvtps_epi32(v.hi)}; }
  static SERVAL_SIMD_INLINE void store_i8x16(int8_t* p, I v) {
    const __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(v.lo, v.hi), 0xD8);  // 16 x i16 in order
    _mm_storeu_si128((__m128i*)p, _mm_packs_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1)));
  }
  static SERVAL_SIMD_INLINE int32_t hsum_i32(I v) {
    const __m256i s8 = _mm256_add_epi32(v.lo, v.hi);
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
    return _mm_cvtsi128_si32(s4);
  }

  static SERVAL_SIMD_INLINE __m256i dot_half(__m256i acc, __m256i u, __m256i s) {
    if constexpr (kVnni) return _mm256_dpbusd_avx_epi32(acc, u, s);
    else return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
  }
  static SERVAL_SIMD_INLINE I dot_u8s8(I acc, I u, I s) { return {dot_half(acc.lo, u.lo, s.lo), dot_half(acc.hi, u.hi, s.hi)}; }
  static SERVAL_SIMD_INLINE I dot_s8s8(I acc, I w, I s) {
    return {dot_half(acc.lo, _mm256_abs_epi8(w.lo), _mm256_sign_epi8(s.lo, w.lo)),
            dot_half(acc.hi, _mm256_abs_epi8(w.hi), _mm256_sign_epi8(s.hi, w.hi))};
  }
  static SERVAL_SIMD_INLINE I dot_s8s8_w16(I acc, I w, I s, I w16) {
    const I u = {_mm256_abs_epi8(w.lo), _mm256_abs_epi8(w.hi)};
    return dot_u8s8_w16(acc, u, I{_mm256_sign_epi8(s.lo, w.lo), _mm256_sign_epi8(s.hi, w.hi)}, w16);
  }
  static SERVAL_SIMD_INLINE I dot_u8s8_w16(I acc, I u, I s, I w16) {
    if constexpr (kVnni)
      return {_mm256_dpwssd_avx_epi32(acc.lo, _mm256_maddubs_epi16(u.lo, s.lo), w16.lo),
              _mm256_dpwssd_avx_epi32(acc.hi, _mm256_maddubs_epi16(u.hi, s.hi), w16.hi)};
    return {_mm256_add_epi32(acc.lo, _mm256_madd_epi16(_mm256_maddubs_epi16(u.lo, s.lo), w16.lo)),
            _mm256_add_epi32(acc.hi, _mm256_madd_epi16(_mm256_maddubs_epi16(u.hi, s.hi), w16.hi))};
  }

  // ---- weight decoders --------------------------------------------------------
  // 16 bytes -> [lo nibbles, hi nibbles] (one 32-block, natural order).
  static SERVAL_SIMD_INLINE __m256i nib16(const uint8_t* a) {
    const __m128i x = _mm_loadu_si128((const __m128i*)a);
    const __m256i y = _mm256_inserti128_si256(_mm256_castsi128_si256(x), _mm_srli_epi16(x, 4), 1);
    return _mm256_and_si256(y, _mm256_set1_epi8(0x0F));
  }
  static SERVAL_SIMD_INLINE I nibbles2(const uint8_t* a, const uint8_t* c) { return {nib16(a), nib16(c)}; }
  static SERVAL_SIMD_INLINE I nibbles1(const uint8_t* a) { return {nib16(a), _mm256_setzero_si256()}; }
  static SERVAL_SIMD_INLINE I bytes2(const int8_t* a, const int8_t* c) {
    return {_mm256_loadu_si256((const __m256i*)a), _mm256_loadu_si256((const __m256i*)c)};
  }
  static SERVAL_SIMD_INLINE I bytes1(const int8_t* a) {
    return {_mm256_loadu_si256((const __m256i*)a), _mm256_setzero_si256()};
  }
  static SERVAL_SIMD_INLINE I ior(I a, I b) { return {_mm256_or_si256(a.lo, b.lo), _mm256_or_si256(a.hi, b.hi)}; }
  // Bit j of the 32-bit little-endian word at a -> byte j = 0x10, else 0.
  static SERVAL_SIMD_INLINE __m256i hbits32(const uint8_t* a) {
    uint32_t x;
    std::memcpy(&x, a, 4);
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3,
                                            3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
    const __m256i v = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)x), spread), bit);
    return _mm256_and_si256(_mm256_cmpeq_epi8(v, bit), _mm256_set1_epi8(0x10));
  }
  // Q5_0/Q5_1's fifth bits of blocks b (a) and b+1 (c), as simd_avx512.h.
  static SERVAL_SIMD_INLINE I hbits2(const uint8_t* a, const uint8_t* c) { return {hbits32(a), hbits32(c)}; }
  static SERVAL_SIMD_INLINE I hbits1(const uint8_t* a) { return {hbits32(a), _mm256_setzero_si256()}; }
  static SERVAL_SIMD_INLINE I xor80(I v) {
    const __m256i k = _mm256_set1_epi8((char)0x80);
    return {_mm256_xor_si256(v.lo, k), _mm256_xor_si256(v.hi, k)};
  }
  static SERVAL_SIMD_INLINE I lookup16(const int8_t* t, I v) {
    const __m256i tbl = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)t));
    return {_mm256_shuffle_epi8(tbl, v.lo), _mm256_shuffle_epi8(tbl, v.hi)};
  }

  // ---- K-quant pieces ------------------------------------------------------------
  static SERVAL_SIMD_INLINE I nibbles_lohi(const uint8_t* q) {
    const __m256i y = _mm256_loadu_si256((const __m256i*)q);
    const __m256i m = _mm256_set1_epi8(0x0F);
    return {_mm256_and_si256(y, m), _mm256_and_si256(_mm256_srli_epi16(y, 4), m)};
  }
  static SERVAL_SIMD_INLINE I bcast32(const uint8_t* p) {
    const __m256i y = _mm256_loadu_si256((const __m256i*)p);
    return {y, y};
  }
  template <int kSh>
  static SERVAL_SIMD_INLINE __m256i shift16(__m256i v) {
    if constexpr (kSh > 0) return _mm256_slli_epi16(v, kSh);
    else if constexpr (kSh < 0) return _mm256_srli_epi16(v, -kSh);
    else return v;
  }
  template <int kSh0, int kSh1>
  static SERVAL_SIMD_INLINE I shift_halves(I hb) {
    return {shift16<kSh0>(hb.lo), shift16<kSh1>(hb.hi)};
  }
  static SERVAL_SIMD_INLINE I or_masked(I v, I h, char mask) {
    const __m256i m = _mm256_set1_epi8(mask);
    return {_mm256_or_si256(v.lo, _mm256_and_si256(h.lo, m)), _mm256_or_si256(v.hi, _mm256_and_si256(h.hi, m))};
  }
  static SERVAL_SIMD_INLINE I and8(I v, char mask) {
    const __m256i m = _mm256_set1_epi8(mask);
    return {_mm256_and_si256(v.lo, m), _mm256_and_si256(v.hi, m)};
  }
  // Each byte minus 1 (TQ2_0's t - 1).
  static SERVAL_SIMD_INLINE I dec8(I v) {
    return {_mm256_sub_epi8(v.lo, _mm256_set1_epi8(1)), _mm256_sub_epi8(v.hi, _mm256_set1_epi8(1))};
  }
  static SERVAL_SIMD_INLINE I srl4(I v) { return {_mm256_srli_epi16(v.lo, 4), _mm256_srli_epi16(v.hi, 4)}; }
  static SERVAL_SIMD_INLINE I load64(const uint8_t* p) { return iload(p); }
  // ---- lattice (IQ) grids: 64 bytes of grid entries, signs by bit mask -------
  // Eight 64-bit grid entries as one vector (matmul_tmpl.inc's iq_gather_*).
  static SERVAL_SIMD_INLINE I u64x8(long long e0, long long e1, long long e2, long long e3, long long e4,
                                    long long e5, long long e6, long long e7) {
    return {_mm256_setr_epi64x(e0, e1, e2, e3), _mm256_setr_epi64x(e4, e5, e6, e7)};
  }
  static SERVAL_SIMD_INLINE I add8(I a, I b) { return {_mm256_add_epi8(a.lo, b.lo), _mm256_add_epi8(a.hi, b.hi)}; }
  // 32 bits -> 32 bytes of 0xFF (bit set) / 0.
  static SERVAL_SIMD_INLINE __m256i bits_to_bytes(uint32_t m) {
    const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3,
                                          3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)m), shuf);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
  }
  static SERVAL_SIMD_INLINE I neg_bytes(I v, uint64_t m) {
    const __m256i lo = bits_to_bytes((uint32_t)m), hi = bits_to_bytes((uint32_t)(m >> 32));
    return {_mm256_sub_epi8(_mm256_xor_si256(v.lo, lo), lo), _mm256_sub_epi8(_mm256_xor_si256(v.hi, hi), hi)};
  }

  // ---- packed K-quant (X16) pieces: one i32 lane per weight row ---------------
  static SERVAL_SIMD_INLINE I imul_lanes(I a, I b) {
    return {_mm256_mullo_epi32(a.lo, b.lo), _mm256_mullo_epi32(a.hi, b.hi)};
  }
  // 16-bit lanes shifted right by a run-time count.
  static SERVAL_SIMD_INLINE I srl16(I v, int n) {
    const __m128i k = _mm_cvtsi32_si128(n);
    return {_mm256_srl_epi16(v.lo, k), _mm256_srl_epi16(v.hi, k)};
  }
  // i32 lanes of two i16 halves: lo (bits 0..15) and hi (16..31); both in [0, 2^15).
  static SERVAL_SIMD_INLINE I pair_i16(I lo, I hi) {
    return {_mm256_or_si256(lo.lo, _mm256_slli_epi32(hi.lo, 16)), _mm256_or_si256(lo.hi, _mm256_slli_epi32(hi.hi, 16))};
  }
  // acc + a.lo16 * b.lo16 + a.hi16 * b.hi16 per i32 lane (signed i16, exact).
  static SERVAL_SIMD_INLINE I dot_i16(I acc, I a, I b) {
    if constexpr (kVnni)
      return {_mm256_dpwssd_avx_epi32(acc.lo, a.lo, b.lo), _mm256_dpwssd_avx_epi32(acc.hi, a.hi, b.hi)};
    return {_mm256_add_epi32(acc.lo, _mm256_madd_epi16(a.lo, b.lo)), _mm256_add_epi32(acc.hi, _mm256_madd_epi16(a.hi, b.hi))};
  }
  // Each i32 lane's low i16 alone (high half cleared).
  static SERVAL_SIMD_INLINE I lo16(I v) {
    const __m256i m = _mm256_set1_epi32(0xFFFF);
    return {_mm256_and_si256(v.lo, m), _mm256_and_si256(v.hi, m)};
  }
  static SERVAL_SIMD_INLINE I iset1(int32_t v) { return {_mm256_set1_epi32(v), _mm256_set1_epi32(v)}; }
  static SERVAL_SIMD_INLINE I u8x16_i32(const uint8_t* p) {
    return {_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p)),
            _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(p + 8)))};
  }
  static SERVAL_SIMD_INLINE I s8x16_i32(const int8_t* p) {
    return {_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)),
            _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(p + 8)))};
  }
  template <int kSh>
  static SERVAL_SIMD_INLINE I shl16(I v) {
    return {shift16<kSh>(v.lo), shift16<kSh>(v.hi)};
  }

  template <int kA, int kB>
  static SERVAL_SIMD_INLINE I scales_s8_2x16(uint64_t s8) {
    return {_mm256_set1_epi16((short)(int8_t)((s8 >> (8 * kA)) & 0xFF)),
            _mm256_set1_epi16((short)(int8_t)((s8 >> (8 * kB)) & 0xFF))};
  }
  template <int kA, int kB>
  static SERVAL_SIMD_INLINE I scales_u8_2x16(uint64_t s8) {
    return {_mm256_set1_epi16((short)((s8 >> (8 * kA)) & 0xFF)), _mm256_set1_epi16((short)((s8 >> (8 * kB)) & 0xFF))};
  }
  template <int kC>
  static SERVAL_SIMD_INLINE I scales_s8_4x8(__m128i s16) {
    const __m128i c0 = _mm_setr_epi8(4 * kC, 4 * kC, 4 * kC, 4 * kC, 4 * kC, 4 * kC, 4 * kC, 4 * kC, 4 * kC + 1,
                                     4 * kC + 1, 4 * kC + 1, 4 * kC + 1, 4 * kC + 1, 4 * kC + 1, 4 * kC + 1, 4 * kC + 1);
    const __m128i c1 = _mm_setr_epi8(4 * kC + 2, 4 * kC + 2, 4 * kC + 2, 4 * kC + 2, 4 * kC + 2, 4 * kC + 2, 4 * kC + 2,
                                     4 * kC + 2, 4 * kC + 3, 4 * kC + 3, 4 * kC + 3, 4 * kC + 3, 4 * kC + 3, 4 * kC + 3,
                                     4 * kC + 3, 4 * kC + 3);
    return {_mm256_cvtepi8_epi16(_mm_shuffle_epi8(s16, c0)), _mm256_cvtepi8_epi16(_mm_shuffle_epi8(s16, c1))};
  }
};
