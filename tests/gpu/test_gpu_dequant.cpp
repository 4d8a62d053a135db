// Device dequantization equals the host's dequantize_row<float> bit for bit (f32 output) and its
// round-to-nearest-even bf16/f16 conversion, for every format and configuration; the padding
// columns are zero and slots of absent experts are left alone.
#include <gtest/gtest.h>

#include <string>

#include "core/formats/mma_pack.h"
#include "core/numeric.h"
#include "cuda/dequant/dequant.h"
#include "gpu_test_util.h"
#include "layer_factory.h"

namespace qmoe::test {
namespace {

struct DeviceFcCopy {
  GpuBuffer weight, scales, zp, global, words, tiled;
  cuda::DeviceFc fc;
};

// FP4 and FP8 kept only in the decode layout, as the layer keeps it (cuda_layer.cu): packed codes
// and tile-ordered scales (FP4's 8-bit ones, fp8_block's per row, none for fp8); no codes or
// scales in ORT's layout.
void use_packed_copy(const QuantizedFc& q, const std::vector<uint8_t>& k_packed, MmaRowMap map,
                     int64_t inter, DType act, DeviceFcCopy* d) {
  const MmaPackShape s = mma_pack_shape(q.format, q.n, q.k, map, inter, act);
  std::vector<uint32_t> words;
  std::vector<uint8_t> tiled;
  if (s.codes == MmaCodes::kFp8) {
    mma_pack_fp8(s, k_packed.data(), q.experts, &words);
    if (s.block_size != 0) {
      mma_pack_scales(s, q.scales.data(), static_cast<int>(dtype_size(q.format.scale_dtype)),
                      q.experts, &tiled);
    }
  } else {
    mma_pack_fp4(s, k_packed.data(), q.experts, &words);
    mma_pack_scales(mma_fp4_scale_shape(s), q.scales.data(), 1, q.experts, &tiled);
  }
  ASSERT_TRUE(d->words.upload(words));
  if (!tiled.empty()) ASSERT_TRUE(d->tiled.upload(tiled));
  d->fc.packed = s;
  d->fc.packed_words = d->words.as<uint32_t>();
  d->fc.packed_scales = tiled.empty() ? nullptr : d->tiled.as<uint8_t>();
  d->fc.weight = nullptr;
  d->fc.scales = nullptr;
}

void upload_fc(const QuantizedFc& q, DeviceFcCopy* d) {
  d->fc.format = q.format;
  d->fc.n = q.n;
  d->fc.k = q.k;
  ASSERT_TRUE(d->weight.upload(q.weight));
  d->fc.weight = d->weight.as<uint8_t>();
  if (!q.scales.empty()) {
    ASSERT_TRUE(d->scales.upload(q.scales));
    d->fc.scales = d->scales.as<uint8_t>();
  }
  if (!q.zero_points.empty()) {
    ASSERT_TRUE(d->zp.upload(q.zero_points));
    d->fc.zero_points = d->zp.as<uint8_t>();
  }
  if (!q.global_scale.empty()) {
    ASSERT_TRUE(d->global.upload(q.global_scale));
    d->fc.global_scale = d->global.as<float>();
  }
}

// Dequantizes experts `ids` (as the touched list) in waves of `slots` and compares every slot.
// packed: FP4 from the decode layout (use_packed_copy) with this row map and layout dtype.
struct Packed {
  bool on = false;
  MmaRowMap map = MmaRowMap::kIdentity;
  int64_t inter = 0;
  DType act = DType::kBF16;
};

void check_format(const FcFormat& f, int64_t experts, int64_t n, int64_t k, DType out_dtype,
                  const Packed& packed = {}) {
  SCOPED_TRACE(f.to_string() + " n " + std::to_string(n) + " k " + std::to_string(k) + " -> " +
               dtype_name(out_dtype) + (packed.on ? " from the packed copy" : ""));
  const uint64_t seed = fresh_seed();
  QuantizedFc q;
  make_fc(f, experts, n, k, seed, &q);
  if (::testing::Test::HasFatalFailure()) return;
  FcFormat kf = f;
  std::vector<uint8_t> repacked;
  if (f.info().kind == FormatKind::kFp4 && f.fp4_layout == Fp4Layout::kNPacked) {
    repacked.resize(q.weight.size());
    fp4_repack(Fp4Layout::kNPacked, q.weight.data(), experts, n, k, repacked.data());
  }
  DeviceFcCopy d;
  upload_fc(q, &d);
  if (!repacked.empty()) {
    ASSERT_TRUE(d.weight.upload(repacked));
    d.fc.weight = d.weight.as<uint8_t>();
    d.fc.format.fp4_layout = Fp4Layout::kKPacked;
  }
  if (packed.on) {
    use_packed_copy(q, repacked.empty() ? q.weight : repacked, packed.map, packed.inter, packed.act,
                    &d);
    if (::testing::Test::HasFatalFailure()) return;
  }
  std::vector<int32_t> touched;
  for (int64_t e = experts - 1; e >= 0; e -= 2) touched.push_back(static_cast<int32_t>(e));
  const int32_t n_touched = static_cast<int32_t>(touched.size());
  GpuBuffer dt, dn;
  ASSERT_TRUE(dt.upload(touched));
  ASSERT_TRUE(dn.upload(&n_touched, 4));
  const int64_t ld = (k + 31) / 32 * 32;
  const int slots = 2;
  const size_t esz = dtype_size(out_dtype);
  const FcWeights host = q.view();
  std::vector<float> row(static_cast<size_t>(k));
  for (int first = 0; first < n_touched; first += slots) {
    GpuBuffer out;
    ASSERT_TRUE(out.allocate(static_cast<size_t>(slots * n * ld) * esz));
    cuda::DequantArgs a;
    a.fc = d.fc;
    a.out_dtype = out_dtype;
    a.out = out.get();
    a.ld = ld;
    a.slot_stride = n * ld;
    a.touched = dt.as<int32_t>();
    a.n_touched = dn.as<int32_t>();
    a.first_group = first;
    a.max_groups = slots;
    Status st = cuda::launch_dequant(a, nullptr);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    CUDA_ASSERT(cudaDeviceSynchronize());
    std::vector<uint8_t> got;
    ASSERT_TRUE(out.download(&got));
    for (int s = 0; s < slots; ++s) {
      const bool present = first + s < n_touched;
      const int64_t e = present ? touched[first + s] : -1;
      for (int64_t r = 0; r < n; ++r) {
        if (present) dequantize_row<float>(f, host, n, k, e, r, row.data());
        for (int64_t c = 0; c < ld; ++c) {
          const size_t at = static_cast<size_t>((s * n + r) * ld + c) * esz;
          uint32_t bits = 0;
          std::memcpy(&bits, &got[at], esz);
          uint32_t want = esz == 2 ? 0xFFFFu : 0xFFFFFFFFu;  // absent slot: poison untouched
          if (present) {
            const float v = c < k ? row[static_cast<size_t>(c)] : 0.0f;
            want = out_dtype == DType::kF32    ? num::f32_bits(v)
                   : out_dtype == DType::kBF16 ? num::f32_to_bf16(v)
                                               : num::f32_to_f16(v);
          }
          ASSERT_EQ(bits, want) << "expert " << e << " row " << r << " col " << c;
        }
      }
    }
  }
}

TEST(GpuDequant, EveryFormatBitExact) {
  QMOE_REQUIRE_GPU();
  for (int i = 0; i < kNumWeightFormats; ++i) {
    const FcFormat f = default_fc_format(static_cast<WeightFormat>(i));
    for (DType out : {DType::kF32, DType::kBF16, DType::kF16}) check_format(f, 5, 96, 256, out);
  }
}

TEST(GpuDequant, IntegerVariantsBitExact) {
  QMOE_REQUIRE_GPU();
  for (int bits : {2, 3, 4, 8}) {
    const WeightFormat wf = bits == 2   ? WeightFormat::kInt2
                            : bits == 3 ? WeightFormat::kInt3
                            : bits == 4 ? WeightFormat::kInt4
                                        : WeightFormat::kInt8;
    for (int block : {0, 16, 32, 128, 256}) {
      for (bool zp : {false, true}) {
        for (DType sd : {DType::kF32, DType::kF16, DType::kBF16}) {
          FcFormat f = default_fc_format(wf);
          f.block_size = block;
          f.zero_points = zp;
          f.scale_dtype = sd;
          check_format(f, 3, 40, 512, DType::kF32);
        }
      }
    }
    // Per-channel rows whose K is not a multiple of 8 (the bitstream tail).
    FcFormat f = default_fc_format(wf);
    f.block_size = 0;
    f.zero_points = true;
    check_format(f, 3, 17, 203, DType::kF32);
    check_format(f, 3, 17, 203, DType::kBF16);
  }
}

TEST(GpuDequant, Fp4AndFp8Layouts) {
  QMOE_REQUIRE_GPU();
  for (WeightFormat wf : {WeightFormat::kNvFp4, WeightFormat::kMxFp4}) {
    FcFormat f = default_fc_format(wf);
    f.fp4_layout = Fp4Layout::kNPacked;
    check_format(f, 4, 64, 224, DType::kF32);
  }
  FcFormat fb = default_fc_format(WeightFormat::kFp8Block);
  for (DType sd : {DType::kF32, DType::kBF16}) {
    fb.scale_dtype = sd;
    check_format(fb, 3, 200, 136, DType::kF32);  // partial edge blocks on both axes
  }
  fb.block_size = 64;
  check_format(fb, 3, 70, 201, DType::kBF16);
  check_format(default_fc_format(WeightFormat::kFp8), 3, 33, 77, DType::kF32);
}

// FP4 from the decode kernels' packed copy: the same bits as from ORT's layout, for both bit
// layouts, gated row maps (FC1's permuted rows), partial tiles and chunks, every output dtype.
TEST(GpuDequant, Fp4FromThePackedCopy) {
  QMOE_REQUIRE_GPU();
  for (WeightFormat wf : {WeightFormat::kNvFp4, WeightFormat::kMxFp4}) {
    FcFormat f = default_fc_format(wf);
    for (DType act : {DType::kBF16, DType::kF16}) {
      for (DType out : {DType::kF32, DType::kBF16, DType::kF16}) {
        check_format(f, 5, 96, 256, out, {true, MmaRowMap::kIdentity, 0, act});
      }
      check_format(f, 3, 40, 224, DType::kF32, {true, MmaRowMap::kIdentity, 0, act});
      check_format(f, 3, 2 * 24, 160, DType::kBF16, {true, MmaRowMap::kGatedInterleaved, 24, act});
      check_format(f, 3, 2 * 20, 96, DType::kF16, {true, MmaRowMap::kGatedConcatenated, 20, act});
    }
    f.fp4_layout = Fp4Layout::kNPacked;
    check_format(f, 4, 64, 224, DType::kF32, {true, MmaRowMap::kIdentity, 0, DType::kBF16});
  }
}

// FP8 from the decode kernels' packed copy: the same bits as from ORT's layout, for both bit
// layouts, both formats (fp8_block with f32/bf16/f16 scales, partial edge blocks, blocks of 32 and
// 128), gated row maps, partial tiles and chunks, every output dtype.
TEST(GpuDequant, Fp8FromThePackedCopy) {
  QMOE_REQUIRE_GPU();
  for (WeightFormat wf : {WeightFormat::kFp8, WeightFormat::kFp8Block}) {
    FcFormat f = default_fc_format(wf);
    for (DType act : {DType::kBF16, DType::kF16}) {
      for (DType out : {DType::kF32, DType::kBF16, DType::kF16}) {
        check_format(f, 5, 136, 288, out, {true, MmaRowMap::kIdentity, 0, act});
      }
      check_format(f, 3, 40, 208, DType::kF32, {true, MmaRowMap::kIdentity, 0, act});
      check_format(f, 3, 2 * 72, 160, DType::kBF16, {true, MmaRowMap::kGatedInterleaved, 72, act});
      check_format(f, 3, 2 * 136, 96, DType::kF16, {true, MmaRowMap::kGatedConcatenated, 136, act});
    }
  }
  FcFormat fb = default_fc_format(WeightFormat::kFp8Block);
  fb.block_size = 32;
  for (DType sd : {DType::kF32, DType::kBF16, DType::kF16}) {
    fb.scale_dtype = sd;
    check_format(fb, 3, 2 * 40, 80, DType::kF32, {true, MmaRowMap::kGatedConcatenated, 40});
  }
}

TEST(GpuDequant, RejectsBadArguments) {
  QMOE_REQUIRE_GPU();
  cuda::DequantArgs a;
  a.fc.format = default_fc_format(WeightFormat::kInt4);
  a.fc.n = 8;
  a.fc.k = 64;
  EXPECT_NE(cuda::launch_dequant(a, nullptr).message().find("ld"), std::string::npos);
  a.ld = 64;
  a.slot_stride = 8 * 64;
  a.max_groups = 1;
  EXPECT_NE(cuda::launch_dequant(a, nullptr).message().find("null"), std::string::npos);
  a.out_dtype = DType::kU8;
  EXPECT_NE(cuda::launch_dequant(a, nullptr).message().find("out_dtype"), std::string::npos);
}

}  // namespace
}  // namespace qmoe::test
