// Model loading: config and weight validation on rewritten copies of a real model.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "gguf/gguf_writer.h"
#include "model/model.h"
#include "model/edited_gguf.h"
#include "model/synthetic.h"

using namespace serval;

namespace {

const std::string kShared = SERVAL_SHARED_DIR;

// Copies stories260K through the writer, letting the test change keys and tensors.
using test::KvEdit;
using test::TensorEdit;

Status load_edited(KvEdit kv_edit, TensorEdit t_edit = nullptr, std::vector<gguf::KeyValue> extra = {}) {
  return test::load_edited_model(kShared + "/models/stories260K.gguf", std::move(kv_edit), std::move(t_edit),
                                 std::move(extra))
      .status();
}

void expect_error(const Status& st, const std::string& needle) {
  ASSERT_FALSE(st.ok()) << "expected an error mentioning '" << needle << "'";
  EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
}

}  // namespace

TEST(ModelLoad, Stories260KConfig) {
  auto m = Model::load(kShared + "/models/stories260K.gguf");
  ASSERT_TRUE(m.ok()) << m.status().message();
  const auto& c = (*m)->config();
  EXPECT_EQ(c.arch, "llama");
  EXPECT_EQ(c.n_vocab, 512);
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.ffn_dim, 172);
  EXPECT_FALSE((*m)->weights().tied_output);
}

TEST(ModelLoad, UnchangedCopyLoads) { EXPECT_TRUE(load_edited(nullptr).ok()); }

TEST(ModelLoad, WrongTypeForKnownKey) {
  expect_error(load_edited([](const std::string& k, gguf::Value* v) {
                 if (k == "llama.embedding_length") *v = gguf::Value("64");
                 return true;
               }),
               "llama.embedding_length': expected an integer, got string");
}

TEST(ModelLoad, UnsupportedArchitecture) {
  expect_error(load_edited([](const std::string& k, gguf::Value* v) {
                 if (k == "general.architecture") *v = gguf::Value("mamba");
                 return true;
               }),
               "unsupported architecture 'mamba'");
}

TEST(ModelLoad, MissingKeyAndOutOfRangeValue) {
  expect_error(load_edited([](const std::string& k, gguf::Value*) { return k != "llama.block_count"; }),
               "llama.block_count' is missing");
  expect_error(load_edited([](const std::string& k, gguf::Value* v) {
                 if (k == "llama.attention.head_count_kv") *v = gguf::Value(uint32_t{3});
                 return true;
               }),
               "does not divide head_count");
  expect_error(load_edited([](const std::string& k, gguf::Value* v) {
                 if (k == "llama.attention.head_count") *v = gguf::Value(uint32_t{0});
                 return true;
               }),
               "llama.attention.head_count': expected a value in [1, 1024], got 0");
}

TEST(ModelLoad, MissingTensorAndWrongShape) {
  expect_error(load_edited(nullptr, [](const std::string& n, std::vector<int64_t>*) { return n != "blk.3.ffn_up.weight"; }),
               "tensor 'blk.3.ffn_up.weight' is missing");
  expect_error(load_edited(nullptr,
                           [](const std::string& n, std::vector<int64_t>* d) {
                             if (n == "blk.0.attn_k.weight") (*d)[1] = 64;
                             return true;
                           }),
               "tensor 'blk.0.attn_k.weight': expected shape [64, 32], got [64, 64]");
}

TEST(ModelLoad, VocabSizeMustMatchEmbedding) {
  expect_error(load_edited([](const std::string& k, gguf::Value* v) {
                 if (k == "tokenizer.ggml.tokens") {
                   auto a = *std::get<std::shared_ptr<const gguf::Array>>(v->v);
                   a.items.pop_back();
                   *v = gguf::Value(std::move(a));
                 }
                 return true;
               }),
               "expected 512 tokens");
}

TEST(ModelLoad, SyntheticTinyModelLoadsAndRuns) {
  auto vocab = gguf::GgufFile::open(kShared + "/models/stories260K.gguf");
  ASSERT_TRUE(vocab.ok());
  auto shape = find_synth_shape("tiny");
  ASSERT_TRUE(shape.ok());
  const std::string path = ::testing::TempDir() + "/serval_synth_tiny.gguf";
  for (DType t : {DType::f16, DType::q8_0, DType::q4_k}) {
    ASSERT_TRUE(write_synthetic_model({*shape, t, 7}, *vocab, path).ok()) << dtype_name(t);
    auto m = Model::load(path);
    ASSERT_TRUE(m.ok()) << m.status().message();
    EXPECT_EQ((*m)->config().dim, 256);
    EXPECT_EQ((*m)->config().n_vocab, 512);
    EXPECT_EQ((*m)->weights().layers[1].w_down.type, t);
  }
  // llama.cpp's Q4_K_M mix: with 2 layers use_more_bits() picks layer 1 only.
  SynthOptions mix{*shape, DType::q4_k, 7};
  mix.q4_k_m = true;
  ASSERT_TRUE(write_synthetic_model(mix, *vocab, path).ok());
  {
    auto m = Model::load(path);
    ASSERT_TRUE(m.ok()) << m.status().message();
    const ModelWeights& w = (*m)->weights();
    EXPECT_EQ(w.output.type, DType::q6_k);
    EXPECT_EQ(w.layers[0].w_down.type, DType::q4_k);
    EXPECT_EQ(w.layers[0].wv.type, DType::q4_k);
    EXPECT_EQ(w.layers[1].w_down.type, DType::q6_k);
    EXPECT_EQ(w.layers[1].wv.type, DType::q6_k);
    EXPECT_EQ(w.layers[1].wq.type, DType::q4_k);
  }
  mix.type = DType::q8_0;
  EXPECT_FALSE(write_synthetic_model(mix, *vocab, path).ok());
  std::remove(path.c_str());
  EXPECT_FALSE(find_synth_shape("gpt-5").ok());
}

