// Loading the families (model/families/): each arch file's hyper-parameters
// and block recipe as llama.cpp reads them; Llama 3's rope_freqs changes the
// output; and every tensor or key that would change the math but that the
// family does not apply is refused by name, like a missing or misshapen
// tensor and an unsupported architecture.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <numeric>

#include "model/batch_forward.h"
#include "model/edited_gguf.h"
#include "model/model.h"
#include "model/teacher_forcing.h"

using namespace serval;

namespace {

const std::string kArch = std::string(SERVAL_SHARED_DIR) + "/models/arch/";

using test::KvEdit;
using test::TensorEdit;

// A copy of an arch file with keys and tensors edited, extra keys and extra
// F32 tensors (zeros) added, loaded from memory.
Expected<std::unique_ptr<Model>> load_edited(const std::string& file, KvEdit kv_edit, TensorEdit t_edit = nullptr,
                                             std::vector<gguf::KeyValue> extra = {},
                                             std::vector<std::pair<std::string, std::vector<int64_t>>> extra_tensors = {}) {
  return test::load_edited_model(kArch + file, std::move(kv_edit), std::move(t_edit), std::move(extra),
                                 std::move(extra_tensors));
}

void expect_error(const Expected<std::unique_ptr<Model>>& m, const std::string& needle) {
  ASSERT_FALSE(m.ok()) << "expected an error mentioning '" << needle << "'";
  EXPECT_NE(m.status().message().find(needle), std::string::npos) << m.status().message();
}

KvEdit set_key(std::string key, gguf::Value value) {
  return [key, value](const std::string& k, gguf::Value* v) {
    if (k == key) *v = value;
    return true;
  };
}

TensorEdit drop(std::string name) {
  return [name](const std::string& n, std::vector<int64_t>*) { return n != name; };
}

}  // namespace

TEST(FamilyLoad, ConfigsAsLlamaCppReadsThem) {
  {
    auto m = Model::load(kArch + "mini-llama3-F16.gguf");
    ASSERT_TRUE(m.ok()) << m.status().message();
    const auto& c = (*m)->config();
    EXPECT_EQ(c.arch, "llama");
    EXPECT_EQ(c.rope.layout, ref::RopeLayout::adjacent);
    EXPECT_EQ(c.rope.freq_base, 500000.0f);
    ASSERT_EQ((*m)->weights().rope_factors.size(), 32u);
    EXPECT_FALSE(c.has_swa());
  }
  {
    auto m = Model::load(kArch + "mini-qwen3-F16.gguf");
    ASSERT_TRUE(m.ok()) << m.status().message();
    const auto& c = (*m)->config();
    EXPECT_EQ(c.head_dim, 128);
    EXPECT_EQ(c.q_dim(), 1024);
    EXPECT_TRUE(c.block.qk_norm);
    EXPECT_EQ(c.rope.layout, ref::RopeLayout::neox);
    EXPECT_TRUE((*m)->weights().tied_output);
  }
  {
    auto m = Model::load(kArch + "mini-gemma3-F16.gguf");
    ASSERT_TRUE(m.ok()) << m.status().message();
    const auto& c = (*m)->config();
    EXPECT_EQ(c.layer_swa, (std::vector<uint8_t>{1, 1, 1, 1, 1, 0}));
    EXPECT_EQ(c.sliding_window, 32);
    EXPECT_EQ(c.rope.freq_base, 1e6f);
    EXPECT_FLOAT_EQ(c.rope.freq_scale, 1.0f / 8.0f);
    EXPECT_EQ(c.rope_swa.freq_base, 10000.0f);
    EXPECT_EQ(c.rope_swa.freq_scale, 1.0f);
    EXPECT_FLOAT_EQ(c.embd_scale, 16.0f);
    EXPECT_TRUE(c.block.post_attn_norm && c.block.post_ffn_norm && c.block.qk_norm);
    EXPECT_EQ(c.block.act, FfnActivation::gelu_tanh);
    EXPECT_EQ(c.attn_softcap, 0.0f);
  }
  {
    auto m = Model::load(kArch + "mini-phi3-F16.gguf");
    ASSERT_TRUE(m.ok()) << m.status().message();
    const auto& c = (*m)->config();
    const auto& l = (*m)->weights().layers[0];
    // Fused tensors are split into views of their row ranges (in the file: Q, K, V; gate, up).
    EXPECT_EQ(l.wq.rows, 512);
    EXPECT_EQ(l.wk.rows, 256);
    EXPECT_EQ(l.wv.rows, 256);
    EXPECT_EQ(l.wk.data, l.wq.data + 512 * row_size(l.wq.type, 512));
    EXPECT_EQ(l.w_up.data, l.w_gate.data + 1536 * row_size(l.w_gate.type, 512));
    EXPECT_EQ(c.sliding_window, 2047);
    EXPECT_TRUE(c.has_swa());
  }
}

