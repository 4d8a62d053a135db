// Built when qmoe is configured without CUDA: the CUDA backend reports itself absent.
#include "cuda/device_info.h"

namespace qmoe {

bool cuda_device_info(CudaDeviceInfo* info) { return false; }

}  // namespace qmoe
