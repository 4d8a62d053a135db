// Block-scaled FP8 projections (quant_method "fp8", DeepSeek-V3 and Qwen3 FP8 checkpoints), read
// into qmoe's fp8_block. A projection with logical W [N, K] and blocks of b x b:
//
//   weight            f8e4m3 [N, K]
//   weight_scale_inv  f32    [ceil(N/b), ceil(K/b)]   (multiplied in, despite the name)
//                     or f8e8m0 (scale_fmt "ue8m0"): one exponent byte e, the scale 2^(e - 127)
//
//   W[n, k] = e4m3(weight[n, k]) * weight_scale_inv[n / b, k / b]
//
// which is qmoe's fp8_block formula with block_size b, so codes and scales are copied. E8M0
// scales become f32 block scales: 2^(e - 127) for e in 0..254 is an f32 (2^-127 a subnormal), so
// the widening is exact; e = 0xFF is E8M0's NaN and is refused. FC1 stacks
// the projections ([gate; up], GluLayout::kConcatenated) rather than interleaving their rows: with
// I a multiple of b, each b-row block of FC1 is a block of one projection and keeps its scale.
//
//   FC1 [2I, H]: rows [0, I) = gate_proj, rows [I, 2I) = up_proj; scale rows [0, I/b), [I/b, 2I/b)
//
// compressed-tensors "float-quantized" FP8 holds weight f8e4m3 [N, K] and weight_scale by
// strategy: "block" [ceil(N/b), ceil(K/b)] (the same as above: exact into fp8_block), "tensor"
// one value (qmoe fp8 with global[e] = the scale: exact when gate and up share it, else FC1 is
// requantized), "channel" [N, 1] (no qmoe format holds a scale per row: requantized into
// fp8_block, the error reported).
#include <algorithm>
#include <cstring>

#include "convert/experts.h"
#include "core/numeric.h"

