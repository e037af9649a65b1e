// serval quantize's library: the tensor-type policy against the files
// llama.cpp's quantizer made (../shared/models/mini), quantized files read back
// (metadata identical, types as planned, dequantized tensors within per-type
// error bounds of the source), refusals, and the imatrix file format.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <unistd.h>

#include "gguf/gguf_reader.h"
#include "kernels/ref/quants.h"
#include "model/synthetic.h"
#include "quantize/imatrix.h"
#include "quantize/quant_policy.h"
#include "quantize/quantize_model.h"

namespace serval::quant {
namespace {

const std::string kShared = SERVAL_SHARED_DIR;
const std::string kMini = kShared + "/models/mini/mini-llama-";
const std::string kStories = kShared + "/models/stories260K.gguf";

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "/serval_quant_" + std::to_string(getpid()) + "_" + name;
}

gguf::GgufFile open_or_die(const std::string& path) {
  auto f = gguf::GgufFile::open(path);
  EXPECT_TRUE(f.ok()) << path << ": " << f.status().message();
  return std::move(f.value());
}

std::vector<float> dequantize(const gguf::GgufFile& f, const gguf::TensorInfo& t) {
  std::vector<float> out(t.n_elements);
  const int64_t cols = t.dims[0], rows = (int64_t)t.n_elements / cols;
  const size_t rs = row_size(t.type, cols);
  for (int64_t r = 0; r < rows; ++r)
    ref::dequantize_row(t.type, f.tensor_data(t).data() + r * rs, out.data() + r * cols, cols);
  return out;
}

double rel_rmse(const std::vector<float>& x, const std::vector<float>& y) {
  double e = 0, s = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    e += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
    s += (double)x[i] * x[i];
  }
  return std::sqrt(e / s);
}

// Per-type relative RMS error a whole tensor of weight-like data must meet:
// the heavy-tailed row bounds of tests/kernels/quant_roundtrip_test.cpp
// (measured on 16384 elements, a little above the errors seen) plus 10 % for
// the source's own spread. A type's error depends only on its bits and block
// layout, so a tensor that misses its bound was written in the wrong type or
// with the wrong rows.
double bound(DType t) {
  switch (t) {
    case DType::f32: return 0.0;
    case DType::f16: return 2.5e-4 * 1.1;
    case DType::bf16: return 1.8e-3 * 1.1;
    case DType::q8_0: return 0.0075 * 1.1;
    case DType::q6_k: return 0.0235 * 1.1;
    case DType::q5_1: return 0.044 * 1.1;
    case DType::q5_0: return 0.058 * 1.1;
    case DType::q5_k: return 0.046 * 1.1;
    case DType::q4_1: return 0.090 * 1.1;
    case DType::q4_0: return 0.115 * 1.1;
    case DType::q4_k: return 0.090 * 1.1;
    case DType::iq4_nl: return 0.096 * 1.1;
    case DType::iq4_xs: return 0.097 * 1.1;
    case DType::q3_k: return 0.186 * 1.1;
    case DType::q2_k: return 0.352 * 1.1;
    // the lattice and ternary types: tests/kernels/quant_iq_test.cpp's Gaussian bounds
    case DType::iq3_s: return 0.145 * 1.1;
    case DType::iq3_xxs: return 0.195 * 1.1;
    case DType::iq2_s: return 0.26 * 1.1;
    case DType::iq2_xs: return 0.31 * 1.1;
    case DType::iq2_xxs: return 0.365 * 1.1;
    case DType::iq1_m: return 0.465 * 1.1;
    case DType::iq1_s: return 0.515 * 1.1;
    case DType::tq1_0: case DType::tq2_0: return 0.505 * 1.1;
    default: return 0.0;
  }
}

