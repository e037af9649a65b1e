// SamplingParams::validate: defaults pass, every field is range-checked and
// its error names the field with the expected and the actual value.
#include "serval/sampling_params.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>

namespace serval {
namespace {

constexpr int32_t kVocab = 1000;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

TEST(SamplingParams, DefaultsMatchOpenAI) {
  SamplingParams p;
  EXPECT_EQ(p.temperature, 1.0f);
  EXPECT_EQ(p.top_k, 0);
  EXPECT_EQ(p.top_p, 1.0f);
  EXPECT_EQ(p.min_p, 0.0f);
  EXPECT_EQ(p.typical_p, 1.0f);
  EXPECT_EQ(p.repetition_penalty, 1.0f);
  EXPECT_EQ(p.frequency_penalty, 0.0f);
  EXPECT_EQ(p.presence_penalty, 0.0f);
  EXPECT_EQ(p.penalty_last_n, 64);
  EXPECT_TRUE(p.logit_bias.empty());
  EXPECT_FALSE(p.seed.has_value());
  EXPECT_TRUE(p.stop.empty());
  EXPECT_TRUE(p.stop_token_ids.empty());
  EXPECT_FALSE(p.max_tokens.has_value());
  EXPECT_FALSE(p.ignore_eos);
  EXPECT_EQ(p.logprobs, 0);
  EXPECT_TRUE(p.validate(kVocab).ok()) << p.validate(kVocab).message();
}

TEST(SamplingParams, BoundaryValuesAreAccepted) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.top_k = -1;
  p.top_p = 1e-6f;
  p.min_p = 1.0f;
  p.typical_p = 1.0f;
  p.repetition_penalty = 10.0f;
  p.frequency_penalty = -2.0f;
  p.presence_penalty = 2.0f;
  p.penalty_last_n = -1;
  p.logit_bias = {{0, -100.0f}, {kVocab - 1, 100.0f}};
  p.seed = 0;
  p.stop = {"x", std::string(256, 'a')};
  p.stop_token_ids = {0, kVocab - 1};
  p.max_tokens = 1;
  p.logprobs = 20;
  EXPECT_TRUE(p.validate(kVocab).ok()) << p.validate(kVocab).message();
  p.top_k = 5000;  // larger than the vocabulary: acts as off
  p.logit_bias.clear();
  for (TokenId t = 0; t < 1024; ++t) p.logit_bias.push_back({t, 1.0f});  // the maximum count
  p.stop.assign(16, "s");
  p.stop_token_ids.assign(256, 7);
  EXPECT_TRUE(p.validate(2048).ok()) << p.validate(2048).message();
}

struct BadCase {
  const char* name;
  std::function<void(SamplingParams&)> mutate;
  std::string message;  // exact
};

class ValidateRejects : public ::testing::TestWithParam<BadCase> {};

TEST_P(ValidateRejects, WithFieldNameExpectedAndActual) {
  SamplingParams p;
  GetParam().mutate(p);
  const Status st = p.validate(kVocab);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::invalid_argument);
  EXPECT_EQ(st.message(), GetParam().message);
}

