// The embedding forward (model/embed_forward.h) against the slow reference
// in the tree (reference_embed): synthetic bert / nomic-bert files written by
// serval gguf synth's writer with the BERT vocab of ../shared, and a real
// decoder file pooled as an embedding model.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <unistd.h>
#include <random>

#include "common/l2_normalize.h"
#include "edited_gguf.h"
#include "gguf/gguf_reader.h"
#include "model/embed_forward.h"
#include "model/model.h"
#include "model/reference_forward.h"
#include "model/synthetic.h"

namespace serval {
namespace {

namespace fs = std::filesystem;

const std::string kShared = SERVAL_SHARED_DIR;
const std::string kBertVocab = kShared + "/tokenizer-vectors/ggml-vocab-bert-bge.gguf";

// A synthetic encoder, written once per (arch, type, pooling, seed) into the temp dir.
std::shared_ptr<const Model> synth_encoder(const std::string& arch, DType type, const std::string& pooling = "",
                                           uint64_t seed = 7) {
  static std::map<std::string, std::shared_ptr<const Model>> cache;
  const std::string key = arch + "-" + std::string(dtype_name(type)) + "-" + pooling + "-" + std::to_string(seed);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  const fs::path path = fs::temp_directory_path() / ("serval-embed-test-" + std::to_string(::getpid()) + "-" + key + ".gguf");
  auto vocab = gguf::GgufFile::open(kBertVocab);
  EXPECT_TRUE(vocab.ok()) << vocab.status().message();
  auto shape = find_synth_shape("bert-tiny");
  EXPECT_TRUE(shape.ok());
  SynthOptions opt(*shape, type, seed);
  opt.arch = arch;
  opt.pooling = pooling;
  Status st = write_synthetic_model(opt, *vocab, path.string());
  EXPECT_TRUE(st.ok()) << st.message();
  auto m = Model::load(path.string());
  EXPECT_TRUE(m.ok()) << m.status().message();
  fs::remove(path);  // the mapping keeps the data
  std::shared_ptr<const Model> sm = std::move(m.value());
  cache[key] = sm;
  return sm;
}

std::vector<std::vector<TokenId>> random_inputs(int64_t n_vocab, const std::vector<int>& lengths, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<TokenId> tok(0, (TokenId)n_vocab - 1);
  std::vector<std::vector<TokenId>> in;
  for (int len : lengths) {
    in.emplace_back();
    for (int i = 0; i < len; ++i) in.back().push_back(tok(rng));
  }
  return in;
}

double cosine(const float* a, const float* b, int64_t n) {
  double ab = 0, aa = 0, bb = 0;
  for (int64_t i = 0; i < n; ++i) {
    ab += (double)a[i] * b[i];
    aa += (double)a[i] * a[i];
    bb += (double)b[i] * b[i];
  }
  return ab / std::sqrt(aa * bb);
}

// Batched output of `fwd` vs reference_embed of each input (both L2-normalized,
// as the API returns them): max |delta| and min cosine.
struct Agreement {
  double max_abs = 0, min_cos = 1;
};
Agreement compare(const Model& fast_model, const Model& ref_model, const std::vector<std::vector<TokenId>>& in,
                  Pooling pooling = Pooling::none) {
  ThreadPool pool(2);
  EmbedForward fwd(fast_model, &pool, pooling);
  std::vector<float> out;
  Status st = fwd.embed(in, &out);
  EXPECT_TRUE(st.ok()) << st.message();
  const int64_t d = fwd.out_dim();
  EXPECT_EQ(out.size(), in.size() * (size_t)d);
  Agreement a;
  for (size_t i = 0; i < in.size() && out.size() == in.size() * (size_t)d; ++i) {
    auto ref = reference_embed(ref_model, in[i], pooling);
    EXPECT_TRUE(ref.ok()) << ref.status().message();
    if (!ref.ok()) continue;
    std::span<float> f(out.data() + i * (size_t)d, (size_t)d);
    if (d > 1) {
      l2_normalize(f);
      l2_normalize(*ref);
      a.min_cos = std::min(a.min_cos, cosine(f.data(), ref->data(), d));
    }
    for (int64_t j = 0; j < d; ++j) a.max_abs = std::max(a.max_abs, (double)std::fabs(f[(size_t)j] - (*ref)[(size_t)j]));
  }
  return a;
}

TEST(EmbedForward, EncoderConfigsAsLlamaCppReadsThem) {
  auto bert = synth_encoder("bert", DType::f32);
  const ModelConfig& c = bert->config();
  EXPECT_TRUE(c.encoder);
  EXPECT_TRUE(c.enc.abs_pos);
  EXPECT_FALSE(c.enc.rope);
  EXPECT_EQ(c.pooling, Pooling::mean);
  EXPECT_FLOAT_EQ(c.norm_eps, 1e-12f);
  EXPECT_EQ(c.n_vocab, 30522);
  EXPECT_EQ(bert->weights().token_type0.size(), (size_t)c.dim);
  auto nomic = synth_encoder("nomic-bert", DType::f32);
  EXPECT_TRUE(nomic->config().enc.rope);
  EXPECT_TRUE(nomic->config().enc.gated);
  EXPECT_FLOAT_EQ(nomic->config().rope.freq_base, 1000.0f);
  EXPECT_EQ(synth_encoder("bert", DType::f32, "rank")->config().pooling, Pooling::rank);
}

TEST(EmbedForward, BertMatchesReferenceAtF32) {
  auto m = synth_encoder("bert", DType::f32);
  // Lengths up to the model's 128 positions.
  const auto in = random_inputs(m->config().n_vocab, {1, 2, 7, 33, 128}, 1);
  const Agreement a = compare(*m, *m, in);
  EXPECT_LE(a.max_abs, 1e-5);
  EXPECT_GE(a.min_cos, 0.99999);
}

TEST(EmbedForward, NomicBertMatchesReferenceAtF32) {
  auto m = synth_encoder("nomic-bert", DType::f32);
  const auto in = random_inputs(m->config().n_vocab, {1, 5, 64, 200}, 2);
  const Agreement a = compare(*m, *m, in);
  EXPECT_LE(a.max_abs, 1e-5);
}

// Against llama.cpp itself: tests/model/golden_llama_cpp_embeddings.json holds
// the token ids and normalized embeddings llama.cpp's llama-embedding (commit
// c392e50, --embd-normalize 2, 7 decimals) printed for the files `serval gguf
// synth --shape bert-tiny [--arch nomic-bert] --type f32` writes with its
// default seed 42 (the writer is deterministic).
TEST(EmbedForward, MatchesLlamaCppOnTheSameFiles) {
  std::ifstream in(std::string(SERVAL_SOURCE_DIR) + "/tests/model/golden_llama_cpp_embeddings.json");
  ASSERT_TRUE(in.good());
  const nlohmann::json g = nlohmann::json::parse(in);
  ASSERT_EQ(g["cases"].size(), 4u);
  for (const auto& cs : g["cases"]) {
    const std::string arch = cs["arch"];
    auto m = synth_encoder(arch, DType::f32, "", 42);
    const std::vector<std::vector<TokenId>> in1 = {cs["tokens"].get<std::vector<TokenId>>()};
    EmbedForward fwd(*m, nullptr);
    std::vector<float> out;
    ASSERT_TRUE(fwd.embed(in1, &out).ok());
    l2_normalize(out);
    const std::vector<float> want = cs["embedding"].get<std::vector<float>>();
    ASSERT_EQ(out.size(), want.size());
    double max_abs = 0;
    for (size_t i = 0; i < out.size(); ++i) max_abs = std::max(max_abs, (double)std::fabs(out[i] - want[i]));
    EXPECT_GE(cosine(out.data(), want.data(), (int64_t)out.size()), 0.99999) << arch << ": " << cs["text"];
    EXPECT_LE(max_abs, 1e-5) << arch << ": " << cs["text"];
  }
}

TEST(EmbedForward, F16WeightsStayWithinCosine) {
  for (const char* arch : {"bert", "nomic-bert"}) {
    auto f16 = synth_encoder(arch, DType::f16);
    auto f32 = synth_encoder(arch, DType::f32);
    const auto in = random_inputs(f16->config().n_vocab, {3, 17, 90}, 3);
    // The same F16 weights through the reference, and the F32 originals.
    EXPECT_GE(compare(*f16, *f16, in).min_cos, 0.9999) << arch;
    EXPECT_GE(compare(*f16, *f32, in).min_cos, 0.9999) << arch;
  }
}

TEST(EmbedForward, RerankScoreMatchesReference) {
  auto m = synth_encoder("bert", DType::f32, "rank");
  const auto in = random_inputs(m->config().n_vocab, {4, 20, 77}, 4);
  EmbedForward fwd(*m, nullptr);
  EXPECT_EQ(fwd.out_dim(), 1);
  const Agreement a = compare(*m, *m, in);
  EXPECT_LE(a.max_abs, 1e-5);
  // Scores differ by input (the head is not constant).
  std::vector<float> out;
  ASSERT_TRUE(fwd.embed(in, &out).ok());
  EXPECT_NE(out[0], out[1]);
}

TEST(EmbedForward, IdenticalAloneAndBatched) {
  for (const char* arch : {"bert", "nomic-bert"}) {
    auto m = synth_encoder(arch, DType::f16);
    ThreadPool pool(2);
    const auto in = random_inputs(m->config().n_vocab, {9, 1, 120, 31, 64, 2}, 5);
    EmbedForward fwd(*m, &pool);
    std::vector<float> all;
    ASSERT_TRUE(fwd.embed(in, &all).ok());
    const size_t d = (size_t)fwd.out_dim();
    for (size_t i = 0; i < in.size(); ++i) {
      std::vector<float> one;
      EmbedForward alone(*m, nullptr);  // and single-threaded
      ASSERT_TRUE(alone.embed(std::span(&in[i], 1), &one).ok());
      EXPECT_EQ(std::memcmp(one.data(), all.data() + i * d, d * sizeof(float)), 0) << arch << " input " << i;
    }
  }
}

TEST(EmbedForward, DecoderPoolsFinalNormedStates) {
  auto m = Model::load(kShared + "/models/arch/mini-qwen3-F16.gguf");
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ((*m)->config().pooling, Pooling::none);
  const auto in = random_inputs((*m)->config().n_vocab, {1, 6, 40}, 6);
  for (Pooling p : {Pooling::last, Pooling::mean}) {
    const Agreement a = compare(**m, **m, in, p);
    EXPECT_GE(a.min_cos, 0.9999) << pooling_name(p);
    EXPECT_LE(a.max_abs, 1e-3) << pooling_name(p);
  }
  // No pooling: not an embedding model.
  EmbedForward none(**m, nullptr);
  std::vector<float> out;
  EXPECT_EQ(none.embed(in, &out).code(), StatusCode::invalid_argument);
}

TEST(EmbedForward, EncoderKeysAndTensorsAreCheckedByName) {
  const fs::path path = fs::temp_directory_path() / ("serval-embed-edit-" + std::to_string(::getpid()) + ".gguf");
  auto vocab = gguf::GgufFile::open(kBertVocab);
  ASSERT_TRUE(vocab.ok());
  SynthOptions opt(*find_synth_shape("bert-tiny"), DType::f32, 3);
  ASSERT_TRUE(write_synthetic_model(opt, *vocab, path.string()).ok());
  auto expect_error = [](const Expected<std::unique_ptr<Model>>& m, const std::string& needle) {
    ASSERT_FALSE(m.ok()) << "loaded, expected: " << needle;
    EXPECT_NE(m.status().message().find(needle), std::string::npos) << m.status().message();
  };
  auto set = [](const std::string& key, gguf::Value v) {
    return [key, v](const std::string& k, gguf::Value* out) {
      if (k == key) *out = v;
      return true;
    };
  };
  // A causal bert changes the math: refused.
  expect_error(test::load_edited_model(path.string(), set("bert.attention.causal", gguf::Value(true))),
               "'bert.attention.causal' = true");
  // Rank pooling without the classification head.
  expect_error(test::load_edited_model(path.string(), set("bert.pooling_type", gguf::Value(uint32_t{4}))),
               "tensor 'cls.weight' (the classification head) is missing");
  // A missing encoder tensor and a misshapen one are named.
  expect_error(test::load_edited_model(path.string(), nullptr,
                                       [](const std::string& n, std::vector<int64_t>*) { return n != "blk.1.attn_output_norm.bias"; }),
               "blk.1.attn_output_norm.bias");
  expect_error(test::load_edited_model(path.string(), nullptr,
                                       [](const std::string& n, std::vector<int64_t>* d) {
                                         if (n == "token_embd_norm.bias") (*d)[0] = 64;
                                         return true;
                                       }),
               "token_embd_norm.bias");
  // An unknown extra tensor (it would change the math) is refused by name.
  expect_error(test::load_edited_model(path.string(), nullptr, nullptr, {}, {{"blk.0.attn_q_norm.weight", {128}}}),
               "blk.0.attn_q_norm.weight");
  // Pooling out of range.
  expect_error(test::load_edited_model(path.string(), set("bert.pooling_type", gguf::Value(uint32_t{9}))),
               "bert.pooling_type");
  fs::remove(path);
  // A decoder cannot be a reranker.
  expect_error(test::load_edited_model(kShared + "/models/arch/mini-qwen3-F16.gguf", nullptr, nullptr,
                                       {{"qwen3.pooling_type", gguf::Value(uint32_t{4})}}),
               "rerankers of the 'qwen3' family are not supported");
}

TEST(EmbedForward, BadInputsAreRefused) {
  auto m = synth_encoder("bert", DType::f32);
  EmbedForward fwd(*m, nullptr);
  std::vector<float> out;
  std::vector<std::vector<TokenId>> empty = {{}};
  EXPECT_NE(fwd.embed(empty, &out).message().find("empty"), std::string::npos);
  std::vector<std::vector<TokenId>> bad = {{1, 30522}};
  EXPECT_NE(fwd.embed(bad, &out).message().find("out of range"), std::string::npos);
  std::vector<std::vector<TokenId>> longer = {std::vector<TokenId>(129, 5)};
  EXPECT_NE(fwd.embed(longer, &out).message().find("positions"), std::string::npos);
}

}  // namespace
}  // namespace serval
