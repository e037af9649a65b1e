// serval's lattice (IQ1/IQ2/IQ3) and ternary (TQ) quantizers against an
// independent one: ../shared/models/mini holds mini-llama quantized by
// ik_llama.cpp's quantizer (with mini-llama-F16.imatrix; TQ by llama.cpp,
// without). For every tensor those files store in such a type, serval
// quantizes the F16 source tensor to the same type with the same imatrix
// entry and both are compared with the source under the measure that
// predicts a layer's output error: sum over elements of imatrix[column] *
// (y - x)^2 (the imatrix is the mean squared activation of each column), and
// plainly (unit weights) where there is no imatrix.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "gguf/gguf_reader.h"
#include "kernels/ref/quants.h"
#include "quantize/imatrix.h"
#include "tensor/dtype.h"

namespace serval::quant {
namespace {

const std::string kMini = std::string(SERVAL_SHARED_DIR) + "/models/mini/";

bool lattice_or_ternary(DType t) {
  switch (t) {
    case DType::iq2_xxs: case DType::iq2_xs: case DType::iq2_s: case DType::iq3_xxs: case DType::iq3_s:
    case DType::iq1_s: case DType::iq1_m: case DType::tq1_0: case DType::tq2_0:
      return true;
    default:
      return false;
  }
}

std::vector<float> dequantize_tensor(const gguf::GgufFile& f, const gguf::TensorInfo& t) {
  const auto data = f.tensor_data(t);
  std::vector<float> y(t.n_elements);
  ref::dequantize_row(t.type, data.data(), y.data(), (int64_t)t.n_elements);
  return y;
}

struct Errors {
  double theirs = 0, ours = 0, ref = 0;
  int tensors = 0;
  double theirs_rel() const { return std::sqrt(theirs / ref); }
  double ours_rel() const { return std::sqrt(ours / ref); }
};

class IqQuantize : public ::testing::TestWithParam<const char*> {};

TEST_P(IqQuantize, ServalIsAtLeastAsCloseAsTheReferenceQuantizer) {
  const std::string name = std::string("mini-llama-") + GetParam() + ".gguf";
  auto src = gguf::GgufFile::open(kMini + "mini-llama-F16.gguf");
  auto q = gguf::GgufFile::open(kMini + name);
  auto im = read_imatrix(kMini + "mini-llama-F16.imatrix");
  ASSERT_TRUE(src.ok() && q.ok() && im.ok());
  const bool ternary = name.find("TQ") != std::string::npos;
  std::map<std::pair<DType, bool>, Errors> sums;  // by type and "weighted by an imatrix entry"
  for (const auto& t : q->tensors()) {
    if (!lattice_or_ternary(t.type)) continue;
    const auto* s = src->find_tensor(t.name);
    ASSERT_NE(s, nullptr) << t.name;
    const int64_t cols = t.dims[0], rows = (int64_t)t.n_elements / cols;
    // token_embd has no entry (it is looked up, not multiplied): both
    // quantizers run without one there, and it is compared unweighted.
    const std::vector<float> imp = ternary ? std::vector<float>() : im->weights(t.name);
    ASSERT_TRUE(imp.empty() || (int64_t)imp.size() == cols) << t.name;
    const auto x = dequantize_tensor(*src, *s);
    const auto y = dequantize_tensor(*q, t);
    std::vector<uint8_t> mine(row_size(t.type, cols));
    std::vector<float> z((size_t)cols);
    Errors& e = sums[{t.type, !imp.empty()}];
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x.data() + r * cols;
      ref::quantize_row(t.type, xr, mine.data(), cols, imp.empty() ? nullptr : imp.data());
      ref::dequantize_row(t.type, mine.data(), z.data(), cols);
      for (int64_t c = 0; c < cols; ++c) {
        const double w = imp.empty() ? 1.0 : imp[(size_t)c];
        const double dy = (double)y[(size_t)(r * cols + c)] - xr[c], dz = (double)z[(size_t)c] - xr[c];
        e.theirs += w * dy * dy;
        e.ours += w * dz * dz;
        e.ref += w * (double)xr[c] * xr[c];
      }
    }
    ++e.tensors;
  }
  ASSERT_FALSE(sums.empty()) << name << " has no lattice or ternary tensors";
  for (const auto& [key, e] : sums) {
    const auto [type, weighted] = key;
    std::printf("  %-22s %-8s %2d tensors  %s rel RMSE: reference quantizer %.5f  serval %.5f  (ratio %.4f)\n",
                name.c_str(), std::string(dtype_name(type)).c_str(), e.tensors,
                weighted ? "imatrix-weighted" : "plain", e.theirs_rel(), e.ours_rel(), e.ours_rel() / e.theirs_rel());
    // A mis-packed field makes the error O(1); a weak search shows as a ratio above 1.
    EXPECT_LT(e.ours_rel(), 0.9) << name;
    EXPECT_LE(e.ours_rel(), e.theirs_rel() * 1.005) << name << " " << dtype_name(type);
  }
}

INSTANTIATE_TEST_SUITE_P(Mini, IqQuantize,
                         ::testing::Values("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S",
                                           "TQ1_0", "TQ2_0"));

}  // namespace
}  // namespace serval::quant
