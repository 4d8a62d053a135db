// The formats the mixed-input GEMM's prepare tests cover: every code kind, with per-channel and
// blocked scales of each scale dtype, with and without zero points.
#pragma once

#include <vector>

#include "qmoe/format.h"

namespace qmoe::test {

inline std::vector<FcFormat> mixed_test_formats() {
  struct Case {
    WeightFormat w;
    int block;
    DType sdt;
    bool zp;
  };
  const Case cases[] = {{WeightFormat::kInt4, 64, DType::kF32, false},
                        {WeightFormat::kInt4, 0, DType::kBF16, false},
                        {WeightFormat::kInt4, 128, DType::kF16, true},
                        {WeightFormat::kInt4, 0, DType::kF32, true},
                        {WeightFormat::kInt8, 128, DType::kF32, false},
                        {WeightFormat::kInt8, 64, DType::kBF16, true},
                        {WeightFormat::kInt8, 0, DType::kF16, true},
                        {WeightFormat::kFp8, 0, DType::kF32, false},
                        {WeightFormat::kFp8Block, 128, DType::kF32, false},
                        {WeightFormat::kFp8Block, 64, DType::kBF16, false}};
  std::vector<FcFormat> out;
  for (const Case& c : cases) {
    FcFormat f = default_fc_format(c.w);
    f.block_size = c.block;
    if (c.w != WeightFormat::kFp8) f.scale_dtype = c.sdt;  // fp8's one global scale is f32
    f.zero_points = c.zp;
    out.push_back(f);
  }
  return out;
}

}  // namespace qmoe::test
