#include "common/roofline.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/cpu_features.h"

namespace serval {
namespace {

using Clock = std::chrono::steady_clock;

// Runs fn(thread index) on T threads started together; returns the wall seconds.
double run_threads(int threads, const std::function<void(int)>& fn) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> ts;
  for (int i = 0; i < threads; ++i)
    ts.emplace_back([&, i] {
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) {
      }
      fn(i);
    });
  while (ready.load() < threads) {
  }
  const auto t0 = Clock::now();
  go.store(true, std::memory_order_release);
  for (auto& t : ts) t.join();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::atomic<uint64_t> g_sink{0};

// ---- memory read bandwidth -------------------------------------------------------

__attribute__((target("avx2"))) uint64_t read_avx2(const uint8_t* p, size_t bytes) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i + 128 <= bytes; i += 128) {
    a0 = _mm256_xor_si256(a0, _mm256_load_si256((const __m256i*)(p + i)));
    a1 = _mm256_xor_si256(a1, _mm256_load_si256((const __m256i*)(p + i + 32)));
    a2 = _mm256_xor_si256(a2, _mm256_load_si256((const __m256i*)(p + i + 64)));
    a3 = _mm256_xor_si256(a3, _mm256_load_si256((const __m256i*)(p + i + 96)));
  }
  const __m256i a = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
  return (uint64_t)_mm256_extract_epi64(a, 0) ^ (uint64_t)_mm256_extract_epi64(a, 3);
}

// ---- compute peaks (kAcc independent chains, kIters steps each) -------------------------

constexpr int kAcc = 12;
constexpr int64_t kIters = 20'000'000;

// The body of every peak function: kAcc independent chains acc = STEP(acc),
// then the lanes folded into g_sink (so the work is observable); BARRIER runs
// before each step (to keep loop-invariant parts of STEP in the loop, once
// per chain). A macro, not a template: each function needs its own target attribute.
#define SERVAL_PEAK_BODY(V, INIT, STEP, FOLD, BARRIER)       \
  V acc[kAcc];                                              \
  for (int k = 0; k < kAcc; ++k) acc[k] = INIT(k);          \
  for (int64_t i = 0; i < iters; ++i) {                     \
    _Pragma("GCC unroll 12") for (int k = 0; k < kAcc; ++k) { \
      BARRIER;                                              \
      acc[k] = STEP(acc[k]);                                \
    }                                                       \
  }                                                         \
  double sum = 0;                                           \
  for (int k = 0; k < kAcc; ++k) sum += (double)FOLD(acc[k]); \
  g_sink += (uint64_t)(int64_t)sum;

// GCC 12's _mm512_reduce_add_* build _mm512_undefined_*() from a
// self-initialized local, which -Wuninitialized reports (as in the kernels,
// src/kernels/x86/target.h).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
__attribute__((target("avx512f"))) void fma_zmm(int64_t iters) {
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
#define SERVAL_STEP(v) _mm512_fmadd_ps(v, a, b)
  SERVAL_PEAK_BODY(__m512, _mm512_set1_ps, SERVAL_STEP, _mm512_reduce_add_ps, (void)0)
#undef SERVAL_STEP
}

__attribute__((target("avx2,fma"))) float hsum_ymm(__m256 v) {
  const __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  return _mm_cvtss_f32(_mm_hadd_ps(_mm_hadd_ps(h, h), _mm_hadd_ps(h, h)));
}
__attribute__((target("avx2"))) int32_t lane0_ymm(__m256i v) { return _mm256_extract_epi32(v, 0); }

__attribute__((target("avx2,fma"))) void fma_ymm(int64_t iters) {
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
#define SERVAL_STEP(v) _mm256_fmadd_ps(v, a, b)
  SERVAL_PEAK_BODY(__m256, _mm256_set1_ps, SERVAL_STEP, hsum_ymm, (void)0)
#undef SERVAL_STEP
}

__attribute__((target("avx512f,avx512bw,avx512vnni"))) void vnni_zmm(int64_t iters) {
  const __m512i u = _mm512_set1_epi8(3), s = _mm512_set1_epi8(-2);
#define SERVAL_STEP(v) _mm512_dpbusd_epi32(v, u, s)
  SERVAL_PEAK_BODY(__m512i, _mm512_set1_epi32, SERVAL_STEP, _mm512_reduce_add_epi32, (void)0)
#undef SERVAL_STEP
}

