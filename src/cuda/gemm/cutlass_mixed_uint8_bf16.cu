// The mixed-input grouped GEMM, uint8 codes, bf16 activations (cutlass_mixed_kernel.cuh).
#include "cuda/gemm/cutlass_mixed_kernel.cuh"

QMOE_CUTLASS_MIXED_INSTANCE(MixedCodes::kUint8, true, cutlass::bfloat16_t)
