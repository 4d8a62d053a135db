// The decode kernel on fp8 and fp8_block weights against the fp64 oracle and the generic path: both
// dtypes (each has its own bit layout), the window's edge (64 tokens decode, 65 go the generic
// way), odd shapes (partial tiles, chunks and scale blocks, FC1's halves in two blocks of rows),
// mixes with integer and FP4 FCs, long K, every form and ring, every e4m3 code, extreme scales,
// and CUDA-graph replay.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "core/numeric.h"
#include "gpu_layer_harness.h"

namespace qmoe::test {
namespace {

constexpr WeightFormat kFp8Formats[] = {WeightFormat::kFp8, WeightFormat::kFp8Block};

TEST(GpuDecodeFp8, MatchesOracle) {
  QMOE_REQUIRE_GPU();
  for_layers_of(kFp8Formats, 512, 256, 16, 4, [](const TestLayer& tl, uint64_t seed) {
    for (int64_t tokens : {1, 2, 3, 4, 8, 16, 33}) check_decode_call(tl, tokens, seed);
  });
}

// 64 tokens is the decode window's last count; 65 goes the generic way, which dequantizes the
// touched experts from the packed copy. E = k = 8: every expert takes every token.
TEST(GpuDecodeFp8, WindowEdge) {
  QMOE_REQUIRE_GPU();
  for_layers_of(kFp8Formats, 256, 128, 8, 8, [](const TestLayer& tl, uint64_t seed) {
    check_decode_call(tl, 64, seed);
    check_decode_call(tl, 65, seed, false);
  });
}

// Odd shapes and mixes: K a multiple of 16 but not of a 32-K chunk (H 208, I 80), fp8_block's K
// not a multiple of its block (H 2880: a last block of 64; I 80, 208) and FC1's gate and linear
// halves starting inside a block of rows (gated concatenated, I 208), blocks of 32 and 64, f16 and
// bf16 block scales, FP8 next to integer and FP4 FCs, and a K so long that fewer than 16 rows fit
// a pass.
TEST(GpuDecodeFp8, ShapesAndMixes) {
  QMOE_REQUIRE_GPU();
  struct Shape {
    WeightFormat fc1, fc2;
    int64_t h, i, e;
    int k;
    DType dt;
    int64_t tokens;
    int block;         // fp8_block's block size (0: the default)
    DType scale_type;  // fp8_block's scale dtype
    bool concatenated;
  };
  const DType f32 = DType::kF32;
  for (const Shape& c : {Shape{WeightFormat::kFp8, WeightFormat::kFp8, 208, 80, 8, 2, DType::kBF16,
                               5, 0, f32, false},
                         Shape{WeightFormat::kFp8Block, WeightFormat::kFp8Block, 208, 80, 8, 2,
                               DType::kF16, 33, 32, DType::kBF16, false},
                         Shape{WeightFormat::kFp8Block, WeightFormat::kFp8Block, 2880, 208, 8, 2,
                               DType::kBF16, 7, 0, f32, true},
                         Shape{WeightFormat::kFp8Block, WeightFormat::kFp8Block, 384, 208, 8, 4,
                               DType::kF16, 12, 64, DType::kF16, true},
                         Shape{WeightFormat::kFp8, WeightFormat::kInt4, 256, 192, 16, 4,
                               DType::kF16, 9, 0, f32, false},
                         Shape{WeightFormat::kNvFp4, WeightFormat::kFp8Block, 256, 256, 16, 4,
                               DType::kBF16, 17, 0, DType::kBF16, false},
                         Shape{WeightFormat::kFp8Block, WeightFormat::kFp8, 8192, 128, 8, 8,
                               DType::kBF16, 20, 0, f32, false}}) {
    LayerSpec s = small_spec(c.fc1, c.h, c.i, c.e, c.k);
    s.fc2 = default_fc_format(c.fc2);
    for (FcFormat* f : {&s.fc1, &s.fc2}) {
      if (f->format != WeightFormat::kFp8Block) continue;
      if (c.block) f->block_size = c.block;
      f->scale_dtype = c.scale_type;
    }
    if (c.fc2 == WeightFormat::kInt4) s.fc2.block_size = 64;
    s.act_dtype = c.dt;
    if (c.concatenated) s.activation.glu = GluLayout::kConcatenated;
    const uint64_t seed = fresh_seed();
    TestLayer tl;
    make_layer(s, seed, &tl);
    SCOPED_TRACE(layer_name(s));
    check_decode_call(tl, c.tokens, seed);
    check_decode_call(tl, 1, seed);
  }
}

// A separate FC3 (DeepSeek-V3's gate and up projections) packs with FC1 as one gated FC: both
// formats and dtypes, I not a multiple of the block (the linear rows start inside a block of
// rows), the window's edge and the generic path (which reads FC1 and FC3 in ORT's layout).
TEST(GpuDecodeFp8, SeparateFc3) {
  QMOE_REQUIRE_GPU();
  for (WeightFormat fmt : kFp8Formats) {
    for (DType dt : {DType::kBF16, DType::kF16}) {
      for (int64_t inter : {256, 208}) {
        LayerSpec s = small_spec(fmt, 384, inter, 8, 8);
        s.activation.glu = GluLayout::kSeparateFc3;
        s.act_dtype = dt;
        const uint64_t seed = fresh_seed();
        TestLayer tl;
        make_layer(s, seed, &tl);
        SCOPED_TRACE(layer_name(s) + " separate FC3");
        for (int64_t tokens : {1, 5, 64}) check_decode_call(tl, tokens, seed);
        check_decode_call(tl, 65, seed, false);
      }
    }
  }
  // FC1 biases keep such layers on the generic path.
  LayerSpec s = small_spec(WeightFormat::kFp8Block, 256, 128, 8, 2);
  s.activation.glu = GluLayout::kSeparateFc3;
  s.has_fc1_bias = true;
  s.act_dtype = DType::kBF16;
  const uint64_t seed = fresh_seed();
  TestLayer tl;
  make_layer(s, seed, &tl);
  check_decode_call(tl, 1, seed, false);
}

// The decode kernel forced, its tiles per block and rings: within the budget; tiles per block of 4
// and more, and both rings, the same bits.
TEST(GpuDecodeFp8, TilesAndRings) {
  QMOE_REQUIRE_GPU();
  for_layers_of(kFp8Formats, 1024, 768, 8, 4,
                [](const TestLayer& tl, uint64_t seed) { check_decode_tiles_and_rings(tl, seed); });
}

// One fp8_block scale entry i of q set to v (in the FC's scale dtype).
void set_block_scale(QuantizedFc* q, size_t i, float v) {
  switch (q->format.scale_dtype) {
    case DType::kBF16: {
      const uint16_t h = num::f32_to_bf16(v);
      std::memcpy(q->scales.data() + 2 * i, &h, 2);
      break;
    }
    case DType::kF16: {
      const uint16_t h = num::f32_to_f16(v);
      std::memcpy(q->scales.data() + 2 * i, &h, 2);
      break;
    }
    default:
      std::memcpy(q->scales.data() + 4 * i, &v, 4);
      break;
  }
}

// Weights and scales at the ends of their ranges. The oracle reads the same modified tensors.
//   codes:   every finite e4m3 code, in turn along each row (the subnormals 0x01..0x07, zeros of
//            both signs, 448), the scales raised to keep the outputs normal;
//   global:  fp8 global scales of 2^-40 on FC1 and 2^+30 on FC2 (bf16 only: f16 cannot hold FC1's
//            output then);
//   zero:    fp8_block, a quarter of the blocks at scale 0;
//   spread:  fp8_block, scales spread over 2^-30..2^+20 (FC1 times FC2 inside the dtype's range).
void modify(TestLayer* tl, const std::string& how, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (QuantizedFc* q : {&tl->fc1, &tl->fc2}) {
    const bool block = q->format.format == WeightFormat::kFp8Block;
    if (how == "codes") {
      unsigned code = static_cast<unsigned>(rng() % 256);
      for (uint8_t& c : q->weight) {
        do code = (code + 1) % 256;
        while ((code & 0x7Fu) == 0x7Fu);  // the two NaN codes
        c = static_cast<uint8_t>(code);
      }
      if (!block) {
        for (float& g : q->global_scale) g = 1.0f / 256;
      } else {
        const size_t n = q->scales.size() / dtype_size(q->format.scale_dtype);
        for (size_t i = 0; i < n; ++i) set_block_scale(q, i, 1.0f / 256);
      }
    }
    if (!block) continue;
    const size_t n = q->scales.size() / dtype_size(q->format.scale_dtype);
    for (size_t i = 0; i < n; ++i) {
      const unsigned r = static_cast<unsigned>(rng() % 1024);
      if (how == "zero" && r % 4 == 0) set_block_scale(q, i, 0.0f);
      if (how == "spread") {
        const int ex =
            q == &tl->fc1 ? -30 + static_cast<int>(r % 31) : -10 + static_cast<int>(r % 21);
        set_block_scale(q, i, std::ldexp(1.0f + static_cast<float>(r % 8) / 8, ex));
      }
    }
  }
  if (how == "global") {
    for (float& g : tl->fc1.global_scale) g = std::ldexp(g, -40);
    for (float& g : tl->fc2.global_scale) g = std::ldexp(g, 30);
  }
  bind_weights(tl);
}

TEST(GpuDecodeFp8, ExtremeCodesAndScales) {
  QMOE_REQUIRE_GPU();
  struct Case {
    WeightFormat f;
    const char* how;
    DType dt;
    DType scale_type;
  };
  for (const Case& c : {Case{WeightFormat::kFp8, "codes", DType::kBF16, DType::kF32},
                        Case{WeightFormat::kFp8, "codes", DType::kF16, DType::kF32},
                        Case{WeightFormat::kFp8Block, "codes", DType::kBF16, DType::kBF16},
                        Case{WeightFormat::kFp8Block, "codes", DType::kF16, DType::kF16},
                        Case{WeightFormat::kFp8, "global", DType::kBF16, DType::kF32},
                        Case{WeightFormat::kFp8Block, "zero", DType::kF16, DType::kF32},
                        Case{WeightFormat::kFp8Block, "spread", DType::kBF16, DType::kF32},
                        Case{WeightFormat::kFp8Block, "spread", DType::kBF16, DType::kBF16}}) {
    LayerSpec s = small_spec(c.f, 512, 256, 16, 4);
    s.act_dtype = c.dt;
    s.fc1.scale_dtype = s.fc2.scale_dtype = c.f == WeightFormat::kFp8 ? DType::kF32 : c.scale_type;
    const uint64_t seed = fresh_seed();
    TestLayer tl;
    make_layer(s, seed, &tl);
    modify(&tl, c.how, seed);
    SCOPED_TRACE(layer_name(s) + " " + c.how);
    check_decode_call(tl, 1, seed);
    check_decode_call(tl, 12, seed);
    check_decode_call(tl, 80, seed,
                      false);  // the generic path (from the packed copy), same tensors
  }
}

// A captured CUDA graph of a decode call replays to the bits of eager calls.
TEST(GpuDecodeFp8, GraphReplayEqualsEager) {
  QMOE_REQUIRE_GPU();
  for_layers_of(kFp8Formats, 512, 256, 16, 4, [](const TestLayer& tl, uint64_t seed) {
    std::unique_ptr<PreparedLayer> layer;
    Status st = prepare_layer(BackendKind::kCuda, tl.spec, tl.weights, {}, &layer);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    ASSERT_EQ(layer->dispatch_choice(5).rfind("decode", 0), 0u);
    check_graph_replay(tl, layer.get(), 5, seed, 2);
  });
}

}  // namespace
}  // namespace qmoe::test
