// Kernel micro-benchmarks: kernels::matmul per weight type and kernel level at
// TinyLlama-1.1B shapes (2048x2048 attention, 5632x2048 gate/up, 2048x5632
// down), as GEMV (n = 1, decode) and GEMM (n = 16, batched decode), plus
// attention. Reports GB/s of weight bytes read and GFLOP/s (2 * rows * cols * n).
//
// Weights are replicated into enough copies (SERVAL_BENCH_MB, default 256 MiB)
// that successive iterations read DRAM rather than cache, as a real model does.
// Threads: SERVAL_BENCH_THREADS (default: ThreadPool::default_threads()).
//
//   serval_kernel_bench --benchmark_filter='matmul/q4_0' --benchmark_repetitions=5
//       --benchmark_report_aggregates_only=true
// (one command line). matmul/<type>x16/... rows multiply with
// kernels::PackedMatrix copies, as the model does for packable types;
// layer/<type>x16/{qkv,gate_up}/... time a layer's products of one input
// one by one against one kernels::matmul_many call; moe/<type>x16/128x8/...
// a MoE layer's chosen experts one by one against kernels::matmul_grouped.
// (the "_min" rows: the least disturbed run; the time-based counters of the
// "_median"/"_min" rows are per-run rates as well.)
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/cpu_features.h"
#include "common/thread_pool.h"
#include "kernels/lora.h"
#include "kernels/matmul.h"
#include "kernels/ref/quants.h"
#include "tensor/dtype.h"

namespace {

using namespace serval;

int env_int(const char* name, int def) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : def;
}

ThreadPool& pool() {
  static ThreadPool p(env_int("SERVAL_BENCH_THREADS", ThreadPool::default_threads()));
  return p;
}

uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// A [rows, cols] matrix of type t in `copies` copies: 64 distinct quantized
// rows (ref::quantize_row is slow), repeated.
struct Matrix {
  DType t;
  int64_t rows, cols;
  size_t bytes;  // one copy
  int copies;
  std::vector<uint8_t> data;
  const uint8_t* copy(int i) const { return data.data() + (size_t)i * bytes; }
};

std::shared_ptr<Matrix> make_matrix(DType t, int64_t rows, int64_t cols) {
  auto m = std::make_shared<Matrix>();
  m->t = t;
  m->rows = rows;
  m->cols = cols;
  const size_t stride = row_size(t, cols);
  m->bytes = stride * (size_t)rows;
  const size_t target = (size_t)env_int("SERVAL_BENCH_MB", 256) << 20;
  m->copies = (int)std::max<size_t>(1, (target + m->bytes - 1) / m->bytes);
  m->data.resize(m->bytes * (size_t)m->copies);
  std::vector<float> src((size_t)cols);
  std::vector<uint8_t> distinct(stride * 64);
  uint64_t s = 1;
  if (ref::can_quantize(t)) {
    for (int r = 0; r < 64; ++r) {
      for (auto& v : src) v = (float)(((double)(mix(++s) >> 11) * 0x1.0p-53 - 0.5) * 0.1);
      ref::quantize_row(t, src.data(), distinct.data() + (size_t)r * stride, cols);
    }
  } else {
    // Types serval reads but does not write (IQ1/IQ2/IQ3, TQ): random bytes
    // (every grid index and sign: the decode cost does not depend on the
    // values) with a small F16 super-scale patched in.
    for (auto& b : distinct) b = (uint8_t)mix(++s);
    const auto tr = *dtype_traits(t);
    const uint16_t d = 0x1400;  // 2^-10
    for (size_t at = 0; at + tr.type_size <= distinct.size(); at += tr.type_size) {
      uint8_t* blk = distinct.data() + at;
      if (t == DType::iq1_m) {  // the super-scale is the top nibbles of the 4 scale words
        for (int k = 0; k < 4; ++k) {
          uint16_t w;
          std::memcpy(&w, blk + 48 + 2 * k, 2);
          w = (uint16_t)((w & 0x0FFF) | ((d >> (4 * k)) & 0xF) << 12);
          std::memcpy(blk + 48 + 2 * k, &w, 2);
        }
      } else {
        const size_t d_at = t == DType::tq1_0 ? 52 : t == DType::tq2_0 ? 64 : 0;
        std::memcpy(blk + d_at, &d, 2);
      }
    }
  }
  for (int c = 0; c < m->copies; ++c)
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(m->data.data() + (size_t)c * m->bytes + (size_t)r * stride, distinct.data() + (size_t)(r % 64) * stride,
                  stride);
  return m;
}

