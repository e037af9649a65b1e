#include "server/multipart.h"

#include <algorithm>
#include <cctype>

namespace serval::server {

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = (char)std::tolower((unsigned char)c);
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// The value of `key` among ;-separated parameters (quoted or not); "" when absent.
std::string param(std::string_view header_value, std::string_view key) {
  size_t pos = header_value.find(';');
  while (pos != std::string_view::npos) {
    std::string_view rest = header_value.substr(pos + 1);
    // Find the end of this parameter, honouring quotes.
    size_t end = 0;
    bool quoted = false;
    for (; end < rest.size(); ++end) {
      if (rest[end] == '"' && (end == 0 || rest[end - 1] != '\\')) quoted = !quoted;
      if (rest[end] == ';' && !quoted) break;
    }
    std::string_view item = trim(rest.substr(0, end));
    const size_t eq = item.find('=');
    if (eq != std::string_view::npos && lower(trim(item.substr(0, eq))) == key) {
      std::string_view v = trim(item.substr(eq + 1));
      if (v.size() >= 2 && v.front() == '"' && v.back() == '"') {
        std::string out;
        for (size_t i = 1; i + 1 < v.size(); ++i) {
          if (v[i] == '\\' && i + 2 < v.size()) ++i;
          out += v[i];
        }
        return out;
      }
      return std::string(v);
    }
    pos = end < rest.size() ? pos + 1 + end : std::string_view::npos;
  }
  return {};
}

}  // namespace

std::string multipart_boundary(std::string_view content_type) {
  const size_t semi = content_type.find(';');
  if (lower(trim(content_type.substr(0, semi))) != "multipart/form-data") return {};
  std::string b = param(content_type, "boundary");
  if (b.empty() || b.size() > 70) return {};
  return b;
}

Expected<std::vector<MultipartPart>> parse_multipart(std::string_view body, std::string_view boundary,
                                                     const MultipartLimits& limits) {
  if (boundary.empty()) return invalid_argument("multipart body: no boundary");
  const std::string delim = "--" + std::string(boundary);
  std::vector<MultipartPart> parts;
  // The first delimiter may be preceded by a preamble; it must start a line.
  size_t pos = body.rfind(delim, 0) == 0 ? 0 : body.find("\r\n" + delim);
  if (pos == std::string_view::npos) return invalid_argument("multipart body: the boundary does not appear");
  if (pos != 0) pos += 2;
  pos += delim.size();
  const std::string next_delim = "\r\n" + delim;
  for (;;) {
    if (body.substr(pos, 2) == "--") return parts;  // closing delimiter
    // Transport padding, then CRLF.
    while (pos < body.size() && (body[pos] == ' ' || body[pos] == '\t')) ++pos;
    if (body.substr(pos, 2) != "\r\n") return invalid_argument("multipart body: malformed boundary line");
    pos += 2;
    if (parts.size() == limits.max_parts)
      return invalid_argument("multipart body: more than " + std::to_string(limits.max_parts) + " parts");
    const size_t hdr_end = body.find("\r\n\r\n", pos);
    const bool no_headers = body.substr(pos, 2) == "\r\n";
    if (!no_headers && (hdr_end == std::string_view::npos || hdr_end - pos > limits.max_part_header_bytes))
      return invalid_argument("multipart body: a part's headers are missing, unterminated or longer than " +
                              std::to_string(limits.max_part_header_bytes) + " bytes");
    MultipartPart part;
    std::string_view headers = no_headers ? std::string_view() : body.substr(pos, hdr_end - pos);
    pos = no_headers ? pos + 2 : hdr_end + 4;
    while (!headers.empty()) {
      const size_t eol = headers.find("\r\n");
      std::string_view line = headers.substr(0, eol);
      headers = eol == std::string_view::npos ? std::string_view() : headers.substr(eol + 2);
      const size_t colon = line.find(':');
      if (colon == std::string_view::npos) continue;
      const std::string name = lower(trim(line.substr(0, colon)));
      std::string_view value = trim(line.substr(colon + 1));
      if (name == "content-disposition") {
        part.name = param(value, "name");
        part.filename = param(value, "filename");
      } else if (name == "content-type") {
        part.content_type = std::string(value);
      }
    }
    if (part.name.empty()) return invalid_argument("multipart body: a part has no Content-Disposition name");
    const size_t end = body.find(next_delim, pos);
    if (end == std::string_view::npos) return invalid_argument("multipart body: the closing boundary is missing");
    part.data = body.substr(pos, end - pos);
    parts.push_back(std::move(part));
    pos = end + next_delim.size();
  }
}

}  // namespace serval::server
