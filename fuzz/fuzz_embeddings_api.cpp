// libFuzzer harness: /v1/embeddings and /v1/rerank request bodies (untrusted,
// from clients; src/server/embeddings_api.h). Any body is a 4xx with a message
// or a request whose inputs the engine can take (non-empty, ids in range, at
// most the input bound, each within the context; dimensions within the
// embedding size; top_n within the documents), and the response builders
// accept it. First byte: even = embeddings, odd = rerank; the rest: the body.
#include <cstdint>
#include <string>
#include <variant>

#include "request_check.h"
#include "server/embeddings_api.h"

namespace {

constexpr int64_t kMaxInputs = 16, kMaxLen = 64, kDim = 8;

void check_inputs(const std::vector<std::vector<serval::TokenId>>& inputs, int64_t n_vocab) {
  using serval::fuzz::require;
  require(!inputs.empty() && (int64_t)inputs.size() <= kMaxInputs, "1..max inputs");
  for (const auto& in : inputs) {
    require(!in.empty() && (int64_t)in.size() <= kMaxLen, "input within 1..max_len tokens");
    for (serval::TokenId t : in) require(t >= 0 && t < n_vocab, "id in range");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using serval::fuzz::require;
  if (size < 1) return 0;
  const bool rerank = data[0] & 1;
  const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  const serval::server::ParseContext& ctx = serval::fuzz::parse_context();
  serval::EmbedHandle h;
  if (rerank) {
    auto r = serval::server::parse_rerank_request(body, ctx, kMaxInputs, kMaxLen);
    if (auto* e = std::get_if<serval::server::ApiError>(&r)) {
      require(e->status >= 400 && e->status < 500 && !e->message.empty(), "a 4xx with a message");
      return 0;
    }
    const auto& rr = std::get<serval::server::RerankRequest>(r);
    check_inputs(rr.inputs, ctx.n_vocab);
    require(rr.documents.size() == rr.inputs.size(), "one input per document");
    require(rr.top_n >= 1 && rr.top_n <= (int64_t)rr.documents.size(), "top_n within the documents");
    h.dim = 1;
    h.data.assign(rr.inputs.size(), 0.5f);
    require(!serval::server::rerank_response(rr, h).empty(), "a response");
    return 0;
  }
  auto r = serval::server::parse_embeddings_request(body, ctx, kMaxInputs, kMaxLen, kDim);
  if (auto* e = std::get_if<serval::server::ApiError>(&r)) {
    require(e->status >= 400 && e->status < 500 && !e->message.empty(), "a 4xx with a message");
    return 0;
  }
  const auto& er = std::get<serval::server::EmbeddingsRequest>(r);
  check_inputs(er.inputs, ctx.n_vocab);
  require(er.n_inputs == (int64_t)er.inputs.size(), "n_inputs counts the inputs");
  require(er.dimensions >= 0 && er.dimensions <= kDim, "dimensions within the embedding");
  h.dim = kDim;
  h.data.assign(er.inputs.size() * kDim, 0.25f);
  require(!serval::server::embeddings_response(er, h).empty(), "a response");
  return 0;
}