// packed: multiply with kernels::PackedMatrix copies of the matrix (as the
// model does for packable types).
void bm_matmul(benchmark::State& state, Isa isa, DType t, int64_t rows, int64_t cols, int64_t n, bool packed) {
  if (kernels::set_isa(isa) != isa) {
    state.SkipWithError("kernel level not supported on this CPU");
    return;
  }
  static std::shared_ptr<Matrix> cached;
  static std::vector<kernels::PackedMatrix> cached_packed;
  if (!cached || cached->t != t || cached->rows != rows || cached->cols != cols) {
    cached.reset();
    cached_packed.clear();
    cached = make_matrix(t, rows, cols);
  }
  const Matrix& m = *cached;
  if (packed && cached_packed.empty())
    for (int c = 0; c < m.copies; ++c) cached_packed.push_back(kernels::PackedMatrix::pack(t, m.copy(c), rows, cols));
  std::vector<float> x((size_t)(n * cols)), y((size_t)(n * rows));
  uint64_t s = 7;
  for (auto& v : x) v = (float)((double)(mix(++s) >> 11) * 0x1.0p-53 - 0.5);
  int c = 0;
  for (auto _ : state) {
    if (packed) kernels::matmul(cached_packed[(size_t)c], x.data(), n, y.data(), &pool());
    else kernels::matmul(t, m.copy(c), rows, cols, x.data(), n, y.data(), &pool());
    benchmark::ClobberMemory();
    if (++c == m.copies) c = 0;
  }
  state.SetBytesProcessed((int64_t)state.iterations() * (int64_t)m.bytes);
  state.counters["GFLOPs"] = benchmark::Counter(2.0 * (double)rows * (double)cols * (double)n * 1e-9 *
                                                    (double)state.iterations(),
                                                benchmark::Counter::kIsRate);
  state.counters["threads"] = pool().n_threads();
}

// A layer's products of one input, TinyLlama shapes: Q, K, V (2048, 256 and
// 256 rows x 2048) or gate and up (5632 x 2048 each), packed, in copies
// spanning SERVAL_BENCH_MB; `many`: one kernels::matmul_many call (the input
// quantized once, one parallel_for), else one kernels::matmul per product, as
// the forward did before it. Same bytes out either way.
void bm_same_input(benchmark::State& state, Isa isa, DType t, bool ffn, int64_t n, bool many) {
  if (kernels::set_isa(isa) != isa) {
    state.SkipWithError("kernel level not supported on this CPU");
    return;
  }
  const int64_t cols = 2048;
  const std::vector<int64_t> rows = ffn ? std::vector<int64_t>{5632, 5632} : std::vector<int64_t>{2048, 256, 256};
  static std::string key;
  static std::vector<std::vector<kernels::PackedMatrix>> sets;  // [copy][product]
  static int64_t set_bytes = 0;
  const std::string want = std::string(dtype_name(t)) + (ffn ? "/ffn" : "/qkv");
  if (key != want) {
    key = want;
    sets.clear();
    std::vector<std::shared_ptr<Matrix>> ms;
    set_bytes = 0;
    for (int64_t r : rows) {
      ms.push_back(make_matrix(t, r, cols));
      set_bytes += (int64_t)ms.back()->bytes;
    }
    const size_t target = (size_t)env_int("SERVAL_BENCH_MB", 256) << 20;
    const int copies = (int)std::max<size_t>(1, target / (size_t)set_bytes);
    for (int c = 0; c < copies; ++c) {
      sets.emplace_back();
      for (const auto& m : ms) sets.back().push_back(kernels::PackedMatrix::pack(t, m->copy(c % m->copies), m->rows, cols));
    }
  }
  std::vector<float> x((size_t)(n * cols));
  std::vector<std::vector<float>> ys;
  for (int64_t r : rows) ys.emplace_back((size_t)(n * r));
  uint64_t s = 7;
  for (auto& v : x) v = (float)((double)(mix(++s) >> 11) * 0x1.0p-53 - 0.5);
  size_t c = 0;
  for (auto _ : state) {
    const auto& set = sets[c];
    if (many) {
      kernels::PackedProduct pp[3];
      for (size_t j = 0; j < set.size(); ++j) pp[j] = {&set[j], ys[j].data()};
      kernels::matmul_many(pp, set.size(), x.data(), n, &pool());
    } else {
      for (size_t j = 0; j < set.size(); ++j) kernels::matmul(set[j], x.data(), n, ys[j].data(), &pool());
    }
    benchmark::ClobberMemory();
    if (++c == sets.size()) c = 0;
  }
  int64_t macs = 0;
  for (int64_t r : rows) macs += r * cols * n;
  state.SetBytesProcessed((int64_t)state.iterations() * set_bytes);
  state.counters["GFLOPs"] =
      benchmark::Counter(2.0 * (double)macs * 1e-9 * (double)state.iterations(), benchmark::Counter::kIsRate);
  state.counters["threads"] = pool().n_threads();
}

