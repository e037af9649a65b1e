// LoRA adapters (model/lora.h): an adapter applied at run time against the
// same adapter merged into the weights the obvious way (merged_matrix, in
// double), a mixed-adapter batch against each sequence run alone (bit for
// bit), and the adapters that must be refused, by name.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include "gguf/gguf_writer.h"
#include "model/batch_forward.h"
#include "model/lora.h"
#include "model/synthetic.h"

using namespace serval;

namespace {

const std::string kShared = SERVAL_SHARED_DIR;
const std::string kBase = kShared + "/models/stories260K.gguf";  // F32, untied output

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("serval-lora-" + std::to_string(::getpid()) + "-" + std::to_string(std::random_device{}()) + "-" + name))
      .string();
}

struct Files {
  std::vector<std::string> paths;
  std::string add(const std::string& name) {
    paths.push_back(temp_path(name));
    return paths.back();
  }
  ~Files() {
    for (const auto& p : paths) std::remove(p.c_str());
  }
};

std::unique_ptr<Model> load(const std::string& p) {
  auto m = Model::load(p);
  EXPECT_TRUE(m.ok()) << m.status().message();
  return m.ok() ? std::move(m.value()) : nullptr;
}

std::string synth_lora(Files& fs, const std::string& name, SynthLoraOptions o) {
  auto base = gguf::GgufFile::open(kBase);
  EXPECT_TRUE(base.ok());
  const std::string p = fs.add(name);
  Status st = write_synthetic_lora(o, *base, p);
  EXPECT_TRUE(st.ok()) << st.message();
  return p;
}

// Logits after each token of `toks` fed one chunk, for one sequence.
std::vector<float> run(const Model& m, const std::vector<TokenId>& toks, const LoraAdapter* lora, ThreadPool* pool) {
  const auto& c = m.config();
  auto kv = KvStorage::create({(int32_t)c.n_layers, (int32_t)c.kv_dim(), 16}, 4);
  EXPECT_TRUE(kv.ok());
  BatchForward bf(m, *kv, pool);
  std::vector<BlockId> table = {0, 1, 2, 3};
  Batch b;
  b.tokens = toks;
  BatchSeq s(0, (int32_t)toks.size(), table, true, (int32_t)toks.size());
  s.lora = lora;
  b.seqs.push_back(s);
  std::vector<float> logits;
  EXPECT_TRUE(bf.forward(b, &logits).ok());
  return logits;
}

std::vector<double> log_softmax(const float* x, size_t n) {
  double mx = x[0];
  for (size_t i = 1; i < n; ++i) mx = std::max(mx, (double)x[i]);
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += std::exp((double)x[i] - mx);
  std::vector<double> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = (double)x[i] - mx - std::log(s);
  return out;
}

const std::vector<TokenId> kPrompt = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 300, 280, 290};

}  // namespace

void check_against_merged(DType type) {
  Files fs;
  SynthLoraOptions o;
  o.type = type;
  o.rank = 8;
  o.alpha = 16;
  o.std_b = 0.05f;
  o.targets.push_back("output");
  const std::string lp = synth_lora(fs, "a.gguf", o);
  auto base = load(kBase);
  ASSERT_TRUE(base);
  auto a = LoraAdapter::load(lp, *base, 0.75f);
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ((*a)->n_matrices(), 5u * 7 + 1);
  EXPECT_EQ((*a)->deltas().begin()->second.f16, type == DType::f16);
  EXPECT_FLOAT_EQ((*a)->scale(), 0.75f * 16 / 8);
  const std::string merged_path = fs.add("merged.gguf");
  ASSERT_TRUE(write_merged_model(*base, **a, merged_path).ok());
  auto merged = load(merged_path);
  ASSERT_TRUE(merged);

  ThreadPool pool(2);
  const auto with = run(*base, kPrompt, a->get(), &pool);
  const auto plain = run(*base, kPrompt, nullptr, &pool);
  const auto ref = run(*merged, kPrompt, nullptr, &pool);
  const size_t nv = (size_t)base->config().n_vocab;
  ASSERT_EQ(with.size(), kPrompt.size() * nv);
  double max_err = 0, max_change = 0;
  for (size_t t = 0; t < kPrompt.size(); ++t) {
    const auto lw = log_softmax(with.data() + t * nv, nv), lr = log_softmax(ref.data() + t * nv, nv),
               lp0 = log_softmax(plain.data() + t * nv, nv);
    for (size_t i = 0; i < nv; ++i) {
      max_err = std::max(max_err, std::abs(lw[i] - lr[i]));
      max_change = std::max(max_change, std::abs(lw[i] - lp0[i]));
    }
  }
  std::printf("%s adapter vs merged: max |d log-prob| %.2e; adapter vs base: %.3f\n",
              std::string(dtype_name(type)).c_str(), max_err, max_change);
  EXPECT_LE(max_err, 1e-4) << "adapter vs merged log-probs";
  EXPECT_GE(max_change, 0.05) << "the adapter must change the output for the comparison to mean anything";
}

