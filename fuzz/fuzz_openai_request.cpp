// JSON request decoder: any body for /v1/completions (first byte even) or
// /v1/chat/completions (odd) is a 4xx with a message or a request that
// satisfies request_check.h's invariants.
#include <cstdint>
#include <string>

#include "request_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const bool chat = data[0] & 1;
  serval::fuzz::parse_and_check(std::string(reinterpret_cast<const char*>(data + 1), size - 1), chat);
  return 0;
}
