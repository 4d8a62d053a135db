#include <cstdio>

#include "cli.h"
#include "cuda/cuda_backend.h"

namespace qmoe::cli {

int usage_error(const std::string& message) {
  std::fprintf(stderr, "qmoe: error: %s\n", message.c_str());
  return kExitUsage;
}

const char* const kExitCodesHelp =
    "Exit codes: 0 success, 1 a failed accuracy check, 2 bad usage or input, 3 an I/O error,\n"
    "4 a request this build or machine cannot run (e.g. no GPU), 5 an internal error.";

int status_error(const Status& s) {
  std::fprintf(stderr, "qmoe: error: %s\n", s.to_string().c_str());
  switch (s.code()) {
    case StatusCode::kOk:
      return kExitOk;
    case StatusCode::kInvalidArgument:
      return kExitUsage;
    case StatusCode::kIoError:
      return kExitIo;
    case StatusCode::kUnsupported:
      return kExitUnsupported;
    case StatusCode::kInternal:
      break;
  }
  return kExitInternal;
}

Status parse_act_dtype(const std::string& s, const char* flag, DType* out) {
  DType t;
  if (!parse_dtype(s, &t) || (t != DType::kF32 && t != DType::kF16 && t != DType::kBF16)) {
    return Status::invalid(std::string(flag) + ": expected f32, f16 or bf16, got '" + s + "'");
  }
  *out = t;
  return Status::ok();
}

Status parse_backend(const std::string& s, BackendKind* out) {
  if (s == "auto") {
    *out = backend_available(BackendKind::kCuda) ? BackendKind::kCuda : BackendKind::kCpu;
  } else if (s == "cpu") {
    *out = BackendKind::kCpu;
  } else if (s == "cuda") {
    std::string why;
    if (!cuda_backend_available(&why)) return Status::unsupported("--backend cuda: " + why);
    *out = BackendKind::kCuda;
  } else {
    return Status::invalid("--backend: expected auto, cpu or cuda, got '" + s + "'");
  }
  return Status::ok();
}

}  // namespace qmoe::cli
