#include "server/embeddings_api.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <numeric>

#include "common/l2_normalize.h"
#include "server/api_translation.h"
#include "tokenizer/vocab.h"

namespace serval::server {

using json = nlohmann::ordered_json;
using ordered_json = nlohmann::ordered_json;

namespace {

// The body as a JSON object (parse_json_object), its "model" checked as the
// generation routes check it.
std::variant<json, ApiError> parse_body(const std::string& body, const ParseContext& ctx, std::string* model) {
  auto parsed = parse_json_object(body, ctx.limits.max_json_depth);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const json& j = std::get<json>(parsed);
  auto it = j.find("model");
  if (auto e = resolve_model(it == j.end() ? nullptr : &*it, ctx, model)) return *e;
  return parsed;
}

// A text's tokens (the body's size bounds the text; the engine bounds the
// tokens by the context), with or without the vocab's special tokens.
std::optional<ApiError> text_input(const ParseContext& ctx, const json& v, const std::string& field,
                                   std::vector<TokenId>* out, bool add_special = true) {
  const std::string& s = v.get_ref<const std::string&>();
  if (s.empty()) return bad_request(field + ": must not be an empty string", field);
  *out = ctx.tok->encode(s, add_special, /*parse_special=*/false);
  return std::nullopt;
}

std::optional<ApiError> token_input(const ParseContext& ctx, const json& arr, const std::string& field,
                                    std::vector<TokenId>* out) {
  if (arr.empty()) return bad_request(field + ": must not be empty", field);
  for (const auto& t : arr) {
    if (!t.is_number_integer()) return bad_request(field + ": token ids must be integers", field);
    const int64_t id = t.get<int64_t>();
    if (id < 0 || id >= ctx.n_vocab)
      return bad_request(field + ": token id " + std::to_string(id) + " is out of range [0, " +
                             std::to_string(ctx.n_vocab) + ")",
                         field, "invalid_token_id");
    out->push_back((TokenId)id);
  }
  return std::nullopt;
}

}  // namespace

std::string base64_encode(const void* data, size_t n) {
  static const char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  const auto* p = static_cast<const uint8_t*>(data);
  std::string out;
  out.reserve((n + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= n; i += 3) {
    const uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8 | p[i + 2];
    for (int k = 18; k >= 0; k -= 6) out.push_back(kAlphabet[(v >> k) & 63]);
  }
  if (i < n) {
    const uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0u);
    out.push_back(kAlphabet[(v >> 18) & 63]);
    out.push_back(kAlphabet[(v >> 12) & 63]);
    out.push_back(i + 1 < n ? kAlphabet[(v >> 6) & 63] : '=');
    out.push_back('=');
  }
  return out;
}

std::optional<ApiError> check_len(const std::vector<TokenId>& in, int64_t max_len, const std::string& field) {
  if ((int64_t)in.size() <= max_len) return std::nullopt;
  return bad_request(field + ": " + std::to_string(in.size()) + " tokens, more than the context of " +
                         std::to_string(max_len),
                     field);
}

std::variant<EmbeddingsRequest, ApiError> parse_embeddings_request(const std::string& body, const ParseContext& ctx,
                                                                   int64_t max_inputs, int64_t max_len, int64_t dim) {
  EmbeddingsRequest r;
  auto pj = parse_body(body, ctx, &r.model);
  if (auto* e = std::get_if<ApiError>(&pj)) return *e;
  const json& j = std::get<json>(pj);
  auto in = j.find("input");
  if (in == j.end() || in->is_null()) return bad_request("input: required", "input");
  if (in->is_string()) {
    r.inputs.emplace_back();
    if (auto e = text_input(ctx, *in, "input", &r.inputs.back())) return *e;
    if (auto e = check_len(r.inputs.back(), max_len, "input[0]")) return *e;
  } else if (in->is_array()) {
    if (in->empty()) return bad_request("input: must not be an empty array", "input");
    if ((*in)[0].is_number()) {  // one input as token ids
      r.inputs.emplace_back();
      if (auto e = token_input(ctx, *in, "input", &r.inputs.back())) return *e;
      if (auto e = check_len(r.inputs.back(), max_len, "input[0]")) return *e;
    } else {
      if ((int64_t)in->size() > max_inputs)
        return bad_request("input: " + std::to_string(in->size()) + " inputs, at most " + std::to_string(max_inputs) +
                               " per request",
                           "input");
      for (size_t i = 0; i < in->size(); ++i) {
        const json& v = (*in)[i];
        const std::string field = "input[" + std::to_string(i) + "]";
        r.inputs.emplace_back();
        if (v.is_string()) {
          if (auto e = text_input(ctx, v, field, &r.inputs.back())) return *e;
        } else if (v.is_array()) {
          if (auto e = token_input(ctx, v, field, &r.inputs.back())) return *e;
        } else {
          return bad_request(field + ": expected a string or an array of token ids", field);
        }
        if (auto e = check_len(r.inputs.back(), max_len, field)) return *e;
      }
    }
  } else {
    return bad_request("input: expected a string, an array of strings, or token ids", "input");
  }
  if (auto f = j.find("encoding_format"); f != j.end() && !f->is_null()) {
    if (!f->is_string() || (*f != "float" && *f != "base64"))
      return bad_request("encoding_format: expected 'float' or 'base64'", "encoding_format");
    r.base64 = *f == "base64";
  }
  if (auto d = j.find("dimensions"); d != j.end() && !d->is_null()) {
    if (!d->is_number_integer() || d->get<int64_t>() < 1 || d->get<int64_t>() > dim)
      return bad_request("dimensions: expected an integer in [1, " + std::to_string(dim) + "] for this model",
                         "dimensions");
    r.dimensions = d->get<int64_t>();
  }
  if (auto u = j.find("user"); u != j.end() && !u->is_null() && !u->is_string())
    return bad_request("user: expected a string", "user");
  r.n_inputs = (int64_t)r.inputs.size();
  return r;
}

std::variant<RerankRequest, ApiError> parse_rerank_request(const std::string& body, const ParseContext& ctx,
                                                           int64_t max_inputs, int64_t max_len) {
  RerankRequest r;
  auto pj = parse_body(body, ctx, &r.model);
  if (auto* e = std::get_if<ApiError>(&pj)) return *e;
  const json& j = std::get<json>(pj);
  auto q = j.find("query");
  if (q == j.end() || !q->is_string()) return bad_request("query: expected a string", "query");
  // The texts' tokens alone: the specials are placed around the pair.
  std::vector<TokenId> query;
  if (auto e = text_input(ctx, *q, "query", &query, false)) return *e;
  // A pair adds at most four special tokens to the query and the document.
  if (auto e = check_len(query, max_len - 4, "query")) return *e;
  auto docs = j.find("documents");
  if (docs == j.end() || !docs->is_array() || docs->empty())
    return bad_request("documents: expected a non-empty array of strings", "documents");
  if ((int64_t)docs->size() > max_inputs)
    return bad_request("documents: " + std::to_string(docs->size()) + " documents, at most " +
                           std::to_string(max_inputs) + " per request",
                       "documents");
  const Vocab& v = ctx.tok->vocab();
  for (size_t i = 0; i < docs->size(); ++i) {
    const std::string field = "documents[" + std::to_string(i) + "]";
    const json* d = &(*docs)[i];
    if (d->is_object() && d->contains("text")) d = &(*d)["text"];
    if (!d->is_string()) return bad_request(field + ": expected a string (or {\"text\": ...})", field);
    std::vector<TokenId> dt;
    if (auto e = text_input(ctx, *d, field, &dt, false)) return *e;
    if ((int64_t)(query.size() + dt.size()) + 4 > max_len)
      return bad_request(field + ": " + std::to_string(dt.size()) + " tokens, with the query's " +
                             std::to_string(query.size()) + ", more than the context of " + std::to_string(max_len),
                         field);
    r.documents.push_back(d->get<std::string>());
    std::vector<TokenId> pair;
    if (v.bos != kNoToken) pair.push_back(v.bos);
    pair.insert(pair.end(), query.begin(), query.end());
    if (v.eos != kNoToken) pair.push_back(v.eos);
    if (v.sep != kNoToken) pair.push_back(v.sep);
    pair.insert(pair.end(), dt.begin(), dt.end());
    pair.push_back(v.eos != kNoToken ? v.eos : v.sep);
    if (pair.back() == kNoToken) pair.pop_back();
    r.inputs.push_back(std::move(pair));
  }
  r.top_n = (int64_t)r.documents.size();
  if (auto t = j.find("top_n"); t != j.end() && !t->is_null()) {
    if (!t->is_number_integer() || t->get<int64_t>() < 1)
      return bad_request("top_n: expected a positive integer", "top_n");
    r.top_n = std::min<int64_t>(t->get<int64_t>(), r.top_n);
  }
  if (auto rd = j.find("return_documents"); rd != j.end() && !rd->is_null()) {
    if (!rd->is_boolean()) return bad_request("return_documents: expected a boolean", "return_documents");
    r.return_documents = rd->get<bool>();
  }
  return r;
}

std::string embeddings_response(const EmbeddingsRequest& r, const EmbedHandle& h) {
  const size_t dim = (size_t)h.dim, keep = r.dimensions > 0 ? (size_t)r.dimensions : dim;
  ordered_json data = ordered_json::array();
  std::vector<float> e(keep);
  for (size_t i = 0; i < (size_t)r.n_inputs && (i + 1) * dim <= h.data.size(); ++i) {
    std::copy(h.data.begin() + (ptrdiff_t)(i * dim), h.data.begin() + (ptrdiff_t)(i * dim + keep), e.begin());
    l2_normalize(e);
    ordered_json item = {{"object", "embedding"}, {"index", i}};
    if (r.base64) item["embedding"] = base64_encode(e.data(), e.size() * sizeof(float));  // x86-64: little-endian
    else item["embedding"] = e;
    data.push_back(std::move(item));
  }
  return json_text(ordered_json{{"object", "list"},
                                {"data", std::move(data)},
                                {"model", r.model},
                                {"usage", {{"prompt_tokens", h.prompt_tokens}, {"total_tokens", h.prompt_tokens}}}});
}

std::string rerank_response(const RerankRequest& r, const EmbedHandle& h) {
  std::vector<size_t> order(r.documents.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return h.data[a] > h.data[b]; });
  ordered_json results = ordered_json::array();
  for (int64_t k = 0; k < r.top_n; ++k) {
    const size_t i = order[(size_t)k];
    ordered_json item = {{"index", i}, {"relevance_score", h.data[i]}};
    if (r.return_documents) item["document"] = {{"text", r.documents[i]}};
    results.push_back(std::move(item));
  }
  return json_text(ordered_json{{"id", random_hex_id("rerank-", 24)},
                                {"model", r.model},
                                {"results", std::move(results)},
                                {"usage", {{"prompt_tokens", h.prompt_tokens}, {"total_tokens", h.prompt_tokens}}}});
}

}  // namespace serval::server
