// cutlass_grouped.h's host side: which arguments the CUTLASS kernel takes, its workspace, and the
// dispatch to the per-dtype instances. No CUTLASS header is included here.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cuda/gemm/cutlass_grouped.h"
#include "cuda/gemm/cutlass_instances.h"

namespace qmoe::cuda {
namespace {

// TMA's rule: global addresses and strides are multiples of 16 bytes.
constexpr int64_t kTmaBytes = 16;

bool fail(std::string* why, const std::string& what) {
  if (why) *why = what;
  return false;
}

bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kTmaBytes == 0; }

}  // namespace

bool cutlass_gemm_can_implement(const GroupedGemmArgs& a, std::string* why) {
  if (a.dtype != DType::kBF16 && a.dtype != DType::kF16) {
    return fail(why, std::string("dtype ") + dtype_name(a.dtype) + " (bf16 or f16 only)");
  }
  const int64_t elems = kTmaBytes / 2;  // 16 bytes of bf16/f16
  if (a.k % elems != 0) return fail(why, "k = " + std::to_string(a.k) + " not a multiple of 8");
  if (a.lda % elems != 0) return fail(why, "lda not a multiple of 8");
  if (a.ldb % elems != 0) return fail(why, "ldb not a multiple of 8");
  if (a.b_stride % elems != 0) return fail(why, "b_stride not a multiple of 8");
  // D is column-major with the n features contiguous: CUTLASS's epilogue wants 16-byte vectors.
  if (a.n % 4 != 0) return fail(why, "n = " + std::to_string(a.n) + " not a multiple of 4");
  if (a.ldc % 4 != 0) return fail(why, "ldc not a multiple of 4");
  if (!aligned(a.a) || !aligned(a.b) || !aligned(a.c)) {
    return fail(why, "a, b or c not 16-byte aligned");
  }
  if (a.n > INT32_MAX || a.k > INT32_MAX) return fail(why, "n or k beyond int32");
  return true;
}

size_t cutlass_gemm_workspace_bytes(DType dtype, int64_t max_groups, int sm_count) {
  if (max_groups <= 0) return 0;
  if (dtype == DType::kBF16) {
    return cutlass_detail::instance_workspace_bytes<true>(max_groups, sm_count);
  }
  if (dtype == DType::kF16) {
    return cutlass_detail::instance_workspace_bytes<false>(max_groups, sm_count);
  }
  return 0;
}

Status launch_cutlass_grouped_gemm(const GroupedGemmArgs& args, int sm_count, void* workspace,
                                   size_t workspace_bytes, cudaStream_t stream) {
  std::string why;
  if (!cutlass_gemm_can_implement(args, &why)) {
    return Status::invalid("launch_cutlass_grouped_gemm: args: " + why);
  }
  if (args.max_groups <= 0) {
    return Status::invalid("launch_cutlass_grouped_gemm: args.max_groups: expected > 0, got " +
                           std::to_string(args.max_groups));
  }
  if (sm_count <= 0) {
    return Status::invalid("launch_cutlass_grouped_gemm: sm_count: expected > 0, got " +
                           std::to_string(sm_count));
  }
  if (args.sched.touched == nullptr || args.sched.n_touched == nullptr ||
      args.sched.offsets == nullptr) {
    return Status::invalid("launch_cutlass_grouped_gemm: args.sched: expected device pointers");
  }
  const size_t need = cutlass_gemm_workspace_bytes(args.dtype, args.max_groups, sm_count);
  if (workspace == nullptr || workspace_bytes < need ||
      reinterpret_cast<uintptr_t>(workspace) % 256 != 0) {
    return Status::invalid("launch_cutlass_grouped_gemm: workspace: expected " +
                           std::to_string(need) + " bytes, 256-byte aligned, got " +
                           std::to_string(workspace == nullptr ? 0 : workspace_bytes));
  }
  return args.dtype == DType::kBF16
             ? cutlass_detail::instance_launch<true>(args, sm_count, workspace, stream)
             : cutlass_detail::instance_launch<false>(args, sm_count, workspace, stream);
}

}  // namespace qmoe::cuda
