// Helpers shared by the weight-format tests (test_formats.cpp, test_quantizers.cpp): every
// format and every configuration it allows, and reading back what a quantizer wrote.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "core/numeric.h"
#include "qmoe/format.h"
#include "qmoe/quantize.h"

namespace qmoe::format_test {

// ---- the format list and every configuration it allows ----

inline const std::vector<WeightFormat>& all_formats() {
  static const std::vector<WeightFormat> v = {
#define QMOE_X(id, ...) WeightFormat::id,
      QMOE_WEIGHT_FORMATS(QMOE_X)
#undef QMOE_X
  };
  return v;
}

// Block sizes to exercise per rule. fp8_block: a partial-edge size, a non-power of two and the
// DeepSeek size (1x1 blocks are near exact, so the error-floor test could not run on them).
inline std::vector<int> test_blocks(const FormatInfo& fi) {
  switch (fi.block_rule) {
    case BlockRule::kIntBlocks:
      return {0, 16, 32, 64, 128, 256};
    case BlockRule::kFixed:
      return {fi.default_block};
    case BlockRule::kNone:
      return {0};
    case BlockRule::kSquare:
      return {7, 100, 128};
  }
  return {};
}

inline std::vector<DType> test_scale_dtypes(const FormatInfo& fi) {
  const bool float_scales = fi.kind == FormatKind::kInteger || fi.block_rule == BlockRule::kSquare;
  if (float_scales) return {DType::kF32, DType::kF16, DType::kBF16};
  return {default_fc_format(fi.id).scale_dtype};
}

// Every format x allowed block x zero points x scale dtype (x fp4 layout).
inline std::vector<FcFormat> all_configs() {
  std::vector<FcFormat> out;
  for (WeightFormat wf : all_formats()) {
    const FormatInfo& fi = format_info(wf);
    for (int bs : test_blocks(fi)) {
      for (int zp = 0; zp <= (fi.zero_points_allowed ? 1 : 0); ++zp) {
        for (DType sd : test_scale_dtypes(fi)) {
          for (int lay = 0; lay < (fi.kind == FormatKind::kFp4 ? 2 : 1); ++lay) {
            FcFormat f = default_fc_format(wf);
            f.block_size = bs;
            f.zero_points = zp != 0;
            f.scale_dtype = sd;
            f.fp4_layout = lay ? Fp4Layout::kNPacked : Fp4Layout::kKPacked;
            out.push_back(f);
          }
        }
      }
    }
  }
  return out;
}

inline FcFormat make_format(WeightFormat wf, int block, bool zp = false, DType sd = DType::kF32) {
  FcFormat f = default_fc_format(wf);
  f.block_size = block;
  f.zero_points = zp;
  if (f.info().kind != FormatKind::kFp4 || sd != DType::kF32) f.scale_dtype = sd;  // fp4: native
  return f;
}

// ---- reading back what a quantizer wrote ----

inline float scale_at(const QuantizedFc& q, int64_t i) {
  switch (q.format.scale_dtype) {
    case DType::kF16: {
      uint16_t h;
      std::memcpy(&h, q.scales.data() + 2 * i, 2);
      return num::f16_to_f32(h);
    }
    case DType::kBF16: {
      uint16_t h;
      std::memcpy(&h, q.scales.data() + 2 * i, 2);
      return num::bf16_to_f32(h);
    }
    case DType::kF8E4M3:
      return num::e4m3_to_f32(q.scales[i]);
    case DType::kF8E8M0:
      return num::e8m0_to_f32(q.scales[i]);
    default: {
      float f;
      std::memcpy(&f, q.scales.data() + 4 * i, 4);
      return f;
    }
  }
}

inline float round_to(DType t, float s) {
  switch (t) {
    case DType::kF16:
      return num::f16_to_f32(num::f32_to_f16(s));
    case DType::kBF16:
      return num::bf16_to_f32(num::f32_to_bf16(s));
    default:
      return s;
  }
}

inline QuantizedFc quantize_or_die(const FcFormat& f, const std::vector<float>& w, int64_t e,
                                   int64_t n, int64_t k) {
  QuantizedFc q;
  const Status st = quantize_fc(f, w.data(), e, n, k, &q);
  EXPECT_TRUE(st.is_ok()) << f.to_string() << ": " << st.to_string();
  return q;
}

}  // namespace qmoe::format_test
