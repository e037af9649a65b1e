#include "server/api_keys.h"

namespace serval::server {

std::string bearer_token(const http::HttpRequest& req) {
  const std::string h = req.header("authorization");
  const std::string prefix = "Bearer ";
  if (h.rfind(prefix, 0) == 0) return h.substr(prefix.size());
  return req.header("x-api-key");
}

bool ct_equal(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char d = 0;
  for (size_t i = 0; i < a.size(); ++i) d |= (unsigned char)(a[i] ^ b[i]);
  return d == 0;
}

int api_key_index(const std::vector<std::string>& keys, const http::HttpRequest& req) {
  if (keys.empty()) return 0;
  const std::string given = bearer_token(req);
  int found = -1;
  for (size_t i = 0; i < keys.size(); ++i)
    if (ct_equal(given, keys[i]) && found < 0) found = (int)i;
  return given.empty() ? -1 : found;
}

}  // namespace serval::server
