// check_spec / check_layer: every malformed spec or weight set is rejected with a message naming
// the argument and what was expected.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "layer_factory.h"

namespace qmoe::test {
namespace {

void expect_error(const Status& st, const std::string& needle) {
  EXPECT_FALSE(st.is_ok()) << "expected an error containing '" << needle << "'";
  EXPECT_NE(st.message().find(needle), std::string::npos)
      << "message '" << st.message() << "' lacks '" << needle << "'";
}

TEST(CheckSpec, AcceptsTheSmallSpec) {
  EXPECT_TRUE(check_spec(small_spec(WeightFormat::kInt4)).is_ok());
}

TEST(CheckSpec, RejectsBadValues) {
  struct Case {
    std::function<void(LayerSpec*)> edit;
    const char* needle;
  };
  const Case cases[] = {
      {[](LayerSpec* s) { s->routing.top_k = 0; }, "k: expected 1 <= k <= 8"},
      {[](LayerSpec* s) { s->routing.top_k = 9; }, "k: expected 1 <= k <= 8"},
      {[](LayerSpec* s) { s->hidden = 0; }, "hidden_size"},
      {[](LayerSpec* s) { s->inter = -3; }, "inter_size"},
      {[](LayerSpec* s) { s->num_experts = 0; }, "num_experts"},
      {[](LayerSpec* s) { s->act_dtype = DType::kU8; }, "act_dtype: expected f32, f16 or bf16"},
      {[](LayerSpec* s) { s->routing.num_shared = 8; }, "num_shared_experts"},
      {[](LayerSpec* s) { s->routing.num_shared = 7; }, "k: expected 1 <= k <= 1"},
      {[](LayerSpec* s) { s->routing.method = RoutingMethod::kSparseMixer, s->routing.top_k = 3; },
       "sparse mixer routing requires k = 2"},
      {[](LayerSpec* s) {
         s->routing.method = RoutingMethod::kGroupedTopK, s->routing.n_group = 3;
       },
       "n_group: expected a divisor of the 8 routed experts"},
      {[](LayerSpec* s) {
         s->routing.method = RoutingMethod::kGroupedTopK, s->routing.n_group = 4,
         s->routing.topk_group = 5;
       },
       "topk_group"},
      {[](LayerSpec* s) {
         s->routing.method = RoutingMethod::kGroupedTopK, s->routing.n_group = 4,
         s->routing.topk_group = 1, s->routing.top_k = 3;
       },
       "grouped top-k can reach only"},
      {[](LayerSpec* s) { s->activation.alpha = NAN; }, "activation_alpha"},
      {[](LayerSpec* s) { s->activation.limit = -1; }, "swiglu_limit"},
      {[](LayerSpec* s) {
         s->activation.kind = Activation::kSilu, s->activation.limit_after_activation = true;
       },
       "swiglu_limit_after_activation"},
      {[](LayerSpec* s) { s->fc1.block_size = 48; }, "fc1"},
      {[](LayerSpec* s) { s->fc2.block_size = 512; }, "fc2"},
      {[](LayerSpec* s) { s->hidden = 200; }, "fc1"},  // 128 does not divide 200
  };
  for (const Case& c : cases) {
    LayerSpec s = small_spec(WeightFormat::kInt4);
    c.edit(&s);
    expect_error(check_spec(s), c.needle);
  }
}

TEST(CheckLayer, RejectsMismatchedTensors) {
  TestLayer tl;
  LayerSpec spec = small_spec(WeightFormat::kInt4);
  spec.has_fc2_bias = true;
  make_layer(spec, fresh_seed(), &tl);
  ASSERT_TRUE(check_layer(tl.spec, tl.weights).is_ok());

  LayerWeights w = tl.weights;
  w.fc1.scales.dims[2] = 1;
  expect_error(check_layer(tl.spec, w),
               "fc1_scales: expected f32 [8, 256, 2], got f32 [8, 256, 1]");
  w = tl.weights;
  w.fc2.weight = TensorView();
  expect_error(check_layer(tl.spec, w), "fc2_experts_weights: missing, expected u8 [8, 256, 64]");
  w = tl.weights;
  w.fc1.scales.dtype = DType::kF16;
  expect_error(check_layer(tl.spec, w), "fc1_scales: expected f32");
  w = tl.weights;
  w.fc1.zero_points = w.fc1.weight;
  expect_error(check_layer(tl.spec, w), "fc1_zero_points");
  w = tl.weights;
  w.fc1.global_scale = TensorView(w.fc1.scales.data, DType::kF32, {8});
  expect_error(check_layer(tl.spec, w), "fc1_global_scale: not used");
  w = tl.weights;
  w.fc2.bias = TensorView();
  expect_error(check_layer(tl.spec, w), "fc2_experts_bias");
  w = tl.weights;
  w.fc3 = w.fc1;
  expect_error(check_layer(tl.spec, w), "fc3_experts_weights");
  w = tl.weights;
  w.router_bias = TensorView(w.fc1.scales.data, DType::kF32, {8});
  expect_error(check_layer(tl.spec, w), "router_correction_bias: only used by grouped_topk");

  // Non-finite scales are caught once, at validation.
  std::vector<float> scales(
      static_cast<const float*>(tl.weights.fc1.scales.data),
      static_cast<const float*>(tl.weights.fc1.scales.data) + tl.weights.fc1.scales.numel());
  scales[17] = NAN;
  w = tl.weights;
  w.fc1.scales.data = scales.data();
  expect_error(check_layer(tl.spec, w), "fc1_scales: non-finite value");
}

// expect_finite tests bits: every non-finite pattern of every float dtype is found (and no finite
// one), and a tensor scanned by several threads reports its lowest bad index.
TEST(ExpectFinite, EveryDtypeAndTheLowestIndex) {
  struct Case {
    DType t;
    std::vector<uint64_t> bad, good;  // element bit patterns
  };
  const Case cases[] = {
      {DType::kF32,
       {0x7F800000u, 0xFF800000u, 0x7FC00000u, 0x7F800001u},
       {0x7F7FFFFFu, 0x80000001u}},
      {DType::kF16, {0x7C00u, 0xFC00u, 0x7E00u, 0x7C01u}, {0x7BFFu, 0xFBFFu, 0x0001u}},
      {DType::kBF16, {0x7F80u, 0xFF80u, 0x7FC0u, 0x7F81u}, {0x7F7Fu, 0xFF7Fu}},
      {DType::kF64, {0x7FF0000000000000ull, 0xFFF8000000000000ull}, {0x7FEFFFFFFFFFFFFFull}},
      {DType::kF8E4M3, {0x7Fu, 0xFFu}, {0x7Eu, 0xFEu, 0x78u, 0x80u}},
      {DType::kF8E8M0, {0xFFu}, {0xFEu, 0x00u}},
  };
  for (const Case& c : cases) {
    const int eb = static_cast<int>(dtype_size(c.t));
    const int64_t n = 1000;
    for (uint64_t good : c.good) {
      std::vector<uint8_t> buf(static_cast<size_t>(n * eb));
      for (int64_t i = 0; i < n; ++i) std::memcpy(&buf[static_cast<size_t>(i * eb)], &good, eb);
      EXPECT_TRUE(expect_finite(TensorView(buf.data(), c.t, {n}), "t").is_ok())
          << dtype_name(c.t) << " " << good;
      for (uint64_t bad : c.bad) {
        std::memcpy(&buf[static_cast<size_t>(777 * eb)], &bad, eb);
        std::memcpy(&buf[static_cast<size_t>(901 * eb)], &bad, eb);
        const Status st = expect_finite(TensorView(buf.data(), c.t, {n}), "t");
        EXPECT_NE(st.message().find("at flat index 777"), std::string::npos)
            << dtype_name(c.t) << " " << bad << ": " << st.message();
        std::memcpy(&buf[static_cast<size_t>(777 * eb)], &good, eb);
        std::memcpy(&buf[static_cast<size_t>(901 * eb)], &good, eb);
      }
    }
  }
  // 160 MB of e4m3 codes: scanned in parts by several threads where the machine has the cores;
  // two NaNs in different parts, the error names the lower.
  const int64_t n = int64_t{160} << 20;
  std::vector<uint8_t> codes(static_cast<size_t>(n), 0x38);
  EXPECT_TRUE(expect_finite(TensorView(codes.data(), DType::kF8E4M3, {n}), "w").is_ok());
  codes[static_cast<size_t>(n - 5)] = 0x7F;
  codes[static_cast<size_t>(n / 2 + 3)] = 0xFF;
  const Status st = expect_finite(TensorView(codes.data(), DType::kF8E4M3, {n}), "w");
  EXPECT_EQ(st.message().rfind("w: non-finite value", 0), 0u) << st.message();
  EXPECT_NE(st.message().find("at flat index " + std::to_string(n / 2 + 3)), std::string::npos)
      << st.message();
}

TEST(CheckLayer, GroupedTopKNeedsTheCorrectionBias) {
  LayerSpec s = small_spec(WeightFormat::kInt4, 256, 128, 16, 4);
  s.routing.method = RoutingMethod::kGroupedTopK;
  s.routing.n_group = 4;
  s.routing.topk_group = 2;
  TestLayer tl;
  make_layer(s, fresh_seed(), &tl);
  ASSERT_TRUE(check_layer(tl.spec, tl.weights).is_ok());
  LayerWeights w = tl.weights;
  w.router_bias = TensorView();
  expect_error(check_layer(tl.spec, w), "router_correction_bias: missing, expected f32 [16]");
}

TEST(LayerMath, FlopsAndBytes) {
  LayerSpec s = small_spec(WeightFormat::kInt8, 256, 128, 8, 2);
  s.fc1.block_size = s.fc2.block_size = 0;
  // 3 tokens x 2 slots x (2*256*256 + 2*128*256)
  EXPECT_DOUBLE_EQ(layer_flops(s, 3), 6.0 * (2 * 256 * 256 + 2 * 128 * 256));
  // int8 per-channel f32 scales: fc1 256x256 + 256*4, fc2 256x128 + 256*4
  EXPECT_EQ(expert_bytes(s), 256 * 256 + 256 * 4 + 256 * 128 + 256 * 4);
}

}  // namespace
}  // namespace qmoe::test
