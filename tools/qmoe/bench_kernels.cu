// The read-bandwidth kernel of `qmoe bench`: a pass over a large buffer that only reads it, so the
// ceiling it measures is of the same traffic as a decode call's (weights read once, little
// written). Built only when tools/CMakeLists.txt adds it (it then defines QMOE_BENCH_READ_KERNEL).
#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>

#include "bench.h"
#include "cuda/common/cuda_check.h"

namespace qmoe::cli {

namespace {

constexpr int kThreads = 512;
// Loads each thread issues before it consumes any: enough bytes in flight per SM to cover the
// DRAM latency at full bandwidth.
constexpr int kUnroll = 4;

__device__ __forceinline__ uint32_t fold(const uint4& v) { return v.x ^ v.y ^ v.z ^ v.w; }

__global__ void __launch_bounds__(kThreads)
    read_sum_kernel(const uint4* __restrict__ src, size_t words, uint32_t* __restrict__ partials) {
  const size_t stride = static_cast<size_t>(gridDim.x) * kThreads;
  size_t i = static_cast<size_t>(blockIdx.x) * kThreads + threadIdx.x;
  uint32_t acc = 0;
  for (; i + (kUnroll - 1) * stride < words; i += kUnroll * stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = __ldg(src + i + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc += fold(v[u]);
  }
  for (; i < words; i += stride) acc += fold(__ldg(src + i));
  // The sum is written out so that no load can be dropped as dead code.
  using Reduce = cub::BlockReduce<uint32_t, kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  const uint32_t block_sum = Reduce(temp).Sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = block_sum;
}

}  // namespace

Status read_sum_blocks(int* blocks) {
  int device = 0, sms = 0, per_sm = 0;
  QMOE_CUDA_TRY(cudaGetDevice(&device));
  QMOE_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  QMOE_CUDA_TRY(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, read_sum_kernel, kThreads, 0));
  *blocks = sms * (per_sm > 0 ? per_sm : 1);
  return Status::ok();
}

Status launch_read_sum(const void* src, size_t words16, uint32_t* partials, int blocks,
                       void* stream) {
  if (blocks <= 0) return Status::invalid("blocks: expected > 0, got " + std::to_string(blocks));
  read_sum_kernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const uint4*>(src), words16, partials);
  QMOE_CUDA_CHECK_LAUNCH("read_sum_kernel");
  return Status::ok();
}

}  // namespace qmoe::cli
