// Shared helpers of the tokenizer tests: paths of the shared data and small
// in-memory GGUF vocabularies.
#pragma once

#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "gguf/gguf_reader.h"
#include "gguf/gguf_writer.h"

namespace serval::test {

inline std::string shared_path(const std::string& rel) { return std::string(SERVAL_SHARED_DIR) + "/" + rel; }

inline gguf::Array string_array(const std::vector<std::string>& v) {
  gguf::Array a;
  a.elem_type = gguf::ValueType::string;
  for (const auto& s : v) a.items.emplace_back(s);
  return a;
}

inline gguf::Array f32_array(const std::vector<float>& v) {
  gguf::Array a;
  a.elem_type = gguf::ValueType::f32;
  for (float x : v) a.items.emplace_back(x);
  return a;
}

inline gguf::Array i32_array(const std::vector<int32_t>& v) {
  gguf::Array a;
  a.elem_type = gguf::ValueType::i32;
  for (int32_t x : v) a.items.emplace_back(x);
  return a;
}

// Parses the writer's image (no tensors). Fails the test on error.
inline gguf::GgufFile parse_or_die(const gguf::GgufWriter& w) {
  auto bytes = w.serialize();
  if (!bytes.ok()) throw std::runtime_error("serialize: " + bytes.status().message());
  auto f = gguf::GgufFile::parse(bytes.value());
  if (!f.ok()) throw std::runtime_error("parse: " + f.status().message());
  return std::move(f.value());
}

inline std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Texts of a tokenizer-vectors `.inp` file: each is followed by
// "\n__ggml_vocab_test__\n" (nothing may follow the last separator).
inline std::vector<std::string> read_vocab_inputs(const std::string& path) {
  const std::string all = read_text_file(path);
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  size_t pos = 0;
  for (;;) {
    const size_t hit = all.find(sep, pos);
    if (hit == std::string::npos) break;
    texts.push_back(all.substr(pos, hit - pos));
    pos = hit + sep.size();
  }
  if (pos != all.size()) throw std::runtime_error("text after the last separator in " + path);
  return texts;
}

}  // namespace serval::test
