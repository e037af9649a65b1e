// Server-sent events (text/event-stream) parser: the client side of an
// OpenAI streaming response (serval bench http, serval gateway).
//
// Feed bytes as they arrive; each complete event's data (its data: lines joined
// by '\n') is handed to the callback: on_event(data), or on_event(event, data)
// with the event's `event:` name ("" without one). Lines end in LF or CRLF;
// comments and the id:/retry: fields are ignored. One event may be at most max_event_bytes long
// (false from feed() once it is exceeded). Not thread-safe (one per stream).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <type_traits>

namespace serval {

class SseParser {
 public:
  explicit SseParser(size_t max_event_bytes = 16u << 20) : max_(max_event_bytes) {}
  template <typename F>
  bool feed(std::string_view bytes, F&& on_event);

 private:
  size_t max_;
  std::string pending_;  // bytes of an unfinished line
  std::string data_;     // data of the event being built
  std::string event_;    // its event: name
  bool has_data_ = false;
};

// ---- inline template ----
template <typename F>
bool SseParser::feed(std::string_view bytes, F&& on_event) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    const size_t nl = bytes.find('\n', pos);
    if (nl == std::string_view::npos) {
      pending_.append(bytes.substr(pos));
      return pending_.size() + data_.size() <= max_;
    }
    std::string_view line = bytes.substr(pos, nl - pos);
    if (!pending_.empty()) {
      pending_.append(line);
      line = pending_;
    }
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) {
      if (has_data_) {
        if (!data_.empty() && data_.back() == '\n') data_.pop_back();
        if constexpr (std::is_invocable_v<F, std::string_view, std::string_view>)
          on_event(std::string_view(event_), std::string_view(data_));
        else
          on_event(std::string_view(data_));
      }
      data_.clear();
      event_.clear();
      has_data_ = false;
    } else if (line.substr(0, 5) == "data:") {
      std::string_view v = line.substr(5);
      if (!v.empty() && v.front() == ' ') v.remove_prefix(1);
      data_.append(v);
      data_.push_back('\n');
      has_data_ = true;
    } else if (line.substr(0, 6) == "event:") {
      std::string_view v = line.substr(6);
      if (!v.empty() && v.front() == ' ') v.remove_prefix(1);
      event_.assign(v.substr(0, 256));
    }  // else: ":" comment, id:/retry: fields
    pending_.clear();
    if (data_.size() > max_) return false;
    pos = nl + 1;
  }
  return true;
}

}  // namespace serval