// vdpbf16ps: per lane two BF16 products added to an F32 accumulator (64
// FLOP per zmm instruction). Measured for the F16/BF16 kernels' choice
// (docs/PERFORMANCE.md): they use F32 FMA, which is faster where this is at
// half rate (Sapphire/Emerald Rapids: 0.5 instructions per cycle).
__attribute__((target("avx512f,avx512bf16"))) void bf16_zmm(int64_t iters) {
  const __m512bh u = (__m512bh)_mm512_set1_epi32(0x3f7f3f7f), s = (__m512bh)_mm512_set1_epi32(0x33d633d6);
#define SERVAL_STEP(v) _mm512_dpbf16_ps(v, u, s)
  SERVAL_PEAK_BODY(__m512, _mm512_set1_ps, SERVAL_STEP, _mm512_reduce_add_ps, (void)0)
#undef SERVAL_STEP
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

__attribute__((target("avx2,avxvnni"))) void vnni_ymm(int64_t iters) {
  const __m256i u = _mm256_set1_epi8(3), s = _mm256_set1_epi8(-2);
#define SERVAL_STEP(v) _mm256_dpbusd_avx_epi32(v, u, s)
  SERVAL_PEAK_BODY(__m256i, _mm256_set1_epi32, SERVAL_STEP, lane0_ymm, (void)0)
#undef SERVAL_STEP
}

// vpmaddubsw + vpmaddwd + vpaddd: the AVX2 (no VNNI) form of 32 int8 multiply-adds per ymm.
__attribute__((target("avx2"))) void maddubs_ymm(int64_t iters) {
  __m256i u = _mm256_set1_epi8(3), s = _mm256_set1_epi8(-2);
  const __m256i one = _mm256_set1_epi16(1);
#define SERVAL_STEP(v) _mm256_add_epi32(v, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), one))
  SERVAL_PEAK_BODY(__m256i, _mm256_set1_epi32, SERVAL_STEP, lane0_ymm, __asm__ volatile("" : "+x"(u), "+x"(s)))
#undef SERVAL_STEP
}

RooflineFigure figure_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.back()};
}

}  // namespace

Expected<RooflineFigure> measure_read_bandwidth(int threads, size_t mib, int reps) {
  if (!cpu_features().avx2) return unsupported("the bandwidth probe needs AVX2");
  if (threads < 1 || reps < 1 || mib < 1) return invalid_argument("roofline: threads, reps and MiB must be >= 1");
  // Each thread reads its own contiguous slice; first-touch by its reader.
  const size_t bytes = mib << 20, slice = bytes / (size_t)threads / 128 * 128;
  auto* buf = static_cast<uint8_t*>(std::aligned_alloc(64, bytes));
  if (!buf) return io_error("roofline: cannot allocate " + std::to_string(mib) + " MiB");
  run_threads(threads, [&](int t) { std::memset(buf + (size_t)t * slice, t + 1, slice); });
  std::vector<double> bw;
  for (int r = 0; r < reps; ++r) {
    const double s = run_threads(threads, [&](int t) { g_sink += read_avx2(buf + (size_t)t * slice, slice); });
    bw.push_back((double)slice * threads / s * 1e-9);
  }
  std::free(buf);
  return figure_of(bw);
}

std::vector<RooflinePeak> measure_peaks(int threads, int reps, double scale) {
  const CpuFeatures& f = cpu_features();
  struct Def {
    const char* name;
    bool ok;
    void (*fn)(int64_t);
    double ops_per_step;  // per thread per loop iteration
    bool fp32;
    bool bf16 = false;
  };
  const Def defs[] = {
      {"fp32 FMA zmm (vfmadd231ps)", f.avx512f, fma_zmm, kAcc * 16 * 2.0, true},
      {"fp32 FMA ymm (vfmadd231ps)", f.avx2 && f.fma, fma_ymm, kAcc * 8 * 2.0, true},
      {"int8 vpdpbusd zmm (AVX-512)", f.avx512vnni, vnni_zmm, kAcc * 64 * 2.0, false},
      {"int8 vpdpbusd ymm (AVX-VNNI)", f.avxvnni, vnni_ymm, kAcc * 32 * 2.0, false},
      {"int8 maddubs+madd ymm (AVX2)", f.avx2, maddubs_ymm, kAcc * 32 * 2.0, false},
      {"bf16 vdpbf16ps zmm (AVX512-BF16)", f.avx512bf16, bf16_zmm, kAcc * 16 * 4.0, false, true},
  };
  const int64_t iters = std::max<int64_t>(1000, (int64_t)((double)(kIters / 4) * std::clamp(scale, 1e-3, 1.0)));
  std::vector<RooflinePeak> out;
  for (const Def& d : defs) {
    RooflinePeak p{d.name, d.fp32 || d.bf16 ? "GFLOP/s" : "GOP/s", d.fp32, d.bf16, d.ok, {}};
    if (d.ok) {
      std::vector<double> r;
      for (int i = 0; i < std::max(1, reps); ++i) {
        const double s = run_threads(threads, [&](int) { d.fn(iters); });
        r.push_back(d.ops_per_step * (double)iters * threads / s * 1e-9);
      }
      p.figure = figure_of(r);
    }
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace serval
