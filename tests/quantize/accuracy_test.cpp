// The accuracy tools on stories260K (a real tiny Llama): perplexity against a
// slow token-by-token reference computation, KL divergence of quantized files
// against the F32 original over a text the original generated, and the
// importance matrix against sums of squares taken directly from the reference
// forward's matrix inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <unistd.h>

#include "model/model.h"
#include "model/reference_forward.h"
#include "quantize/imatrix.h"
#include "quantize/perplexity.h"
#include "quantize/quantize_model.h"

namespace serval::quant {
namespace {

const std::string kStories = std::string(SERVAL_SHARED_DIR) + "/models/stories260K.gguf";
constexpr int32_t kCtx = 128;
constexpr int32_t kChunks = 4;

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "/serval_acc_" + std::to_string(getpid()) + "_" + name;
}

std::unique_ptr<Model> load(const std::string& path) {
  auto m = Model::load(path);
  EXPECT_TRUE(m.ok()) << path << ": " << m.status().message();
  return m.ok() ? std::move(m.value()) : nullptr;
}

// log-softmax in double.
std::vector<double> log_softmax(const std::vector<float>& x) {
  double mx = x[0];
  for (float v : x) mx = std::max(mx, (double)v);
  double s = 0;
  for (float v : x) s += std::exp(v - mx);
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = x[i] - mx - std::log(s);
  return out;
}

// A text the F32 model wrote: kChunks * kCtx tokens sampled at temperature 1
// (seeded), restarting from BOS at every chunk so each stays within context.
const std::vector<int32_t>& story_tokens() {
  static const std::vector<int32_t> tokens = [] {
    auto m = load(kStories);
    std::vector<int32_t> t;
    std::mt19937_64 rng(2026);
    std::vector<float> logits((size_t)m->config().n_vocab);
    for (int c = 0; c < kChunks; ++c) {
      ReferenceForward fwd(*m, kCtx);
      int32_t tok = 1;  // BOS
      for (int i = 0; i < kCtx; ++i) {
        t.push_back(tok);
        EXPECT_TRUE(fwd.eval(tok, logits).ok());
        const auto lp = log_softmax(logits);
        std::vector<double> p(lp.size());
        for (size_t v = 0; v < lp.size(); ++v) p[v] = std::exp(lp[v]);
        tok = (int32_t)std::discrete_distribution<int32_t>(p.begin(), p.end())(rng);
      }
    }
    return t;
  }();
  return tokens;
}

EvalOptions options() {
  EvalOptions o;
  o.n_ctx = kCtx;
  return o;
}

// Perplexity over the chunks equals exp(mean NLL) computed token by token with
// the reference forward, scoring the second half of each chunk.
TEST(Perplexity, MatchesTheTokenByTokenReference) {
  auto m = load(kStories);
  auto chunked = chunk_tokens(story_tokens(), *m, options());
  ASSERT_TRUE(chunked.ok());
  ASSERT_EQ(chunked->size(), (size_t)(kChunks * kCtx));
  auto r = perplexity(*m, *chunked, options());
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->n_chunks, kChunks);
  EXPECT_EQ(r->n_scored, kChunks * (kCtx - 1 - kCtx / 2));

  double nll = 0;
  int64_t n = 0;
  std::vector<float> logits((size_t)m->config().n_vocab);
  for (int c = 0; c < kChunks; ++c) {
    ReferenceForward fwd(*m, kCtx);
    const int32_t* toks = chunked->data() + c * kCtx;
    for (int j = 0; j < kCtx - 1; ++j) {
      ASSERT_TRUE(fwd.eval(toks[j], logits).ok());
      if (j < kCtx / 2) continue;
      nll -= log_softmax(logits)[(size_t)toks[j + 1]];
      ++n;
    }
  }
  const double ppl = std::exp(nll / (double)n);
  EXPECT_NEAR(r->ppl, ppl, 1e-3 * ppl);
  EXPECT_GT(r->ppl_err, 0.0);
  EXPECT_LT(r->ppl, 20.0) << "a model scoring its own text must find it likely";

  // Too few tokens for one chunk, and a context beyond the model's, are refused.
  EXPECT_FALSE(chunk_tokens(std::vector<int32_t>(kCtx - 1, 5), *m, options()).ok());
  EvalOptions big = options();
  big.n_ctx = 1 << 20;
  EXPECT_FALSE(chunk_tokens(story_tokens(), *m, big).ok());
}

struct Kl {
  KlResult r;
  bool ok = false;
};

Kl kl_of(const std::string& model_path, const std::string& base) {
  auto m = load(model_path);
  Kl k;
  if (!m) return k;
  auto r = kl_divergence(*m, base, options(), *chunk_tokens(story_tokens(), *m, options()));
  EXPECT_TRUE(r.ok()) << r.status().message();
  if (r.ok()) k = {*r, true};
  return k;
}