// The Llama 3.1 frequency factors change the output (an engine that ignored
// them was off by 0.08 on average against llama.cpp): without the tensor the
// teacher-forced log-probs move far from the goldens' bounds.
TEST(FamilyLoad, Llama3RopeFreqsAreApplied) {
  auto with = Model::load(kArch + "mini-llama3-F16.gguf");
  auto without = load_edited("mini-llama3-F16.gguf", nullptr, drop("rope_freqs.weight"));
  ASSERT_TRUE(with.ok() && without.ok());
  std::vector<TokenId> toks(60);
  std::iota(toks.begin(), toks.end(), 3);
  const auto a = test::forward_all(**with, KvType::f32, toks, 60);
  const auto b = test::forward_all(**without, KvType::f32, toks, 60);
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, (double)std::fabs(a[i] - b[i]));
  EXPECT_GT(worst, 0.05) << "rope_freqs made no difference";
}

TEST(FamilyLoad, UnusedTensorsAreRefusedByName) {
  // Q/K/V biases on a family without them (qwen2 has them, llama does not).
  expect_error(load_edited("mini-llama3-F16.gguf", nullptr, nullptr, {}, {{"blk.0.attn_q.bias", {512}}}),
               "tensor 'blk.0.attn_q.bias' is not used by the 'llama' family");
  // q/k norms on llama; post-norms on qwen3; an unknown tensor anywhere.
  expect_error(load_edited("mini-llama3-F16.gguf", nullptr, nullptr, {}, {{"blk.1.attn_k_norm.weight", {64}}}),
               "blk.1.attn_k_norm.weight");
  expect_error(load_edited("mini-qwen3-F16.gguf", nullptr, nullptr, {}, {{"blk.0.post_ffw_norm.weight", {512}}}),
               "blk.0.post_ffw_norm.weight");
  expect_error(load_edited("mini-phi3-F16.gguf", nullptr, nullptr, {}, {{"blk.0.something_new.weight", {8}}}),
               "'blk.0.something_new.weight' is not used by the 'phi3' family");
}

TEST(FamilyLoad, MissingAndMisshapenTensorsAreNamed) {
  expect_error(load_edited("mini-gemma3-F16.gguf", nullptr, drop("blk.1.post_ffw_norm.weight")),
               "tensor 'blk.1.post_ffw_norm.weight' is missing");
  expect_error(load_edited("mini-qwen3-F16.gguf", nullptr, drop("blk.0.attn_q_norm.weight")),
               "tensor 'blk.0.attn_q_norm.weight' is missing");
  expect_error(load_edited("mini-gemma3-F16.gguf", nullptr,
                           [](const std::string& n, std::vector<int64_t>* d) {
                             if (n == "blk.2.attn_k_norm.weight") *d = {32};
                             return true;
                           }),
               "tensor 'blk.2.attn_k_norm.weight': expected shape [64], got [32]");
  // The fused QKV of phi3 must hold q_dim + 2 kv_dim rows.
  expect_error(load_edited("mini-phi3-F16.gguf", set_key("phi3.attention.head_count_kv", gguf::Value(uint32_t{8}))),
               "tensor 'blk.0.attn_qkv.weight': expected shape [512, 1536]");
}

TEST(FamilyLoad, KeysThatChangeTheMathAreAppliedOrRefused) {
  expect_error(load_edited("mini-llama3-F16.gguf", nullptr, nullptr, {{"llama.logit_scale", gguf::Value(0.5f)}}),
               "metadata key 'llama.logit_scale'");
  expect_error(
      load_edited("mini-qwen3-F16.gguf", nullptr, nullptr, {{"qwen3.attn_logit_softcapping", gguf::Value(30.0f)}}),
      "'qwen3.attn_logit_softcapping' = 30");
  expect_error(load_edited("mini-llama3-F16.gguf", nullptr, nullptr,
                           {{"llama.rope.scaling.type", gguf::Value(std::string("llama4"))}}),
               "rope.scaling.type' = 'llama4' is not supported");
  // Neutral values are fine.
  EXPECT_TRUE(load_edited("mini-llama3-F16.gguf", nullptr, nullptr, {{"llama.logit_scale", gguf::Value(1.0f)}}).ok());
  // A window the llama family does not use: loads (as in llama.cpp) with a warning naming the key.
  auto m = load_edited("mini-llama3-F16.gguf", nullptr, nullptr, {{"llama.attention.sliding_window", gguf::Value(uint32_t{4096})}});
  ASSERT_TRUE(m.ok()) << m.status().message();
  ASSERT_EQ((*m)->warnings().size(), 1u);
  EXPECT_NE((*m)->warnings()[0].find("llama.attention.sliding_window"), std::string::npos);
  EXPECT_FALSE((*m)->config().has_swa());
}

