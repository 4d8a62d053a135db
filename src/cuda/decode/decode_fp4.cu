// The decode kernel's NVFP4 and MXFP4 instantiations (E2M1 codes in the FP4 layout, 4 bits): one
// scale-block variant each (NVFP4 one fp32 block over K, MXFP4 blocks of two K steps), both
// dtypes and both rings (decode_kernel.cuh's for_each_kernel).
#include "cuda/decode/decode_kernel.cuh"

namespace qmoe::cuda::decode_detail {

template Status launch_decode_kind<4, kNvFp4Codes>(const DecodeFcArgs&, const DecodeGeometry&,
                                                   size_t, cudaStream_t);
template Status prepare_decode_kind<4, kNvFp4Codes>();
template Status launch_decode_kind<4, kMxFp4Codes>(const DecodeFcArgs&, const DecodeGeometry&,
                                                   size_t, cudaStream_t);
template Status prepare_decode_kind<4, kMxFp4Codes>();

}  // namespace qmoe::cuda::decode_detail
