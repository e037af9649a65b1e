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

#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "kernels/isa_levels.h"
#include "model/teacher_forcing.h"
#include "quantize/quant_policy.h"
#include "quantize/quantize_model.h"

namespace serval::quant {
namespace {
const std::string kShared = SERVAL_SHARED_DIR;
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
  // Every level in the release stage; the best one under the sanitizers.
  for (Isa isa : test::forward_levels()) {
    ASSERT_EQ(kernels::set_isa(isa), isa);
    std::map<std::string, test::TeacherForced> err;
    for (const auto& [ft, p] : path) {
      auto model = Model::load(p);
      ASSERT_TRUE(model.ok()) << model.status().message();
      err[ft] = test::teacher_forced(**model, KvType::f32, golden["mini-llama-F16.gguf"]);
      std::printf("%-10s %s (serval quantize) vs llama.cpp F16: mean |d logprob| %.4f  max %.4f\n", isa_name(isa),
                  ft.c_str(), err[ft].mean, err[ft].max);
    }
    EXPECT_LE(err["IQ4_XS"].mean, 1.2 * err["IQ4_NL"].mean) << isa_name(isa);
    EXPECT_LE(err["IQ4_XS"].max, 1.5 * err["IQ4_NL"].max) << isa_name(isa);
  }
  for (const auto& [ft, p] : path) std::remove(p.c_str());
}

}  // namespace serval::quant
