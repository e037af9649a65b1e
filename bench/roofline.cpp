// The roofline of this machine, for docs/PERFORMANCE.md: memory read
// bandwidth (a streaming read of a buffer far larger than the caches, split
// over T threads) and peak throughput of the instructions the kernels are made
// of: fp32 FMA (vfmadd231ps zmm / ymm) and int8 dot products (vpdpbusd zmm,
// AVX-VNNI vpdpbusd ymm, and the AVX2 vpmaddubsw + vpmaddwd + vpaddd triple),
// each on T threads with enough independent accumulators to cover latency.
//
//   serval_roofline [--threads T] [--mb MiB] [--reps R]
// prints one line per measurement: the median and the best of R runs.
// Instructions the CPU lacks are reported as "n/a".
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

__attribute__((target("avx512f"))) void fma_zmm(int64_t iters) {
  __m512 acc[kAcc];
  for (int k = 0; k < kAcc; ++k) acc[k] = _mm512_set1_ps((float)k);
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int k = 0; k < kAcc; ++k) acc[k] = _mm512_fmadd_ps(acc[k], a, b);
  }
  float s = 0;
  for (int k = 0; k < kAcc; ++k) s += _mm512_reduce_add_ps(acc[k]);
  g_sink += (uint64_t)s;
}

__attribute__((target("avx2,fma"))) void fma_ymm(int64_t iters) {
  __m256 acc[kAcc];
  for (int k = 0; k < kAcc; ++k) acc[k] = _mm256_set1_ps((float)k);
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int k = 0; k < kAcc; ++k) acc[k] = _mm256_fmadd_ps(acc[k], a, b);
  }
  float v[8], s = 0;
  for (int k = 0; k < kAcc; ++k) {
    _mm256_storeu_ps(v, acc[k]);
    for (float f : v) s += f;
  }
  g_sink += (uint64_t)s;
}

__attribute__((target("avx512f,avx512bw,avx512vnni"))) void vnni_zmm(int64_t iters) {
  __m512i acc[kAcc];
  for (int k = 0; k < kAcc; ++k) acc[k] = _mm512_set1_epi32(k);
  const __m512i u = _mm512_set1_epi8(3), s = _mm512_set1_epi8(-2);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int k = 0; k < kAcc; ++k) acc[k] = _mm512_dpbusd_epi32(acc[k], u, s);
  }
  int64_t t = 0;
  for (int k = 0; k < kAcc; ++k) t += _mm512_reduce_add_epi32(acc[k]);
  g_sink += (uint64_t)t;
}

__attribute__((target("avx2,avxvnni"))) void vnni_ymm(int64_t iters) {
  __m256i acc[kAcc];
  for (int k = 0; k < kAcc; ++k) acc[k] = _mm256_set1_epi32(k);
  const __m256i u = _mm256_set1_epi8(3), s = _mm256_set1_epi8(-2);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int k = 0; k < kAcc; ++k) acc[k] = _mm256_dpbusd_avx_epi32(acc[k], u, s);
  }
  int64_t t = 0;
  for (int k = 0; k < kAcc; ++k) t += _mm256_extract_epi32(acc[k], 0) + _mm256_extract_epi32(acc[k], 7);
  g_sink += (uint64_t)t;
}

// vpmaddubsw + vpmaddwd + vpaddd: the AVX2 (no VNNI) form of 32 int8 multiply-adds per ymm.
__attribute__((target("avx2"))) void maddubs_ymm(int64_t iters) {
  __m256i acc[kAcc];
  for (int k = 0; k < kAcc; ++k) acc[k] = _mm256_set1_epi32(k);
  const __m256i u = _mm256_set1_epi8(3), s = _mm256_set1_epi8(-2), one = _mm256_set1_epi16(1);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int k = 0; k < kAcc; ++k)
      acc[k] = _mm256_add_epi32(acc[k], _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), one));
  }
  int64_t t = 0;
  for (int k = 0; k < kAcc; ++k) t += _mm256_extract_epi32(acc[k], 0);
  g_sink += (uint64_t)t;
}

