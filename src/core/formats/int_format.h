// Integer formats (int2, int3, int4, int8): (q - zp) * scale over a row-local LSB-first bitstream.
#pragma once

#include <cstdint>

#include "qmoe/quantize.h"

namespace qmoe {
namespace formats {

// Quantizes expert e of w [n, k] into out (sized by allocate_fc). w must be finite.
void quantize_int_expert(const float* w, int64_t e, QuantizedFc* out);

template <typename T>
void dequantize_int_row(const FcFormat& f, const FcWeights& w, int64_t n, int64_t k, int64_t e,
                        int64_t row, T* out);

}  // namespace formats
}  // namespace qmoe
