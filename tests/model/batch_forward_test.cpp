// The batched paged forward against the reference forward, and its batch invariance.
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <cstring>

#include "model/batch_forward.h"
#include "model/reference_forward.h"

using namespace serval;

namespace {

const std::string kShared = SERVAL_SHARED_DIR;

struct Fixture {
  std::unique_ptr<Model> model;
  std::unique_ptr<KvStorage> kv;
};

Fixture make(const std::string& file, int32_t n_blocks, int32_t block_size) {
  Fixture f;
  auto m = Model::load(kShared + "/models/" + file);
  EXPECT_TRUE(m.ok()) << m.status().message();
  f.model = std::move(m.value());
  const auto& c = f.model->config();
  auto kv = KvStorage::create({(int32_t)c.n_layers, (int32_t)c.kv_dim(), block_size}, n_blocks);
  EXPECT_TRUE(kv.ok());
  f.kv = std::make_unique<KvStorage>(std::move(kv.value()));
  return f;
}

// Feeds `tokens` to one sequence in chunks of `chunk`, returning the logits
// after each of the last `n_tail` tokens' chunks (one row per chunk end).
std::vector<std::vector<float>> run_chunks(BatchForward& bf, std::span<const BlockId> table,
                                           const std::vector<TokenId>& tokens, int chunk) {
  std::vector<std::vector<float>> out;
  for (size_t pos = 0; pos < tokens.size(); pos += (size_t)chunk) {
    const int32_t len = (int32_t)std::min<size_t>((size_t)chunk, tokens.size() - pos);
    Batch b;
    b.tokens.assign(tokens.begin() + (long)pos, tokens.begin() + (long)pos + len);
    b.seqs.push_back({(int64_t)pos, len, table, true});
    std::vector<float> logits;
    EXPECT_TRUE(bf.forward(b, &logits).ok());
    out.push_back(logits);
  }
  return out;
}

}  // namespace

// Against the reference forward (F32 activations, double accumulation). For
// F32 weights the fast path also keeps activations in F32, so logits agree to
// rounding; for quantized weights the fast kernels quantize activations to
// 8-bit blocks as llama.cpp does, so the comparison is on the top-5
// log-probabilities with the foundation issue's bounds for quantized formats.
TEST(BatchForward, MatchesReferenceForward) {
  for (const char* file :
       {"stories260K.gguf", "mini/mini-qwen2-Q4_K_M.gguf", "mini/mini-llama-Q6_K.gguf", "mini/mini-llama-F16.gguf"}) {
    Fixture f = make(file, 8, 16);
    BatchForward bf(*f.model, *f.kv, nullptr);
    ReferenceForward ref(*f.model, 128);
    std::vector<TokenId> toks = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426,
                                 338, 401, 396, 267, 337};
    std::vector<BlockId> table = {5, 2};  // deliberately not 0, 1
    auto got = run_chunks(bf, table, toks, 1);
    std::vector<float> want((size_t)f.model->config().n_vocab);
    double max_logit = 0, max_lp = 0, sum_lp = 0;
    int64_t n_lp = 0;
    auto log_softmax = [](const std::vector<float>& l) {
      double mx = *std::max_element(l.begin(), l.end()), sum = 0;
      for (float x : l) sum += std::exp((double)x - mx);
      std::vector<double> o(l.size());
      for (size_t i = 0; i < l.size(); ++i) o[i] = (double)l[i] - mx - std::log(sum);
      return o;
    };
    for (size_t i = 0; i < toks.size(); ++i) {
      ASSERT_TRUE(ref.eval(toks[i], want).ok());
      for (size_t v = 0; v < want.size(); ++v) max_logit = std::max(max_logit, (double)std::fabs(got[i][v] - want[v]));
      const auto a = log_softmax(got[i]), b = log_softmax(want);
      std::vector<size_t> idx(b.size());
      for (size_t k = 0; k < idx.size(); ++k) idx[k] = k;
      std::partial_sort(idx.begin(), idx.begin() + 5, idx.end(), [&](size_t x, size_t y) { return b[x] > b[y]; });
      for (int k = 0; k < 5; ++k) {
        const double d = std::fabs(a[idx[(size_t)k]] - b[idx[(size_t)k]]);
        max_lp = std::max(max_lp, d);
        sum_lp += d;
        ++n_lp;
      }
    }
    // F32 and F16 weights take F32 activations: only the summation order differs.
    const DType wt = f.model->weights().layers[0].wq.type;
    const bool f32 = wt == DType::f32 || wt == DType::f16;
    std::printf("%-32s max |d logit| %.2e  top-5 |d logprob| mean %.4f max %.4f\n", file, max_logit,
                sum_lp / (double)n_lp, max_lp);
    if (f32) {
      EXPECT_LT(max_logit, 2e-3) << file;
    } else {
      EXPECT_LT(sum_lp / (double)n_lp, 0.08) << file;
      EXPECT_LT(max_lp, 0.4) << file;
    }
  }
}

