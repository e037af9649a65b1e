// Independent check against real files: llama.cpp's quantizations of the mini
// model (../shared/models/mini) dequantized by serval must match the F16 source
// tensor of the same name with a small, sensibly ordered error. A wrong scale
// unpacking or a swapped nibble order turns the error into O(1).
//
// The same tensors quantized by serval's reference quantizers must be at least
// as close to the source as llama.cpp's (without an imatrix, as those files
// were made).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "gguf/gguf_reader.h"
#include "kernels/ref/quants.h"
#include "tensor/dtype.h"

namespace serval {
namespace {

const std::string kMini = std::string(SERVAL_SHARED_DIR) + "/models/mini/";

std::vector<float> dequantize_tensor(const gguf::GgufFile& f, const gguf::TensorInfo& t) {
  EXPECT_TRUE(ref::can_dequantize(t.type)) << t.name << " " << dtype_name(t.type);
  const auto data = f.tensor_data(t);
  EXPECT_EQ(data.size(), row_size(t.type, (int64_t)t.n_elements)) << t.name;
  std::vector<float> y(t.n_elements);
  ref::dequantize_row(t.type, data.data(), y.data(), (int64_t)t.n_elements);
  return y;
}

// Sums over all tensors of one type in one file: squared errors of
// llama.cpp's (err) and serval's (ours) quantization against the source, plain
// and weighted by x^2 (the large weights, which ggml's quantizers favour).
struct ErrSums {
  double err2 = 0, ours2 = 0, ref2 = 0;
  double werr2 = 0, wours2 = 0, wref2 = 0;
  int64_t n = 0;
  int tensors = 0;
  double rel() const { return std::sqrt(err2 / ref2); }
  double ours_rel() const { return std::sqrt(ours2 / ref2); }
  double wrel() const { return std::sqrt(werr2 / wref2); }
  double ours_wrel() const { return std::sqrt(wours2 / wref2); }
};

// Relative RMSE (over all tensors of the type) of llama.cpp's quantization vs
// the F16 source, per tensor type, for one file; also serval's own.
std::map<DType, ErrSums> compute_file_errors(const std::string& name, bool with_serval) {
  auto src = gguf::GgufFile::open(kMini + "mini-llama-F16.gguf");
  auto q = gguf::GgufFile::open(kMini + name);
  EXPECT_TRUE(src.ok()) << src.status().message();
  EXPECT_TRUE(q.ok()) << name << ": " << q.status().message();
  std::map<DType, ErrSums> out;
  if (!src.ok() || !q.ok()) return out;
  EXPECT_EQ(q->tensors().size(), src->tensors().size()) << name;
  for (const auto& t : q->tensors()) {
    const auto* s = src->find_tensor(t.name);
    EXPECT_NE(s, nullptr) << name << ": no source tensor " << t.name;
    if (!s) continue;
    EXPECT_EQ(t.n_elements, s->n_elements) << t.name;
    const auto x = dequantize_tensor(*src, *s);
    const auto y = dequantize_tensor(*q, t);
    if (t.type == s->type) {  // copied unquantized (norms): must be identical
      EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)), 0) << name << " " << t.name;
      continue;
    }
    // serval's quantization of the same source values
    std::vector<float> z(x.size());
    if (with_serval) {
      std::vector<uint8_t> mine(row_size(t.type, (int64_t)x.size()));
      ref::quantize_row(t.type, x.data(), mine.data(), (int64_t)x.size());
      ref::dequantize_row(t.type, mine.data(), z.data(), (int64_t)x.size());
    }

    ErrSums& e = out[t.type];
    double te = 0, tr = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double x2 = (double)x[i] * x[i];
      const double ey = ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
      const double ez = ((double)z[i] - x[i]) * ((double)z[i] - x[i]);
      te += ey;
      tr += x2;
      e.ours2 += ez;
      e.werr2 += x2 * ey;
      e.wours2 += x2 * ez;
      e.wref2 += x2 * x2;
    }
    e.err2 += te;
    e.ref2 += tr;
    e.n += (int64_t)x.size();
    ++e.tensors;
    EXPECT_TRUE(std::isfinite(te)) << name << " " << t.name;
  }
  return out;
}

