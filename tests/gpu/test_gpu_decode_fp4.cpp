// The decode kernel on NVFP4 and MXFP4 weights against the fp64 oracle and the generic path: both
// dtypes (each has its own bit layout), the window's edge (64 tokens decode, 65 go the generic
// way), odd shapes (partial tiles and chunks), long K (several passes), every form and ring, and
// extreme scales (zero, the e4m3 subnormals and maximum, e8m0's ends, tiny and huge global scales).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "cuda/layer/dispatch.h"
#include "gpu_layer_harness.h"

namespace qmoe::test {
namespace {

constexpr WeightFormat kFp4Formats[] = {WeightFormat::kNvFp4, WeightFormat::kMxFp4};

TEST(GpuDecodeFp4, MatchesOracle) {
  QMOE_REQUIRE_GPU();
  for_layers_of(kFp4Formats, 512, 256, 16, 4, [](const TestLayer& tl, uint64_t seed) {
    for (int64_t tokens : {1, 2, 4, 8, 16, 33}) {
      check_decode_call(tl, tokens, seed, true, with_dispatch("decode/1"));
    }
  });
}

// The default window's last decode count, then the generic path. E = k = 8: every expert takes
// every token. 64 tokens, except MXFP4, whose generic path runs the narrow tile on the e4m3 copy:
// 6 routes per expert there (dispatch.h, kDecodeMaxMeanRoutesE4m3Copy).
TEST(GpuDecodeFp4, WindowEdge) {
  QMOE_REQUIRE_GPU();
  for_layers_of(kFp4Formats, 256, 128, 8, 8, [](const TestLayer& tl, uint64_t seed) {
    const bool copy = tl.spec.fc1.format == WeightFormat::kMxFp4;
    const int64_t last = copy ? cuda::kDecodeMaxMeanRoutesE4m3Copy : cuda::kDecodeWindowTokens;
    check_decode_call(tl, last, seed);
    check_decode_call(tl, last + 1, seed, false);
  });
}

// Mixed FP4 / integer FCs, odd shapes (K not a multiple of a 64-K chunk, partial tiles), gated
// concatenated layout, and a K so long that fewer than 16 rows fit a pass.
TEST(GpuDecodeFp4, ShapesAndMixes) {
  QMOE_REQUIRE_GPU();
  struct Shape {
    WeightFormat fc1, fc2;
    int64_t h, i, e;
    int k;
    DType dt;
    int64_t tokens;
  };
  for (const Shape& c :
       {Shape{WeightFormat::kNvFp4, WeightFormat::kNvFp4, 208, 80, 8, 2, DType::kBF16, 5},
        Shape{WeightFormat::kMxFp4, WeightFormat::kMxFp4, 224, 96, 8, 2, DType::kF16, 33},
        Shape{WeightFormat::kNvFp4, WeightFormat::kInt4, 256, 192, 16, 4, DType::kF16, 9},
        Shape{WeightFormat::kInt8, WeightFormat::kMxFp4, 320, 128, 16, 4, DType::kBF16, 17},
        Shape{WeightFormat::kMxFp4, WeightFormat::kNvFp4, 8192, 128, 8, 8, DType::kBF16, 20}}) {
    LayerSpec s = small_spec(c.fc1, c.h, c.i, c.e, c.k);
    s.fc2 = default_fc_format(c.fc2);
    if (c.fc2 == WeightFormat::kInt4) s.fc2.block_size = 64;
    if (c.fc1 == WeightFormat::kInt8) s.fc1.block_size = 64;
    s.act_dtype = c.dt;
    if (c.h == 256) s.activation.glu = GluLayout::kConcatenated;
    const uint64_t seed = fresh_seed();
    TestLayer tl;
    make_layer(s, seed, &tl);
    SCOPED_TRACE(layer_name(s));
    check_decode_call(tl, c.tokens, seed);
    check_decode_call(tl, 1, seed);
  }
}

// ORT's N-packed FP4 layout ([E, K, N/2]) decodes to the same bits as the K-packed one.
TEST(GpuDecodeFp4, NPackedLayoutKeepsTheBits) {
  QMOE_REQUIRE_GPU();
  for (WeightFormat f : kFp4Formats) {
    LayerSpec s = small_spec(f, 256, 128, 8, 2);
    s.act_dtype = DType::kBF16;
    const uint64_t seed = fresh_seed();
    TestLayer k_packed;
    make_layer(s, seed, &k_packed);
    TestLayer n_packed = k_packed;
    for (QuantizedFc* q : {&n_packed.fc1, &n_packed.fc2}) {
      std::vector<uint8_t> src = q->weight;
      fp4_repack(Fp4Layout::kKPacked, src.data(), q->experts, q->n, q->k, q->weight.data());
      q->format.fp4_layout = Fp4Layout::kNPacked;
    }
    n_packed.spec.fc1.fp4_layout = n_packed.spec.fc2.fp4_layout = Fp4Layout::kNPacked;
    bind_weights(&n_packed);
    bind_weights(&k_packed);
    TestInputs ti;
    make_inputs(s, 6, seed, false, &ti);
    GpuRun a, b;
    gpu_run(k_packed, ti, &a);
    gpu_run(n_packed, ti, &b);
    EXPECT_LE(a.error, gpu_budget(s.act_dtype));
    EXPECT_EQ(a.out, b.out) << format_info(f).name;
  }
}

// The decode kernel forced, its tiles per block and rings: within the budget; tiles per block of 4
// and more, and both rings, the same bits.
TEST(GpuDecodeFp4, TilesAndRings) {
  QMOE_REQUIRE_GPU();
  for_layers_of(kFp4Formats, 1024, 768, 8, 4,
                [](const TestLayer& tl, uint64_t seed) { check_decode_tiles_and_rings(tl, seed); });
}

// Where shared memory holds fewer blocks than the registers allow (K 2880: a 5.8 KB row per route
// and as many bytes of MXFP4 scales per tile), the launcher trades rows per pass and tiles per
// block for blocks (DecodeOptions::min_blocks): more passes over the weights, the same bits.
TEST(GpuDecodeFp4, SharedMemoryTradesKeepTheBits) {
  QMOE_REQUIRE_GPU();
  LayerSpec s = small_spec(WeightFormat::kMxFp4, 2880, 2880, 8, 4);
  s.act_dtype = DType::kBF16;
  const uint64_t seed = fresh_seed();
  TestLayer tl;
  make_layer(s, seed, &tl);
  for (int64_t tokens : {6, 24}) {
    TestInputs ti;
    make_inputs(tl.spec, tokens, seed + tokens, false, &ti);
    for (int tpb : {0, 8}) {
      SCOPED_TRACE("tokens " + std::to_string(tokens) + " tiles per block " + std::to_string(tpb));
      PrepareOptions o = with_tiles(tpb);
      o.dispatch = "decode/1";  // the generic path takes 24 tokens by default
      o.decode.rows = 8;
      GpuRun traded, kept;
      o.decode.min_blocks = 4;
      gpu_run(tl, ti, &traded, o);
      o.decode.min_blocks = 0;
      gpu_run(tl, ti, &kept, o);
      EXPECT_LE(traded.error, gpu_budget(s.act_dtype));
      EXPECT_EQ(traded.out, kept.out);
    }
  }
}

// Scales at the ends of their ranges. The oracle reads the same modified tensors.
//   NVFP4: a quarter of the blocks at scale 0; every scale among the e4m3 subnormals and
//          smallest normals (codes 1..15; with f16 the decoded weights are then f16 subnormals,
//          the global scale raised to keep the outputs normal); every scale near the maximum
//          (0x70..0x7E, 448), the global scale cut to keep the outputs in range; global scales of
//          2^-40 on FC1 and 2^+30 on FC2 (bf16 only: f16 cannot hold FC1's output then).
//   MXFP4: e8m0 at 2^127 (code 254) on blocks whose codes are all zero (0 * 2^127 must stay 0),
//          2^-127 (code 0, an fp32 subnormal) on a quarter of the blocks, and scales spread over
//          2^-27..2^13 (codes 100..140).
void modify_scales(TestLayer* tl, const std::string& how, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (QuantizedFc* q : {&tl->fc1, &tl->fc2}) {
    const bool nv = q->format.format == WeightFormat::kNvFp4;
    const int block = nv ? 16 : 32;
    const int64_t blocks = q->k / block;
    for (size_t i = 0; i < q->scales.size(); ++i) {
      uint8_t& c = q->scales[i];
      const unsigned r = static_cast<unsigned>(rng() % 1024);
      if (how == "zero" && r % 4 == 0) c = 0;
      if (how == "tiny") c = static_cast<uint8_t>(1 + r % 15);
      if (how == "huge") c = static_cast<uint8_t>(0x70 + r % 15);
      if (how == "e8m0-ends" && r % 4 == 0) c = 0;
      if (how == "e8m0-ends" && r % 4 == 1) {
        c = 254;
        const int64_t row = static_cast<int64_t>(i) / blocks, b = static_cast<int64_t>(i) % blocks;
        uint8_t* codes = q->weight.data() + row * (q->k / 2) + b * (block / 2);
        std::fill(codes, codes + block / 2, uint8_t{0});
      }
      if (how == "e8m0-spread") c = static_cast<uint8_t>(100 + r % 41);
    }
    if (how == "huge" || how == "tiny") {  // keep the outputs inside f16's normal range
      for (float& g : q->global_scale) g = std::ldexp(g, how == "huge" ? -2 : 12);
    }
  }
  if (how == "global") {
    for (float& g : tl->fc1.global_scale) g = std::ldexp(g, -40);
    for (float& g : tl->fc2.global_scale) g = std::ldexp(g, 30);
  }
  bind_weights(tl);
}

TEST(GpuDecodeFp4, ExtremeScales) {
  QMOE_REQUIRE_GPU();
  struct Case {
    WeightFormat f;
    const char* how;
    DType dt;
  };
  for (const Case& c : {Case{WeightFormat::kNvFp4, "zero", DType::kBF16},
                        Case{WeightFormat::kNvFp4, "tiny", DType::kBF16},
                        Case{WeightFormat::kNvFp4, "tiny", DType::kF16},
                        Case{WeightFormat::kNvFp4, "huge", DType::kBF16},
                        Case{WeightFormat::kNvFp4, "huge", DType::kF16},
                        Case{WeightFormat::kNvFp4, "global", DType::kBF16},
                        Case{WeightFormat::kMxFp4, "zero", DType::kF16},
                        Case{WeightFormat::kMxFp4, "e8m0-ends", DType::kBF16},
                        Case{WeightFormat::kMxFp4, "e8m0-ends", DType::kF16},
                        Case{WeightFormat::kMxFp4, "e8m0-spread", DType::kBF16},
                        Case{WeightFormat::kMxFp4, "global", DType::kBF16}}) {
    LayerSpec s = small_spec(c.f, 512, 256, 16, 4);
    s.act_dtype = c.dt;
    const uint64_t seed = fresh_seed();
    TestLayer tl;
    make_layer(s, seed, &tl);
    modify_scales(&tl, c.how, seed);
    SCOPED_TRACE(layer_name(s) + " scales " + c.how);
    check_decode_call(tl, 1, seed);
    check_decode_call(tl, 12, seed);
    check_decode_call(tl, 80, seed, false);  // the generic path on the same tensors
  }
}

}  // namespace
}  // namespace qmoe::test
