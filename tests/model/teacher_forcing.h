// Test helpers shared by the tests that teacher-force the batched forward on
// llama.cpp's goldens (../shared/golden/mini-formats.json): the logits of
// every position of one sequence, and the log-probability error against a
// golden's top-5 candidates. Header-only; used from tests/model and
// tests/quantize.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <numeric>
#include <vector>

#include "model/batch_forward.h"

namespace serval::test {

// Runs `tokens` through one sequence (KV element type `type`) in prefill chunks
// of `chunk` tokens; returns the logits of every position, [tokens.size(), n_vocab].
// The block table is not the identity, so paging is exercised.
inline std::vector<float> forward_all(const Model& m, KvType type, const std::vector<TokenId>& tokens, int chunk) {
  const auto& c = m.config();
  const int32_t bs = 16, nb = (int32_t)(tokens.size() + bs - 1) / bs;
  auto kv = KvStorage::create({(int32_t)c.n_layers, (int32_t)c.kv_dim(), bs, type}, nb + 1);
  EXPECT_TRUE(kv.ok());
  std::vector<BlockId> table((size_t)nb);
  std::iota(table.rbegin(), table.rend(), 1);
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

struct TeacherForced {
  double mean = 0, max = 0;  // |our log-prob - llama.cpp's| over the top-5 candidates of every step
  int agree = 0, total = 0;  // steps where our argmax is llama.cpp's greedy token
  int gap_steps = 0, gap_agree = 0;  // the same, over the steps whose golden top-2 gap exceeds 0.01
};

// Every golden case (`cases`: prompt_tokens, greedy_tokens, top5_logprobs per
// step), prompt plus forced continuation given to logits_of(tokens), which
// returns the logits of every position, [tokens.size(), n_vocab].
template <class LogitsOf>
TeacherForced teacher_forced_by(const nlohmann::json& cases, int64_t n_vocab, LogitsOf&& logits_of) {
  TeacherForced r;
  double sum = 0;
  int64_t n = 0;
  for (const auto& c : cases) {
    auto tokens = c["prompt_tokens"].get<std::vector<TokenId>>();
    const auto forced = c["greedy_tokens"].get<std::vector<TokenId>>();
    const size_t n_prompt = tokens.size();
    tokens.insert(tokens.end(), forced.begin(), forced.end() - 1);
    const std::vector<float> logits = logits_of(tokens);
    EXPECT_EQ(logits.size(), tokens.size() * (size_t)n_vocab);
    if (logits.size() != tokens.size() * (size_t)n_vocab) return {INFINITY, INFINITY, 0, 1, 1, 0};
    for (size_t step = 0; step < forced.size(); ++step) {
      const float* l = logits.data() + (n_prompt - 1 + step) * (size_t)n_vocab;
      double lmax = -INFINITY, z = 0;
      for (int64_t i = 0; i < n_vocab; ++i) lmax = std::max(lmax, (double)l[i]);
      for (int64_t i = 0; i < n_vocab; ++i) z += std::exp((double)l[i] - lmax);
      const auto& top = c["top5_logprobs"][step];
      for (const auto& e : top) {
        const double lp = (double)l[e["id"].get<size_t>()] - lmax - std::log(z);
        const double d = std::fabs(lp - e["logprob"].get<double>());
        sum += d;
        r.max = std::max(r.max, d);
        ++n;
      }
      const bool agree = std::max_element(l, l + n_vocab) - l == forced[step];
      r.agree += agree;
      ++r.total;
      if (top.size() >= 2 && top[0]["logprob"].get<double>() - top[1]["logprob"].get<double>() > 0.01) {
        ++r.gap_steps;
        r.gap_agree += agree;
      }
    }
  }
  r.mean = n ? sum / (double)n : INFINITY;
  return r;
}

// Every golden case of one model (`cases`: its array in mini-formats.json),
// prompt plus forced continuation run as one prefill.
inline TeacherForced teacher_forced(const Model& m, KvType type, const nlohmann::json& cases) {
  return teacher_forced_by(cases, m.config().n_vocab, [&](const std::vector<TokenId>& tokens) {
    return forward_all(m, type, tokens, (int)tokens.size());
  });
}

}  // namespace serval::test
