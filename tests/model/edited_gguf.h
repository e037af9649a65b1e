// Test helper shared by the model-loading tests: a GGUF file copied through
// the writer with keys and tensors edited, dropped or added, loaded as a
// Model from memory. Header-only; tests/model only.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gguf/gguf_reader.h"
#include "gguf/gguf_writer.h"
#include "model/model.h"

namespace serval::test {

using KvEdit = std::function<bool(const std::string& key, gguf::Value* v)>;                   // false = drop
using TensorEdit = std::function<bool(const std::string& name, std::vector<int64_t>* dims)>;  // false = drop

// `path` with kv_edit / t_edit applied, `extra` keys and `extra_tensors` (F32
// zeros of the given dims) added. A tensor whose dims change must be F32: its
// bytes are cut or zero-extended to the new size.
inline Expected<std::unique_ptr<Model>> load_edited_model(
    const std::string& path, KvEdit kv_edit, TensorEdit t_edit = nullptr, std::vector<gguf::KeyValue> extra = {},
    std::vector<std::pair<std::string, std::vector<int64_t>>> extra_tensors = {}) {
  auto src = gguf::GgufFile::open(path);
  EXPECT_TRUE(src.ok()) << path;
  if (!src.ok()) return src.status();
  gguf::GgufWriter w;
  for (const auto& kv : src->metadata()) {
    gguf::Value v = kv.value;
    if (!kv_edit || kv_edit(kv.key, &v)) w.add(kv.key, v);
  }
  for (auto& kv : extra) w.add(kv.key, kv.value);
  auto elems = [](const std::vector<int64_t>& dims) {
    uint64_t n = 1;
    for (auto d : dims) n *= (uint64_t)d;
    return n;
  };
  for (const auto& t : src->tensors()) {
    auto dims = t.dims;
    if (t_edit && !t_edit(t.name, &dims)) continue;
    auto data = src->tensor_data(t);
    std::vector<uint8_t> bytes(data.begin(), data.end());
    if (dims != t.dims) {
      EXPECT_EQ(t.type, DType::f32) << "only F32 tensors change shape here: " << t.name;
      bytes.resize(elems(dims) * 4);
    }
    w.add_tensor(t.name, dims, t.type, std::move(bytes));
  }
  for (const auto& [name, dims] : extra_tensors) w.add_tensor(name, dims, DType::f32, std::vector<uint8_t>(elems(dims) * 4, 0));
  auto img = w.serialize();
  EXPECT_TRUE(img.ok());
  if (!img.ok()) return img.status();
  auto f = gguf::GgufFile::parse(*img);
  if (!f.ok()) return f.status();
  return Model::from_file(std::move(f.value()));
}

}  // namespace serval::test
