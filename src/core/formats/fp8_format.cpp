// FP8 formats. Layout (per expert):
//   weight  e4m3 [N, K], row-major
//   fp8:       global fp32 scalar;                         w = e4m3 * global
//   fp8_block: scales [ceil(N/bs), ceil(K/bs)] in scale_dtype; w = e4m3 * scale[n/bs, k/bs]
// Edge blocks may be partial.
#include "core/formats/fp8_format.h"

#include <algorithm>
#include <cmath>

#include "core/formats/codec.h"

namespace qmoe {
namespace formats {

namespace {

template <typename T>
inline void fp8_span(const uint8_t* p, int64_t count, T s, T* out) {
  for (int64_t i = 0; i < count; ++i) out[i] = static_cast<T>(kE4m3.v[p[i]]) * s;
}

template <typename T, DType kScale>
void fp8_block_row(const uint8_t* codes, const uint8_t* scales, int64_t scale_index, int64_t k,
                   int64_t block, T* out) {
  for (int64_t k0 = 0, b = 0; k0 < k; k0 += block, ++b) {
    const T s = static_cast<T>(load_scale<kScale>(scales, scale_index + b));
    fp8_span<T>(codes + k0, std::min(block, k - k0), s, out + k0);
  }
}

// Stores e4m3(x / s) for count values; s == 0 (an underflowed stored scale) gives zeros.
void encode_fp8(const float* x, int64_t count, float s, uint8_t* dst) {
  for (int64_t i = 0; i < count; ++i) dst[i] = s > 0.0f ? num::f32_to_e4m3(x[i] / s) : 0;
}

}  // namespace

void quantize_fp8_expert(const float* w, int64_t e, QuantizedFc* out) {
  const FcFormat& f = out->format;
  const int64_t n = out->n, k = out->k;
  uint8_t* codes = out->weight.data() + e * n * k;
  if (f.format == WeightFormat::kFp8) {
    float amax = 0.0f;
    for (int64_t i = 0; i < n * k; ++i) amax = std::max(amax, std::fabs(w[i]));
    const float g = amax > 0.0f ? amax / 448.0f : 1.0f;
    out->global_scale[e] = g;
    encode_fp8(w, n * k, g, codes);
    return;
  }
  const int64_t bs = f.block_size;
  const int64_t nbn = ceil_div(n, bs), nbk = ceil_div(k, bs);
  for (int64_t bn = 0; bn < nbn; ++bn) {
    const int64_t rows = std::min(bs, n - bn * bs);
    for (int64_t bk = 0; bk < nbk; ++bk) {
      const int64_t cols = std::min(bs, k - bk * bs);
      const float* x = w + bn * bs * k + bk * bs;
      float amax = 0.0f;
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(x[r * k + c]));
      }
      const float s = store_float_scale(f.scale_dtype, amax > 0.0f ? amax / 448.0f : 1.0f,
                                        out->scales.data(), (e * nbn + bn) * nbk + bk);
      for (int64_t r = 0; r < rows; ++r) {
        encode_fp8(x + r * k, cols, s, codes + (bn * bs + r) * k + bk * bs);
      }
    }
  }
}

template <typename T>
void dequantize_fp8_row(const FcFormat& f, const FcWeights& w, int64_t n, int64_t k, int64_t e,
                        int64_t row, T* out) {
  const uint8_t* codes = static_cast<const uint8_t*>(w.weight.data) + (e * n + row) * k;
  if (f.format == WeightFormat::kFp8) {
    fp8_span<T>(codes, k, static_cast<T>(static_cast<const float*>(w.global_scale.data)[e]), out);
    return;
  }
  const int64_t bs = f.block_size;
  const int64_t nbk = ceil_div(k, bs);
  const int64_t first = (e * ceil_div(n, bs) + row / bs) * nbk;
  const uint8_t* scales = static_cast<const uint8_t*>(w.scales.data);
  switch (f.scale_dtype) {
    case DType::kF16:
      fp8_block_row<T, DType::kF16>(codes, scales, first, k, bs, out);
      break;
    case DType::kBF16:
      fp8_block_row<T, DType::kBF16>(codes, scales, first, k, bs, out);
      break;
    default:
      fp8_block_row<T, DType::kF32>(codes, scales, first, k, bs, out);
      break;
  }
}

template void dequantize_fp8_row<float>(const FcFormat&, const FcWeights&, int64_t, int64_t,
                                        int64_t, int64_t, float*);
template void dequantize_fp8_row<double>(const FcFormat&, const FcWeights&, int64_t, int64_t,
                                         int64_t, int64_t, double*);

}  // namespace formats
}  // namespace qmoe
