// The model families (model/families/) against llama.cpp: for each dense
// family file of ../shared/models/arch/, ik_llama.cpp's greedy paths and top-5
// log-probs (../shared/golden/arch.json, 40 steps, so the gemma3 file's
// 32-token sliding window is crossed) teacher-forced through the batched
// forward at every kernel level this CPU runs, in prefill and in decode
// steps, and through the reference forward: mean |d logprob| <= 0.005, max
// <= 0.03 (F16), and our argmax is the golden's greedy token wherever the
// golden's top-2 gap exceeds 0.01.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <numeric>
#include <nlohmann/json.hpp>

#include "kernels/isa_levels.h"
#include "model/reference_forward.h"
#include "model/teacher_forcing.h"

using namespace serval;

namespace {

const std::string kShared = SERVAL_SHARED_DIR;
// The mini-mixtral golden is left out: ik_llama.cpp's llama graph (August
// 2026) adds the normed FFN input instead of the residual stream after its
// MoE branch (build_llama: `add_input` on the normed tensor, the residual
// add commented out); serval runs Mixtral's real math, and matches that
// golden to 0.0003 only when made to replicate the slip. Mixtral is checked
// against the reference forward below instead.
const char* const kFiles[] = {"mini-llama3-F16.gguf", "mini-qwen3-F16.gguf",    "mini-gemma3-F16.gguf",
                              "mini-phi3-F16.gguf",   "mini-qwen3moe-F16.gguf", "mini-gpt-oss-F16.gguf"};

nlohmann::json golden() {
  std::ifstream in(kShared + "/golden/arch.json");
  return nlohmann::json::parse(in);
}

using Score = test::TeacherForced;

Score score(const nlohmann::json& cases, int64_t n_vocab,
            const std::function<std::vector<float>(const std::vector<TokenId>&)>& logits_of) {
  return test::teacher_forced_by(cases, n_vocab, logits_of);
}

void expect_close(const Score& r, const std::string& what) {
  std::printf("%-44s mean |d logprob| %.5f  max %.5f  greedy agreement %d/%d (gap > 0.01)\n", what.c_str(), r.mean,
              r.max, r.gap_agree, r.gap_steps);
  EXPECT_LE(r.mean, 0.005) << what;
  EXPECT_LE(r.max, 0.03) << what;
  EXPECT_EQ(r.gap_agree, r.gap_steps) << what;
  EXPECT_GT(r.gap_steps, r.total / 2) << what;  // most of the steps (120: three cases of 40) are decided
}

// Under the sanitizers (test::sanitized()) the memory-safety check needs each
// code path once, not every golden case at every level: the batched forward
// runs the best level only (test::forward_levels(); the scalar level alone
// took two minutes there), and the scalar reference forward (12x slower under
// ASan) scores the first golden case. The release stage runs everything.
nlohmann::json cases_to_run(const nlohmann::json& cases) {
  if (!test::sanitized() || cases.size() <= 1) return cases;
  return nlohmann::json::array({cases[0]});
}

}  // namespace

TEST(ArchForward, BatchedForwardMatchesLlamaCppAtEveryLevel) {
  const auto g = golden();
  test::IsaGuard guard;
  for (Isa isa : test::forward_levels()) {
    ASSERT_EQ(kernels::set_isa(isa), isa);
    for (const char* file : kFiles) {
      auto model = Model::load(kShared + "/models/arch/" + file);
      ASSERT_TRUE(model.ok()) << file << ": " << model.status().message();
      const Model& m = **model;
      // Whole prompt + continuation as one prefill.
      const Score pre = score(g[file], m.config().n_vocab, [&](const std::vector<TokenId>& t) {
        return test::forward_all(m, KvType::f32, t, (int)t.size());
      });
      expect_close(pre, std::string(isa_name(isa)) + " prefill " + file);
      // Chunks of 7: windows and tiles cut at every offset.
      const Score chunked = score(g[file], m.config().n_vocab, [&](const std::vector<TokenId>& t) {
        return test::forward_all(m, KvType::f32, t, 7);
      });
      expect_close(chunked, std::string(isa_name(isa)) + " chunks of 7 " + file);
    }
  }
}

