// The reference forward pass against llama.cpp's golden outputs (../shared/golden).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/model.h"
#include "model/reference_forward.h"

using namespace serval;
using json = nlohmann::json;

namespace {

const std::string kShared = SERVAL_SHARED_DIR;

json load_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return json::parse(in);
}

std::vector<double> log_softmax(const std::vector<float>& logits) {
  double mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) sum += std::exp((double)l - mx);
  const double lse = mx + std::log(sum);
  std::vector<double> out(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) out[i] = (double)logits[i] - lse;
  return out;
}

int32_t argmax(const std::vector<float>& v) {
  return (int32_t)(std::max_element(v.begin(), v.end()) - v.begin());
}

struct Diff {
  double sum = 0, max = 0;
  int64_t n = 0;
  void add(double d) { sum += d; max = std::max(max, d); ++n; }
  double mean() const { return n ? sum / (double)n : 0; }
};

}  // namespace

// Greedy generation of 200 tokens reproduces llama.cpp exactly, and every step's
// top-5 log-probabilities are within 1e-3 (the golden used an F32 KV cache).
TEST(ReferenceForward, Stories260KGreedyMatchesLlamaCpp) {
  auto model = Model::load(kShared + "/models/stories260K.gguf");
  ASSERT_TRUE(model.ok()) << model.status().message();
  const json golden = load_json(kShared + "/golden/stories260K-greedy.json");
  Diff diff;
  for (const auto& c : golden["cases"]) {
    ReferenceForward fwd(**model, 512);
    std::vector<float> logits((size_t)(*model)->config().n_vocab);
    const auto prompt = c["prompt_tokens"].get<std::vector<int32_t>>();
    for (size_t i = 0; i < prompt.size(); ++i) {
      ASSERT_TRUE(fwd.eval(prompt[i], i + 1 == prompt.size() ? std::span<float>(logits) : std::span<float>()).ok());
    }
    const auto expected = c["greedy_tokens"].get<std::vector<int32_t>>();
    std::vector<int32_t> got;
    for (size_t step = 0; step < expected.size(); ++step) {
      const auto lp = log_softmax(logits);
      for (const auto& e : c["top5_logprobs"][step]) {
        const double d = std::fabs(lp[e["id"].get<size_t>()] - e["logprob"].get<double>());
        diff.add(d);
        EXPECT_LT(d, 1e-3) << c["prompt"] << " step " << step << " id " << e["id"];
      }
      const int32_t tok = argmax(logits);
      got.push_back(tok);
      ASSERT_TRUE(fwd.eval(tok, logits).ok());
    }
    EXPECT_EQ(got, expected) << c["prompt"];
  }
  std::printf("stories260K top-5 |d logprob|: mean %.2e max %.2e over %lld values\n", diff.mean(), diff.max,
              (long long)diff.n);
}

// Teacher forcing on every mini model and prompt of `golden_file`: our
// log-probabilities of llama.cpp's top-5 candidates, within bound(file) =
// {mean, max}.
void teacher_force_mini(const std::string& golden_file, size_t min_files,
                        std::pair<double, double> (*bound)(const std::string& file)) {
  const json golden = load_json(kShared + "/golden/" + golden_file);
  ASSERT_GE(golden.size(), min_files);
  for (const auto& [file, cases] : golden.items()) {
    auto model = Model::load(kShared + "/models/mini/" + file);
    ASSERT_TRUE(model.ok()) << file << ": " << model.status().message();
    Diff diff;
    int greedy_agree = 0, greedy_total = 0;
    for (const auto& c : cases) {
      ReferenceForward fwd(**model, 256);
      std::vector<float> logits((size_t)(*model)->config().n_vocab);
      const auto prompt = c["prompt_tokens"].get<std::vector<int32_t>>();
      for (size_t i = 0; i < prompt.size(); ++i)
        ASSERT_TRUE(fwd.eval(prompt[i], i + 1 == prompt.size() ? std::span<float>(logits) : std::span<float>()).ok());
      const auto forced = c["greedy_tokens"].get<std::vector<int32_t>>();
      for (size_t step = 0; step < forced.size(); ++step) {
        const auto lp = log_softmax(logits);
        for (const auto& e : c["top5_logprobs"][step])
          diff.add(std::fabs(lp[e["id"].get<size_t>()] - e["logprob"].get<double>()));
        greedy_agree += argmax(logits) == forced[step];
        ++greedy_total;
        ASSERT_TRUE(fwd.eval(forced[step], logits).ok());
      }
    }
    std::printf("%-24s mean |d logprob| %.4f  max %.4f  greedy agreement %d/%d\n", file.c_str(), diff.mean(),
                diff.max, greedy_agree, greedy_total);
    const auto [mean_bound, max_bound] = bound(file);
    EXPECT_LE(diff.mean(), mean_bound) << file;
    EXPECT_LE(diff.max, max_bound) << file;
  }
}

TEST(ReferenceForward, MiniFormatsTeacherForcedMatchLlamaCpp) {
  teacher_force_mini("mini-formats.json", 10, [](const std::string& file) {
    return file.find("F16") != std::string::npos ? std::pair{0.005, 0.03} : std::pair{0.08, 0.4};
  });
}

// The importance-matrix IQ/TQ/Q3_K files: 3-bit and wider within 0.08 / 0.4,
// the 1- and 2-bit and ternary types within 0.15 / 0.8.
TEST(ReferenceForward, MiniIqFormatsTeacherForcedMatchLlamaCpp) {
  teacher_force_mini("mini-formats-iq.json", 12, [](const std::string& file) {
    const bool low_bit = file.find("IQ1") != std::string::npos || file.find("IQ2") != std::string::npos ||
                         file.find("TQ") != std::string::npos;
    return low_bit ? std::pair{0.15, 0.8} : std::pair{0.08, 0.4};
  });
}

TEST(ReferenceForward, RejectsOutOfRangeTokensAndFullContext) {
  auto model = Model::load(kShared + "/models/stories260K.gguf");
  ASSERT_TRUE(model.ok());
  ReferenceForward fwd(**model, 2);
  EXPECT_EQ(fwd.eval(-1, {}).code(), StatusCode::invalid_argument);
  EXPECT_EQ(fwd.eval(512, {}).code(), StatusCode::invalid_argument);
  EXPECT_TRUE(fwd.eval(1, {}).ok());
  EXPECT_TRUE(fwd.eval(2, {}).ok());
  EXPECT_EQ(fwd.eval(3, {}).code(), StatusCode::resource_exhausted);
  fwd.truncate(1);
  EXPECT_TRUE(fwd.eval(3, {}).ok());
}