TEST(Lora, AdapterEqualsTheMergedModel) { check_against_merged(DType::f32); }
TEST(Lora, F16AdapterEqualsTheMergedModel) { check_against_merged(DType::f16); }

TEST(Lora, MixedAdapterBatchIsBitIdenticalToSoloRuns) {
  Files fs;
  auto base = load(kBase);
  ASSERT_TRUE(base);
  std::vector<std::shared_ptr<const LoraAdapter>> ads;
  for (int i = 0; i < 3; ++i) {
    SynthLoraOptions o;
    o.rank = 4 + 4 * i;
    o.seed = 100 + (uint64_t)i;
    o.std_b = 0.05f;
    if (i == 2) o.targets = {"attn_v", "ffn_down", "output"};
    if (i == 1) o.type = DType::f16;  // kept in F16 (lora_row_f16)
    auto a = LoraAdapter::load(synth_lora(fs, "m" + std::to_string(i) + ".gguf", o), *base);
    ASSERT_TRUE(a.ok()) << a.status().message();
    ads.push_back(*a);
  }
  ThreadPool pool(2);
  const auto& c = base->config();
  const size_t nv = (size_t)c.n_vocab;
  // 8 sequences: adapters 0,1,2, the base, 0,1,2, the base; prompts of different lengths.
  const int n_seq = 8;
  std::vector<std::vector<TokenId>> prompts;
  std::vector<const LoraAdapter*> which;
  for (int s = 0; s < n_seq; ++s) {
    std::vector<TokenId> p(kPrompt.begin(), kPrompt.begin() + 6 + s);
    p[1] = (TokenId)(300 + s);
    prompts.push_back(p);
    which.push_back(s % 4 == 3 ? nullptr : ads[(size_t)(s % 4)].get());
  }
  std::vector<std::vector<float>> solo;
  for (int s = 0; s < n_seq; ++s) {
    auto l = run(*base, prompts[(size_t)s], which[(size_t)s], &pool);
    solo.emplace_back(l.end() - (long)nv, l.end());  // the last token's row
  }
  auto kv = KvStorage::create({(int32_t)c.n_layers, (int32_t)c.kv_dim(), 16}, 2 * n_seq);
  ASSERT_TRUE(kv.ok());
  BatchForward bf(*base, *kv, &pool);
  std::vector<std::vector<BlockId>> tables;
  for (int s = 0; s < n_seq; ++s) tables.push_back({(BlockId)(2 * s), (BlockId)(2 * s + 1)});
  Batch b;
  for (int s = 0; s < n_seq; ++s) {
    b.tokens.insert(b.tokens.end(), prompts[(size_t)s].begin(), prompts[(size_t)s].end());
    BatchSeq bs(0, (int32_t)prompts[(size_t)s].size(), tables[(size_t)s], true);
    bs.lora = which[(size_t)s];
    b.seqs.push_back(bs);
  }
  std::vector<float> logits;
  ASSERT_TRUE(bf.forward(b, &logits).ok());
  ASSERT_EQ(logits.size(), n_seq * nv);
  for (int s = 0; s < n_seq; ++s)
    EXPECT_EQ(std::memcmp(logits.data() + s * nv, solo[(size_t)s].data(), nv * 4), 0) << "sequence " << s;
  // Different adapters really give different outputs.
  EXPECT_NE(std::memcmp(solo[0].data(), solo[3].data(), nv * 4), 0);
}

