// The decode kernels' fragment layout holds every code exactly once, at the position mma_pack.h
// documents, for every width, row map and K (padding included).
#include <gtest/gtest.h>

#include "core/formats/codec.h"
#include "core/formats/mma_pack.h"
#include "layer_factory.h"

namespace qmoe::test {
namespace {

void check_roundtrip(WeightFormat wf, int64_t n, int64_t k, MmaRowMap map, int64_t inter) {
  SCOPED_TRACE(std::string(format_info(wf).name) + " n " + std::to_string(n) + " k " +
               std::to_string(k) + " map " + std::to_string(static_cast<int>(map)));
  const int64_t experts = 3;
  QuantizedFc q;
  FcFormat f = default_fc_format(wf);
  f.block_size = 16;
  make_fc(f, experts, n, k, fresh_seed(), &q);
  if (::testing::Test::HasFatalFailure()) return;
  const MmaPackShape s = mma_pack_shape(f, n, k, map, inter);
  std::vector<uint32_t> packed;
  mma_pack_int(s, q.weight.data(), experts, &packed);
  ASSERT_EQ(packed.size(), static_cast<size_t>(experts * s.words_per_expert()));
  const int b = f.bits();
  const int64_t row_bytes = formats::packed_bytes(k, b);
  std::vector<int> seen(static_cast<size_t>(n), 0);
  const int64_t kpad = s.chunks * 16 * s.steps_per_chunk;
  for (int64_t e = 0; e < experts; ++e) {
    std::fill(seen.begin(), seen.end(), 0);
    for (int64_t pr = 0; pr < s.tiles * 16; ++pr) {
      const int64_t lr = s.logical_row(pr);
      if (lr >= 0) ++seen[static_cast<size_t>(lr)];
      for (int64_t kk = 0; kk < kpad; ++kk) {
        const unsigned want =
            (lr >= 0 && kk < k)
                ? formats::read_bits(q.weight.data() + (e * n + lr) * row_bytes, kk, b)
                : 1u << (b - 1);
        ASSERT_EQ(mma_packed_code(s, packed.data(), e, pr, kk), want)
            << "expert " << e << " packed row " << pr << " k " << kk;
      }
    }
    for (int64_t r = 0; r < n; ++r) ASSERT_EQ(seen[static_cast<size_t>(r)], 1) << "row " << r;
  }
}

TEST(MmaPack, EveryWidthAndRowMap) {
  for (WeightFormat wf :
       {WeightFormat::kInt2, WeightFormat::kInt3, WeightFormat::kInt4, WeightFormat::kInt8}) {
    check_roundtrip(wf, 48, 128, MmaRowMap::kIdentity, 0);
    check_roundtrip(wf, 40, 96, MmaRowMap::kIdentity, 0);  // a partial tile and a partial chunk
    check_roundtrip(wf, 2 * 24, 64, MmaRowMap::kGatedInterleaved, 24);
    check_roundtrip(wf, 2 * 20, 80, MmaRowMap::kGatedConcatenated, 20);  // a partial unit group
  }
}

// Every scale and zero point of the tile-ordered copies equals the ORT tensors' entry of its
// logical row and block, bit for bit; padding rows and blocks hold 0 and the symmetric point.
void check_scales(WeightFormat wf, int block, int64_t n, int64_t k, MmaRowMap map, int64_t inter,
                  DType scale_dtype) {
  SCOPED_TRACE(std::string(format_info(wf).name) + " block " + std::to_string(block) + " n " +
               std::to_string(n) + " k " + std::to_string(k));
  const int64_t experts = 2;
  FcFormat f = default_fc_format(wf);
  f.block_size = block;
  f.zero_points = true;
  f.scale_dtype = scale_dtype;
  QuantizedFc q;
  make_fc(f, experts, n, k, fresh_seed(), &q);
  if (::testing::Test::HasFatalFailure()) return;
  const MmaPackShape s = mma_pack_shape(f, n, k, map, inter);
  const int64_t kpad = s.chunks * 16 * s.steps_per_chunk;
  ASSERT_EQ(s.scale_blocks, block ? (kpad + block - 1) / block : 1);
  const int eb = static_cast<int>(dtype_size(scale_dtype));
  std::vector<uint8_t> sc, zp;
  mma_pack_scales(s, q.scales.data(), eb, experts, &sc);
  mma_pack_zero_points(s, q.zero_points.data(), experts, &zp);
  ASSERT_EQ(sc.size(), static_cast<size_t>(experts * s.tiles * 16 * s.scale_blocks * eb));
  ASSERT_EQ(zp.size(), static_cast<size_t>(experts * s.tiles * 16 * s.scale_blocks));
  const int64_t nblk = block ? k / block : 1;
  const int b = f.bits();
  for (int64_t e = 0; e < experts; ++e) {
    for (int64_t pr = 0; pr < s.tiles * 16; ++pr) {
      const int64_t lr = s.logical_row(pr);
      for (int64_t bl = 0; bl < s.scale_blocks; ++bl) {
        const int64_t i = mma_scale_index(s, e, pr, bl);
        const bool real = lr >= 0 && bl < nblk;
        for (int by = 0; by < eb; ++by) {
          const uint8_t want = real ? q.scales[((e * n + lr) * nblk + bl) * eb + by] : 0;
          ASSERT_EQ(sc[i * eb + by], want) << "expert " << e << " row " << pr << " block " << bl;
        }
        unsigned zwant = 1u << (b - 1);
        if (real) {
          zwant = block ? formats::read_bits(
                              q.zero_points.data() + (e * n + lr) * formats::packed_bytes(nblk, b),
                              bl, b)
                        : formats::read_bits(q.zero_points.data() + e * formats::packed_bytes(n, b),
                                             lr, b);
        }
        ASSERT_EQ(zp[i], zwant) << "expert " << e << " row " << pr << " block " << bl;
      }
    }
  }
}

TEST(MmaPack, ScalesAndZeroPointsInTileOrder) {
  check_scales(WeightFormat::kInt4, 128, 48, 256, MmaRowMap::kIdentity, 0, DType::kBF16);
  check_scales(WeightFormat::kInt4, 0, 40, 96, MmaRowMap::kIdentity, 0, DType::kF32);
  check_scales(WeightFormat::kInt2, 64, 2 * 20, 192, MmaRowMap::kGatedConcatenated, 20,
               DType::kF16);
  check_scales(WeightFormat::kInt8, 16, 2 * 24, 64, MmaRowMap::kGatedInterleaved, 24, DType::kBF16);
  check_scales(WeightFormat::kInt3, 32, 24, 160, MmaRowMap::kIdentity, 0, DType::kF32);
  check_scales(WeightFormat::kInt4, 0, 2 * 12, 64, MmaRowMap::kGatedInterleaved, 12, DType::kF16);
}

TEST(MmaPack, SupportedFormats) {
  EXPECT_TRUE(mma_pack_supported(default_fc_format(WeightFormat::kInt4), 2048));
  EXPECT_TRUE(mma_pack_supported(default_fc_format(WeightFormat::kInt3), 2048));
  EXPECT_FALSE(mma_pack_supported(default_fc_format(WeightFormat::kNvFp4), 2048));
  FcFormat f = default_fc_format(WeightFormat::kInt8);
  f.block_size = 0;
  EXPECT_TRUE(mma_pack_supported(f, 768));
  EXPECT_FALSE(mma_pack_supported(f, 200));  // K not a multiple of 16
  f.block_size = 48;                         // scale blocks must be powers of two
  EXPECT_FALSE(mma_pack_supported(f, 768));
}

}  // namespace
}  // namespace qmoe::test
