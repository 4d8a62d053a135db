// The fused decode kernel's int8 instantiations (a file per width, so that they compile in
// parallel).
#include "cuda/fused/fused_decode_kernel.cuh"

namespace qmoe::cuda::fused_detail {

template const void* fused_kernel_for<8>(bool, int);

}  // namespace qmoe::cuda::fused_detail
