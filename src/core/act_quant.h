// FP8 activations (PrepareOptions::act_quant = "fp8_e4m3"): the rows the FP8 grouped GEMM reads.
// A row of k values is cut into groups of kActQuantGroup columns; each group gets
//
//   scale = amax / 448          amax = the largest |x| of the group (448: e4m3's largest finite)
//   inv   = 448 / amax          (0 when the group is all zero)
//   code  = e4m3(x * inv)       round to nearest even, saturating
//
// so that x ~ code * scale with e4m3's 3 mantissa bits relative to each value (values below
// amax * 2^-14.8 fall into e4m3's subnormals); one division per group, a multiply per value.
// Host and device share these formulas; the device converts with cvt.rn.satfinite, which
// num::f32_to_e4m3 reproduces bit for bit, and quantize_rows_e4m3 is the host twin the tests hold
// the device rows to.
//
//   codes  [rows, ldq] e4m3     scales [rows, ceil(k / kActQuantGroup)] f32 (the GEMM's K-major
//                               SFB)
#pragma once

#include <cmath>
#include <cstdint>

#include "core/numeric.h"

namespace qmoe {

constexpr int kActQuantGroup = 128;
constexpr float kE4m3Max = 448.0f;

QMOE_HD float e4m3_group_scale(float amax) { return amax / kE4m3Max; }
QMOE_HD float e4m3_group_inverse(float amax) { return amax > 0.0f ? kE4m3Max / amax : 0.0f; }

// The code of x in a group of this inverse scale (host form; the device's cvt gives the same
// bits).
QMOE_HD uint8_t e4m3_group_code(float x, float inv) { return num::f32_to_e4m3(x * inv); }

// rows x k values (row stride ldx) to codes (row stride ldq) and scales [rows, ceil(k / 128)].
// Where k is not a multiple of kActQuantGroup (gpt-oss's 2880) the last group holds the row's
// last k % 128 values and zeros: its codes past k are 0, and the row of codes is ceil(k / 128) x
// 128 wide, which the FP8 GEMM's K (padded to 128) reads.
inline void quantize_rows_e4m3(const float* x, int64_t ldx, int64_t rows, int64_t k, uint8_t* q,
                               int64_t ldq, float* scales) {
  const int64_t groups = (k + kActQuantGroup - 1) / kActQuantGroup;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t c0 = g * kActQuantGroup;
      const int64_t n = k - c0 < kActQuantGroup ? k - c0 : kActQuantGroup;
      const float* v = x + r * ldx + c0;
      float amax = 0.0f;
      for (int64_t i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(v[i]));
      scales[r * groups + g] = e4m3_group_scale(amax);
      const float inv = e4m3_group_inverse(amax);
      for (int64_t i = 0; i < kActQuantGroup; ++i) {
        q[r * ldq + c0 + i] = i < n ? e4m3_group_code(v[i], inv) : 0;
      }
    }
  }
}

}  // namespace qmoe