INSTANTIATE_TEST_SUITE_P(
    Fields, ValidateRejects,
    ::testing::Values(
        BadCase{"temperature_negative", [](SamplingParams& p) { p.temperature = -0.5f; },
                "temperature: expected a value in [0, 100], got -0.5"},
        BadCase{"temperature_large", [](SamplingParams& p) { p.temperature = 101.0f; },
                "temperature: expected a value in [0, 100], got 101"},
        BadCase{"temperature_nan", [](SamplingParams& p) { p.temperature = kNaN; },
                "temperature: expected a value in [0, 100], got nan"},
        BadCase{"top_k", [](SamplingParams& p) { p.top_k = -2; },
                "top_k: expected -1 or 0 (off) or a positive count, got -2"},
        BadCase{"top_p_large", [](SamplingParams& p) { p.top_p = 1.5f; },
                "top_p: expected a value in (0, 1], got 1.5"},
        BadCase{"top_p_zero", [](SamplingParams& p) { p.top_p = 0.0f; },
                "top_p: expected a value in (0, 1], got 0"},
        BadCase{"top_p_nan", [](SamplingParams& p) { p.top_p = kNaN; },
                "top_p: expected a value in (0, 1], got nan"},
        BadCase{"min_p", [](SamplingParams& p) { p.min_p = -0.25f; },
                "min_p: expected a value in [0, 1], got -0.25"},
        BadCase{"typical_p", [](SamplingParams& p) { p.typical_p = 0.0f; },
                "typical_p: expected a value in (0, 1], got 0"},
        BadCase{"repetition_penalty_zero", [](SamplingParams& p) { p.repetition_penalty = 0.0f; },
                "repetition_penalty: expected a value in (0, 10], got 0"},
        BadCase{"repetition_penalty_inf",
                [](SamplingParams& p) { p.repetition_penalty = std::numeric_limits<float>::infinity(); },
                "repetition_penalty: expected a value in (0, 10], got inf"},
        BadCase{"frequency_penalty", [](SamplingParams& p) { p.frequency_penalty = 2.5f; },
                "frequency_penalty: expected a value in [-2, 2], got 2.5"},
        BadCase{"presence_penalty", [](SamplingParams& p) { p.presence_penalty = -3.0f; },
                "presence_penalty: expected a value in [-2, 2], got -3"},
        BadCase{"penalty_last_n", [](SamplingParams& p) { p.penalty_last_n = -2; },
                "penalty_last_n: expected -1 (whole history), 0 (off) or a positive count, got -2"},
        BadCase{"logit_bias_count", [](SamplingParams& p) { p.logit_bias.resize(1025); },
                "logit_bias: expected at most 1024 entries, got 1025"},
        BadCase{"logit_bias_token_high", [](SamplingParams& p) { p.logit_bias = {{1, 1.0f}, {1000, 1.0f}}; },
                "logit_bias[1].token: expected a token id in [0, 1000), got 1000"},
        BadCase{"logit_bias_token_negative", [](SamplingParams& p) { p.logit_bias = {{-1, 1.0f}}; },
                "logit_bias[0].token: expected a token id in [0, 1000), got -1"},
        BadCase{"logit_bias_value", [](SamplingParams& p) { p.logit_bias = {{5, 1.0f}, {6, -150.0f}}; },
                "logit_bias[1].bias: expected a value in [-100, 100], got -150"},
        BadCase{"logit_bias_value_nan", [](SamplingParams& p) { p.logit_bias = {{5, kNaN}}; },
                "logit_bias[0].bias: expected a value in [-100, 100], got nan"},
        BadCase{"logit_bias_duplicate", [](SamplingParams& p) { p.logit_bias = {{7, 1.0f}, {3, 1.0f}, {7, 2.0f}}; },
                "logit_bias[2].token: expected a token id not already in logit_bias[0], got 7"},
        BadCase{"stop_count", [](SamplingParams& p) { p.stop.assign(17, "x"); },
                "stop: expected at most 16 strings, got 17"},
        BadCase{"stop_empty", [](SamplingParams& p) { p.stop = {"a", ""}; },
                "stop[1]: expected a string of 1 to 256 bytes, got 0 bytes"},
        BadCase{"stop_long", [](SamplingParams& p) { p.stop = {std::string(257, 'x')}; },
                "stop[0]: expected a string of 1 to 256 bytes, got 257 bytes"},
        BadCase{"stop_token_ids_count", [](SamplingParams& p) { p.stop_token_ids.assign(257, 1); },
                "stop_token_ids: expected at most 256 entries, got 257"},
        BadCase{"stop_token_ids_range", [](SamplingParams& p) { p.stop_token_ids = {2, 5000}; },
                "stop_token_ids[1]: expected a token id in [0, 1000), got 5000"},
        BadCase{"max_tokens", [](SamplingParams& p) { p.max_tokens = 0; },
                "max_tokens: expected a value >= 1, got 0"},
        BadCase{"logprobs_high", [](SamplingParams& p) { p.logprobs = 21; },
                "logprobs: expected a value in [0, 20], got 21"},
        BadCase{"logprobs_negative", [](SamplingParams& p) { p.logprobs = -1; },
                "logprobs: expected a value in [0, 20], got -1"}),
    [](const ::testing::TestParamInfo<BadCase>& info) { return std::string(info.param.name); });

TEST(SamplingParams, RejectsNonPositiveVocabulary) {
  const Status st = SamplingParams{}.validate(0);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message(), "n_vocab: expected a positive vocabulary size, got 0");
}

}  // namespace
}  // namespace serval
