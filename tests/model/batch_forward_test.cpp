// The batched paged forward against the reference forward, and its batch invariance.
#include <gtest/gtest.h>

#include <cmath>
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

TEST(BatchForward, MatchesReferenceForward) {
  for (const char* file : {"stories260K.gguf", "mini/mini-qwen2-Q4_K_M.gguf", "mini/mini-llama-Q6_K.gguf"}) {
    Fixture f = make(file, 8, 16);
    BatchForward bf(*f.model, *f.kv, nullptr);
    ReferenceForward ref(*f.model, 128);
    std::vector<TokenId> toks = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426,
                                 338, 401, 396, 267, 337};
    std::vector<BlockId> table = {5, 2};  // deliberately not 0, 1
    auto got = run_chunks(bf, table, toks, 1);
    std::vector<float> want((size_t)f.model->config().n_vocab);
    double max_diff = 0;
    for (size_t i = 0; i < toks.size(); ++i) {
      ASSERT_TRUE(ref.eval(toks[i], want).ok());
      for (size_t v = 0; v < want.size(); ++v) max_diff = std::max(max_diff, (double)std::fabs(got[i][v] - want[v]));
    }
    EXPECT_LT(max_diff, 2e-3) << file;
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
