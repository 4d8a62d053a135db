// The decode kernel's NVFP4 and MXFP4 instantiations (E2M1 codes in the FP4 layout, 4 bits): one
// scale-block variant each (NVFP4 one fp32 block over K, MXFP4 blocks of two K steps), both
// dtypes, every column-group count and both rings.
#include "cuda/decode/decode_kernel.cuh"

namespace qmoe::cuda::decode_detail {

namespace {

constexpr int kNv = static_cast<int>(MmaCodes::kNvFp4);
constexpr int kMx = static_cast<int>(MmaCodes::kMxFp4);

template <int kCode>
constexpr int fp4_spb() {
  return kCode == kNv ? 0 : 2;
}

template <int kCode, bool kBf16>
Status launch_fp4(const DecodeFcArgs& a, const DecodeGeometry& geo, size_t smem, int route_groups,
                  cudaStream_t stream) {
  constexpr int kSpb = fp4_spb<kCode>();
  if (route_groups == 0) return launch_one<4, kBf16, 0, kSpb, kCode>(a, geo, smem, stream);
  if (route_groups == 1) return launch_one<4, kBf16, 1, kSpb, kCode>(a, geo, smem, stream);
  return launch_one<4, kBf16, 2, kSpb, kCode>(a, geo, smem, stream);
}

template <int kCode, bool kBf16>
Status opt_in_fp4() {
  constexpr int kSpb = fp4_spb<kCode>();
  QMOE_RETURN_IF_ERROR((opt_in<4, kBf16, 0, kSpb, kCode>()));
  QMOE_RETURN_IF_ERROR((opt_in<4, kBf16, 1, kSpb, kCode>()));
  return opt_in<4, kBf16, 2, kSpb, kCode>();
}

}  // namespace

Status launch_decode_fp4(const DecodeFcArgs& a, const DecodeGeometry& geo, size_t smem,
                         int route_groups, cudaStream_t stream) {
  const bool bf16 = a.dtype == DType::kBF16;
  if (a.shape.codes == MmaCodes::kNvFp4) {
    return bf16 ? launch_fp4<kNv, true>(a, geo, smem, route_groups, stream)
                : launch_fp4<kNv, false>(a, geo, smem, route_groups, stream);
  }
  return bf16 ? launch_fp4<kMx, true>(a, geo, smem, route_groups, stream)
              : launch_fp4<kMx, false>(a, geo, smem, route_groups, stream);
}

Status prepare_decode_fp4() {
  QMOE_RETURN_IF_ERROR((opt_in_fp4<kNv, true>()));
  QMOE_RETURN_IF_ERROR((opt_in_fp4<kNv, false>()));
  QMOE_RETURN_IF_ERROR((opt_in_fp4<kMx, true>()));
  return opt_in_fp4<kMx, false>();
}

}  // namespace qmoe::cuda::decode_detail
