// Status and Expected<T>: the error values of every layer (DESIGN.md, principle 7).
//
// Anything a user, a file or load can cause is reported as a Status with a
// message that names the field and the expected vs actual value. Programmer
// invariants use SERVAL_ASSERT instead. Value types; thread-compatible.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <variant>

namespace serval {

enum class StatusCode {
  ok = 0,
  invalid_argument,  // a flag, request field or parameter is out of range
  invalid_file,      // a file's contents are malformed
  not_found,         // a file, key or tensor is missing
  unsupported,       // well-formed but not supported (architecture, type)
  io_error,          // the OS refused (open, mmap, read)
  resource_exhausted,
  internal,
};

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return {}; }

  bool ok() const { return code_ == StatusCode::ok; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // Prefixes the message with context ("loading tensor 'x': ...").
  Status with_context(const std::string& ctx) const {
    if (ok()) return *this;
    return Status(code_, ctx + ": " + message_);
  }

 private:
  StatusCode code_ = StatusCode::ok;
  std::string message_;
};

inline Status invalid_argument(std::string m) { return {StatusCode::invalid_argument, std::move(m)}; }
inline Status invalid_file(std::string m) { return {StatusCode::invalid_file, std::move(m)}; }
inline Status not_found(std::string m) { return {StatusCode::not_found, std::move(m)}; }
inline Status unsupported(std::string m) { return {StatusCode::unsupported, std::move(m)}; }
inline Status io_error(std::string m) { return {StatusCode::io_error, std::move(m)}; }

// Expected<T>: a T or a non-ok Status (std::expected arrives only in C++23).
template <typename T>
class Expected {
 public:
  Expected(T value) : v_(std::move(value)) {}                  // NOLINT(implicit)
  Expected(Status status) : v_(std::move(status)) {            // NOLINT(implicit)
    if (std::get<Status>(v_).ok()) v_ = Status(StatusCode::internal, "Expected built from an ok Status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return ok(); }

  const Status& status() const {
    static const Status ok_s;
    return ok() ? ok_s : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace serval

#define SERVAL_ASSERT(cond)                                                             \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      std::fprintf(stderr, "serval: assertion failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
      std::abort();                                                                     \
    }                                                                                   \
  } while (0)

#define SERVAL_RETURN_IF_ERROR(expr)       \
  do {                                     \
    ::serval::Status _st = (expr);         \
    if (!_st.ok()) return _st;             \
  } while (0)
