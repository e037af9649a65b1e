// GGUF reader: any bytes are either refused with a message or give a file
// whose every tensor lies inside it; accepted files then go through the
// tokenizer and model-config readers (crafted vocabularies and shapes).
#include <cstdint>
#include <span>

#include "fuzz_common.h"
#include "model/model.h"
#include "model/model_config.h"

using namespace serval;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto f = gguf::GgufFile::parse(std::span<const uint8_t>(data, size));
  if (!f.ok()) {
    fuzz::require(!f.status().message().empty(), "a refused file has a message");
    return 0;
  }
  for (const auto& kv : f->metadata()) (void)gguf::value_to_string(kv.value);
  for (const auto& t : f->tensors()) {
    auto bytes = f->tensor_data(t);
    fuzz::require(bytes.size() == t.n_bytes, "tensor_data size == n_bytes");
    volatile uint8_t sink = 0;
    if (!bytes.empty()) sink = bytes.front() ^ bytes.back();  // ASan: inside the image
    (void)sink;
  }
  if (auto tok = Tokenizer::from_gguf(*f); tok.ok()) {
    const int32_t n = tok->n_vocab();
    for (int32_t id = 0; id < n && id < 4096; ++id) (void)tok->token_to_piece(id, true);
    auto ids = tok->encode("Hello world <s> 123 \xff", true, true);
    for (TokenId id : ids) fuzz::require(id >= 0 && id < n, "encode gives ids in [0, n_vocab)");
    (void)tok->decode(ids, true);
  } else {
    fuzz::require(!tok.status().message().empty(), "a refused vocabulary has a message");
  }
  if (auto cfg = read_model_config(*f); !cfg.ok()) {
    fuzz::require(!cfg.status().message().empty(), "a refused model config has a message");
    return 0;
  }
  // Weight shapes against the metadata (the loader maps, it does not copy).
  if (auto m = Model::from_file(std::move(*f)); !m.ok())
    fuzz::require(!m.status().message().empty(), "a refused model has a message");
  return 0;
}