TEST(ArchForward, ReferenceForwardMatchesLlamaCpp) {
  const auto g = golden();
  for (const char* file : kFiles) {
    auto model = Model::load(kShared + "/models/arch/" + file);
    ASSERT_TRUE(model.ok()) << file << ": " << model.status().message();
    const Model& m = **model;
    const int64_t nv = m.config().n_vocab;
    const Score r = score(cases_to_run(g[file]), nv, [&](const std::vector<TokenId>& t) {
      ReferenceForward fwd(m, (int64_t)t.size());
      std::vector<float> all(t.size() * (size_t)nv);
      for (size_t i = 0; i < t.size(); ++i)
        EXPECT_TRUE(fwd.eval(t[i], std::span<float>(all.data() + i * (size_t)nv, (size_t)nv)).ok());
      return all;
    });
    expect_close(r, std::string("reference ") + file);
  }
}

// Mixtral-style llama with experts: the batched forward (grouped expert
// matmul, every level) against the reference forward's log-probs over 60
// positions (softmax router, top-2, renormalized).
TEST(ArchForward, MixtralBatchedMatchesReference) {
  auto model = Model::load(kShared + "/models/arch/mini-mixtral-F16.gguf");
  ASSERT_TRUE(model.ok()) << model.status().message();
  const Model& m = **model;
  ASSERT_TRUE(m.config().block.moe);
  const int64_t nv = m.config().n_vocab;
  std::vector<TokenId> toks = {1};
  for (int i = 0; i < 59; ++i) toks.push_back((TokenId)(3 + (i * 37) % 500));
  std::vector<float> want(toks.size() * (size_t)nv);
  {
    ReferenceForward fwd(m, (int64_t)toks.size());
    for (size_t i = 0; i < toks.size(); ++i)
      ASSERT_TRUE(fwd.eval(toks[i], std::span<float>(want.data() + i * (size_t)nv, (size_t)nv)).ok());
  }
  auto logprobs = [&](const float* l) {
    std::vector<double> lp((size_t)nv);
    double mx = -INFINITY, z = 0;
    for (int64_t i = 0; i < nv; ++i) mx = std::max(mx, (double)l[i]);
    for (int64_t i = 0; i < nv; ++i) z += std::exp((double)l[i] - mx);
    for (int64_t i = 0; i < nv; ++i) lp[(size_t)i] = (double)l[i] - mx - std::log(z);
    return lp;
  };
  test::IsaGuard guard;
  for (Isa isa : test::available_isa_levels()) {
    ASSERT_EQ(kernels::set_isa(isa), isa);
    const auto got = test::forward_all(m, KvType::f32, toks, 13);
    double sum = 0, worst = 0;
    int n = 0;
    for (size_t p = 0; p < toks.size(); ++p) {
      const auto a = logprobs(got.data() + p * (size_t)nv), b = logprobs(want.data() + p * (size_t)nv);
      // the reference's top 5
      std::vector<int> idx((size_t)nv);
      std::iota(idx.begin(), idx.end(), 0);
      std::partial_sort(idx.begin(), idx.begin() + 5, idx.end(), [&](int x, int y) { return b[(size_t)x] > b[(size_t)y]; });
      for (int k = 0; k < 5; ++k) {
        const double d = std::fabs(a[(size_t)idx[(size_t)k]] - b[(size_t)idx[(size_t)k]]);
        sum += d;
        worst = std::max(worst, d);
        ++n;
      }
    }
    std::printf("%-10s mixtral batched vs reference: mean |d logprob| %.5f max %.5f\n", isa_name(isa), sum / n, worst);
    EXPECT_LE(sum / n, 0.005) << isa_name(isa);
    EXPECT_LE(worst, 0.03) << isa_name(isa);
  }
}
