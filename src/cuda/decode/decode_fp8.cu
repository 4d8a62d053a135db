// The decode kernel's FP8 instantiations (fp8 and fp8_block: e4m3 codes in the FP8 layout, 8 bits,
// scale blocks of whole chunks or one per row, so one scale-block variant): both dtypes, every
// column-group count and both rings. The launch switch and the shared-memory opt-in both walk the
// one list below.
#include <type_traits>

#include "cuda/decode/decode_kernel.cuh"

namespace qmoe::cuda::decode_detail {

namespace {

constexpr int kFp8Code = static_cast<int>(MmaCodes::kFp8);

// The instantiation list: f(bf16, column groups) for every kernel this file holds, in order,
// stopping at the first error.
template <typename F>
Status for_each_fp8_kernel(F&& f) {
  using T = std::true_type;
  using N = std::false_type;
  QMOE_RETURN_IF_ERROR(f(T{}, std::integral_constant<int, 0>{}));
  QMOE_RETURN_IF_ERROR(f(T{}, std::integral_constant<int, 1>{}));
  QMOE_RETURN_IF_ERROR(f(T{}, std::integral_constant<int, 2>{}));
  QMOE_RETURN_IF_ERROR(f(N{}, std::integral_constant<int, 0>{}));
  QMOE_RETURN_IF_ERROR(f(N{}, std::integral_constant<int, 1>{}));
  return f(N{}, std::integral_constant<int, 2>{});
}

}  // namespace

Status launch_decode_fp8(const DecodeFcArgs& a, const DecodeGeometry& geo, size_t smem,
                         int route_groups, cudaStream_t stream) {
  const bool bf16 = a.dtype == DType::kBF16;
  bool launched = false;
  QMOE_RETURN_IF_ERROR(for_each_fp8_kernel([&](auto b, auto mc) -> Status {
    if (launched || b.value != bf16 || mc.value != route_groups) return Status::ok();
    launched = true;
    return launch_one<8, decltype(b)::value, decltype(mc)::value, 0, kFp8Code>(a, geo, smem,
                                                                               stream);
  }));
  if (!launched) {
    return Status::internal("decode: no FP8 kernel for " + std::to_string(route_groups) +
                            " column groups");
  }
  return Status::ok();
}

Status prepare_decode_fp8() {
  return for_each_fp8_kernel([](auto b, auto mc) -> Status {
    return opt_in<8, decltype(b)::value, decltype(mc)::value, 0, kFp8Code>();
  });
}

}  // namespace qmoe::cuda::decode_detail