// The same sequence, alone token by token, in prefill chunks of 7, and batched
// with two other sequences: bit-identical logits.
TEST(BatchForward, BatchInvariantBitForBit) {
  Fixture f = make("stories260K.gguf", 16, 4);
  ThreadPool pool(2);
  BatchForward bf(*f.model, *f.kv, &pool);
  const std::vector<TokenId> a = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421};
  const std::vector<TokenId> other1 = {1, 300, 301, 302, 303, 304, 305, 306, 307};
  const std::vector<TokenId> other2 = {1, 50, 60};
  std::vector<BlockId> ta = {0, 1, 2, 3}, t1 = {4, 5, 6}, t2 = {7};
  auto alone = run_chunks(bf, ta, a, 1);
  auto chunked = run_chunks(bf, ta, a, 7);
  ASSERT_EQ(chunked.size(), 2u);
  EXPECT_EQ(std::memcmp(chunked[0].data(), alone[6].data(), alone[6].size() * 4), 0);
  EXPECT_EQ(std::memcmp(chunked[1].data(), alone.back().data(), alone.back().size() * 4), 0);

  // Mixed batch: other1 prefill (9 tokens), a's first 12 tokens in one chunk, other2 (3).
  Batch b;
  b.tokens.insert(b.tokens.end(), other1.begin(), other1.end());
  b.tokens.insert(b.tokens.end(), a.begin(), a.end() - 1);
  b.tokens.insert(b.tokens.end(), other2.begin(), other2.end());
  b.seqs.push_back({0, (int32_t)other1.size(), t1, true});
  b.seqs.push_back({0, (int32_t)a.size() - 1, ta, true});
  b.seqs.push_back({0, (int32_t)other2.size(), t2, false});
  std::vector<float> logits;
  ASSERT_TRUE(bf.forward(b, &logits).ok());
  const size_t nv = alone[0].size();
  ASSERT_EQ(logits.size(), 2 * nv);
  EXPECT_EQ(std::memcmp(logits.data() + nv, alone[a.size() - 2].data(), nv * 4), 0);
  // Then a's last token as a decode next to a decode of other2.
  Batch d;
  d.tokens = {a.back(), 99};
  d.seqs.push_back({(int64_t)a.size() - 1, 1, ta, true});
  d.seqs.push_back({3, 1, t2, true});
  ASSERT_TRUE(bf.forward(d, &logits).ok());
  EXPECT_EQ(std::memcmp(logits.data(), alone.back().data(), nv * 4), 0);
}

TEST(BatchForward, RejectsBadBatches) {
  Fixture f = make("stories260K.gguf", 4, 4);
  BatchForward bf(*f.model, *f.kv, nullptr);
  std::vector<BlockId> table = {0};
  std::vector<float> logits;
  Batch b;
  b.tokens = {1, 2, 3, 4, 5};
  b.seqs.push_back({0, 5, table, true});  // 5 positions, table holds 4
  EXPECT_FALSE(bf.forward(b, &logits).ok());
  b.tokens = {1, 512};
  b.seqs = {{0, 2, table, true}};
  EXPECT_FALSE(bf.forward(b, &logits).ok());
  std::vector<BlockId> bad = {9};
  b.tokens = {1};
  b.seqs = {{0, 1, bad, true}};
  EXPECT_FALSE(bf.forward(b, &logits).ok());
}
