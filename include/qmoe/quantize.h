// qmoe: host quantizers and dequantizers for every weight format, producing and reading ORT's raw
// layouts (see FcTensorShapes). The quantizer formulas are documented in docs/formats.md.
#pragma once

#include <cstdint>
#include <vector>

#include "qmoe/format.h"
#include "qmoe/layer.h"
#include "qmoe/status.h"

namespace qmoe {

// One FC of all experts, quantized, owning its bytes in ORT's raw layout.
struct QuantizedFc {
  FcFormat format;
  int64_t experts = 0, n = 0, k = 0;
  std::vector<uint8_t> weight;
  std::vector<uint8_t> scales;       // scale_dtype elements
  std::vector<uint8_t> zero_points;  // empty unless format.zero_points
  std::vector<float> global_scale;   // [E] where the format has one

  // Views with the shapes of fc_tensor_shapes(); bias is passed through.
  FcWeights view(const TensorView& bias = TensorView()) const;
};

// Sizes every buffer of *out for `experts` experts of logical [n, k] (contents zeroed).
Status allocate_fc(const FcFormat& f, int64_t experts, int64_t n, int64_t k, QuantizedFc* out);

// Quantizes expert e from fp32 w [n, k] (row-major, logical orientation) into *out, which must come
// from allocate_fc. Experts are independent, so callers may quantize them in parallel.
Status quantize_expert(const float* w, int64_t e, QuantizedFc* out);

// Quantizes fp32 w [experts, n, k] into a new QuantizedFc.
Status quantize_fc(const FcFormat& f, const float* w, int64_t experts, int64_t n, int64_t k,
                   QuantizedFc* out);

// Dequantizes row `row` (K values) of expert e of a raw-layout FC. T is float or double: for float
// the arithmetic is the documented fp32 formula ((q - zp) * scale, code * block_scale * global,
// ...); for double every step is exact or rounded once in fp64 (the oracle). No validation: call
// check_layer() first.
template <typename T>
void dequantize_row(const FcFormat& f, const FcWeights& w, int64_t n, int64_t k, int64_t e,
                    int64_t row, T* out);

// Dequantizes a whole FC [experts, n, k] to fp32 (tests, tools).
Status dequantize_fc(const FcFormat& f, const FcWeights& w, int64_t experts, int64_t n, int64_t k,
                     float* out);

// Repacks FP4 weights between ORT's N-packed [E, K, N/2] and the row-major K-packed [E, N, K/2]
// layout. Exact (a permutation of nibbles).
void fp4_repack(Fp4Layout from, const uint8_t* src, int64_t experts, int64_t n, int64_t k,
                uint8_t* dst);

// Relative-norm error ||deq(quant(w)) - w|| / ||w|| that quantizing N(0, 1) weights into f may
// reach, for K >= 256. Tests assert it; README's table prints it.
double quantization_error_budget(const FcFormat& f);

}  // namespace qmoe
