// GGUF reader: any bytes are either refused with a message or give a file
// whose every tensor lies inside it; accepted files then go through the
// tokenizer and model-config readers (crafted vocabularies and shapes), and
// the LoRA adapter reader against stories260K (model/lora.h).
#include <cstdint>
#include <span>

#include "fuzz_common.h"
#include "model/lora.h"
#include "model/model.h"
#include "model/model_config.h"

using namespace serval;

namespace {

// The base adapters are checked against (loaded once).
const Model* lora_base() {
  static auto m = Model::load(std::string(SERVAL_SHARED_DIR) + "/models/stories260K.gguf");
  return m.ok() ? m->get() : nullptr;
}

}  // namespace

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
  if (const Model* base = lora_base()) {
    if (auto a = LoraAdapter::from_file(*f, *base); a.ok()) {
      for (const auto& [m, d] : (*a)->deltas()) {
        fuzz::require(d.rows == m->rows && d.cols == m->cols, "an adapter's deltas fit their base matrices");
        const size_t na = d.f16 ? d.at16.size() : d.at.size(), nb = d.f16 ? d.bt16.size() : d.bt.size();
        fuzz::require(na == (size_t)(d.cols * d.rank) && nb == (size_t)(d.rank * d.rows),
                      "A and B hold rank x shape elements");
      }
    } else {
      fuzz::require(!a.status().message().empty(), "a refused adapter has a message");
    }
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
