// API keys of a server: the key a request carries and which configured key
// it matches (constant-time). Shared by the OpenAI server and the model
// router in front of several of them.
#pragma once

#include <string>
#include <vector>

#include "server/http_server.h"

namespace serval::server {

// The key after "Bearer " in the Authorization header, else the x-api-key
// header (Anthropic's clients); empty when absent.
std::string bearer_token(const http::HttpRequest& req);

// Constant-time string equality (the length is not secret).
bool ct_equal(const std::string& a, const std::string& b);

// Index of the request's key in `keys`; 0 when `keys` is empty (no auth);
// -1 when the key is missing or wrong. Compares with every key (no early exit).
int api_key_index(const std::vector<std::string>& keys, const http::HttpRequest& req);

}  // namespace serval::server
