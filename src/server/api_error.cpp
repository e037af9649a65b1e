#include "server/api_error.h"

#include <nlohmann/json.hpp>

namespace serval::server {

std::string http_layer_error_body(int status, const std::string& message) {
  ApiError e;
  e.status = status;
  e.message = message;
  return e.body();
}

std::string ApiError::body() const {
  nlohmann::json e = {{"message", message},
                      {"type", type},
                      {"param", param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param)},
                      {"code", code.empty() ? nlohmann::json(nullptr) : nlohmann::json(code)}};
  return nlohmann::json{{"error", e}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

ApiError from_status(const Status& st) {
  ApiError e = bad_request(st.message());
  const auto colon = st.message().find(':');
  if (colon != std::string::npos && colon < 40 && st.message().find(' ') > colon) e.param = st.message().substr(0, colon);
  if (st.code() == StatusCode::resource_exhausted) {
    e.status = 503;
    e.type = "server_error";
  } else if (st.code() == StatusCode::internal || st.code() == StatusCode::io_error) {
    e.status = 500;
    e.type = "server_error";
  }
  return e;
}

}  // namespace serval::server
