// The decode kernel's FP8 instantiations (fp8 and fp8_block: e4m3 codes in the FP8 layout, 8 bits,
// scale blocks of whole chunks or one per row, so one scale-block variant): both dtypes and both
// rings (decode_kernel.cuh's for_each_kernel).
#include "cuda/decode/decode_kernel.cuh"

namespace qmoe::cuda::decode_detail {

template Status launch_decode_kind<8, kFp8Codes>(const DecodeFcArgs&, const DecodeGeometry&, size_t,
                                                 cudaStream_t);
template Status prepare_decode_kind<8, kFp8Codes>();

}  // namespace qmoe::cuda::decode_detail

#if defined(QMOE_STAMPS)
#include "cuda/common/stamps.h"
namespace qmoe::cuda {
QMOE_STAMPS_EXPORT(stamps_take_decode_fp8)
}  // namespace qmoe::cuda
#endif