struct Stat {
  double median, best;
};
Stat stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.back()};
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, reps = 5;
  size_t mb = 1024;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const long v = std::strtol(argv[i + 1], nullptr, 10);
    if (a == "--threads" && v >= 1 && v <= 256) threads = (int)v;
    else if (a == "--mb" && v >= 64 && v <= (1 << 20)) mb = (size_t)v;
    else if (a == "--reps" && v >= 1 && v <= 100) reps = (int)v;
    else {
      std::fprintf(stderr, "usage: serval_roofline [--threads 1..256] [--mb 64..] [--reps 1..100]\n");
      return 2;
    }
  }
  const serval::CpuFeatures& f = serval::cpu_features();
  if (argc % 2 == 0) {
    std::fprintf(stderr, "usage: serval_roofline [--threads 1..256] [--mb 64..] [--reps 1..100]\n");
    return 2;
  }
  if (!f.avx2) {
    std::fprintf(stderr, "serval_roofline: needs AVX2\n");
    return 1;
  }
  std::printf("threads %d, reps %d (median / best)\n", threads, reps);

  // Memory: each thread reads its own contiguous slice; first-touch by its reader.
  const size_t bytes = mb << 20, slice = bytes / (size_t)threads / 128 * 128;
  auto* buf = static_cast<uint8_t*>(std::aligned_alloc(64, bytes));
  if (!buf) {
    std::fprintf(stderr, "serval_roofline: cannot allocate %zu MiB\n", mb);
    return 1;
  }
  run_threads(threads, [&](int t) { std::memset(buf + (size_t)t * slice, t + 1, slice); });
  std::vector<double> bw;
  for (int r = 0; r < reps; ++r) {
    const double s = run_threads(threads, [&](int t) { g_sink += read_avx2(buf + (size_t)t * slice, slice); });
    bw.push_back((double)slice * threads / s * 1e-9);
  }
  const Stat m = stats(bw);
  std::printf("memory read bandwidth      %8.1f / %8.1f GB/s   (%zu MiB buffer)\n", m.median, m.best, mb);
  std::free(buf);

  struct Peak {
    const char* name;
    bool ok;
    void (*fn)(int64_t);
    double ops_per_step;  // per thread per loop iteration
    const char* unit;
  };
  const Peak peaks[] = {
      {"fp32 FMA zmm (vfmadd231ps)", f.avx512f, fma_zmm, kAcc * 16 * 2.0, "GFLOP/s"},
      {"fp32 FMA ymm (vfmadd231ps)", f.avx2 && f.fma, fma_ymm, kAcc * 8 * 2.0, "GFLOP/s"},
      {"int8 vpdpbusd zmm (AVX-512)", f.avx512vnni, vnni_zmm, kAcc * 64 * 2.0, "GOP/s"},
      {"int8 vpdpbusd ymm (AVX-VNNI)", f.avxvnni, vnni_ymm, kAcc * 32 * 2.0, "GOP/s"},
      {"int8 maddubs+madd ymm (AVX2)", f.avx2, maddubs_ymm, kAcc * 32 * 2.0, "GOP/s"},
  };
  for (const Peak& p : peaks) {
    if (!p.ok) {
      std::printf("%-30s      n/a\n", p.name);
      continue;
    }
    std::vector<double> r;
    for (int i = 0; i < reps; ++i) {
      const double s = run_threads(threads, [&](int) { p.fn(kIters / 4); });
      r.push_back(p.ops_per_step * (double)(kIters / 4) * threads / s * 1e-9);
    }
    const Stat st = stats(r);
    std::printf("%-30s %8.1f / %8.1f %s\n", p.name, st.median, st.best, p.unit);
  }
  return g_sink.load() == 42 ? 3 : 0;  // (keeps the results observable)
}