void bm_attention(benchmark::State& state, Isa isa, int64_t n_ctx) {
  if (kernels::set_isa(isa) != isa) {
    state.SkipWithError("kernel level not supported on this CPU");
    return;
  }
  // TinyLlama: 32 query heads, 4 KV heads, head_dim 64; KV blocks of 16.
  const int32_t n_heads = 32, n_kv = 4, hd = 64, bs = 16;
  const int64_t kv_stride = n_kv * hd, n_blocks = (n_ctx + bs - 1) / bs;
  std::vector<float> k((size_t)(n_blocks * bs * kv_stride)), v(k.size()), q((size_t)(n_heads * hd)), out(q.size()),
      scratch((size_t)n_ctx);
  uint64_t s = 3;
  for (auto& e : k) e = (float)((double)(mix(++s) >> 11) * 0x1.0p-53 - 0.5);
  for (auto& e : v) e = (float)((double)(mix(++s) >> 11) * 0x1.0p-53 - 0.5);
  for (auto& e : q) e = (float)((double)(mix(++s) >> 11) * 0x1.0p-53 - 0.5);
  std::vector<const float*> kb, vb;
  for (int64_t b = 0; b < n_blocks; ++b) {
    kb.push_back(k.data() + b * bs * kv_stride);
    vb.push_back(v.data() + b * bs * kv_stride);
  }
  for (auto _ : state) {
    kernels::attention(q.data(), kb.data(), vb.data(), bs, kv_stride, n_ctx, n_heads, n_kv, hd, 0.125f, out.data(),
                       scratch.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed((int64_t)state.iterations() * n_ctx * kv_stride * 2 * 4);
}


// LoRA updates of a decode step: `adapters` rank-16 F16 adapters of one
// [rows, cols] base matrix, `per` token rows each (the mixed-adapter batch of
// bench/lora_bench.py: 8 adapters x 2 rows), spread over the pool by
// adapter, each adapter's rows in one kernels::lora_rows_f16 call as
// model/lora.cpp's apply_lora does. Adapter copies span SERVAL_BENCH_MB so
// each iteration reads them from DRAM. Bytes: every adapter's A and B once.
void bm_lora(benchmark::State& state, Isa isa, int64_t rows, int64_t cols, int adapters, int per) {
  if (kernels::set_isa(isa) != isa) {
    state.SkipWithError("kernel level not supported on this CPU");
    return;
  }
  const int64_t rank = 16;
  const size_t one = (size_t)(rank * (rows + cols));  // elements of A and B
  const size_t set = one * (size_t)adapters;
  const size_t target = (size_t)env_int("SERVAL_BENCH_MB", 256) << 20;
  const int copies = (int)std::max<size_t>(1, target / (set * 2));
  std::vector<uint16_t> w(set * (size_t)copies);
  uint64_t s = 5;
  for (auto& v : w) {
    const uint64_t r = mix(++s);
    v = (uint16_t)(0x2000 + (r & 0x0fff) + ((r >> 12 & 1) << 15));
  }
  const int64_t n = (int64_t)adapters * per;
  std::vector<float> x((size_t)(n * cols)), y((size_t)(n * rows));
  for (auto& v : x) v = (float)((double)(mix(++s) >> 11) * 0x1.0p-53 - 0.5);
  int c = 0;
  for (auto _ : state) {
    const uint16_t* base = w.data() + (size_t)c * set;
    pool().parallel_for(adapters, [&](int64_t b, int64_t e) {
      float t[16 * kernels::kLoraGroupRows];
      const float* xs[64];
      float* ys[64];
      for (int64_t a = b; a < e; ++a) {
        const uint16_t* at = base + (size_t)a * one;
        for (int r = 0; r < per; ++r) {
          xs[r] = x.data() + (a * per + r) * cols;
          ys[r] = y.data() + (a * per + r) * rows;
        }
        kernels::lora_rows_f16(at, at + rank * cols, rank, cols, rows, 0.5f, xs, ys, per, t);
      }
    });
    benchmark::ClobberMemory();
    if (++c == copies) c = 0;
  }
  state.SetBytesProcessed((int64_t)state.iterations() * (int64_t)(set * 2));
}

// A MoE layer's experts, the Qwen3-30B-A3B shape (128 experts: gate and up
// 768 x 2048, down 2048 x 768; 8 used per token), packed, for n tokens each
// routed to 8 distinct experts drawn at random (seeded; 16 such routings
// in turn, so the weights come from DRAM): `grouped` runs all
// gate/up products in one kernels::matmul_grouped and all down products in
// another, as BatchForward::moe_ffn does; else one matmul_many (gate, up) and
// one matmul (down) per chosen expert, as it did before. The SwiGLU between
// them is left out (the same in both). Bytes: the chosen experts' weights.
void bm_moe(benchmark::State& state, DType t, int64_t n, bool grouped) {
  if (kernels::set_isa(Isa::avx512vnni) != Isa::avx512vnni) {
    state.SkipWithError("kernel level not supported on this CPU");
    return;
  }
  constexpr int64_t kExperts = 128, kUsed = 8, kDim = 2048, kFf = 768;
  static std::string key;
  static std::vector<kernels::PackedMatrix> gate, up, down;
  if (key != dtype_name(t)) {
    key = dtype_name(t);
    gate.clear();
    up.clear();
    down.clear();
    const auto g = make_matrix(t, kFf, kDim), d = make_matrix(t, kDim, kFf);
    for (int64_t e = 0; e < kExperts; ++e) {
      gate.push_back(kernels::PackedMatrix::pack(t, g->copy((int)(e % g->copies)), kFf, kDim));
      up.push_back(kernels::PackedMatrix::pack(t, g->copy((int)((e + 1) % g->copies)), kFf, kDim));
      down.push_back(kernels::PackedMatrix::pack(t, d->copy((int)(e % d->copies)), kDim, kFf));
    }
  }
  // kRoutings routings, cycled, so that successive iterations read other
  // experts (from DRAM, as a decode step does); in each, the rows of each
  // expert (token indices) in token order.
  constexpr int kRoutings = 16;
  std::vector<std::vector<std::vector<int64_t>>> routing(kRoutings, std::vector<std::vector<int64_t>>(kExperts));
  std::vector<size_t> routing_bytes(kRoutings, 0);
  uint64_t s = 11;
  for (int k = 0; k < kRoutings; ++k) {
    for (int64_t i = 0; i < n; ++i) {
      std::vector<int64_t> chosen;
      while ((int64_t)chosen.size() < kUsed) {
        const int64_t e = (int64_t)(mix(++s) % kExperts);
        if (std::find(chosen.begin(), chosen.end(), e) == chosen.end()) chosen.push_back(e);
      }
      for (int64_t e : chosen) routing[(size_t)k][(size_t)e].push_back(i);
    }
    for (int64_t e = 0; e < kExperts; ++e)
      if (!routing[(size_t)k][(size_t)e].empty())
        routing_bytes[(size_t)k] += gate[(size_t)e].bytes() + up[(size_t)e].bytes() + down[(size_t)e].bytes();
  }
  std::vector<float> x((size_t)(n * kDim)), gathered((size_t)(n * kUsed * kDim));
  for (auto& v : x) v = (float)((double)(mix(++s) >> 11) * 0x1.0p-53 - 0.5);
  std::vector<float> gy((size_t)(n * kUsed * kFf)), uy(gy.size()), h(gy.size(), 0.01f), dy((size_t)(n * kUsed * kDim));
  std::vector<kernels::GroupedProduct> gu, dn;
  int64_t bytes = 0;
  int k = 0;
  for (auto _ : state) {
    const auto& toks = routing[(size_t)k];
    bytes += (int64_t)routing_bytes[(size_t)k];
    if (++k == kRoutings) k = 0;
    int64_t r0 = 0;
    if (grouped) {
      gu.clear();
      dn.clear();
      for (int64_t e = 0; e < kExperts; ++e) {
        const int64_t m = (int64_t)toks[(size_t)e].size();
        if (m == 0) continue;
        gu.push_back({&gate[(size_t)e], x.data(), m, gy.data() + r0 * kFf, toks[(size_t)e].data()});
        gu.push_back({&up[(size_t)e], x.data(), m, uy.data() + r0 * kFf, toks[(size_t)e].data()});
        dn.push_back({&down[(size_t)e], h.data() + r0 * kFf, m, dy.data() + r0 * kDim});
        r0 += m;
      }
      kernels::matmul_grouped(gu.data(), gu.size(), &pool());
      kernels::matmul_grouped(dn.data(), dn.size(), &pool());
    } else {
      for (int64_t e = 0; e < kExperts; ++e) {
        const int64_t m = (int64_t)toks[(size_t)e].size();
        if (m == 0) continue;
        for (int64_t j = 0; j < m; ++j)
          std::memcpy(gathered.data() + j * kDim, x.data() + toks[(size_t)e][(size_t)j] * kDim, kDim * sizeof(float));
        kernels::PackedProduct pp[2] = {{&gate[(size_t)e], gy.data() + r0 * kFf}, {&up[(size_t)e], uy.data() + r0 * kFf}};
        kernels::matmul_many(pp, 2, gathered.data(), m, &pool());
        kernels::matmul(down[(size_t)e], h.data() + r0 * kFf, m, dy.data() + r0 * kDim, &pool());
        r0 += m;
      }
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(bytes);
  state.counters["threads"] = pool().n_threads();
}

// On a shared machine other processes only ever slow a run down: with
// --benchmark_repetitions the min is the figure to compare (besides the median).
double min_of(const std::vector<double>& v) { return v.empty() ? 0.0 : *std::min_element(v.begin(), v.end()); }

int register_all() {
  const Isa isas[] = {Isa::ref, Isa::avx2, Isa::avx2vnni, Isa::avx512, Isa::avx512vnni};
  const DType types[] = {DType::q4_0, DType::q8_0, DType::iq4_nl, DType::q4_1, DType::q5_0,
                         DType::q5_1, DType::q2_k, DType::q3_k,   DType::q4_k, DType::q5_k,
                         DType::q6_k, DType::iq4_xs, DType::f16,  DType::bf16, DType::f32,
                         DType::iq2_xxs, DType::iq2_xs, DType::iq2_s, DType::iq3_xxs, DType::iq3_s,
                         DType::iq1_s, DType::iq1_m, DType::tq1_0, DType::tq2_0};
  struct Shape {
    int64_t rows, cols;
  };
  const Shape shapes[] = {{2048, 2048}, {5632, 2048}, {2048, 5632}};
  for (DType t : types)
    for (bool packed : {false, true}) {
      if (packed && !kernels::PackedMatrix::packable(t)) continue;
      for (const Shape& sh : shapes)
        for (int64_t n : {1, 16, 128})
          for (Isa isa : isas) {
            if (!isa_supported(isa, cpu_features())) continue;
            const std::string name = "matmul/" + std::string(dtype_name(t)) + (packed ? "x16" : "") + "/" +
                                     std::to_string(sh.rows) + "x" + std::to_string(sh.cols) + "/n" +
                                     std::to_string(n) + "/" + isa_name(isa);
            benchmark::RegisterBenchmark(name.c_str(), bm_matmul, isa, t, sh.rows, sh.cols, n, packed)
                ->Unit(benchmark::kMicrosecond)
                ->UseRealTime()
                ->ComputeStatistics("min", min_of);
          }
    }
  for (DType t : {DType::q4_0, DType::q8_0, DType::q4_k})
    for (bool ffn : {false, true})
      for (int64_t n : {1, 16, 128})
        for (bool many : {false, true}) {
          const Isa isa = Isa::avx512vnni;
          if (!isa_supported(isa, cpu_features())) continue;
          const std::string name = "layer/" + std::string(dtype_name(t)) + "x16/" + (ffn ? "gate_up" : "qkv") + "/n" +
                                   std::to_string(n) + "/" + (many ? "many" : "one_by_one");
          benchmark::RegisterBenchmark(name.c_str(), bm_same_input, isa, t, ffn, n, many)
              ->Unit(benchmark::kMicrosecond)
              ->UseRealTime()
              ->ComputeStatistics("min", min_of);
        }
  // The MoE router (F32, 128 experts x 2048), which llama.cpp's files keep unquantized.
  for (int64_t n : {1, 16}) {
    if (!isa_supported(Isa::avx512vnni, cpu_features())) break;
    const std::string name = "matmul/f32/128x2048/n" + std::to_string(n) + "/avx512vnni";
    benchmark::RegisterBenchmark(name.c_str(), bm_matmul, Isa::avx512vnni, DType::f32, 128, 2048, n, false)
        ->Unit(benchmark::kMicrosecond)
        ->UseRealTime()
        ->ComputeStatistics("min", min_of);
  }
  for (DType t : {DType::q4_0, DType::q4_k})
    for (int64_t n : {1, 16, 128})
      for (bool grouped : {false, true}) {
        if (!isa_supported(Isa::avx512vnni, cpu_features())) break;
        const std::string name = "moe/" + std::string(dtype_name(t)) + "x16/128x8/n" + std::to_string(n) + "/" +
                                 (grouped ? "grouped" : "one_by_one");
        benchmark::RegisterBenchmark(name.c_str(), bm_moe, t, n, grouped)
            ->Unit(benchmark::kMicrosecond)
            ->UseRealTime()
            ->ComputeStatistics("min", min_of);
      }
  for (int64_t ctx : {128, 1024})
    for (Isa isa : isas) {
      if (!isa_supported(isa, cpu_features())) continue;
      const std::string name = "attention/ctx" + std::to_string(ctx) + "/" + isa_name(isa);
      benchmark::RegisterBenchmark(name.c_str(), bm_attention, isa, ctx)
          ->Unit(benchmark::kMicrosecond)
          ->UseRealTime()
          ->ComputeStatistics("min", min_of);
    }
  for (const Shape& sh : shapes)
    for (Isa isa : isas) {
      if (!isa_supported(isa, cpu_features())) continue;
      for (int per : {1, 2, 4}) {
        const std::string name = "lora/f16x8x" + std::to_string(per) + "/" + std::to_string(sh.rows) + "x" +
                                 std::to_string(sh.cols) + "/" + isa_name(isa);
        benchmark::RegisterBenchmark(name.c_str(), bm_lora, isa, sh.rows, sh.cols, 8, per)
            ->Unit(benchmark::kMicrosecond)
            ->UseRealTime()
            ->ComputeStatistics("min", min_of);
      }
    }
  return 0;
}

const int registered = register_all();

}  // namespace

BENCHMARK_MAIN();
