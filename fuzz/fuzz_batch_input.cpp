// Batch uploads: a multipart/form-data body (boundary "b") is split into its
// parts, and every part's bytes are validated as a batch input file, with
// small limits. Part data must lie inside the body; validation must account
// for every non-blank line (valid + malformed = total, line numbers rising)
// unless it refuses the file as a whole; every error record is JSON.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string_view>

#include "fuzz_common.h"
#include "server/batch_runner.h"
#include "server/multipart.h"

using namespace serval;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  server::BatchLimits limits;
  limits.max_file_bytes = 32 * 1024;
  limits.max_lines = 64;
  limits.max_line_bytes = 2048;
  limits.max_custom_id = 32;
  std::vector<std::string_view> files;
  auto parts = server::parse_multipart(body, "b");
  if (parts.ok()) {
    fuzz::require(parts->size() <= server::MultipartLimits{}.max_parts, "part count within the limit");
    for (const auto& p : *parts) {
      fuzz::require(p.data.data() >= body.data() && p.data.data() + p.data.size() <= body.data() + body.size(),
                    "part data inside the body");
      fuzz::require(!p.name.empty(), "every part has a name");
      files.push_back(p.data);
    }
  } else {
    fuzz::require(!parts.status().message().empty(), "a refusal has a message");
    files.push_back(body);  // the bytes as a file of their own
  }
  for (std::string_view f : files) {
    for (const char* endpoint : {"/v1/completions", "*"}) {
      server::ValidatedInput v = server::validate_batch_input(f, endpoint, limits);
      if (!v.fatal.empty()) continue;
      fuzz::require(v.total == (int64_t)(v.lines.size() + v.malformed.size()), "every line accounted for");
      fuzz::require(v.total >= 1 && v.total <= (int64_t)limits.max_lines, "line count within the limit");
      int64_t last = 0;
      for (const auto& l : v.lines) {
        fuzz::require(l.line > last, "valid lines in file order");
        last = l.line;
        fuzz::require(!l.custom_id.empty() && l.custom_id.size() <= limits.max_custom_id, "custom_id bounded");
        fuzz::require(server::batch_endpoint_supported(l.url), "a supported url");
        fuzz::require(nlohmann::json::parse(l.body, nullptr, false).is_object(), "the body is a JSON object");
      }
      for (const auto& m : v.malformed) {
        fuzz::require(!m.ok && m.line >= 1, "a malformed line has its number");
        const auto rec = nlohmann::json::parse(m.record, nullptr, false);
        fuzz::require(rec.is_object() && rec["error"]["line"] == m.line, "the error record is JSON with the line");
      }
    }
  }
  return 0;
}
