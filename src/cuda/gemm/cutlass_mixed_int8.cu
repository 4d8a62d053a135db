// The mixed-input grouped GEMM's int8 instances (cutlass_mixed_instances.h): kInt8 (signed codes,
// shuffled) and kInt8Zero (the same codes, zero points) with bf16 activations on the 256 x 128
// tile and with f16 on 128 x 128. Grouped by kind as cutlass_mixed_int4.cu says why; the narrow
// tile at one CTA per SM, kInt8's with and without the activation epilogue (at two:
// cutlass_mixed_narrow.cu).
#include "cuda/gemm/cutlass_mixed_narrow.cuh"
#include "cuda/gemm/cutlass_mixed_tall.cuh"

QMOE_CUTLASS_MIXED_INSTANCE(MixedCodes::kInt8, true, 256, 128, false, 1, cutlass::bfloat16_t)
QMOE_CUTLASS_MIXED_INSTANCE(MixedCodes::kInt8, false, 128, 128, false, 1, cutlass::half_t)
QMOE_CUTLASS_MIXED_INSTANCE(MixedCodes::kInt8Zero, true, 256, 128, false, 1, cutlass::bfloat16_t)
QMOE_CUTLASS_MIXED_INSTANCE(MixedCodes::kInt8Zero, false, 128, 128, false, 1, cutlass::half_t)
QMOE_CUTLASS_MIXED_INSTANCE(MixedCodes::kInt8, true, 256, 32, false, 1, cutlass::bfloat16_t)
QMOE_CUTLASS_MIXED_INSTANCE(MixedCodes::kInt8, true, 256, 32, true, 1, cutlass::bfloat16_t)
QMOE_CUTLASS_MIXED_INSTANCE(MixedCodes::kInt8Zero, true, 256, 32, false, 1, cutlass::bfloat16_t)
