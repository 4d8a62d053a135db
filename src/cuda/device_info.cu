// Queries the CUDA runtime. Kept in a .cu so that the CUDA toolchain of a QMOE_CUDA build compiles
// and links it, the same path the kernels take.
#include <cuda_runtime.h>

#include "cuda/device_info.h"

namespace qmoe {

bool cuda_device_info(CudaDeviceInfo* info) {
  *info = CudaDeviceInfo();
  cudaRuntimeGetVersion(&info->runtime_version);
  cudaDriverGetVersion(&info->driver_version);
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count <= 0) {
    cudaGetLastError();  // clear the sticky "no device" error
    return false;
  }
  info->device_count = count;
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return false;
  info->name = prop.name;
  info->cc_major = prop.major;
  info->cc_minor = prop.minor;
  info->sm_count = prop.multiProcessorCount;
  info->global_mem_bytes = static_cast<long long>(prop.totalGlobalMem);
  info->l2_bytes = prop.l2CacheSize;
  return true;
}

}  // namespace qmoe
