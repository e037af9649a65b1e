// Engine::embed: embedding calls batched through the engine loop (many inputs
// per step, split over steps by the token budget) give exactly what the
// embedding forward gives each input alone, next to generation.
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>
#include <unistd.h>

#include "engine_test_util.h"
#include "model/embed_forward.h"
#include "model/synthetic.h"

namespace serval {
namespace {

namespace fs = std::filesystem;

const Loaded& bert_tiny() {
  static Loaded x = [] {
    const fs::path path = fs::temp_directory_path() / ("serval-engine-embed-" + std::to_string(::getpid()) + ".gguf");
    auto vocab = gguf::GgufFile::open(kShared + "/tokenizer-vectors/ggml-vocab-bert-bge.gguf");
    EXPECT_TRUE(vocab.ok());
    SynthOptions opt(*find_synth_shape("bert-tiny"), DType::f16, 11);
    EXPECT_TRUE(write_synthetic_model(opt, *vocab, path.string()).ok());
    Loaded l;
    auto m = Model::load(path.string());
    EXPECT_TRUE(m.ok()) << m.status().message();
    fs::remove(path);
    l.model = std::shared_ptr<const Model>(std::move(m.value()));
    auto t = Tokenizer::from_gguf(l.model->file());
    EXPECT_TRUE(t.ok());
    l.tok = std::make_unique<Tokenizer>(std::move(t.value()));
    return l;
  }();
  return x;
}

std::vector<std::vector<TokenId>> inputs(int n, int max_len, int64_t n_vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<TokenId>> in((size_t)n);
  for (auto& v : in) {
    const int len = 1 + (int)(rng() % (uint32_t)max_len);
    for (int i = 0; i < len; ++i) v.push_back((TokenId)(rng() % (uint32_t)n_vocab));
  }
  return in;
}

TEST(EngineEmbed, ConcurrentCallsMatchTheForwardAlone) {
  const Loaded& b = bert_tiny();
  EngineConfig cfg;
  cfg.n_threads = 2;
  cfg.max_batch_tokens = 100;  // several steps per call
  auto e = Engine::create(b.model, *b.tok, cfg);
  ASSERT_TRUE(e.ok()) << e.status().message();
  const EngineInfo info = (*e)->info();
  EXPECT_FALSE(info.generates);
  EXPECT_EQ(info.pooling, Pooling::mean);
  EXPECT_EQ(info.embedding_dim, b.model->config().dim);

  std::vector<std::vector<std::vector<TokenId>>> calls;
  for (uint32_t c = 0; c < 4; ++c) calls.push_back(inputs(12 + (int)c, 120, b.model->config().n_vocab, 100 + c));
  std::vector<std::shared_ptr<EmbedHandle>> handles(calls.size());
  std::vector<std::thread> th;
  for (size_t c = 0; c < calls.size(); ++c)
    th.emplace_back([&, c] {
      auto h = (*e)->embed(EmbedRequest{calls[c]});
      ASSERT_TRUE(h.ok()) << h.status().message();
      handles[c] = *h;
    });
  for (auto& t : th) t.join();
  EmbedForward alone(*b.model, nullptr);
  for (size_t c = 0; c < calls.size(); ++c) {
    ASSERT_TRUE(handles[c]);
    ASSERT_TRUE(handles[c]->wait(60000));
    ASSERT_TRUE(handles[c]->error.ok()) << handles[c]->error.message();
    const size_t d = (size_t)handles[c]->dim;
    ASSERT_EQ(handles[c]->data.size(), calls[c].size() * d);
    for (size_t i = 0; i < calls[c].size(); ++i) {
      std::vector<float> one;
      ASSERT_TRUE(alone.embed(std::span(&calls[c][i], 1), &one).ok());
      EXPECT_EQ(std::memcmp(one.data(), handles[c]->data.data() + i * d, d * sizeof(float)), 0) << c << "/" << i;
    }
  }
  const EngineStats st = (*e)->stats();
  int64_t n_inputs = 0;
  for (const auto& c : calls) n_inputs += (int64_t)c.size();
  EXPECT_EQ(st.embed_inputs, n_inputs);
  EXPECT_GT(st.embed_steps, 4);  // the budget split the calls
}

TEST(EngineEmbed, EncodersDoNotGenerateAndBadCallsAreRefused) {
  const Loaded& b = bert_tiny();
  EngineConfig cfg;
  cfg.max_embed_inputs = 8;
  auto e = Engine::create(b.model, *b.tok, cfg);
  ASSERT_TRUE(e.ok());
  Request r;
  r.prompt = {101, 2000, 102};
  auto s = (*e)->submit(r);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("embedding model"), std::string::npos);
  EXPECT_NE((*e)->embed(EmbedRequest{}).status().message().find("input"), std::string::npos);
  EXPECT_NE((*e)->embed(EmbedRequest{{{}}}).status().message().find("input[0]"), std::string::npos);
  EXPECT_NE((*e)->embed(EmbedRequest{std::vector<std::vector<TokenId>>(9, {5})}).status().message().find("at most 8"),
            std::string::npos);
  EXPECT_NE((*e)->embed(EmbedRequest{{{5}, std::vector<TokenId>(129, 5)}}).status().message().find("input[1]"),
            std::string::npos);
  EXPECT_NE((*e)->embed(EmbedRequest{{{5, -1}}}).status().message().find("out of range"), std::string::npos);
}

TEST(EngineEmbed, DecoderEmbedsWithPoolingNextToGeneration) {
  // stories260K has no pooling type: it does not embed unless told to.
  const Request r = greedy_request(stories().tok->encode("Once upon a time", true, false), 24);
  std::vector<TokenId> expect;
  {
    auto plain = make_engine(EngineConfig{});
    EXPECT_NE(plain->embed(EmbedRequest{{{1, 2}}}).status().message().find("does not produce embeddings"),
              std::string::npos);
    auto s = plain->submit(r);
    ASSERT_TRUE(s.ok());
    expect = collect(**s, 1)[0].tokens;
  }
  EngineConfig cfg;
  cfg.pooling = Pooling::last;
  auto e = make_engine(cfg);
  EXPECT_TRUE(e->info().generates);
  EXPECT_EQ(e->info().pooling, Pooling::last);
  auto s = e->submit(r);
  ASSERT_TRUE(s.ok());
  const auto in = inputs(5, 40, stories().model->config().n_vocab, 7);
  auto h = e->embed(EmbedRequest{in});
  ASSERT_TRUE(h.ok()) << h.status().message();
  ASSERT_TRUE((*h)->wait(60000));
  ASSERT_TRUE((*h)->error.ok()) << (*h)->error.message();
  EmbedForward alone(*stories().model, nullptr, Pooling::last);
  const size_t d = (size_t)(*h)->dim;
  for (size_t i = 0; i < in.size(); ++i) {
    std::vector<float> one;
    ASSERT_TRUE(alone.embed(std::span(&in[i], 1), &one).ok());
    EXPECT_EQ(std::memcmp(one.data(), (*h)->data.data() + i * d, d * sizeof(float)), 0) << i;
  }
  // Generation next to the embedding steps is unchanged.
  EXPECT_EQ(collect(**s, 1)[0].tokens, expect);
}

}  // namespace
}  // namespace serval
