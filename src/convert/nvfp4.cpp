// ModelOpt NVFP4 projections (NVIDIA TensorRT Model Optimizer's Hugging Face export, quant_algo
// NVFP4), read into qmoe's nvfp4. A projection with logical W [N, K]:
//
//   weight          u8     [N, K/2]    two E2M1 codes a byte along K, low nibble = even k
//   weight_scale    e4m3   [N, K/16]   one scale per 16 along K
//   weight_scale_2  f32    [] or [1]   the projection's global scale
//   input_scale     f32                the activations' global scale (not read: qmoe quantizes
//                                      no activations)
//
//   W[n, k] = e2m1(code) * e4m3(weight_scale[n, k/16]) * weight_scale_2
//
// which is qmoe's nvfp4 (K-packed) with global[e] = weight_scale_2: codes and block scales are
// copied. FC1 interleaves gate and up rows under one global scale, so it is exact when gate and
// up share weight_scale_2 (ModelOpt's export makes them equal for fused gate/up); otherwise FC1 is
// requantized from the source's dequantization and the error reported.
#include <cstring>

#include "convert/experts.h"
#include "core/numeric.h"

namespace qmoe::convert {

namespace {

float global_of(const ProjTensors& p) { return *static_cast<const float*>(p.global.data); }

// Copies p's codes and block scales into rows row0, row0 + stride, ... of expert 0 of fc.
void copy_rows(const ProjTensors& p, int64_t row0, int64_t stride, QuantizedFc* fc) {
  const size_t code_row = static_cast<size_t>(p.k / 2), scale_row = static_cast<size_t>(p.k / 16);
  const auto* codes = static_cast<const uint8_t*>(p.qweight.data);
  const auto* scales = static_cast<const uint8_t*>(p.scales.data);
  for (int64_t n = 0; n < p.n; ++n) {
    const size_t row = static_cast<size_t>(row0 + n * stride);
    std::memcpy(fc->weight.data() + row * code_row, codes + n * code_row, code_row);
    std::memcpy(fc->scales.data() + row * scale_row, scales + n * scale_row, scale_row);
  }
}

// The source's dequantization of p into rows row0, row0 + stride, ... of w [*, K] (fp32: the
// code times the e4m3 scale is exact, times the global rounds once).
void dequantize_rows(const ProjTensors& p, int64_t row0, int64_t stride, float* w) {
  const auto* codes = static_cast<const uint8_t*>(p.qweight.data);
  const auto* scales = static_cast<const uint8_t*>(p.scales.data);
  const float g = global_of(p);
  for (int64_t n = 0; n < p.n; ++n) {
    float* out = w + (row0 + n * stride) * p.k;
    for (int64_t k = 0; k < p.k; ++k) {
      const uint8_t byte = codes[n * (p.k / 2) + k / 2];
      const float v = num::e2m1_to_f32((k & 1) ? byte >> 4 : byte & 15);
      out[k] = v * num::e4m3_to_f32(scales[n * (p.k / 16) + k / 16]) * g;
    }
  }
}

}  // namespace

Status resolve_nvfp4(const Checkpoint& c, ProjTensors* p, int64_t* bytes) {
  std::string file;
  if (p->k % 16 != 0) {
    QMOE_RETURN_IF_ERROR(c.tensor(p->name + ".weight", &p->qweight, &file));
    return Status::invalid(file + ": tensor '" + p->name + ".weight': K = " + std::to_string(p->k) +
                           " is not a multiple of the NVFP4 block 16");
  }
  QMOE_RETURN_IF_ERROR(c.expect(p->name + ".weight", DType::kU8, {p->n, p->k / 2}, &p->qweight));
  QMOE_RETURN_IF_ERROR(
      c.expect(p->name + ".weight_scale", DType::kF8E4M3, {p->n, p->k / 16}, &p->scales));
  const std::string g = p->name + ".weight_scale_2";
  QMOE_RETURN_IF_ERROR(c.tensor(g, &p->global, &file));
  if (p->global.dtype != DType::kF32 || p->global.numel() != 1 || p->global.rank > 1) {
    return Status::invalid(file + ": tensor '" + g + "': expected one F32 ([] or [1]), got " +
                           safetensors_dtype_name(p->global.dtype) + " " +
                           p->global.shape_string());
  }
  const float v = global_of(*p);
  if (!(v > 0) || v > 3.4e38f) {
    return Status::invalid(file + ": tensor '" + g + "': expected a positive finite scale, got " +
                           std::to_string(v));
  }
  *bytes += static_cast<int64_t>(p->qweight.bytes() + p->scales.bytes() + p->global.bytes());
  return Status::ok();
}

Status convert_nvfp4(const ExpertTensors& t, ExpertScratch* s, ExpertStats* stats) {
  copy_rows(t.down, 0, 1, &s->fc2);
  s->fc2.global_scale[0] = global_of(t.down);
  if (global_of(t.gate) == global_of(t.up)) {
    copy_rows(t.gate, 0, 2, &s->fc1);
    copy_rows(t.up, 1, 2, &s->fc1);
    s->fc1.global_scale[0] = global_of(t.gate);
    return Status::ok();
  }
  const int64_t inter = t.gate.n, hidden = t.gate.k;
  s->w1.resize(static_cast<size_t>(2 * inter * hidden));
  dequantize_rows(t.gate, 0, 2, s->w1.data());
  dequantize_rows(t.up, 1, 2, s->w1.data());
  stats->requantized = true;
  return requantize(s->w1, 2 * inter, hidden, &s->fc1, &stats->requant_error);
}

}  // namespace qmoe::convert
