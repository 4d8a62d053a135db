// FP4 formats (nvfp4, mxfp4): E2M1 codes, a block scale per 16 / 32 values along K and an fp32
// global scale per expert; w = (code * block_scale) * global.
#pragma once

#include <cstdint>

#include "qmoe/quantize.h"

namespace qmoe {
namespace formats {

// Quantizes expert e of w [n, k] into out (sized by allocate_fc). w must be finite.
void quantize_fp4_expert(const float* w, int64_t e, QuantizedFc* out);

template <typename T>
void dequantize_fp4_row(const FcFormat& f, const FcWeights& w, int64_t n, int64_t k, int64_t e,
                        int64_t row, T* out);

}  // namespace formats
}  // namespace qmoe
