// Status and Result<T>: how every farpool call that can fail reports why.
//
// A Status is either OK or carries a code and a human-readable message that names the
// component and the reason, e.g.
//   "server 3 (10.0.0.3:7000): lease refused: pool full (0 B of 4 GiB free)".
// `Aborted` is reserved for retryable conflicts (a transaction lost a race) and is distinct
// from failures, so callers can retry the one and report the other. `Evicted` is distinct
// from `Unavailable`: the servers fenced this process off (it was taken for stalled), which
// says nothing about their health and is not undone; a new Pool::Connect gets a new identity.
//
// Thread-safety: values; safe to copy between threads.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace farpool {

enum class StatusCode : uint8_t {
  kOk = 0,
  kInvalidArgument,    // the caller passed something malformed (bad address, size, file)
  kNotFound,           // a named thing does not exist
  kOutOfMemory,        // the pool (or a server) has no room for the request
  kUnavailable,        // a server is unreachable, dead or shut down
  kTimedOut,           // an operation did not complete within its deadline
  kProtocol,           // a peer sent a malformed or incompatible message
  kAborted,            // retryable conflict
  kIoError,            // an operating-system call failed
  kInternal,           // a bug or an unexpected library error
  kAlreadyExists,      // a thing to be created exclusively exists (a table, a file)
  kResourceExhausted,  // a fixed-size table is full (session slots, catalog, name table)
  kPermissionDenied,   // the peer did not prove it belongs to the cluster (its secret)
  kEvicted,            // this process was evicted (Pool::Evict): every server refuses it for
                       // good; no outage of the server that says so
};
// The largest code; codes travel on the wire as numbers (transport/frame.h), so new codes are
// appended and existing numbers never change.
inline constexpr StatusCode kLastStatusCode = StatusCode::kEvicted;

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string m) {
    return {StatusCode::kInvalidArgument, std::move(m)};
  }
  static Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
  static Status OutOfMemory(std::string m) { return {StatusCode::kOutOfMemory, std::move(m)}; }
  static Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
  static Status TimedOut(std::string m) { return {StatusCode::kTimedOut, std::move(m)}; }
  static Status Protocol(std::string m) { return {StatusCode::kProtocol, std::move(m)}; }
  static Status Aborted(std::string m) { return {StatusCode::kAborted, std::move(m)}; }
  static Status IoError(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
  static Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
  static Status AlreadyExists(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
  static Status PermissionDenied(std::string m) {
    return {StatusCode::kPermissionDenied, std::move(m)};
  }
  static Status ResourceExhausted(std::string m) {
    return {StatusCode::kResourceExhausted, std::move(m)};
  }
  static Status Evicted(std::string m) { return {StatusCode::kEvicted, std::move(m)}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "<CodeName>: <message>", or "OK".
  std::string ToString() const;

  // Returns a copy whose message is "<context>: <message>"; OK stays OK.
  Status WithContext(std::string_view context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Either a value or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}         // NOLINT(google-explicit-constructor)
  Result(Status status) : status_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    if (status_.ok()) status_ = Status::Internal("Result constructed from an OK status");
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }

  // REQUIRES: ok()
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace farpool

#define FARPOOL_CONCAT_INNER_(a, b) a##b
#define FARPOOL_CONCAT_(a, b) FARPOOL_CONCAT_INNER_(a, b)

// Returns the Status of `expr` from the enclosing function if it is not OK.
#define FARPOOL_RETURN_IF_ERROR(expr)                  \
  do {                                                 \
    ::farpool::Status farpool_status_ = (expr);        \
    if (!farpool_status_.ok()) return farpool_status_; \
  } while (0)

// Evaluates `rexpr` (a Result<T>); on error returns its Status, else moves the value to `lhs`.
#define FARPOOL_ASSIGN_OR_RETURN(lhs, rexpr) \
  FARPOOL_ASSIGN_OR_RETURN_IMPL_(FARPOOL_CONCAT_(farpool_result_, __LINE__), lhs, rexpr)
// NOLINTBEGIN(bugprone-macro-parentheses): `lhs` is a declaration, it cannot be parenthesised.
#define FARPOOL_ASSIGN_OR_RETURN_IMPL_(result, lhs, rexpr) \
  auto result = (rexpr);                                   \
  if (!result.ok()) return result.status();                \
  lhs = std::move(result).value()
// NOLINTEND(bugprone-macro-parentheses)
