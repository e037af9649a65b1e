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

// Every file of `golden_file` teacher-forced at each level of `levels`:
// within bound(file) = {mean, max}.
void teacher_force_at(const std::string& golden_file, size_t min_files, const std::vector<Isa>& levels,
                      std::pair<double, double> (*bound)(const std::string& file)) {
  std::ifstream in(kShared + "/golden/" + golden_file);
  const auto golden = nlohmann::json::parse(in);
  ASSERT_GE(golden.size(), min_files);
  test::IsaGuard guard;
  for (Isa isa : levels) {
    ASSERT_EQ(kernels::set_isa(isa), isa);
    for (const auto& [file, cases] : golden.items()) {
      auto model = Model::load(kShared + "/models/mini/" + file);
      ASSERT_TRUE(model.ok()) << file << ": " << model.status().message();
      const test::TeacherForced r = test::teacher_forced(**model, KvType::f32, cases);
      std::printf("%-10s %-24s mean |d logprob| %.4f  max %.4f  greedy agreement %d/%d\n", isa_name(isa),
                  file.c_str(), r.mean, r.max, r.agree, r.total);
      const auto [mean_bound, max_bound] = bound(file);
      EXPECT_LE(r.mean, mean_bound) << file << " at " << isa_name(isa);
      EXPECT_LE(r.max, max_bound) << file << " at " << isa_name(isa);
    }
  }
}

TEST(FormatsForward, EverySimdLevelTeacherForcedMatchesLlamaCpp) {
  auto levels = test::available_isa_levels();
  levels.erase(levels.begin());  // ref: reference_forward_test
  if (levels.empty()) GTEST_SKIP() << "no SIMD level on this CPU";
  teacher_force_at("mini-formats.json", 10, levels, [](const std::string& file) {
    return file.find("F16") != std::string::npos ? std::pair{0.005, 0.03} : std::pair{0.08, 0.4};
  });
}

// The importance-matrix files of ../shared/golden/mini-formats-iq.json
// (IQ1_S .. IQ4_XS, Q3_K_S/M by ik_llama.cpp's quantizer; TQ1_0, TQ2_0 by
// llama.cpp's), at every level this CPU runs (ref: the F32-activation path of
// the batched forward), prefill in one step: 3-bit and wider within mean 0.08
// / max 0.4, the 1- and 2-bit (and ternary) types within 0.15 / 0.8.
TEST(FormatsForward, IqFormatsTeacherForcedMatchLlamaCppAtEveryLevel) {
  teacher_force_at("mini-formats-iq.json", 12, test::available_isa_levels(), [](const std::string& file) {
    const bool low_bit = file.find("IQ1") != std::string::npos || file.find("IQ2") != std::string::npos ||
                         file.find("TQ") != std::string::npos;
    return low_bit ? std::pair{0.15, 0.8} : std::pair{0.08, 0.4};
  });
}
