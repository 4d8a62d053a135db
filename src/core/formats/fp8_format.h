// FP8 formats: e4m3 weights [N, K] with one fp32 global scale per expert (fp8) or one scale per
// square block of block_size x block_size over (N, K) (fp8_block).
#pragma once

#include <cstdint>

#include "qmoe/quantize.h"

namespace qmoe {
namespace formats {

// Quantizes expert e of w [n, k] into out (sized by allocate_fc). w must be finite.
void quantize_fp8_expert(const float* w, int64_t e, QuantizedFc* out);

template <typename T>
void dequantize_fp8_row(const FcFormat& f, const FcWeights& w, int64_t n, int64_t k, int64_t e,
                        int64_t row, T* out);

}  // namespace formats
}  // namespace qmoe
