// OpenAI-style API errors: every bad request gets a 4xx (or 5xx) with the body
// {"error": {"message", "type", "param", "code"}}.
#pragma once

#include <string>

#include "common/status.h"

namespace serval::server {

struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the offending field, empty when none
  std::string code;   // machine-readable, empty when none

  std::string body() const;  // the JSON body
};

inline ApiError bad_request(std::string message, std::string param = {}, std::string code = {}) {
  return ApiError{400, std::move(message), "invalid_request_error", std::move(param), std::move(code)};
}

// 405 for a route that exists under other methods; send it with an
// `Allow: <allow>` header.
inline ApiError method_not_allowed_error(const std::string& allow) {
  return ApiError{405, "method not allowed; use " + allow, "invalid_request_error", "", "method_not_allowed"};
}

// The body of an answer the HTTP layer gives itself (413, 431, 408, 400):
// an http::ErrorBody for HttpServer::create.
std::string http_layer_error_body(int status, const std::string& message);

// Maps an engine/validation Status to a 400 whose param is the field named at
// the start of the message ("top_p: expected ...").
ApiError from_status(const Status& st);

}  // namespace serval::server
