// The fused decode kernel's int4 instantiations (a file per width, so that they compile in
// parallel).
#include "cuda/fused/fused_decode_kernel.cuh"

namespace qmoe::cuda::fused_detail {

template const void* fused_kernel_for<4>(bool, int);

}  // namespace qmoe::cuda::fused_detail
