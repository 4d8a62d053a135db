// The mixed-input grouped GEMM's e4m3 instances (fp8, fp8_block and MXFP4's e4m3 copy,
// cutlass_mixed_instances.h): bf16 activations on the 256 x 128 and 256 x 64 tiles, f16 on
// 128 x 128 and 256 x 64. Grouped by kind as cutlass_mixed_int4.cu says why; the narrow tile's
// at one CTA per SM are here too (at two: cutlass_mixed_narrow.cu).
#include "cuda/gemm/cutlass_mixed_mid.cuh"
#include "cuda/gemm/cutlass_mixed_narrow.cuh"
#include "cuda/gemm/cutlass_mixed_tall.cuh"

QMOE_CUTLASS_MIXED_INSTANCE(MixedCodes::kE4m3, true, 256, 128, false, 1, cutlass::bfloat16_t)
QMOE_CUTLASS_MIXED_INSTANCE(MixedCodes::kE4m3, true, 256, 64, false, 1, cutlass::bfloat16_t)
QMOE_CUTLASS_MIXED_INSTANCE(MixedCodes::kE4m3, false, 128, 128, false, 1, cutlass::half_t)
QMOE_CUTLASS_MIXED_INSTANCE(MixedCodes::kE4m3, false, 256, 64, false, 1, cutlass::half_t)
QMOE_CUTLASS_MIXED_INSTANCE(MixedCodes::kE4m3, true, 256, 32, false, 1, cutlass::bfloat16_t)
QMOE_CUTLASS_MIXED_INSTANCE(MixedCodes::kE4m3, false, 256, 32, false, 1, cutlass::half_t)