TEST(QuantPolicy, FileTypeNames) {
  auto t = find_file_type("q4_k");  // llama-quantize's alias
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->name, "Q4_K_M");
  EXPECT_EQ(t->ftype, 15u);
  EXPECT_EQ(find_file_type("Q5_K")->ftype, 17u);
  EXPECT_EQ(find_file_type("q8_0")->ftype, 7u);
  EXPECT_EQ(find_file_type("IQ4_NL")->ftype, 25u);
  EXPECT_EQ(find_file_type("iq4_xs")->ftype, 30u);
  EXPECT_EQ(find_file_type("Q2_K")->ftype, 10u);
  EXPECT_EQ(find_file_type("q3_k_s")->ftype, 11u);
  EXPECT_EQ(find_file_type("Q3_K")->ftype, 12u);  // alias of Q3_K_M
  EXPECT_EQ(find_file_type("Q3_K_L")->ftype, 13u);
  EXPECT_FALSE(find_file_type("Q9_9").has_value());
  EXPECT_FALSE(find_file_type("").has_value());
}

// llama.cpp quantized mini-llama-F16.gguf into each of these files: our plan
// for the same source must give every tensor the type llama.cpp gave it
// (output.weight Q6_K, attn_v/ffn_down of the "more bits" layer 1 in Q6_K for
// the _M mixes, attn_v/attn_output/ffn_down in Q3_K for Q2_K, norms F32, ...).
TEST(QuantPolicy, MatchesLlamaCppOnTheMiniModel) {
  const gguf::GgufFile src = open_or_die(kMini + "F16.gguf");
  // The lattice files were made with mini-llama-F16.imatrix (ik_llama.cpp's
  // quantizer, llama.cpp's mixes); the others without one.
  for (const char* name : {"Q8_0", "Q4_0", "Q4_K_M", "Q5_K_M", "Q6_K", "IQ4_NL", "Q2_K", "Q3_K_S", "Q3_K_M", "IQ4_XS",
                           "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "TQ1_0", "TQ2_0"}) {
    const gguf::GgufFile ref = open_or_die(kMini + name + ".gguf");
    const auto ft = find_file_type(name);
    ASSERT_TRUE(ft.has_value());
    EXPECT_EQ(ref.get_uint("general.file_type").value(), ft->ftype) << name;
    const bool with_imatrix = name[0] == 'I' && std::string(name) != "IQ4_NL" && std::string(name) != "IQ4_XS";
    const auto plans = plan_tensors(src, *ft, with_imatrix);
    ASSERT_EQ(plans.size(), src.tensors().size());
    for (size_t i = 0; i < plans.size(); ++i) {
      const auto& t = src.tensors()[i];
      const gguf::TensorInfo* r = ref.find_tensor(t.name);
      ASSERT_NE(r, nullptr) << t.name;
      EXPECT_EQ(dtype_name(plans[i].type), dtype_name(r->type)) << name << " " << t.name;
      EXPECT_FALSE(plans[i].fallback);
    }
  }
}

// Mixture of experts, as llama.cpp's llama_tensor_get_type for 8 experts:
// the router (ffn_gate_inp) stays F32, attn_k and attn_v take Q8_0,
// attn_output Q5_K (Q4_K_M), the 3-D expert tensors the mix's type, with the
// "more bits" layers' ffn_down_exps in Q6_K.
TEST(QuantPolicy, ExpertTensorsFollowLlamaCpp) {
  const gguf::GgufFile src = open_or_die(std::string(SERVAL_SHARED_DIR) + "/models/arch/mini-qwen3moe-F16.gguf");
  const auto plans = plan_tensors(src, *find_file_type("Q4_K_M"), false);
  std::map<std::string, std::string> got;
  for (size_t i = 0; i < plans.size(); ++i)
    got[src.tensors()[i].name] = std::string(dtype_name(plans[i].quantize ? plans[i].type : src.tensors()[i].type));
  EXPECT_EQ(got["blk.0.ffn_gate_inp.weight"], "f32");
  EXPECT_EQ(got["blk.1.ffn_gate_inp.weight"], "f32");
  EXPECT_EQ(got["blk.0.attn_k.weight"], "q8_0");
  EXPECT_EQ(got["blk.0.attn_v.weight"], "q8_0");
  EXPECT_EQ(got["blk.0.attn_output.weight"], "q5_K");
  EXPECT_EQ(got["blk.0.attn_q.weight"], "q4_K");
  EXPECT_EQ(got["blk.0.ffn_gate_exps.weight"], "q4_K");
  EXPECT_EQ(got["blk.0.ffn_up_exps.weight"], "q4_K");
  EXPECT_EQ(got["blk.0.ffn_down_exps.weight"], "q4_K");
  EXPECT_EQ(got["blk.1.ffn_down_exps.weight"], "q6_K");  // use_more_bits(1, 2)
  EXPECT_EQ(got["output.weight"], "q6_K");
}

// stories260K: rows of 64 (no 256-element block fits) and ffn_down rows of 172
// (no block fits at all; llama.cpp refuses the file there).
TEST(QuantPolicy, RowLengthFallback) {
  const gguf::GgufFile src = open_or_die(kStories);
  auto type_of = [&](const char* ft, const std::string& tensor) {
    const auto plans = plan_tensors(src, *find_file_type(ft), false);
    for (size_t i = 0; i < plans.size(); ++i)
      if (src.tensors()[i].name == tensor) return plans[i];
    ADD_FAILURE() << tensor;
    return TensorPlan{};
  };
  EXPECT_EQ(type_of("Q8_0", "blk.0.attn_q.weight").type, DType::q8_0);
  EXPECT_EQ(type_of("Q8_0", "output.weight").type, DType::q8_0);
  EXPECT_EQ(type_of("Q8_0", "blk.0.ffn_down.weight").type, DType::f32);
  EXPECT_TRUE(type_of("Q8_0", "blk.0.ffn_down.weight").fallback);
  EXPECT_EQ(type_of("Q8_0", "blk.0.ffn_norm.weight").type, DType::f32);
  EXPECT_FALSE(type_of("Q8_0", "blk.0.ffn_norm.weight").quantize);
  EXPECT_EQ(type_of("Q4_K_M", "blk.0.attn_q.weight").type, DType::q5_0);   // Q4_K -> Q5_0
  EXPECT_EQ(type_of("Q5_K_M", "blk.0.attn_q.weight").type, DType::q5_1);   // Q5_K -> Q5_1
  EXPECT_EQ(type_of("Q4_K_M", "blk.0.attn_v.weight").type, DType::q5_0);
  EXPECT_EQ(type_of("Q4_K_M", "blk.4.attn_v.weight").type, DType::q8_0);   // more bits: Q6_K -> Q8_0
  EXPECT_EQ(type_of("Q4_K_M", "output.weight").type, DType::q8_0);         // no Q4_K block fits
  EXPECT_EQ(type_of("IQ4_XS", "blk.0.attn_q.weight").type, DType::iq4_nl);  // IQ4_XS -> IQ4_NL
  EXPECT_EQ(type_of("Q4_K_M", "blk.4.ffn_down.weight").type, DType::f32);  // nothing fits 172
  EXPECT_EQ(type_of("Q4_0", "output.weight").type, DType::q8_0);           // Q6_K -> Q8_0
}

// A synthetic model at the "tiny" shape (dim 256, 2 layers, ffn 512, the
// stories260K vocab): small enough to quantize to every type in a few seconds.
// The files live as long as the test program and are removed at its exit.
struct TinyModels {
  std::map<DType, std::string> paths;
  ~TinyModels() {
    for (const auto& [type, path] : paths) std::remove(path.c_str());
  }
};

const std::string& tiny_model(DType type) {
  static TinyModels models;
  auto& paths = models.paths;
  auto it = paths.find(type);
  if (it != paths.end()) return it->second;
  const std::string path = temp_path("tiny_" + std::string(dtype_name(type)) + ".gguf");
  const gguf::GgufFile vocab = open_or_die(kStories);
  Status st = write_synthetic_model({*find_synth_shape("tiny"), type, 7}, vocab, path);
  EXPECT_TRUE(st.ok()) << st.message();
  return paths[type] = path;
}

struct QuantizedFile {
  std::string path;
  QuantizeSummary summary;
};

QuantizedFile quantize_to(const std::string& src, const std::string& ft, const Imatrix* im = nullptr) {
  QuantizedFile q;
  q.path = temp_path(ft + ".gguf");
  QuantizeOptions opt;
  opt.file_type = *find_file_type(ft);
  opt.imatrix = im;
  auto r = quantize_model(src, q.path, opt);
  EXPECT_TRUE(r.ok()) << r.status().message();
  if (r.ok()) q.summary = *r;
  return q;
}

// Every type round-trips through the reader: same metadata (in order, apart
// from general.file_type / quantization_version), same tensors and shapes, the
// planned types, and values within the type's error bound of the source.
TEST(QuantizeModel, FilesRoundTripThroughTheReader) {
  const std::string src_path = tiny_model(DType::f16);
  const gguf::GgufFile src = open_or_die(src_path);
  // The 1- and 2-bit mixes need an importance matrix: a flat one (every
  // column 1) for every matrix.
  Imatrix flat;
  for (const auto& t : src.tensors())
    if (t.dims.size() >= 2 && t.dims[1] > 1) flat.entries[t.name] = {1, std::vector<float>((size_t)t.dims[0], 1.0f)};
  for (const FileType& ft : file_types()) {
    SCOPED_TRACE(std::string(ft.name));
    bool needs = false;  // IQ1/IQ2 mixes, and IQ3_XXS (its attn_q/attn_k become IQ2_S)
    const auto plain = plan_tensors(src, ft, false);
    for (size_t i = 0; i < plain.size(); ++i) needs |= needs_imatrix(ft, src.tensors()[i].name, plain[i].type);
    QuantizedFile q = quantize_to(src_path, std::string(ft.name), needs ? &flat : nullptr);
    const gguf::GgufFile out = open_or_die(q.path);
    EXPECT_EQ(out.alignment(), src.alignment());
    EXPECT_EQ(out.get_uint("general.file_type").value(), ft.ftype);
    std::vector<std::string> keys_src, keys_out;
    for (const auto& kv : src.metadata()) keys_src.push_back(kv.key);
    for (const auto& kv : out.metadata()) keys_out.push_back(kv.key);
    if (!src.has("general.quantization_version")) keys_src.push_back("general.quantization_version");
    if (needs)
      for (const char* k : {"quantize.imatrix.file", "quantize.imatrix.dataset", "quantize.imatrix.entries_count",
                            "quantize.imatrix.chunks_count"})
        keys_src.push_back(k);
    EXPECT_EQ(keys_out, keys_src);
    for (const auto& kv : src.metadata()) {
      if (kv.key == "general.file_type") continue;
      EXPECT_EQ(gguf::value_to_string(*out.find(kv.key), (size_t)-1),
                gguf::value_to_string(kv.value, (size_t)-1))
          << kv.key;
    }
    const auto plans = plan_tensors(src, ft, needs);
    ASSERT_EQ(out.tensors().size(), src.tensors().size());
    for (size_t i = 0; i < plans.size(); ++i) {
      const auto& a = src.tensors()[i];
      const auto& b = out.tensors()[i];
      ASSERT_EQ(a.name, b.name);
      EXPECT_EQ(a.dims, b.dims) << a.name;
      EXPECT_EQ(b.type, plans[i].type) << a.name;
      if (b.type == a.type) {
        EXPECT_TRUE(std::equal(out.tensor_data(b).begin(), out.tensor_data(b).end(), src.tensor_data(a).begin()))
            << a.name << " must be copied byte for byte";
        continue;
      }
      const double e = rel_rmse(dequantize(src, a), dequantize(out, b));
      EXPECT_LE(e, bound(b.type)) << a.name << " as " << dtype_name(b.type);
      if (b.type != DType::f32) {
        EXPECT_GT(e, 0.0) << a.name;
      }
    }
    std::remove(q.path.c_str());
  }
}

TEST(QuantizeModel, RefusesQuantizedSourceUnlessAllowed) {
  QuantizeOptions opt;
  opt.file_type = *find_file_type("Q4_0");
  const std::string out = temp_path("requant.gguf");
  auto r = quantize_model(tiny_model(DType::q8_0), out, opt);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("already quantized"), std::string::npos) << r.status().message();
  EXPECT_NE(access(out.c_str(), F_OK), 0) << "nothing may be written";
  std::vector<std::string> warnings;
  opt.allow_requantize = true;
  opt.warn = [&](const std::string& m) { warnings.push_back(m); };
  r = quantize_model(tiny_model(DType::q8_0), out, opt);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(warnings.size(), 1u);
  EXPECT_EQ(open_or_die(out).find_tensor("blk.0.attn_q.weight")->type, DType::q4_0);
  std::remove(out.c_str());
}