// Adapter files copied through the writer with one edit each.
TEST(Lora, BadAdaptersAreRefusedNamingTheProblem) {
  Files fs;
  auto base = load(kBase);
  ASSERT_TRUE(base);
  SynthLoraOptions o;
  o.rank = 4;
  const std::string good = synth_lora(fs, "good.gguf", o);
  auto src = gguf::GgufFile::open(good);
  ASSERT_TRUE(src.ok());
  using KvFn = std::function<bool(const std::string&, gguf::Value*)>;
  using TFn = std::function<bool(const std::string&, std::vector<int64_t>*)>;
  auto edited = [&](KvFn kv_edit, TFn t_edit,
                    std::vector<std::pair<std::string, std::vector<int64_t>>> extra = {}) -> std::string {
    gguf::GgufWriter w;
    for (const auto& kv : src->metadata()) {
      gguf::Value v = kv.value;
      if (!kv_edit || kv_edit(kv.key, &v)) w.add(kv.key, v);
    }
    for (const auto& t : src->tensors()) {
      auto dims = t.dims;
      if (t_edit && !t_edit(t.name, &dims)) continue;
      auto d = src->tensor_data(t);
      std::vector<uint8_t> bytes(d.begin(), d.end());
      uint64_t ne = 1;
      for (auto x : dims) ne *= (uint64_t)x;
      bytes.resize(ne * 4);
      w.add_tensor(t.name, dims, t.type, std::move(bytes));
    }
    for (const auto& [name, dims] : extra) {
      uint64_t ne = 1;
      for (auto x : dims) ne *= (uint64_t)x;
      w.add_tensor(name, dims, DType::f32, std::vector<uint8_t>(ne * 4, 0));
    }
    const std::string p = fs.add("bad.gguf");
    EXPECT_TRUE(w.write_file(p).ok());
    return p;
  };
  auto refused = [&](const std::string& path, const std::string& needle) {
    auto a = LoraAdapter::load(path, *base);
    ASSERT_FALSE(a.ok()) << needle;
    EXPECT_NE(a.status().message().find(needle), std::string::npos) << a.status().message();
  };
  refused(edited([](const std::string& k, gguf::Value* v) {
            if (k == "general.architecture") *v = std::string("qwen2");
            return true;
          }, nullptr),
          "LoRA adapter for architecture 'qwen2', the base model is 'llama'");
  refused(edited([](const std::string& k, gguf::Value*) { return k != "adapter.type"; }, nullptr), "adapter.type");
  refused(edited(nullptr, [](const std::string& n, std::vector<int64_t>* d) {
            if (n == "blk.2.ffn_up.weight.lora_a") (*d)[0] = 32;
            return true;
          }),
          "LoRA tensor 'blk.2.ffn_up.weight': shape A [32, 4]");
  refused(edited(nullptr, [](const std::string& n, std::vector<int64_t>*) { return n != "blk.1.attn_k.weight.lora_b"; }),
          "'blk.1.attn_k.weight.lora_b'");
  refused(edited(nullptr, nullptr, {{"token_embd.weight.lora_a", {64, 4}}, {"token_embd.weight.lora_b", {4, 512}}}),
          "no adaptable matrix 'token_embd.weight'");
  refused(edited(nullptr, nullptr, {{"blk.9.attn_q.weight.lora_a", {64, 4}}, {"blk.9.attn_q.weight.lora_b", {4, 64}}}),
          "'blk.9.attn_q.weight'");
  refused(kBase, "general.type");  // a model, not an adapter
  EXPECT_FALSE(LoraAdapter::load(good, *base, std::nanf("")).ok());
}
