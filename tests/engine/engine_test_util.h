// Helpers shared by the engine tests: the stories260K model, collecting a
// request's events, greedy requests.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/model.h"
#include "serval/engine.h"
#include "tokenizer/tokenizer.h"

namespace serval {
namespace {

const std::string kShared = SERVAL_SHARED_DIR;

struct Loaded {
  std::shared_ptr<const Model> model;
  std::unique_ptr<Tokenizer> tok;
};

// A model under ../shared/models and its tokenizer, loaded once.
const Loaded& shared_model(const std::string& rel) {
  static std::map<std::string, Loaded> cache;
  auto it = cache.find(rel);
  if (it != cache.end()) return it->second;
  Loaded x;
  auto m = Model::load(kShared + "/models/" + rel);
  EXPECT_TRUE(m.ok()) << rel;
  x.model = std::shared_ptr<const Model>(std::move(m.value()));
  auto t = Tokenizer::from_gguf(x.model->file());
  EXPECT_TRUE(t.ok());
  x.tok = std::make_unique<Tokenizer>(std::move(t.value()));
  return cache.emplace(rel, std::move(x)).first->second;
}

const Loaded& stories() { return shared_model("stories260K.gguf"); }

[[maybe_unused]] std::unique_ptr<Engine> make_engine(EngineConfig cfg) {
  auto e = Engine::create(stories().model, *stories().tok, cfg);
  EXPECT_TRUE(e.ok()) << e.status().message();
  return std::move(e.value());
}

// The engine's stats once it is parked between steps (everything the last
// step did, e.g. freeing a finished request's blocks, is in them); the engine
// steps on afterwards.
[[maybe_unused]] EngineStats settled_stats(Engine& e) {
  e.pause();
  EngineStats st = e.stats();
  e.resume();
  return st;
}

struct Sample {
  std::vector<TokenId> tokens;
  std::vector<float> chosen_logprobs;
  std::vector<float> top_logprobs;  // flattened
  std::string text;
  FinishReason finish = FinishReason::none;
};

std::vector<Sample> collect(RequestStream& s, int n) {
  std::vector<Sample> out((size_t)n);
  OutputEvent ev;
  while (s.next(&ev)) {
    EXPECT_TRUE(ev.error.ok()) << ev.error.message();
    if (!ev.error.ok()) break;
    Sample& o = out[(size_t)ev.index];
    o.tokens.insert(o.tokens.end(), ev.tokens.begin(), ev.tokens.end());
    o.text += ev.text;
    for (const auto& lp : ev.logprobs) {
      o.chosen_logprobs.push_back(lp.chosen.logprob);
      for (const auto& t : lp.top) o.top_logprobs.push_back(t.logprob);
    }
    if (ev.finish != FinishReason::none) o.finish = ev.finish;
  }
  return out;
}

Request greedy_request(std::vector<TokenId> prompt, int max_tokens, int logprobs = 5) {
  Request r;
  r.prompt = std::move(prompt);
  r.params.temperature = 0;
  r.params.max_tokens = max_tokens;
  r.params.logprobs = logprobs;
  r.params.ignore_eos = true;
  return r;
}

}  // namespace
}  // namespace serval
