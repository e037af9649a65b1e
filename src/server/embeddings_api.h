// Embeddings and reranking over HTTP: request parsing and response bodies
// (the engine computes them: Engine::embed).
//   POST /v1/embeddings   OpenAI: input (a string, an array of strings, an
//                         array of token ids or an array of such arrays),
//                         encoding_format (float | base64: little-endian
//                         float32), dimensions (Matryoshka: the first N
//                         dimensions, renormalized), model, user.
//                         Embeddings are L2-normalized, as OpenAI's are.
//   POST /v1/rerank       Jina / Cohere: query, documents (strings or
//                         {"text": ...}), top_n, return_documents, model.
//                         Each document is scored with the query as one
//                         input, [CLS] query [SEP] document [SEP] (the
//                         vocab's own BOS / EOS / SEP), results best first.
// Texts are tokenized with the vocab's special tokens added and any special
// token text in them left as text.
#pragma once

#include <string>
#include <variant>
#include <vector>

#include "serval/engine.h"
#include "server/api_error.h"
#include "server/openai_request.h"

namespace serval::server {

struct EmbeddingsRequest {
  std::string model;
  std::vector<std::vector<TokenId>> inputs;
  int64_t n_inputs = 0;  // inputs.size() as parsed (the inputs may move on to the engine)
  bool base64 = false;
  int64_t dimensions = 0;  // 0: all of them
};

struct RerankRequest {
  std::string model;
  std::vector<std::string> documents;
  std::vector<std::vector<TokenId>> inputs;  // one per document: query and document
  int64_t top_n = 0;                         // results returned (all by default)
  bool return_documents = false;
};

// max_inputs bounds the inputs (documents), max_len the tokens of each (the
// query and a document together, for rerank: checked before a pair is
// built); dim is the model's embedding size.
std::variant<EmbeddingsRequest, ApiError> parse_embeddings_request(const std::string& body, const ParseContext& ctx,
                                                                   int64_t max_inputs, int64_t max_len, int64_t dim);
std::variant<RerankRequest, ApiError> parse_rerank_request(const std::string& body, const ParseContext& ctx,
                                                           int64_t max_inputs, int64_t max_len);

// The response bodies from a finished EmbedHandle (h.error ok).
std::string embeddings_response(const EmbeddingsRequest& r, const EmbedHandle& h);
std::string rerank_response(const RerankRequest& r, const EmbedHandle& h);

// Standard base64 (RFC 4648, with padding) of bytes.
std::string base64_encode(const void* data, size_t n);

}  // namespace serval::server