namespace qmoe::convert {

namespace {

float scale_at(const TensorView& s, int64_t i) {
  float v;
  widen(TensorView(static_cast<const uint8_t*>(s.data) + i * dtype_size(s.dtype), s.dtype, {1}),
        &v);
  return v;
}

// Rows of w [*, K] from p's codes times a per-row (channel) or single (tensor) scale, into rows
// row0, row0 + stride, ... (fp32: one rounded product each, as the source dequantizes).
void dequantize_scaled_rows(const ProjTensors& p, bool per_row, int64_t row0, int64_t stride,
                            float* w) {
  const auto* codes = static_cast<const uint8_t*>(p.weight.data);
  for (int64_t n = 0; n < p.n; ++n) {
    const float s = scale_at(p.scales, per_row ? n : 0);
    float* out = w + (row0 + n * stride) * p.k;
    for (int64_t k = 0; k < p.k; ++k) out[k] = num::e4m3_to_f32(codes[n * p.k + k]) * s;
  }
}

// Copies p's code rows into rows row0, row0 + stride, ... of expert 0 of an fp8 fc.
void copy_code_rows(const ProjTensors& p, int64_t row0, int64_t stride, QuantizedFc* fc) {
  const auto* codes = static_cast<const uint8_t*>(p.weight.data);
  for (int64_t n = 0; n < p.n; ++n) {
    std::memcpy(fc->weight.data() + (row0 + n * stride) * p.k, codes + n * p.k,
                static_cast<size_t>(p.k));
  }
}

}  // namespace

Status resolve_compressed_fp8(const Checkpoint& c, const CompressedTensorsConfig& q,
                              DType* scale_dtype, ProjTensors* p, int64_t* bytes) {
  QMOE_RETURN_IF_ERROR(c.expect(p->name + ".weight", DType::kF8E4M3, {p->n, p->k}, &p->weight));
  const std::string name = p->name + ".weight_scale";
  if (q.group_size > 0) {
    const int64_t b = q.group_size;
    QMOE_RETURN_IF_ERROR(
        expect_scales(c, name, scale_dtype, (p->n + b - 1) / b, (p->k + b - 1) / b, &p->scales));
  } else if (!q.fp8_tensor) {
    QMOE_RETURN_IF_ERROR(expect_scales(c, name, scale_dtype, p->n, 1, &p->scales));
  } else {
    std::string file;
    QMOE_RETURN_IF_ERROR(c.tensor(name, &p->scales, &file));
    const DType t = p->scales.dtype;
    if ((t != DType::kF32 && t != DType::kF16 && t != DType::kBF16) || p->scales.numel() != 1 ||
        p->scales.rank > 1) {
      return Status::invalid(file + ": tensor '" + name +
                             "': expected one F32, F16 or BF16 value ([] or [1]), got " +
                             safetensors_dtype_name(t) + " " + p->scales.shape_string());
    }
  }
  *bytes += static_cast<int64_t>(p->weight.bytes() + p->scales.bytes());
  return Status::ok();
}

Status convert_compressed_fp8(const ExpertTensors& t, const CompressedTensorsConfig& q,
                              ExpertScratch* s, ExpertStats* stats) {
  const int64_t inter = t.gate.n, hidden = t.gate.k;
  if (q.group_size > 0) {  // block: exact, [gate; up] stacked
    const Fp8Config f{true, q.group_size};
    transcode_fp8(t.gate, f, 0, &s->fc1);
    transcode_fp8(t.up, f, inter, &s->fc1);
    transcode_fp8(t.down, f, 0, &s->fc2);
    return Status::ok();
  }
  double err = 0;
  if (q.fp8_tensor) {  // qmoe fp8: codes copied, global = the projection's scale
    copy_code_rows(t.down, 0, 1, &s->fc2);
    s->fc2.global_scale[0] = scale_at(t.down.scales, 0);
    if (scale_at(t.gate.scales, 0) == scale_at(t.up.scales, 0)) {
      copy_code_rows(t.gate, 0, 2, &s->fc1);
      copy_code_rows(t.up, 1, 2, &s->fc1);
      s->fc1.global_scale[0] = scale_at(t.gate.scales, 0);
      return Status::ok();
    }
  } else {  // channel: no qmoe format has a scale per row
    s->w2.resize(static_cast<size_t>(hidden * inter));
    dequantize_scaled_rows(t.down, true, 0, 1, s->w2.data());
    QMOE_RETURN_IF_ERROR(requantize(s->w2, hidden, inter, &s->fc2, &err));
  }
  s->w1.resize(static_cast<size_t>(2 * inter * hidden));
  dequantize_scaled_rows(t.gate, !q.fp8_tensor, 0, 2, s->w1.data());
  dequantize_scaled_rows(t.up, !q.fp8_tensor, 1, 2, s->w1.data());
  double err1 = 0;
  QMOE_RETURN_IF_ERROR(requantize(s->w1, 2 * inter, hidden, &s->fc1, &err1));
  stats->requantized = true;
  stats->requant_error = std::max(err, err1);
  return Status::ok();
}

Status resolve_fp8(const Checkpoint& c, const Fp8Config& f, DType* scale_dtype, ProjTensors* p,
                   int64_t* bytes) {
  const int64_t b = f.block;
  QMOE_RETURN_IF_ERROR(c.expect(p->name + ".weight", DType::kF8E4M3, {p->n, p->k}, &p->weight));
  const std::string name = p->name + ".weight_scale_inv";
  const int64_t rows = (p->n + b - 1) / b, cols = (p->k + b - 1) / b;
  std::string file;
  QMOE_RETURN_IF_ERROR(c.tensor(name, &p->scales, &file));
  // The first projection decides between float and E8M0 scales; the rest must agree.
  if (*scale_dtype == DType::kU8 && p->scales.dtype == DType::kF8E8M0) {
    *scale_dtype = DType::kF8E8M0;
  }
  if (*scale_dtype != DType::kF8E8M0) {
    QMOE_RETURN_IF_ERROR(expect_scales(c, name, scale_dtype, rows, cols, &p->scales));
  } else {
    QMOE_RETURN_IF_ERROR(c.expect(name, DType::kF8E8M0, {rows, cols}, &p->scales));
    const auto* e = static_cast<const uint8_t*>(p->scales.data);
    for (int64_t i = 0; i < rows * cols; ++i) {
      if (e[i] == 0xFF) {
        return Status::invalid(file + ": tensor '" + name + "': [" + std::to_string(i / cols) +
                               ", " + std::to_string(i % cols) +
                               "] is 0xFF, E8M0's NaN: the block has no scale");
      }
    }
  }
  *bytes += static_cast<int64_t>(p->weight.bytes() + p->scales.bytes());
  return Status::ok();
}

void transcode_fp8(const ProjTensors& p, const Fp8Config& f, int64_t row0, QuantizedFc* fc) {
  const int64_t b = f.block;
  const size_t ssize = dtype_size(fc->format.scale_dtype);
  uint8_t* scales = fc->scales.data() + static_cast<size_t>(row0 / b * ((p.k + b - 1) / b)) * ssize;
  std::memcpy(fc->weight.data() + row0 * p.k, p.weight.data, p.weight.bytes());
  if (p.scales.dtype != DType::kF8E8M0) {
    std::memcpy(scales, p.scales.data, p.scales.bytes());
    return;
  }
  const auto* e = static_cast<const uint8_t*>(p.scales.data);
  for (int64_t i = 0; i < p.scales.numel(); ++i) {  // f32: 2^(e - 127), exact
    const float v = num::e8m0_to_f32(e[i]);
    std::memcpy(scales + static_cast<size_t>(i) * sizeof(float), &v, sizeof(float));
  }
}

}  // namespace qmoe::convert