// Q8_0 keeps >= 95 % top-1 agreement with the F32 original over its own text;
// Q4_0 and Q4_K_M (on this model: Q5_0 / Q8_0 by the row-length fallback)
// agree less and diverge more, as fewer bits must.
TEST(KlDivergence, QuantizedStoriesAgainstF32) {
  auto m = load(kStories);
  const std::string base = temp_path("base.kl");
  auto chunked = chunk_tokens(story_tokens(), *m, options());
  auto p = perplexity(*m, *chunked, options(), base);
  ASSERT_TRUE(p.ok()) << p.status().message();

  // Against itself: no divergence, full agreement.
  Kl self = kl_of(kStories, base);
  ASSERT_TRUE(self.ok);
  EXPECT_LT(self.r.kl_mean, 1e-6);
  EXPECT_EQ(self.r.top1, 1.0);
  EXPECT_NEAR(self.r.ppl_ratio, 1.0, 1e-4);
  EXPECT_NEAR(self.r.base_ppl, p->ppl, 1e-3 * p->ppl);

  std::map<std::string, Kl> res;
  for (const char* ft : {"Q8_0", "Q4_0", "Q4_K_M"}) {
    const std::string path = temp_path(std::string(ft) + ".gguf");
    QuantizeOptions opt;
    opt.file_type = *find_file_type(ft);
    auto q = quantize_model(kStories, path, opt);
    ASSERT_TRUE(q.ok()) << q.status().message();
    // Q8_0: the five ffn_down (rows of 172) stay F32; Q4_0: also output.weight
    // (Q6_K -> Q8_0); Q4_K_M: every matrix but output.weight (Q8_0 by its own rule).
    const std::map<std::string, size_t> fallbacks = {{"Q8_0", 5}, {"Q4_0", 6}, {"Q4_K_M", 36}};
    EXPECT_EQ(q->n_fallback, fallbacks.at(ft)) << ft;
    res[ft] = kl_of(path, base);
    ASSERT_TRUE(res[ft].ok);
    std::printf("  %-7s KL %.6f  top-1 %.4f  PPL ratio %.4f\n", ft, res[ft].r.kl_mean, res[ft].r.top1,
                res[ft].r.ppl_ratio);
    std::remove(path.c_str());
  }
  EXPECT_GE(res["Q8_0"].r.top1, 0.95);
  EXPECT_GT(res["Q8_0"].r.kl_mean, 0.0);
  for (const char* low : {"Q4_0", "Q4_K_M"}) {
    EXPECT_LT(res[low].r.top1, res["Q8_0"].r.top1) << low;
    EXPECT_GT(res[low].r.kl_mean, res["Q8_0"].r.kl_mean) << low;
  }

  // Another text's tokens, and another model's vocab, are refused.
  std::vector<int32_t> other = *chunked;
  other[5] = (other[5] + 1) % 512;
  EXPECT_FALSE(kl_divergence(*m, base, options(), other).ok());
  // Truncated or forged files are refused before anything is read past the header.
  std::ifstream in(base, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string bad = temp_path("bad.kl");
  std::ofstream(bad, std::ios::binary).write(bytes.data(), (std::streamsize)(bytes.size() / 2));
  EXPECT_FALSE(kl_divergence(*m, bad, options()).ok());
  std::string forged = bytes;
  const uint32_t huge = 0xFFFFFFF0u;
  std::memcpy(forged.data() + 16, &huge, 4);  // n_chunks
  std::ofstream(bad, std::ios::binary | std::ios::trunc).write(forged.data(), (std::streamsize)forged.size());
  EXPECT_FALSE(kl_divergence(*m, bad, options()).ok());
  std::remove(bad.c_str());
  std::remove(base.c_str());
}

// The imatrix collected from the batched forward equals sums of squares of the
// matrix inputs the reference forward sees (token by token), tensor by tensor.
TEST(Imatrix, EqualsSumsOfSquaresOfTheReferenceInputs) {
  auto m = load(kStories);
  EvalOptions o = options();
  o.max_chunks = 2;
  auto chunked = chunk_tokens(story_tokens(), *m, o);
  ASSERT_TRUE(chunked.ok());
  ImatrixCollector col(*m);
  ASSERT_TRUE(perplexity(*m, *chunked, o, "", &col).ok());
  const Imatrix im = col.result("story");
  EXPECT_EQ(im.last_call, 2);

  // Slow side: the reference forward, its inputs summed here.
  std::map<const Matrix*, std::vector<double>> sums;
  MatmulObserver obs = [&](const Matrix& mat, const float* in, int64_t rows) {
    auto& s = sums[&mat];
    s.resize((size_t)mat.cols);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < mat.cols; ++j) s[(size_t)j] += (double)in[r * mat.cols + j] * in[r * mat.cols + j];
  };
  std::vector<float> logits((size_t)m->config().n_vocab);
  for (int c = 0; c < 2; ++c) {
    ReferenceForward fwd(*m, kCtx);
    fwd.set_observer(&obs);
    for (int j = 0; j < kCtx; ++j) ASSERT_TRUE(fwd.eval((*chunked)[(size_t)(c * kCtx + j)], {}).ok());
  }
  const ModelWeights& w = m->weights();
  ASSERT_EQ(im.entries.size(), w.layers.size() * 7);
  for (size_t il = 0; il < w.layers.size(); ++il) {
    const LayerWeights& l = w.layers[il];
    const std::pair<const Matrix*, const char*> mats[] = {
        {&l.wq, "attn_q"}, {&l.wk, "attn_k"}, {&l.wv, "attn_v"}, {&l.wo, "attn_output"},
        {&l.w_gate, "ffn_gate"}, {&l.w_up, "ffn_up"}, {&l.w_down, "ffn_down"}};
    for (const auto& [mat, name] : mats) {
      const std::string key = "blk." + std::to_string(il) + "." + name + ".weight";
      ASSERT_TRUE(im.entries.count(key)) << key;
      const ImatrixEntry& e = im.entries.at(key);
      EXPECT_EQ(e.ncall, 2);
      const auto& want = sums[mat];
      ASSERT_EQ(e.values.size(), want.size()) << key;
      for (size_t j = 0; j < want.size(); ++j)
        ASSERT_NEAR(e.values[j], want[j], 1e-3 * want[j] + 1e-6) << key << " column " << j;
    }
  }
}

}  // namespace
}  // namespace serval::quant
