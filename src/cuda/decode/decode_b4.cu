// The decode kernel's int4 instantiations (a file per width, so that they compile in parallel).
#include "cuda/decode/decode_kernel.cuh"

namespace qmoe::cuda::decode_detail {

template Status launch_decode_kind<4, kIntCodes>(const DecodeFcArgs&, const DecodeGeometry&, size_t,
                                                 cudaStream_t);
template Status prepare_decode_kind<4, kIntCodes>();

}  // namespace qmoe::cuda::decode_detail

#if defined(QMOE_STAMPS)
#include "cuda/common/stamps.h"
namespace qmoe::cuda {
QMOE_STAMPS_EXPORT(stamps_take_decode4)
}  // namespace qmoe::cuda
#endif
