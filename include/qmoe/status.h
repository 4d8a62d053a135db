// qmoe: status values. The library never throws across its API and never aborts; every fallible
// call returns a Status whose message names the offending argument and what was expected.
#pragma once

#include <string>
#include <utility>

namespace qmoe {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // a shape, size, value or attribute the caller got wrong
  kUnsupported,      // a valid request this build or backend cannot run
  kIoError,          // file access failed
  kInternal,         // a bug in qmoe: please report
};

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return Status(); }
  static Status invalid(std::string msg) { return {StatusCode::kInvalidArgument, std::move(msg)}; }
  static Status unsupported(std::string msg) { return {StatusCode::kUnsupported, std::move(msg)}; }
  static Status io_error(std::string msg) { return {StatusCode::kIoError, std::move(msg)}; }
  static Status internal(std::string msg) { return {StatusCode::kInternal, std::move(msg)}; }

  bool is_ok() const { return code_ == StatusCode::kOk; }
  explicit operator bool() const { return is_ok(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "invalid argument: fc1_scales: expected shape [8, 1536, 16], got [8, 1536, 8]"
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

const char* status_code_name(StatusCode code);

}  // namespace qmoe

// Propagates a non-ok Status to the caller.
#define QMOE_RETURN_IF_ERROR(expr)                  \
  do {                                              \
    ::qmoe::Status qmoe_status_ = (expr);           \
    if (!qmoe_status_.is_ok()) return qmoe_status_; \
  } while (0)
