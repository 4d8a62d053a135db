// Programmatic dependent launch (Hopper): a kernel launched with it may start while the previous
// kernel on the stream is still running; it must call pdl_wait() before it reads that kernel's
// results, and calls pdl_trigger() once its own dependents may start. Without the launch
// attribute both are no-ops, so a kernel runs correctly either way.
//
// Read what the previous kernel wrote with coherent loads (plain ones, or __ldcg), never with
// __ldg / ld.global.nc: the compiler takes a non-coherent load for one of memory that nothing
// writes while the kernel runs, and may issue it before griddepcontrol.wait, whose memory clobber
// orders only ordinary loads (a decode kernel's __ldg of the routing's output was issued before
// its wait: bench/results/2026-12-06-h100-expert-runs.md).
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace qmoe::cuda {

__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

__device__ __forceinline__ void pdl_trigger() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// Launches kernel<<<grid, block, smem, stream>>>(args...) in thread-block clusters of `cluster`
// CTAs (a plain launch where that is one), with programmatic stream serialization when pdl is set.
template <typename... KernelArgs, typename... Args>
cudaError_t launch_cluster_maybe_pdl(void (*kernel)(KernelArgs...), dim3 grid, dim3 block,
                                     dim3 cluster, size_t smem, cudaStream_t stream, bool pdl,
                                     Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (cluster.x * cluster.y * cluster.z > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster.x;
    attr[n].val.clusterDim.y = cluster.y;
    attr[n].val.clusterDim.z = cluster.z;
    ++n;
  }
  cfg.attrs = n > 0 ? attr : nullptr;
  cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

// Launches kernel<<<grid, block, smem, stream>>>(args...), with programmatic stream
// serialization when pdl is set.
template <typename... KernelArgs, typename... Args>
cudaError_t launch_maybe_pdl(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem,
                             cudaStream_t stream, bool pdl, Args&&... args) {
  return launch_cluster_maybe_pdl(kernel, grid, block, dim3(1, 1, 1), smem, stream, pdl,
                                  std::forward<Args>(args)...);
}

}  // namespace qmoe::cuda