// Upper bounds on llama.cpp's relative RMSE per type on these (Gaussian-like)
// weights, a little above the measured values. A mis-decoded format lands far
// above them.
double bound_for(DType t) {
  switch (t) {
    case DType::q8_0: return 0.007;
    case DType::q6_k: return 0.022;
    case DType::q5_k: return 0.045;
    case DType::q4_k: return 0.085;
    case DType::q4_0: return 0.10;
    case DType::iq4_nl: return 0.09;
    case DType::q3_k: return 0.19;
    case DType::q2_k: return 0.36;
    default: return 0;
  }
}

class MiniModelFiles : public ::testing::TestWithParam<const char*> {};

TEST_P(MiniModelFiles, DequantizedTensorsMatchF16SourceAndServalQuantizesAsWell) {
  const std::string name = GetParam();
  const auto sums = compute_file_errors(name, /*with_serval=*/true);
  ASSERT_FALSE(sums.empty()) << name << ": no quantized tensors";
  for (const auto& [type, e] : sums) {
    std::printf("  %-22s %-7s %2d tensors %8lld elems  rel RMSE llama.cpp %.5f serval %.5f"
                "  (x^2-weighted %.5f / %.5f)\n",
                name.c_str(), std::string(dtype_name(type)).c_str(), e.tensors, (long long)e.n,
                e.rel(), e.ours_rel(), e.wrel(), e.ours_wrel());
    ASSERT_GT(bound_for(type), 0) << "unexpected type " << dtype_name(type) << " in " << name;
    EXPECT_LT(e.rel(), bound_for(type)) << name << " " << dtype_name(type);
    // serval's own quantizer: no worse than llama.cpp's under either measure
    // (0.5% slack for rounding-level differences).
    EXPECT_LE(e.ours_rel(), e.rel() * 1.005) << name << " " << dtype_name(type);
    EXPECT_LE(e.ours_wrel(), e.wrel() * 1.005) << name << " " << dtype_name(type) << " (x^2-weighted)";
  }
}

INSTANTIATE_TEST_SUITE_P(Mini, MiniModelFiles,
                         ::testing::Values("mini-llama-Q8_0.gguf", "mini-llama-Q6_K.gguf",
                                           "mini-llama-Q5_K_M.gguf", "mini-llama-Q4_K_M.gguf",
                                           "mini-llama-Q4_0.gguf", "mini-llama-IQ4_NL.gguf",
                                           "mini-llama-Q2_K.gguf"),
                         [](const auto& info) {
                           std::string s = info.param;
                           s = s.substr(11, s.size() - 11 - 5);  // strip "mini-llama-" and ".gguf"
                           return s;
                         });

// The errors must order as the bits per weight do.
TEST(MiniModelFiles, ErrorsOrderByBitsPerWeight) {
  auto rel = [](const char* file, DType t) {
    const auto sums = compute_file_errors(file, /*with_serval=*/false);
    const auto it = sums.find(t);
    EXPECT_NE(it, sums.end()) << file << " has no " << dtype_name(t) << " tensors";
    return it == sums.end() ? 0.0 : it->second.rel();
  };
  const double q8 = rel("mini-llama-Q8_0.gguf", DType::q8_0);
  const double q6 = rel("mini-llama-Q6_K.gguf", DType::q6_k);
  const double q5k = rel("mini-llama-Q5_K_M.gguf", DType::q5_k);
  const double q4k = rel("mini-llama-Q4_K_M.gguf", DType::q4_k);
  const double q40 = rel("mini-llama-Q4_0.gguf", DType::q4_0);
  const double iq4 = rel("mini-llama-IQ4_NL.gguf", DType::iq4_nl);
  const double q3k = rel("mini-llama-Q2_K.gguf", DType::q3_k);
  const double q2k = rel("mini-llama-Q2_K.gguf", DType::q2_k);
  EXPECT_LT(q8, q6 / 2);
  EXPECT_LT(q6, q5k / 1.5);
  EXPECT_LT(q5k, q4k / 1.5);
  EXPECT_LT(q4k, q3k / 1.5);
  EXPECT_LT(q3k, q2k);
  EXPECT_LT(q4k, q40);   // 4.5 bpw with fitted mins beats 4.5 bpw symmetric
  EXPECT_LT(iq4, q40);   // the non-linear grid beats the linear one at equal size
  EXPECT_GT(q40, q5k);
}

}  // namespace
}  // namespace serval
