// check_token_stop: EOS, stop_token_ids, ignore_eos and max_tokens.
#include "sampler/stop_conditions.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace serval {
namespace {

struct Case {
  const char* name;
  std::vector<TokenId> stop_token_ids;
  std::optional<int32_t> max_tokens;
  bool ignore_eos;
  TokenId token;
  int32_t n_generated;
  FinishReason expected;
};

class TokenStop : public ::testing::TestWithParam<Case> {};

TEST_P(TokenStop, Decides) {
  const Case& c = GetParam();
  SamplingParams p;
  p.stop_token_ids = c.stop_token_ids;
  p.max_tokens = c.max_tokens;
  p.ignore_eos = c.ignore_eos;
  const std::vector<TokenId> eos = {2, 32007};  // e.g. </s> and <|end|>
  EXPECT_EQ(check_token_stop(p, c.token, c.n_generated, eos), c.expected);
}

INSTANTIATE_TEST_SUITE_P(
    Table, TokenStop,
    ::testing::Values(Case{"plain_token", {}, std::nullopt, false, 100, 5, FinishReason::none},
                      Case{"eos", {}, std::nullopt, false, 2, 5, FinishReason::stop},
                      Case{"second_eos_id", {}, std::nullopt, false, 32007, 1, FinishReason::stop},
                      Case{"eos_ignored", {}, std::nullopt, true, 2, 5, FinishReason::none},
                      Case{"stop_token", {9, 11}, std::nullopt, false, 11, 3, FinishReason::stop},
                      Case{"stop_token_despite_ignore_eos", {9}, std::nullopt, true, 9, 3, FinishReason::stop},
                      Case{"below_max_tokens", {}, 4, false, 100, 3, FinishReason::none},
                      Case{"at_max_tokens", {}, 4, false, 100, 4, FinishReason::length},
                      Case{"eos_at_max_tokens_is_stop", {}, 4, false, 2, 4, FinishReason::stop},
                      Case{"ignored_eos_at_max_tokens_is_length", {}, 4, true, 2, 4, FinishReason::length},
                      Case{"max_tokens_one", {}, 1, false, 100, 1, FinishReason::length}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

TEST(FinishReasonName, MatchesOpenAI) {
  EXPECT_STREQ(finish_reason_name(FinishReason::stop), "stop");
  EXPECT_STREQ(finish_reason_name(FinishReason::length), "length");
  EXPECT_STREQ(finish_reason_name(FinishReason::none), "");
}

}  // namespace
}  // namespace serval
