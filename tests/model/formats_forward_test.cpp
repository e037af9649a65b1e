// The batched forward (the SIMD kernels, 8-bit activations for the quantized
// formats) on every mini model of ../shared/golden/mini-formats.json, at every
// SIMD level this CPU runs, teacher-forced on llama.cpp's greedy continuations:
// log-probabilities of llama.cpp's top-5 candidates stay within the kernels
// issue's bounds (F16: mean 0.005, max 0.03; quantized: mean 0.08, max 0.4).
// reference_forward_test checks the same bounds on the scalar reference path.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "kernels/isa_levels.h"
#include "model/teacher_forcing.h"

using namespace serval;

namespace {
const std::string kShared = SERVAL_SHARED_DIR;
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
      const test::TeacherForced r = test::teacher_forced(**model, KvType::f32, cases);
      std::printf("%-10s %-24s mean |d logprob| %.4f  max %.4f  greedy agreement %d/%d\n", isa_name(isa),
                  file.c_str(), r.mean, r.max, r.agree, r.total);
      const bool is_f16 = file.find("F16") != std::string::npos;
      EXPECT_LE(r.mean, is_f16 ? 0.005 : 0.08) << file << " at " << isa_name(isa);
      EXPECT_LE(r.max, is_f16 ? 0.03 : 0.4) << file << " at " << isa_name(isa);
    }
  }
}

// The importance-matrix files of ../shared/golden/mini-formats-iq.json
// (IQ1_S .. IQ4_XS, Q3_K_S/M by ik_llama.cpp's quantizer; TQ1_0, TQ2_0 by
// llama.cpp's), at every level this CPU runs (ref: the F32-activation path of
// the batched forward), prefill in one step: 3-bit and wider within mean 0.08
// / max 0.4, the 1- and 2-bit (and ternary) types within 0.15 / 0.8.
TEST(FormatsForward, IqFormatsTeacherForcedMatchLlamaCppAtEveryLevel) {
  std::ifstream in(kShared + "/golden/mini-formats-iq.json");
  const auto golden = nlohmann::json::parse(in);
  ASSERT_GE(golden.size(), 12u);
  test::IsaGuard guard;
  for (Isa isa : test::available_isa_levels()) {
    ASSERT_EQ(kernels::set_isa(isa), isa);
    for (const auto& [file, cases] : golden.items()) {
      auto model = Model::load(kShared + "/models/mini/" + file);
      ASSERT_TRUE(model.ok()) << file << ": " << model.status().message();
      const test::TeacherForced r = test::teacher_forced(**model, KvType::f32, cases);
      std::printf("%-10s %-24s mean |d logprob| %.4f  max %.4f  greedy agreement %d/%d\n", isa_name(isa),
                  file.c_str(), r.mean, r.max, r.agree, r.total);
      const bool low_bit = file.find("IQ1") != std::string::npos || file.find("IQ2") != std::string::npos ||
                           file.find("TQ") != std::string::npos;
      EXPECT_LE(r.mean, low_bit ? 0.15 : 0.08) << file << " at " << isa_name(isa);
      EXPECT_LE(r.max, low_bit ? 0.8 : 0.4) << file << " at " << isa_name(isa);
    }
  }
}