Imatrix ones_imatrix(const gguf::GgufFile& f, int64_t len_delta) {
  Imatrix im;
  im.last_call = 3;
  im.dataset = "test";
  for (const auto& t : f.tensors())
    if (t.name.find("blk.") == 0 && t.dims.size() == 2) im.entries[t.name] = {3, std::vector<float>((size_t)(t.dims[0] + len_delta), 3.0f)};
  return im;
}

TEST(Imatrix, FileRoundTripAndBadFiles) {
  const gguf::GgufFile src = open_or_die(kStories);
  Imatrix im = ones_imatrix(src, 0);
  im.entries.begin()->second.values[5] = 7.5f;
  const std::string path = temp_path("im.dat");
  ASSERT_TRUE(write_imatrix(im, path).ok());
  auto back = read_imatrix(path);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->last_call, 3);
  EXPECT_EQ(back->dataset, "test");
  ASSERT_EQ(back->entries.size(), im.entries.size());
  for (const auto& [name, e] : im.entries) {
    EXPECT_EQ(back->entries[name].ncall, e.ncall);
    EXPECT_EQ(back->entries[name].values, e.values);
  }
  // weights() divides by ncall as llama-quantize does.
  EXPECT_FLOAT_EQ(back->weights(im.entries.begin()->first)[5], 2.5f);
  EXPECT_FLOAT_EQ(back->weights(im.entries.begin()->first)[0], 1.0f);

  // Truncations anywhere inside the entries, and garbage, are refused.
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (size_t cut : {size_t{2}, size_t{4}, size_t{9}, bytes.size() / 2}) {
    std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), (std::streamsize)cut);
    EXPECT_FALSE(read_imatrix(path).ok()) << "cut at " << cut;
  }
  std::ofstream(path, std::ios::binary | std::ios::trunc) << "GGUF and more";
  auto g = read_imatrix(path);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("GGUF imatrix"), std::string::npos);
  std::remove(path.c_str());
}

TEST(Imatrix, QuantizeRefusesMismatchedDims) {
  const gguf::GgufFile src = open_or_die(kMini + "F16.gguf");
  Imatrix bad = ones_imatrix(src, 1);
  QuantizeOptions opt;
  opt.file_type = *find_file_type("Q4_K_M");
  opt.imatrix = &bad;
  auto r = quantize_model(kMini + "F16.gguf", temp_path("bad_im.gguf"), opt);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("imatrix entry"), std::string::npos) << r.status().message();
  // An imatrix of another model matches no tensor.
  Imatrix other;
  other.entries["nothing.weight"] = {1, std::vector<float>(8, 1.0f)};
  opt.imatrix = &other;
  r = quantize_model(kMini + "F16.gguf", temp_path("bad_im.gguf"), opt);
  ASSERT_FALSE(r.ok());
}

}  // namespace
}  // namespace serval::quant
