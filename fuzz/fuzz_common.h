// Shared setup of the libFuzzer harnesses: the real tiny model's tokenizer and
// a real chat template, loaded once per process from the shared test data
// (SERVAL_SHARED_DIR, overridable with the environment variable of that name).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "gguf/gguf_reader.h"
#include "tokenizer/chat_template/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace serval::fuzz {

inline std::string shared_dir() {
  if (const char* d = std::getenv("SERVAL_SHARED_DIR")) return d;
  return SERVAL_SHARED_DIR;
}

[[noreturn]] inline void die(const std::string& msg) {
  std::fprintf(stderr, "fuzz setup: %s\n", msg.c_str());
  std::abort();
}

// Crashes (a finding) when an invariant does not hold, printing `what`.
inline void require(bool ok, const std::string& what) {
  if (!ok) die("invariant violated: " + what);
}

inline const Tokenizer& stories_tokenizer() {
  static const Tokenizer tok = [] {
    auto f = gguf::GgufFile::open(shared_dir() + "/models/stories260K.gguf");
    if (!f.ok()) die(f.status().message());
    auto t = Tokenizer::from_gguf(*f);
    if (!t.ok()) die(t.status().message());
    return *t;
  }();
  return tok;
}

inline const ChatTemplate& phi_template() {
  static const ChatTemplate tmpl = [] {
    std::ifstream in(shared_dir() + "/chat-templates/microsoft-Phi-3.5-mini-instruct.jinja");
    std::stringstream ss;
    ss << in.rdbuf();
    auto t = ChatTemplate::compile(ss.str());
    if (!t.ok()) die(t.status().message());
    return *t;
  }();
  return tmpl;
}

}  // namespace serval::fuzz
