// The batched forward (the SIMD kernels, 8-bit activations for the quantized
// formats) on every mini model of ../shared/golden/mini-formats.json, at every
// SIMD level this CPU runs, teacher-forced on llama.cpp's greedy continuations:
// log-probabilities of llama.cpp's top-5 candidates stay within the kernels
// issue's bounds (F16: mean 0.005, max 0.03; quantized: mean 0.08, max 0.4).
// reference_forward_test checks the same bounds on the scalar reference path.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "kernels/isa_levels.h"
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

// The logits of every position of `tokens`, run as one prefill of one sequence.
std::vector<float> forward_all(const Model& m, const std::vector<TokenId>& tokens) {
  const auto& c = m.config();
  const int32_t bs = 16, nb = (int32_t)(tokens.size() + bs - 1) / bs;
  auto kv = KvStorage::create({(int32_t)c.n_layers, (int32_t)c.kv_dim(), bs, KvType::f32}, nb + 1);
  EXPECT_TRUE(kv.ok());
  std::vector<BlockId> table((size_t)nb);
  std::iota(table.begin(), table.end(), 1);
  BatchForward bf(m, *kv, nullptr);
  Batch b;
  b.tokens = tokens;
  b.seqs.push_back({0, (int32_t)tokens.size(), table, true, (int32_t)tokens.size()});
  std::vector<float> logits;
  EXPECT_TRUE(bf.forward(b, &logits).ok());
  return logits;
}

}  // namespace

TEST(FormatsForward, EverySimdLevelTeacherForcedMatchesLlamaCpp) {
  std::ifstream in(kShared + "/golden/mini-formats.json");
  const auto golden = nlohmann::json::parse(in);
  ASSERT_GE(golden.size(), 10u);
  auto levels = test::available_isa_levels();
  levels.erase(levels.begin());  // ref: reference_forward_test
  if (levels.empty()) GTEST_SKIP() << "no SIMD level on this CPU";
  test::IsaGuard guard;
  for (Isa isa : levels) {
    ASSERT_EQ(kernels::set_isa(isa), isa);
    for (const auto& [file, cases] : golden.items()) {
      auto model = Model::load(kShared + "/models/mini/" + file);
      ASSERT_TRUE(model.ok()) << file << ": " << model.status().message();
      const int64_t n_vocab = (*model)->config().n_vocab;
      double sum = 0, mx = 0;
      int64_t n = 0;
      int agree = 0, total = 0;
      for (const auto& c : cases) {
        auto tokens = c["prompt_tokens"].get<std::vector<TokenId>>();
        const auto forced = c["greedy_tokens"].get<std::vector<TokenId>>();
        const size_t n_prompt = tokens.size();
        tokens.insert(tokens.end(), forced.begin(), forced.end() - 1);
        const auto logits = forward_all(**model, tokens);
        ASSERT_EQ(logits.size(), tokens.size() * (size_t)n_vocab);
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
      ASSERT_GT(n, 0) << file;
      const double mean = sum / (double)n;
      std::printf("%-10s %-24s mean |d logprob| %.4f  max %.4f  greedy agreement %d/%d\n", isa_name(isa),
                  file.c_str(), mean, mx, agree, total);
      const bool is_f16 = file.find("F16") != std::string::npos;
      EXPECT_LE(mean, is_f16 ? 0.005 : 0.08) << file << " at " << isa_name(isa);
      EXPECT_LE(mx, is_f16 ? 0.03 : 0.4) << file << " at " << isa_name(isa);
    }
  }
}
