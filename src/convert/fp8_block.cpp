// Block-scaled FP8 projections (quant_method "fp8", DeepSeek-V3 and Qwen3 FP8 checkpoints), read
// into qmoe's fp8_block. A projection with logical W [N, K] and blocks of b x b:
//
//   weight            f8e4m3 [N, K]
//   weight_scale_inv  f32    [ceil(N/b), ceil(K/b)]   (multiplied in, despite the name)
//
//   W[n, k] = e4m3(weight[n, k]) * weight_scale_inv[n / b, k / b]
//
// which is qmoe's fp8_block formula with block_size b, so codes and scales are copied. FC1 stacks
// the projections ([gate; up], GluLayout::kConcatenated) rather than interleaving their rows: with
// I a multiple of b, each b-row block of FC1 is a block of one projection and keeps its scale.
//
//   FC1 [2I, H]: rows [0, I) = gate_proj, rows [I, 2I) = up_proj; scale rows [0, I/b), [I/b, 2I/b)
#include <cstring>

#include "convert/experts.h"

namespace qmoe::convert {

Status resolve_fp8(const Checkpoint& c, const Fp8Config& f, DType* scale_dtype, ProjTensors* p,
                   int64_t* bytes) {
  const int64_t b = f.block;
  QMOE_RETURN_IF_ERROR(c.expect(p->name + ".weight", DType::kF8E4M3, {p->n, p->k}, &p->weight));
  QMOE_RETURN_IF_ERROR(expect_scales(c, p->name + ".weight_scale_inv", scale_dtype,
                                     (p->n + b - 1) / b, (p->k + b - 1) / b, &p->scales));
  *bytes += static_cast<int64_t>(p->weight.bytes() + p->scales.bytes());
  return Status::ok();
}

void transcode_fp8(const ProjTensors& p, const Fp8Config& f, int64_t row0, QuantizedFc* fc) {
  const int64_t b = f.block;
  const size_t scale_row = static_cast<size_t>((p.k + b - 1) / b) * dtype_size(p.scales.dtype);
  std::memcpy(fc->weight.data() + row0 * p.k, p.weight.data, p.weight.bytes());
  std::memcpy(fc->scales.data() + static_cast<size_t>(row0 / b) * scale_row, p.scales.data,
              p.scales.bytes());
}

}  // namespace qmoe::convert
