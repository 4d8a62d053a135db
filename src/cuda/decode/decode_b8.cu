// The decode kernel's int8 instantiations (a file per width, so that they compile in parallel).
#include "cuda/decode/decode_kernel.cuh"

namespace qmoe::cuda::decode_detail {

template Status launch_decode_kind<8, kIntCodes>(const DecodeFcArgs&, const DecodeGeometry&, size_t,
                                                 cudaStream_t);
template Status prepare_decode_kind<8, kIntCodes>();

}  // namespace qmoe::cuda::decode_detail
