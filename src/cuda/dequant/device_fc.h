// One FC of all experts as the CUDA backend keeps it in device memory: ORT's raw layout (FP4 in the
// K-packed orientation, repacked once at prepare), scales and zero points as stored.
#pragma once

#include <cstdint>

#include "core/formats/mma_pack.h"
#include "qmoe/format.h"
#include "qmoe/tensor.h"

namespace qmoe::cuda {

struct DeviceFc {
  FcFormat format;
  int64_t n = 0, k = 0;                  // logical [n, k] per expert
  const uint8_t* weight = nullptr;       // see fc_tensor_shapes (fp4: K-packed)
  const uint8_t* scales = nullptr;       // scale_dtype elements, or nullptr (fp8)
  const uint8_t* zero_points = nullptr;  // integer formats with zero points
  const float* global_scale = nullptr;   // [E], formats with a global scale
  const void* bias = nullptr;            // [E, n] in bias_dtype, or nullptr
  DType bias_dtype = DType::kF32;
  // FP4 and FP8 kept only in the decode kernels' layout (one copy of the weights on the device;
  // weight and scales are then null): the packed codes and the tile-ordered scales (mma_pack.h;
  // FP4's 8-bit ones, fp8_block's per packed row in scale_dtype, none for fp8), which the generic
  // path dequantizes from (dequant_packed.cu).
  MmaPackShape packed;
  // The packed FC's first logical row this FC's row 0 is: FP8 FC1 (0) and a separate FC3 (I)
  // share one packed gated FC (layer_prepare.cu); 0 otherwise.
  int64_t packed_row0 = 0;
  const uint32_t* packed_words = nullptr;
  const uint8_t* packed_scales = nullptr;
};

}  // namespace qmoe::cuda
