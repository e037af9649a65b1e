// Model loading: config and weight validation on rewritten copies of a real model.
#include <gtest/gtest.h>

#include <functional>

#include "gguf/gguf_writer.h"
#include "model/model.h"
#include "model/synthetic.h"

using namespace serval;

namespace {

const std::string kShared = SERVAL_SHARED_DIR;

// Copies stories260K through the writer, letting the test change keys and tensors.
using KvEdit = std::function<bool(const std::string& key, gguf::Value* v)>;  // false = drop
using TensorEdit = std::function<bool(const std::string& name, std::vector<int64_t>* dims)>;

Status load_edited(KvEdit kv_edit, TensorEdit t_edit = nullptr, std::vector<gguf::KeyValue> extra = {}) {
  auto src = gguf::GgufFile::open(kShared + "/models/stories260K.gguf");
  EXPECT_TRUE(src.ok());
  gguf::GgufWriter w;
  for (const auto& kv : src->metadata()) {
    gguf::Value v = kv.value;
    if (!kv_edit || kv_edit(kv.key, &v)) w.add(kv.key, v);
  }
  for (auto& kv : extra) w.add(kv.key, kv.value);
  for (const auto& t : src->tensors()) {
    auto dims = t.dims;
    if (t_edit && !t_edit(t.name, &dims)) continue;
    auto data = src->tensor_data(t);
    std::vector<uint8_t> bytes(data.begin(), data.end());
    uint64_t n = 1;
    for (auto d : dims) n *= (uint64_t)d;
    bytes.resize(n * 4);  // F32 model
    w.add_tensor(t.name, dims, t.type, std::move(bytes));
  }
  auto img = w.serialize();
  EXPECT_TRUE(img.ok());
  auto f = gguf::GgufFile::parse(*img);
  if (!f.ok()) return f.status();
  auto m = Model::from_file(std::move(f.value()));
  return m.status();
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
  EXPECT_EQ(c.arch.name, "llama");
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
  std::remove(path.c_str());
  EXPECT_FALSE(find_synth_shape("gpt-5").ok());
}