TEST(FamilyLoad, UnsupportedArchitecturesAreNamed) {
  expect_error(load_edited("mini-llama3-F16.gguf", set_key("general.architecture", gguf::Value(std::string("mamba")))),
               "unsupported architecture 'mamba' (supported: llama, qwen2, qwen3, qwen3moe, gemma2, gemma3, phi3, gpt-oss, "
               "bert, nomic-bert)");
  // Experts on a family without them.
  expect_error(load_edited("mini-qwen3-F16.gguf", nullptr, nullptr, {{"qwen3.expert_count", gguf::Value(uint32_t{8})}}),
               "mixture-of-experts 'qwen3' models are not supported");
}

TEST(FamilyLoad, MixtureOfExpertsConfigs) {
  for (const char* f : {"mini-qwen3moe-F16.gguf", "mini-mixtral-F16.gguf", "mini-gpt-oss-F16.gguf"}) {
    auto m = Model::load(kArch + f);
    ASSERT_TRUE(m.ok()) << f << ": " << m.status().message();
    const auto& c = (*m)->config();
    EXPECT_TRUE(c.block.moe) << f;
    EXPECT_EQ(c.n_expert, 8) << f;
    EXPECT_EQ(c.n_expert_used, 2) << f;
    EXPECT_EQ((*m)->weights().layers[1].exp_down.size(), 8u) << f;
  }
  auto g = Model::load(kArch + "mini-gpt-oss-F16.gguf");
  ASSERT_TRUE(g.ok());
  const auto& c = (*g)->config();
  EXPECT_EQ(c.block.gating, MoeGating::softmax_of_topk);
  EXPECT_EQ(c.block.act, FfnActivation::swiglu_oai);
  EXPECT_TRUE(c.block.attn_sinks && c.block.attn_out_bias && c.block.moe_biases);
  EXPECT_EQ(c.layer_swa, (std::vector<uint8_t>{1, 0}));
  EXPECT_EQ(c.rope.ext_factor, 1.0f);  // YaRN
  EXPECT_FLOAT_EQ(c.rope.freq_scale, 1.0f / 32.0f);
  EXPECT_EQ((*g)->weights().layers[0].sinks.size(), 8u);
}

// Bad expert hyper-parameters and expert tensors of the wrong shape get an
// error naming the key or tensor.
TEST(FamilyLoad, BadExpertKeysAndTensorsAreNamed) {
  const std::string f = "mini-qwen3moe-F16.gguf";
  expect_error(load_edited(f, set_key("qwen3moe.expert_count", gguf::Value(uint32_t{0}))),
               "qwen3moe.expert_count': expected a value in [1, 1024], got 0");
  expect_error(load_edited(f, set_key("qwen3moe.expert_count", gguf::Value(uint32_t{1u << 20}))),
               "qwen3moe.expert_count': expected a value in [1, 1024]");
  expect_error(load_edited(f, set_key("qwen3moe.expert_used_count", gguf::Value(uint32_t{9}))),
               "qwen3moe.expert_used_count': expected a value in [1, 8], got 9");
  expect_error(load_edited(f, set_key("qwen3moe.expert_count", gguf::Value(uint32_t{4}))),
               "tensor 'blk.0.ffn_gate_inp.weight': expected shape [512, 4]");
  expect_error(load_edited(f, set_key("qwen3moe.expert_feed_forward_length", gguf::Value(uint32_t{128}))),
               "tensor 'blk.0.ffn_gate_exps.weight': expected shape [512, 128, 8]");
  expect_error(load_edited(f, nullptr, drop("blk.1.ffn_down_exps.weight")),
               "tensor 'blk.1.ffn_down_exps.weight' is missing");
  expect_error(load_edited("mini-gpt-oss-F16.gguf", nullptr, drop("blk.0.attn_sinks.weight")),
               "tensor 'blk.0.attn_sinks.weight' is missing");
}
