// multipart/form-data bodies (RFC 7578), as the OpenAI SDKs send file
// uploads: the parts of an in-memory body, bounded in count and header size.
// Pure function; thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace serval::server {

struct MultipartPart {
  std::string name;          // form field name (Content-Disposition name=)
  std::string filename;      // Content-Disposition filename=, empty for plain fields
  std::string content_type;  // empty when absent
  std::string_view data;     // the part's bytes (a view into the body)
};

struct MultipartLimits {
  size_t max_parts = 16;
  size_t max_part_header_bytes = 8 * 1024;
};

// The boundary parameter of a Content-Type header; empty when it is not
// multipart/form-data or has no usable boundary (1..70 characters).
std::string multipart_boundary(std::string_view content_type);

// Splits body into its parts. Errors (invalid_argument) name what is wrong:
// a missing opening or closing boundary, too many parts, a part without a
// Content-Disposition name.
Expected<std::vector<MultipartPart>> parse_multipart(std::string_view body, std::string_view boundary,
                                                     const MultipartLimits& limits = {});

}  // namespace serval::server
