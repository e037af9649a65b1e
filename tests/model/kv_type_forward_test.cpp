// The batched forward with every KV element type (--kv-type) on mini-llama F16
// (head_dim 64), teacher-forced on llama.cpp's greedy continuations
// (../shared/golden/mini-formats.json): log-probabilities of llama.cpp's top-5
// candidates stay within per-type bounds, and chunked prefill gives the same
// bits as one pass for every type (the tile kernel's batch invariance).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "model/batch_forward.h"

using namespace serval;

namespace {

const std::string kShared = SERVAL_SHARED_DIR;

std::vector<double> log_softmax(const float* l, int64_t n) {
  double mx = -INFINITY, s = 0;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, (double)l[i]);
  for (int64_t i = 0; i < n; ++i) s += std::exp((double)l[i] - mx);
  std::vector<double> out((size_t)n);
  for (int64_t i = 0; i < n; ++i) out[(size_t)i] = (double)l[i] - mx - std::log(s);
  return out;
}

// Runs `tokens` through one sequence in chunks of `chunk`, returning the
// logits of every position, [tokens.size(), n_vocab].
std::vector<float> forward_all(const Model& m, KvType type, const std::vector<TokenId>& tokens, int chunk) {
  const auto& c = m.config();
  const int32_t bs = 16, nb = (int32_t)(tokens.size() + bs - 1) / bs;
  auto kv = KvStorage::create({(int32_t)c.n_layers, (int32_t)c.kv_dim(), bs, type}, nb + 1);
  EXPECT_TRUE(kv.ok());
  std::vector<BlockId> table((size_t)nb);
  std::iota(table.rbegin(), table.rend(), 1);  // not the identity
  BatchForward bf(m, *kv, nullptr);
  std::vector<float> all, logits;
  for (size_t pos = 0; pos < tokens.size(); pos += (size_t)chunk) {
    const int32_t len = (int32_t)std::min<size_t>((size_t)chunk, tokens.size() - pos);
    Batch b;
    b.tokens.assign(tokens.begin() + (long)pos, tokens.begin() + (long)pos + len);
    b.seqs.push_back({(int64_t)pos, len, table, true, len});
    EXPECT_TRUE(bf.forward(b, &logits).ok());
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

}  // namespace

// Bounds on |our log-prob - llama.cpp's| over the top-5 candidates of every
// step (llama.cpp ran with its default F16 KV). f32/f16 keep the F16 weights'
// own error (reference_forward_test's bounds: mean 0.005, max 0.03). The
// coarser formats add their rounding of K and V; measured on this model
// (2026-11-29; mean / max, greedy agreement of 128 steps):
//   f32 0.0015/0.008 128, f16 0.0017/0.011 128, bf16 0.0065/0.032 128,
//   q8_0 0.0225/0.107 127, fp8 0.112/0.486 121, q4_0 0.353/1.34 94
// and bounded with about 2x headroom; the mean error must also grow with
// coarser formats (f16 < q8_0 < fp8 < q4_0), which a decoding bug would break.
TEST(KvTypeForward, TeacherForcedLogprobsWithinPerTypeBounds) {
  std::ifstream in(kShared + "/golden/mini-formats.json");
  const auto golden = nlohmann::json::parse(in);
  const std::string file = "mini-llama-F16.gguf";
  auto model = Model::load(kShared + "/models/mini/" + file);
  ASSERT_TRUE(model.ok());
  const int64_t n_vocab = (*model)->config().n_vocab;
  struct Bound {
    KvType t;
    double mean, max;
  };
  const Bound bounds[] = {{KvType::f32, 0.005, 0.03}, {KvType::f16, 0.005, 0.03}, {KvType::bf16, 0.015, 0.07},
                          {KvType::q8_0, 0.045, 0.2}, {KvType::fp8, 0.2, 0.9},    {KvType::q4_0, 0.6, 2.5}};
  std::vector<double> means;
  for (const Bound& b : bounds) {
    double sum = 0, mx = 0;
    int64_t n = 0;
    int agree = 0, total = 0;
    for (const auto& c : golden[file]) {
      auto tokens = c["prompt_tokens"].get<std::vector<TokenId>>();
      const auto forced = c["greedy_tokens"].get<std::vector<TokenId>>();
      const size_t n_prompt = tokens.size();
      tokens.insert(tokens.end(), forced.begin(), forced.end() - 1);
      const auto logits = forward_all(**model, b.t, tokens, (int)tokens.size());
      for (size_t step = 0; step < forced.size(); ++step) {
        const float* l = logits.data() + (n_prompt - 1 + step) * (size_t)n_vocab;
        const auto lp = log_softmax(l, n_vocab);
        for (const auto& e : c["top5_logprobs"][step]) {
          const double d = std::fabs(lp[e["id"].get<size_t>()] - e["logprob"].get<double>());
          sum += d;
          mx = std::max(mx, d);
          ++n;
        }
        agree += std::max_element(l, l + n_vocab) - l == forced[step];
        ++total;
      }
    }
    std::printf("kv %-5s |d logprob| vs llama.cpp: mean %.4f max %.4f  greedy agreement %d/%d\n",
                kv_type_name(b.t), sum / (double)n, mx, agree, total);
    EXPECT_LE(sum / (double)n, b.mean) << kv_type_name(b.t);
    EXPECT_LE(mx, b.max) << kv_type_name(b.t);
    means.push_back(sum / (double)n);
  }
  EXPECT_LT(means[1], means[3]);  // f16 < q8_0
  EXPECT_LT(means[3], means[4]);  // q8_0 < fp8
  EXPECT_LT(means[4], means[5]);  // fp8 < q4_0
}

// Prefill in chunks of 1, 5 and 16 tokens gives the same bits as one pass,
// for every KV type: each token's attention does not depend on its tile.
TEST(KvTypeForward, ChunkedPrefillIsBitIdenticalForEveryType) {
  auto model = Model::load(kShared + "/models/mini/mini-llama-Q8_0.gguf");
  ASSERT_TRUE(model.ok());
  std::vector<TokenId> tokens;
  for (int i = 0; i < 45; ++i) tokens.push_back((TokenId)(1 + (i * 37) % 500));
  for (KvType t : kAllKvTypes) {
    const auto whole = forward_all(**model, t, tokens, (int)tokens.size());
    for (int chunk : {1, 5, 16}) {
      const auto parts = forward_all(**model, t, tokens, chunk);
      ASSERT_EQ(parts.size(), whole.size());
      EXPECT_EQ(std::memcmp(parts.data(), whole.data(), whole.size() * 4), 0) << kv_type_name(t) << " chunk " << chunk;
    }
  }
}

TEST(KvTypeForward, BlockTypesRefuseHeadDimNotAMultipleOf32) {
  auto model = Model::load(kShared + "/models/stories260K.gguf");  // head_dim 8
  ASSERT_TRUE(model.ok());
  const auto& c = (*model)->config();
  // The storage refuses rows that 32-blocks do not tile (kv_dim 32 would fit).
  auto kv = KvStorage::create({(int32_t)c.n_layers, (int32_t)c.kv_dim(), 16, KvType::q8_0}, 2);
  ASSERT_TRUE(kv.ok()) << "kv_dim " << c.kv_dim();
  BatchForward bf(**model, *kv, nullptr);
  std::vector<BlockId> table{0};
  Batch b;
  b.tokens = {1};
  b.seqs.push_back({0, 1, table, true});
  std::vector<float> logits;
  const Status st = bf.forward(b, &logits);
  EXPECT_EQ(st.code(), StatusCode::invalid_argument);
  EXPECT_NE(st.message().find("multiple of 32"), std::string::npos) << st.message();
}
