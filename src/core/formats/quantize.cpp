// Public quantize / dequantize entry points: argument checks and dispatch to the format codecs.
#include "qmoe/quantize.h"

#include <cmath>
#include <string>

#include "core/formats/codec.h"
#include "core/formats/fp4_format.h"
#include "core/formats/fp8_format.h"
#include "core/formats/int_format.h"
#include "core/tensor_check.h"

namespace qmoe {

namespace {

int64_t numel(const int64_t* dims, int rank) {
  int64_t c = 1;
  for (int i = 0; i < rank; ++i) c *= dims[i];
  return c;
}

TensorView make_view(const void* data, DType t, const int64_t* dims, int rank) {
  TensorView v;
  v.data = data;
  v.dtype = t;
  v.rank = rank;
  for (int i = 0; i < rank; ++i) v.dims[i] = dims[i];
  return v;
}

// The buffer sizes allocate_fc gives a QuantizedFc of this format and size.
struct FcSizes {
  size_t weight, scales, zero_points, global_scale;
};

FcSizes fc_sizes(const FcFormat& f, int64_t experts, int64_t n, int64_t k) {
  const FcTensorShapes s = fc_tensor_shapes(f, experts, n, k);
  FcSizes z;
  z.weight = static_cast<size_t>(numel(s.weight, s.weight_rank)) * dtype_size(s.weight_dtype);
  z.scales = s.scale_rank
                 ? static_cast<size_t>(numel(s.scale, s.scale_rank)) * dtype_size(s.scale_dtype)
                 : 0;
  z.zero_points =
      s.zero_point_rank ? static_cast<size_t>(numel(s.zero_point, s.zero_point_rank)) : 0;
  z.global_scale = s.global_scale ? static_cast<size_t>(experts) : 0;
  return z;
}

Status check_sizes(int64_t experts, int64_t n, int64_t k) {
  if (experts < 1) return Status::invalid("experts: expected >= 1, got " + std::to_string(experts));
  // Keeps every byte offset the codecs compute (at most E * N * K * 4) inside int64.
  const double elems =
      static_cast<double>(experts) * static_cast<double>(n) * static_cast<double>(k);
  if (elems > 1e17) {
    return Status::invalid("fc: " + std::to_string(experts) + " x " + std::to_string(n) + " x " +
                           std::to_string(k) + " weights is too large");
  }
  return Status::ok();
}

}  // namespace

FcWeights QuantizedFc::view(const TensorView& bias) const {
  const FcTensorShapes s = fc_tensor_shapes(format, experts, n, k);
  FcWeights w;
  w.weight = make_view(weight.data(), s.weight_dtype, s.weight, s.weight_rank);
  if (s.scale_rank) w.scales = make_view(scales.data(), s.scale_dtype, s.scale, s.scale_rank);
  if (s.zero_point_rank) {
    w.zero_points = make_view(zero_points.data(), DType::kU8, s.zero_point, s.zero_point_rank);
  }
  if (s.global_scale) w.global_scale = make_view(global_scale.data(), DType::kF32, &experts, 1);
  w.bias = bias;
  return w;
}

Status allocate_fc(const FcFormat& f, int64_t experts, int64_t n, int64_t k, QuantizedFc* out) {
  if (!out) return Status::invalid("out: expected a QuantizedFc, got nullptr");
  QMOE_RETURN_IF_ERROR(check_fc_format(f, n, k, "fc"));
  QMOE_RETURN_IF_ERROR(check_sizes(experts, n, k));
  const FcSizes z = fc_sizes(f, experts, n, k);
  out->format = f;
  out->experts = experts;
  out->n = n;
  out->k = k;
  out->weight.assign(z.weight, 0);
  out->scales.assign(z.scales, 0);
  out->zero_points.assign(z.zero_points, 0);
  out->global_scale.assign(z.global_scale, 0.0f);
  return Status::ok();
}

Status quantize_expert(const float* w, int64_t e, QuantizedFc* out) {
  if (!out) return Status::invalid("out: expected a QuantizedFc, got nullptr");
  if (!w) return Status::invalid("w: expected fp32 weights, got nullptr");
  QMOE_RETURN_IF_ERROR(check_fc_format(out->format, out->n, out->k, "fc"));
  QMOE_RETURN_IF_ERROR(check_sizes(out->experts, out->n, out->k));
  if (e < 0 || e >= out->experts) {
    return Status::invalid("e: expected an expert in [0, " + std::to_string(out->experts) +
                           "), got " + std::to_string(e));
  }
  const FcSizes z = fc_sizes(out->format, out->experts, out->n, out->k);
  if (out->weight.size() != z.weight || out->scales.size() != z.scales ||
      out->zero_points.size() != z.zero_points || out->global_scale.size() != z.global_scale) {
    return Status::invalid("out: buffers do not match " + out->format.to_string() +
                           " for its experts, n and k (size it with allocate_fc)");
  }
  const int64_t count = out->n * out->k;
  for (int64_t i = 0; i < count; ++i) {
    if (!std::isfinite(w[i])) {
      return Status::invalid("w: non-finite value " + std::to_string(w[i]) + " at [" +
                             std::to_string(i / out->k) + ", " + std::to_string(i % out->k) +
                             "] of expert " + std::to_string(e));
    }
  }
  switch (out->format.info().kind) {
    case FormatKind::kInteger:
      formats::quantize_int_expert(w, e, out);
      break;
    case FormatKind::kFp4:
      formats::quantize_fp4_expert(w, e, out);
      break;
    case FormatKind::kFp8:
      formats::quantize_fp8_expert(w, e, out);
      break;
  }
  return Status::ok();
}

Status quantize_fc(const FcFormat& f, const float* w, int64_t experts, int64_t n, int64_t k,
                   QuantizedFc* out) {
  QMOE_RETURN_IF_ERROR(allocate_fc(f, experts, n, k, out));
  for (int64_t e = 0; e < experts; ++e) {
    QMOE_RETURN_IF_ERROR(quantize_expert(w ? w + e * n * k : nullptr, e, out));
  }
  return Status::ok();
}

template <typename T>
void dequantize_row(const FcFormat& f, const FcWeights& w, int64_t n, int64_t k, int64_t e,
                    int64_t row, T* out) {
  switch (f.info().kind) {
    case FormatKind::kInteger:
      formats::dequantize_int_row<T>(f, w, n, k, e, row, out);
      break;
    case FormatKind::kFp4:
      formats::dequantize_fp4_row<T>(f, w, n, k, e, row, out);
      break;
    case FormatKind::kFp8:
      formats::dequantize_fp8_row<T>(f, w, n, k, e, row, out);
      break;
  }
}

template void dequantize_row<float>(const FcFormat&, const FcWeights&, int64_t, int64_t, int64_t,
                                    int64_t, float*);
template void dequantize_row<double>(const FcFormat&, const FcWeights&, int64_t, int64_t, int64_t,
                                     int64_t, double*);

Status dequantize_fc(const FcFormat& f, const FcWeights& w, int64_t experts, int64_t n, int64_t k,
                     float* out) {
  QMOE_RETURN_IF_ERROR(check_fc_format(f, n, k, "fc"));
  QMOE_RETURN_IF_ERROR(check_sizes(experts, n, k));
  if (!out) return Status::invalid("out: expected an fp32 buffer, got nullptr");
  const FcTensorShapes s = fc_tensor_shapes(f, experts, n, k);
  QMOE_RETURN_IF_ERROR(expect_tensor(w.weight, "weight", s.weight_dtype, s.weight, s.weight_rank));
  if (s.scale_rank) {
    QMOE_RETURN_IF_ERROR(expect_tensor(w.scales, "scales", s.scale_dtype, s.scale, s.scale_rank));
  }
  if (s.zero_point_rank) {
    QMOE_RETURN_IF_ERROR(
        expect_tensor(w.zero_points, "zero_points", DType::kU8, s.zero_point, s.zero_point_rank));
  }
  if (s.global_scale) {
    QMOE_RETURN_IF_ERROR(expect_tensor(w.global_scale, "global_scale", DType::kF32, &experts, 1));
  }
  for (int64_t e = 0; e < experts; ++e) {
    for (int64_t row = 0; row < n; ++row) {
      dequantize_row<float>(f, w, n, k, e, row, out + (e * n + row) * k);
    }
  }
  return Status::ok();
}

}  // namespace qmoe
