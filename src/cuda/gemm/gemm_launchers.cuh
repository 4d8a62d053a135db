// The per-dtype launchers behind launch_grouped_gemm(). They run after the arguments were validated
// and max_tiles > 0; each sets its kernel's attributes once per device and launches on `stream`.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "cuda/common/cuda_check.h"
#include "cuda/gemm/grouped_gemm.h"
#include "qmoe/status.h"

namespace qmoe::cuda::gemm_detail {

// bf16 / f16 operands on tensor cores (grouped_gemm_mma.cu).
Status launch_mma_gemm(const GroupedGemmArgs& args, cudaStream_t stream);
// f32 operands on CUDA cores (grouped_gemm_f32.cu).
Status launch_f32_gemm(const GroupedGemmArgs& args, cudaStream_t stream);

// Runs `configure` (kernel attributes: a host-side call, no stream work, so graph capture is
// unaffected) the first time a device is seen; `done` holds one bit per device. Two threads racing
// may both configure, which is harmless: the attributes are idempotent.
template <typename Fn>
Status configure_once(std::atomic<uint64_t>* done, Fn configure) {
  int device = 0;
  QMOE_CUDA_TRY(cudaGetDevice(&device));
  const uint64_t bit = device < 64 ? (uint64_t{1} << device) : 0;
  if (bit != 0 && (done->load(std::memory_order_acquire) & bit) != 0) return Status::ok();
  QMOE_RETURN_IF_ERROR(configure());
  done->fetch_or(bit, std::memory_order_release);
  return Status::ok();
}

}  // namespace qmoe::cuda::gemm_detail
