// qmoe: what the CUDA runtime says about the GPU, for `qmoe info` and backend_available().
#pragma once

#include <string>

namespace qmoe {

struct CudaDeviceInfo {
  int device_count = 0;
  std::string name;  // device 0
  int cc_major = 0, cc_minor = 0;
  int sm_count = 0;
  long long global_mem_bytes = 0;
  int l2_bytes = 0;
  int runtime_version = 0, driver_version = 0;
};

// False when qmoe was built without CUDA or no device is present (info->device_count says which).
bool cuda_device_info(CudaDeviceInfo* info);

}  // namespace qmoe
