// Error budgets: the relative-norm error ||deq(quant(w)) - w|| / ||w|| that N(0, 1) weights may
// reach, about 1.25x above measured maxima. Measured with this library's quantizers: 300 draws of
// [16, 256] and 9 draws of [16, K] for K in {1024, 4096, 16384}, maximum over every scale dtype.
// Per-channel error grows with K (the row's amax grows), so those budgets hold up to K = 16384.
// docs/formats.md has the measured values.
#include "qmoe/quantize.h"

namespace qmoe {

namespace {

// Rows: per-channel, then block 16, 32, 64, 128, 256. Columns: symmetric, with zero points.
struct IntBudget {
  int bits;
  double v[6][2];
};
constexpr IntBudget kIntBudgets[] = {
    {2, {{0.96, 0.93}, {0.56, 0.46}, {0.62, 0.53}, {0.68, 0.60}, {0.74, 0.67}, {0.80, 0.73}}},
    {3, {{0.43, 0.42}, {0.25, 0.20}, {0.27, 0.23}, {0.30, 0.26}, {0.33, 0.29}, {0.35, 0.32}}},
    {4, {{0.20, 0.20}, {0.12, 0.090}, {0.13, 0.11}, {0.14, 0.12}, {0.15, 0.14}, {0.17, 0.15}}},
    {8,
     {{0.012, 0.012},
      {0.0067, 0.0055},
      {0.0073, 0.0063},
      {0.0080, 0.0071},
      {0.0088, 0.0080},
      {0.0097, 0.0088}}},
};

double int_budget(int bits, int block_size, bool zero_points) {
  int row = 0;  // per-channel, also the fallback for a block size outside the table (the worst)
  for (int bs = 16, r = 1; bs <= 256; bs *= 2, ++r) {
    if (block_size == bs) row = r;
  }
  for (const IntBudget& b : kIntBudgets) {
    if (b.bits == bits) return b.v[row][zero_points ? 1 : 0];
  }
  return 1.0;
}

}  // namespace

double quantization_error_budget(const FcFormat& f) {
  switch (f.format) {
    case WeightFormat::kInt2:
    case WeightFormat::kInt3:
    case WeightFormat::kInt4:
    case WeightFormat::kInt8:
      return int_budget(f.bits(), f.block_size, f.zero_points);
    case WeightFormat::kNvFp4:
      return 0.13;
    case WeightFormat::kMxFp4:
      return 0.17;
    case WeightFormat::kFp8:
      return 0.035;
    case WeightFormat::kFp8Block:
      return 0.035;  // any block size; 1x1 blocks are near exact
  }
  return 1.0;
}

}  // namespace qmoe