// ---- crafted model files: absurd hyper-parameters and shapes that disagree --
// Each is refused with a message naming the key or tensor (and runs clean
// under ASan/UBSan: no allocation sized from an unchecked value).

namespace {

struct Crafted {
  const char* name;
  KvEdit kv;
  TensorEdit tensors;
  const char* expect;  // substring of the error message
  std::vector<gguf::KeyValue> extra = {};  // keys stories260K lacks
};

KvEdit set_key(std::string key, gguf::Value value) {
  return [key, value](const std::string& k, gguf::Value* v) {
    if (k == key) *v = value;
    return true;
  };
}

TensorEdit set_dims(std::string name, std::vector<int64_t> dims) {
  return [name, dims](const std::string& n, std::vector<int64_t>* d) {
    if (n == name) *d = dims;
    return true;
  };
}

}  // namespace

class ModelCrafted : public ::testing::TestWithParam<Crafted> {};

TEST_P(ModelCrafted, RefusedWithMessage) {
  const Crafted& c = GetParam();
  expect_error(load_edited(c.kv, c.tensors, c.extra), c.expect);
}

INSTANTIATE_TEST_SUITE_P(
    Table, ModelCrafted,
    ::testing::Values(
        Crafted{"block_count_2_31", set_key("llama.block_count", gguf::Value(uint32_t{1u << 31})), nullptr,
                "llama.block_count': expected a value in [1, 1024], got 2147483648"},
        Crafted{"block_count_u64_max", set_key("llama.block_count", gguf::Value(~uint64_t{0})), nullptr,
                "llama.block_count"},
        Crafted{"block_count_negative", set_key("llama.block_count", gguf::Value(int32_t{-1})), nullptr,
                "llama.block_count': expected a value in [1, 1024], got -1"},
        Crafted{"block_count_past_the_tensors", set_key("llama.block_count", gguf::Value(uint32_t{6})), nullptr,
                "tensor 'blk.5."},
        Crafted{"head_count_2_20", set_key("llama.attention.head_count", gguf::Value(uint32_t{1u << 20})), nullptr,
                "llama.attention.head_count': expected a value in [1, 1024]"},
        Crafted{"head_count_kv_above_head_count",
                set_key("llama.attention.head_count_kv", gguf::Value(uint32_t{16})), nullptr,
                "llama.attention.head_count_kv': expected a value in [1, 8], got 16"},
        Crafted{"head_count_not_dividing_dim", set_key("llama.attention.head_count", gguf::Value(uint32_t{7})), nullptr,
                "head_count_kv': 4 does not divide head_count 7"},
        Crafted{"key_length_2_30", nullptr, nullptr, "llama.attention.key_length': expected a value in [2, 4096]",
                {{"llama.attention.key_length", gguf::Value(uint32_t{1u << 30})}}},
        Crafted{"key_length_disagrees_with_tensors", nullptr, nullptr, "expected shape",
                {{"llama.attention.key_length", gguf::Value(uint32_t{16})}}},
        Crafted{"embedding_length_2_40", set_key("llama.embedding_length", gguf::Value(uint64_t{1} << 40)), nullptr,
                "llama.embedding_length': expected a value in [1, 65536]"},
        Crafted{"embedding_length_disagrees", set_key("llama.embedding_length", gguf::Value(uint32_t{128})), nullptr,
                "expected shape"},
        Crafted{"feed_forward_length_disagrees", set_key("llama.feed_forward_length", gguf::Value(uint32_t{173})),
                nullptr, "expected shape"},
        Crafted{"context_length_2_62", set_key("llama.context_length", gguf::Value(uint64_t{1} << 62)), nullptr,
                "llama.context_length': expected a value in [1, 16777216]"},
        Crafted{"rms_eps_nan", set_key("llama.attention.layer_norm_rms_epsilon", gguf::Value(std::nanf(""))), nullptr,
                "layer_norm_rms_epsilon"},
        Crafted{"rope_freq_base_negative", nullptr, nullptr, "llama.rope.freq_base': expected a value in",
                {{"llama.rope.freq_base", gguf::Value(-1.0f)}}},
        Crafted{"token_embd_transposed", nullptr, set_dims("token_embd.weight", {512, 64}), "token_embd.weight"},
        Crafted{"output_vocab_disagrees", nullptr, set_dims("output.weight", {64, 511}), "output.weight"},
        Crafted{"attn_q_extra_dim", nullptr, set_dims("blk.0.attn_q.weight", {64, 64, 2}), "blk.0.attn_q.weight"},
        Crafted{"ffn_down_transposed", nullptr, set_dims("blk.2.ffn_down.weight", {64, 172}), "blk.2.ffn_down.weight"},
        Crafted{"norm_is_a_matrix", nullptr, set_dims("blk.1.attn_norm.weight", {64, 2}), "blk.1.attn_norm.weight"}),
    [](const ::testing::TestParamInfo<Crafted>& i) { return std::string(i.param.name); });
