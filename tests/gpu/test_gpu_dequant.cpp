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

// FP4 and FP8 kept only in the decode layout, as the layer keeps it (layer_prepare.cu): packed codes
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

// Every expert of fc dequantized in one launch (all touched, in order), as host bytes.
void dequant_all(const cuda::DeviceFc& fc, int64_t experts, int64_t k, DType out_dtype,
                 std::vector<uint8_t>* bytes) {
  std::vector<int32_t> touched;
  for (int64_t e = 0; e < experts; ++e) touched.push_back(static_cast<int32_t>(e));
  const int32_t n_touched = static_cast<int32_t>(experts);
  GpuBuffer dt, dn, out;
  ASSERT_TRUE(dt.upload(touched));
  ASSERT_TRUE(dn.upload(&n_touched, 4));
  const int64_t ld = (k + 31) / 32 * 32;
  ASSERT_TRUE(out.allocate(static_cast<size_t>(experts * fc.n * ld) * dtype_size(out_dtype)));
  cuda::DequantArgs a;
  a.fc = fc;
  a.out_dtype = out_dtype;
  a.out = out.get();
  a.ld = ld;
  a.slot_stride = fc.n * ld;
  a.touched = dt.as<int32_t>();
  a.n_touched = dn.as<int32_t>();
  a.max_groups = static_cast<int>(experts);
  const Status st = cuda::launch_dequant(a, nullptr);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  CUDA_ASSERT(cudaDeviceSynchronize());
  ASSERT_TRUE(out.download(bytes));
}

// FP8 FC1 and a separate FC3 kept as one packed gated FC (layer_prepare.cu): each dequantized from
// it, its own rows (packed_row0 0 and I), equals its dequantization from ORT's layout bit for bit.
TEST(GpuDequant, Fp8GateAndLinearFromOnePackedCopy) {
  QMOE_REQUIRE_GPU();
  for (WeightFormat wf : {WeightFormat::kFp8Block, WeightFormat::kFp8}) {
    const FcFormat f = default_fc_format(wf);
    const bool block = wf == WeightFormat::kFp8Block;
    const int64_t experts = 3, inter = 208, k = 160;
    QuantizedFc gate, lin;
    make_fc(f, experts, inter, k, fresh_seed(), &gate);
    make_fc(f, experts, inter, k, fresh_seed(), &lin);
    if (::testing::Test::HasFatalFailure()) return;
    const MmaPackShape s =
        mma_pack_shape(f, 2 * inter, k, MmaRowMap::kGatedConcatenated, inter, DType::kF16);
    MmaPackShape rows_shape = s;
    rows_shape.scale_rows = 1;
    std::vector<uint32_t> words;
    mma_pack_fp8(s, gate.weight.data(), experts, &words, lin.weight.data());
    const int eb = block ? static_cast<int>(dtype_size(f.scale_dtype)) : 4;
    auto bytes = [&](const QuantizedFc& q) {
      return block ? q.scales.data() : reinterpret_cast<const uint8_t*>(q.global_scale.data());
    };
    std::vector<uint8_t> rows, tiled;
    mma_gated_row_scales(s, bytes(gate), bytes(lin), eb, block ? f.block_size : inter, experts,
                         &rows);
    mma_pack_scales(rows_shape, rows.data(), eb, experts, &tiled);
    GpuBuffer dw, ds;
    ASSERT_TRUE(dw.upload(words));
    ASSERT_TRUE(ds.upload(tiled));
    for (int h = 0; h < 2; ++h) {
      const QuantizedFc& q = h ? lin : gate;
      SCOPED_TRACE(std::string(format_info(wf).name) + (h ? " linear (FC3)" : " gate (FC1)"));
      DeviceFcCopy d;
      upload_fc(q, &d);
      cuda::DeviceFc packed = d.fc;
      packed.format.scale_dtype = block ? f.scale_dtype : DType::kF32;
      packed.packed = rows_shape;
      packed.packed_words = dw.as<uint32_t>();
      packed.packed_scales = ds.as<uint8_t>();
      packed.packed_row0 = h * inter;
      packed.weight = nullptr;
      packed.scales = nullptr;
      std::vector<uint8_t> want, got;
      dequant_all(d.fc, experts, k, DType::kBF16, &want);
      dequant_all(packed, experts, k, DType::kBF16, &got);
      ASSERT_EQ(got.size(), want.size());
      EXPECT_EQ(got, want);
    }
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
