// IQ4_XS end to end (no llama.cpp IQ4_XS file is in ../shared): serval
// quantize makes IQ4_XS and IQ4_NL files from mini-llama F16, and the batched
// forward on each, at every level this CPU runs, is teacher-forced on
// llama.cpp's continuations of the F16 model (../shared/golden/mini-formats.json).
// 4-bit weights move this random-weight model's log-probabilities a lot
// (measured mean |d logprob| 0.82 for IQ4_XS, 0.80 for IQ4_NL, 0.06 for
// Q8_0), so the check is relative: IQ4_XS, the same codebook with 6-bit
// sub-block scales, stays within 1.2x (mean) and 1.5x (max) of IQ4_NL's error;
// a wrong scale, nibble or codebook entry gives several times more.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <unistd.h>

#include "kernels/isa_levels.h"
#include "model/batch_forward.h"
#include "quantize/quant_policy.h"
#include "quantize/quantize_model.h"

namespace serval::quant {
namespace {

const std::string kShared = SERVAL_SHARED_DIR;

// Mean and max |our log-prob - llama.cpp's| over the top-5 candidates of every
// forced step, one prefill per golden case.
std::pair<double, double> teacher_forced_error(const Model& m, const nlohmann::json& cases) {
  const int64_t n_vocab = m.config().n_vocab;
  double sum = 0, mx = 0;
  int64_t n = 0;
  for (const auto& c : cases) {
    auto tokens = c["prompt_tokens"].get<std::vector<TokenId>>();
    const auto forced = c["greedy_tokens"].get<std::vector<TokenId>>();
    const size_t n_prompt = tokens.size();
    tokens.insert(tokens.end(), forced.begin(), forced.end() - 1);
    const int32_t bs = 16, nb = (int32_t)(tokens.size() + bs - 1) / bs;
    auto kv = KvStorage::create({(int32_t)m.config().n_layers, (int32_t)m.config().kv_dim(), bs, KvType::f32}, nb);
    EXPECT_TRUE(kv.ok());
    std::vector<BlockId> table((size_t)nb);
    std::iota(table.begin(), table.end(), 0);
    BatchForward bf(m, *kv, nullptr);
    Batch b;
    b.tokens = tokens;
    b.seqs.push_back({0, (int32_t)tokens.size(), table, true, (int32_t)tokens.size()});
    std::vector<float> logits;
    EXPECT_TRUE(bf.forward(b, &logits).ok());
    for (size_t step = 0; step < forced.size(); ++step) {
      const float* l = logits.data() + (n_prompt - 1 + step) * (size_t)n_vocab;
      double lmax = -INFINITY, z = 0;
      for (int64_t i = 0; i < n_vocab; ++i) lmax = std::max(lmax, (double)l[i]);
      for (int64_t i = 0; i < n_vocab; ++i) z += std::exp((double)l[i] - lmax);
      for (const auto& e : c["top5_logprobs"][step]) {
        const double lp = (double)l[e["id"].get<size_t>()] - lmax - std::log(z);
        const double d = std::fabs(lp - e["logprob"].get<double>());
        sum += d;
        mx = std::max(mx, d);
        ++n;
      }
    }
  }
  return {n ? sum / (double)n : INFINITY, mx};
}

}  // namespace

TEST(Iq4Xs, QuantizedMiniModelTracksLlamaCppLikeIq4Nl) {
  const std::string src = kShared + "/models/mini/mini-llama-F16.gguf";
  std::ifstream in(kShared + "/golden/mini-formats.json");
  const auto golden = nlohmann::json::parse(in);
  std::map<std::string, std::string> path;
  for (const char* ft : {"IQ4_XS", "IQ4_NL"}) {
    path[ft] = ::testing::TempDir() + "/serval_" + ft + "_" + std::to_string(getpid()) + ".gguf";
    QuantizeOptions opt;
    opt.file_type = *find_file_type(ft);
    auto q = quantize_model(src, path[ft], opt);
    ASSERT_TRUE(q.ok()) << q.status().message();
  }
  test::IsaGuard guard;
  for (Isa isa : test::available_isa_levels()) {
    ASSERT_EQ(kernels::set_isa(isa), isa);
    std::map<std::string, std::pair<double, double>> err;
    for (const auto& [ft, p] : path) {
      auto model = Model::load(p);
      ASSERT_TRUE(model.ok()) << model.status().message();
      err[ft] = teacher_forced_error(**model, golden["mini-llama-F16.gguf"]);
      std::printf("%-10s %s (serval quantize) vs llama.cpp F16: mean |d logprob| %.4f  max %.4f\n", isa_name(isa),
                  ft.c_str(), err[ft].first, err[ft].second);
    }
    EXPECT_LE(err["IQ4_XS"].first, 1.2 * err["IQ4_NL"].first) << isa_name(isa);
    EXPECT_LE(err["IQ4_XS"].second, 1.5 * err["IQ4_NL"].second) << isa_name(isa);
  }
  for (const auto& [ft, p] : path) std::remove(p.c_str());
}

}  // namespace serval::quant
