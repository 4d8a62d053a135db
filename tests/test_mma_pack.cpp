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
