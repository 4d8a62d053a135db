// launch_grouped_gemm(): argument validation and dispatch by dtype. Nothing here synchronizes or
// allocates, so a launch can be captured in a CUDA graph.
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <string>

#include "cuda/gemm/gemm_launchers.cuh"
#include "cuda/gemm/grouped_gemm.h"

namespace qmoe::cuda {
namespace {

Status bad(const std::string& field, const std::string& expected, const std::string& got) {
  return Status::invalid("launch_grouped_gemm: args." + field + ": expected " + expected +
                         ", got " + got);
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

std::string ptr_string(const void* p) {
  if (p == nullptr) return "null";
  return "address with remainder " + std::to_string(reinterpret_cast<uintptr_t>(p) & 15u) +
         " mod 16";
}

Status check_pointer(const char* field, const void* p, bool needs16) {
  if (p == nullptr) return bad(field, "a device pointer", "null");
  if (needs16 && !aligned16(p)) return bad(field, "a 16-byte aligned pointer", ptr_string(p));
  return Status::ok();
}

Status validate(const GroupedGemmArgs& a) {
  constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();
  if (a.dtype != DType::kBF16 && a.dtype != DType::kF16 && a.dtype != DType::kF32) {
    return bad("dtype", "bf16, f16 or f32", dtype_name(a.dtype));
  }
  const int64_t elem = static_cast<int64_t>(dtype_size(a.dtype));
  QMOE_RETURN_IF_ERROR(check_pointer("a", a.a, true));
  QMOE_RETURN_IF_ERROR(check_pointer("b", a.b, true));
  QMOE_RETURN_IF_ERROR(check_pointer("c", a.c, true));
  QMOE_RETURN_IF_ERROR(check_pointer("sched.touched", a.sched.touched, false));
  QMOE_RETURN_IF_ERROR(check_pointer("sched.n_touched", a.sched.n_touched, false));
  QMOE_RETURN_IF_ERROR(check_pointer("sched.offsets", a.sched.offsets, false));
  QMOE_RETURN_IF_ERROR(check_pointer("sched.tile_start", a.sched.tile_start, false));
  const std::string k_align = std::to_string(kGemmKAlign);
  if (a.n <= 0 || a.n > kIntMax) {
    return bad("n", "a count in [1, " + std::to_string(kIntMax) + "]", std::to_string(a.n));
  }
  if (a.k <= 0 || a.k > kIntMax || a.k % kGemmKAlign != 0) {
    return bad("k", "a positive multiple of " + k_align + " (callers zero-pad K)",
               std::to_string(a.k));
  }
  if (a.lda < a.k || a.lda % kGemmKAlign != 0) {
    return bad("lda", "a multiple of " + k_align + " >= k = " + std::to_string(a.k),
               std::to_string(a.lda));
  }
  if (a.ldb < a.k || a.ldb % kGemmKAlign != 0) {
    return bad("ldb", "a multiple of " + k_align + " >= k = " + std::to_string(a.k),
               std::to_string(a.ldb));
  }
  if (a.ldc < a.n) {
    return bad("ldc", ">= n = " + std::to_string(a.n), std::to_string(a.ldc));
  }
  if (a.max_groups <= 0) return bad("max_groups", "> 0", std::to_string(a.max_groups));
  if (a.first_group < 0) return bad("first_group", ">= 0", std::to_string(a.first_group));
  // Every group's B must start 16-byte aligned; with more than one group they must not overlap.
  if (a.b_stride < 0 || (a.b_stride * elem) % 16 != 0) {
    return bad("b_stride", "a non-negative multiple of " + std::to_string(16 / elem) + " elements",
               std::to_string(a.b_stride));
  }
  if (a.max_groups > 1 && a.b_stride < a.n * a.ldb) {
    return bad("b_stride", ">= n * ldb = " + std::to_string(a.n * a.ldb) + " when max_groups > 1",
               std::to_string(a.b_stride));
  }
  if (a.max_tiles < 0) return bad("max_tiles", ">= 0", std::to_string(a.max_tiles));
  return Status::ok();
}

}  // namespace

Status launch_grouped_gemm(const GroupedGemmArgs& args, cudaStream_t stream) {
  QMOE_RETURN_IF_ERROR(validate(args));
  if (args.max_tiles == 0) return Status::ok();
  if (args.dtype == DType::kF32) return gemm_detail::launch_f32_gemm(args, stream);
  return gemm_detail::launch_mma_gemm(args, stream);
}

}  // namespace qmoe::cuda
