// Tile attention micro-benchmarks (kernels/attention.h) at TinyLlama-1.1B's
// attention shape (32 query heads, 4 KV heads, head_dim 64, blocks of 16), per
// KV type and kernel level: the last m tokens of an n_ctx context, either as one
// tile ("tile": one pass over K/V for all m tokens) or as m one-token tiles
// ("token": what a per-token kernel costs), and for f32 also through the
// previous per-token F32 kernel kernels::attention ("legacy"). items/s = query
// tokens per second on one thread; tile/token is the multi-query gain.
// "small/..." runs stories260K's shape instead (8 query heads, 4 KV heads,
// head_dim 8): a decode token at a short context, where the kernel's per-chunk
// work (K transpose, softmax bookkeeping) outweighs its arithmetic.
//
//   serval_attention_bench --benchmark_filter='q8_0/m16/' --benchmark_repetitions=5
//       --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "common/cpu_features.h"
#include "kernels/attention.h"
#include "kernels/matmul.h"
#include "tensor/kv_type.h"

namespace {

using namespace serval;

constexpr int32_t kBlock = 16;

struct Shape {
  int32_t heads, kv_heads, head_dim;
};
constexpr Shape kTinyLlama{32, 4, 64}, kStories{8, 4, 8};

enum class Mode { tile, token, legacy };

void bm_tile(benchmark::State& state, Shape shape, Isa isa, KvType type, int32_t m, int64_t n_ctx, Mode mode) {
  kernels::set_isa(isa);
  const int32_t kHeads = shape.heads, kKvHeads = shape.kv_heads, kHeadDim = shape.head_dim;
  const int32_t kv_dim = kKvHeads * kHeadDim, q_dim = kHeads * kHeadDim;
  const size_t row = kv_row_bytes(type, kv_dim);
  const int64_t nb = (n_ctx + kBlock - 1) / kBlock;
  std::vector<uint8_t> kpool((size_t)(nb * kBlock) * row), vpool(kpool.size());
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x((size_t)kv_dim), q((size_t)(m * q_dim)), out(q.size());
  for (int64_t p = 0; p < nb * kBlock; ++p) {
    for (auto& v : x) v = nd(rng);
    kernels::kv_store_row(type, x.data(), kv_dim, kpool.data() + (size_t)p * row);
    for (auto& v : x) v = nd(rng);
    kernels::kv_store_row(type, x.data(), kv_dim, vpool.data() + (size_t)p * row);
  }
  for (auto& v : q) v = nd(rng);
  std::vector<const uint8_t*> kb, vb;
  for (int64_t b = 0; b < nb; ++b) {
    kb.push_back(kpool.data() + (size_t)(b * kBlock) * row);
    vb.push_back(vpool.data() + (size_t)(b * kBlock) * row);
  }
  kernels::AttentionTile t;
  t.q_stride = q_dim;
  t.k = {kb.data(), kBlock, row, type};
  t.v = {vb.data(), kBlock, row, type};
  t.n_heads = kHeads;
  t.n_kv_heads = kKvHeads;
  t.head_dim = kHeadDim;
  t.scale = 1.0f / std::sqrt((float)kHeadDim);
  t.out_stride = q_dim;
  const int64_t p0 = n_ctx - m;
  std::vector<const float*> kf, vf;
  for (int64_t b = 0; b < nb; ++b) {
    kf.push_back(reinterpret_cast<const float*>(kb[(size_t)b]));
    vf.push_back(reinterpret_cast<const float*>(vb[(size_t)b]));
  }
  std::vector<float> scratch((size_t)n_ctx);
  for (auto _ : state) {
    if (mode == Mode::legacy) {
      for (int32_t i = 0; i < m; ++i)
        kernels::attention(q.data() + i * q_dim, kf.data(), vf.data(), kBlock, kv_dim, p0 + i + 1, kHeads, kKvHeads,
                           kHeadDim, t.scale, out.data() + i * q_dim, scratch.data());
      benchmark::ClobberMemory();
      continue;
    }
    for (int32_t g = 0; g < kKvHeads; ++g) {
      t.kv_head = g;
      if (mode == Mode::tile) {
        t.q = q.data();
        t.out = out.data();
        t.p0 = p0;
        t.m = m;
        kernels::attention_tile(t);
      } else {
        for (int32_t i = 0; i < m; ++i) {
          t.q = q.data() + i * q_dim;
          t.out = out.data() + i * q_dim;
          t.p0 = p0 + i;
          t.m = 1;
          kernels::attention_tile(t);
        }
      }
    }
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed((int64_t)state.iterations() * m);
}

double min_of(const std::vector<double>& v) { return v.empty() ? 0.0 : *std::min_element(v.begin(), v.end()); }

int register_all() {
  for (KvType type : kAllKvTypes)
    for (int32_t m : {1, 16, 64})
      for (int64_t ctx : {512, 2048})
        for (Isa isa : {Isa::avx2, Isa::avx512})
          for (Mode mode : {Mode::tile, Mode::token, Mode::legacy}) {
            if (!isa_supported(isa, cpu_features()) || (m == 1 && mode == Mode::token) ||
                (mode == Mode::legacy && type != KvType::f32))
              continue;
            const char* mode_name = mode == Mode::tile ? "/tile" : mode == Mode::token ? "/token" : "/legacy";
            const std::string name = std::string(kv_type_name(type)) + "/m" + std::to_string(m) + "/ctx" +
                                     std::to_string(ctx) + "/" + isa_name(isa) + mode_name;
            benchmark::RegisterBenchmark(name.c_str(), bm_tile, kTinyLlama, isa, type, m, ctx, mode)
                ->Unit(benchmark::kMicrosecond)
                ->UseRealTime()
                ->ComputeStatistics("min", min_of);
          }
  for (KvType type : {KvType::f16, KvType::f32})
    for (int64_t ctx : {64, 128})
      for (Isa isa : {Isa::avx2, Isa::avx512}) {
        if (!isa_supported(isa, cpu_features())) continue;
        const std::string name = std::string("small/") + kv_type_name(type) + "/m1/ctx" + std::to_string(ctx) + "/" +
                                 isa_name(isa) + "/tile";
        benchmark::RegisterBenchmark(name.c_str(), bm_tile, kStories, isa, type, 1, ctx, Mode::tile)
            ->Unit(benchmark::kMicrosecond)
            ->UseRealTime()
            ->ComputeStatistics("min", min_of);
      }
  return 0;
}

const int registered = register_all();

}  // namespace

BENCHMARK_MAIN();
