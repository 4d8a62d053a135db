// Calls of zero tokens (an input of shape [0, H], [B, 0, H] or [0, S, H]): ORT accepts them, and
// batch schedulers and expert-parallel ranks send them. They return ok with an empty output, read
// and write nothing (poisoned buffers stay as they were), and accept null data pointers and a null
// workspace; workspace_size(0) is 0. Bad shapes are still rejected.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "layer_factory.h"
#include "qmoe/routing.h"

namespace qmoe::test {
namespace {

constexpr uint8_t kPoison = 0xEE;

// A 64-byte aligned block of poison that stands in for every buffer of a call.
struct PoisonBlock {
  std::vector<uint8_t> bytes = std::vector<uint8_t>(4096 + 64, kPoison);
  uint8_t* get() {
    return bytes.data() + (64 - reinterpret_cast<uintptr_t>(bytes.data()) % 64) % 64;
  }
  bool intact() const {
    for (uint8_t b : bytes) {
      if (b != kPoison) return false;
    }
    return true;
  }
};

// The input's shape for a zero-token call: rank 2 [0, H], or rank 3 with B or S zero.
std::vector<int64_t> empty_shape(int form, int64_t hidden) {
  if (form == 0) return {0, hidden};
  if (form == 1) return {3, 0, hidden};
  return {0, 5, hidden};
}

LayerSpec zero_token_spec(DType act) {
  LayerSpec s = small_spec(WeightFormat::kInt4);
  s.act_dtype = act;
  s.has_fc1_bias = s.has_fc2_bias = true;
  return s;
}

TEST(ZeroTokens, CpuCallIsEmptyAndTouchesNothing) {
  for (DType act : {DType::kF32, DType::kBF16}) {
    TestLayer tl;
    make_layer(zero_token_spec(act), fresh_seed(), &tl);
    const LayerSpec& s = tl.spec;
    for (int threads : {1, 3}) {
      std::unique_ptr<PreparedLayer> layer;
      PrepareOptions opt;
      opt.num_threads = threads;
      ASSERT_TRUE(prepare_layer(BackendKind::kCpu, s, tl.weights, opt, &layer).is_ok());
      EXPECT_EQ(layer->workspace_size(0), 0u);
      for (int form = 0; form < 3; ++form) {
        for (bool with_rw : {false, true}) {
          for (bool null_data : {true, false}) {
            SCOPED_TRACE(std::string(dtype_name(act)) + " threads " + std::to_string(threads) +
                         " form " + std::to_string(form) + (with_rw ? " router_weights" : "") +
                         (null_data ? " null pointers" : " poisoned buffers"));
            PoisonBlock x, logits, rw, out, ws;
            auto ptr = [&](PoisonBlock& b) -> uint8_t* { return null_data ? nullptr : b.get(); };
            const std::vector<int64_t> shape = empty_shape(form, s.hidden);
            RunInputs in;
            in.input = shaped_view<TensorView>(ptr(x), act, shape);
            in.router_logits = shaped_view<TensorView>(ptr(logits), act, {0, s.num_experts});
            if (with_rw) {
              in.router_weights = shaped_view<TensorView>(ptr(rw), act, {0, s.num_experts});
            }
            const MutableTensorView ov = shaped_view<MutableTensorView>(ptr(out), act, shape);
            RunProfile profile;
            profile.route_us = profile.fc1_us = profile.fc2_us = profile.combine_us = 7.0;
            profile.combine_fused = true;
            // A null workspace of 0 bytes (workspace_size(0)), then a poisoned one.
            Status st = layer->run(in, ov, nullptr, 0, nullptr, &profile);
            ASSERT_TRUE(st.is_ok()) << st.to_string();
            EXPECT_EQ(profile.total_us(), 0.0);
            EXPECT_FALSE(profile.combine_fused);
            st = layer->run(in, ov, ws.get(), 4096, nullptr);
            ASSERT_TRUE(st.is_ok()) << st.to_string();
            EXPECT_TRUE(out.intact()) << "output written";
            EXPECT_TRUE(ws.intact()) << "workspace written";
            EXPECT_TRUE(x.intact() && logits.intact() && rw.intact()) << "input written";
            st = run_layer(*layer, in, ov);
            ASSERT_TRUE(st.is_ok()) << st.to_string();

            std::vector<double> ref(3, 1.0);
            st = reference_forward(s, tl.weights, in, &ref);
            ASSERT_TRUE(st.is_ok()) << st.to_string();
            EXPECT_TRUE(ref.empty());
          }
        }
      }
    }
  }
}

TEST(ZeroTokens, WorkspaceSizeIsZeroThenMonotone) {
  TestLayer tl;
  make_layer(zero_token_spec(DType::kF32), fresh_seed(), &tl);
  for (int threads : {1, 4}) {
    std::unique_ptr<PreparedLayer> layer;
    PrepareOptions opt;
    opt.num_threads = threads;
    ASSERT_TRUE(prepare_layer(BackendKind::kCpu, tl.spec, tl.weights, opt, &layer).is_ok());
    EXPECT_EQ(layer->workspace_size(-3), 0u);
    EXPECT_EQ(layer->workspace_size(0), 0u);
    EXPECT_GT(layer->workspace_size(1), 0u);
    for (int64_t t = 1; t <= 80; ++t) {
      EXPECT_LE(layer->workspace_size(t - 1), layer->workspace_size(t)) << "tokens " << t;
    }
  }
}

TEST(ZeroTokens, BadShapesAreStillRejected) {
  TestLayer tl;
  make_layer(zero_token_spec(DType::kF32), fresh_seed(), &tl);
  const LayerSpec& s = tl.spec;
  std::unique_ptr<PreparedLayer> layer;
  ASSERT_TRUE(prepare_layer(BackendKind::kCpu, s, tl.weights, {}, &layer).is_ok());
  RunInputs good;
  good.input = TensorView(nullptr, DType::kF32, {0, s.hidden});
  good.router_logits = TensorView(nullptr, DType::kF32, {0, s.num_experts});
  const MutableTensorView good_out(nullptr, DType::kF32, {0, s.hidden});
  ASSERT_TRUE(layer->run(good, good_out, nullptr, 0, nullptr).is_ok());

  auto expect_error = [&](const RunInputs& in, const MutableTensorView& out, const char* what) {
    const Status st = layer->run(in, out, nullptr, 0, nullptr);
    EXPECT_NE(st.message().find(what), std::string::npos) << what << " / " << st.to_string();
  };
  RunInputs bad = good;
  bad.input = TensorView(nullptr, DType::kF32, {0, s.hidden + 1});
  expect_error(bad, good_out, "input: expected shape [tokens, 256]");
  bad.input = TensorView(nullptr, DType::kF32, {-2, 0, s.hidden});
  expect_error(bad, good_out, "input: negative dimension");
  bad.input = TensorView();  // no shape: absent, not empty
  expect_error(bad, good_out, "input: missing");
  bad = good;
  std::vector<float> row(s.num_experts, 0.0f);
  bad.router_logits = TensorView(row.data(), DType::kF32, {1, s.num_experts});
  expect_error(bad, good_out, "router_probs: expected f32 [0, 8]");
  bad.router_logits = TensorView(nullptr, DType::kF32, {1, s.num_experts});  // not empty: absent
  expect_error(bad, good_out, "router_probs: missing");
  bad.router_logits = TensorView();
  expect_error(bad, good_out, "router_probs: missing");
  bad = good;
  bad.router_weights = TensorView(nullptr, DType::kF32, {0, s.num_experts + 1});
  expect_error(bad, good_out, "router_weights: expected f32 [0, 8]");
  expect_error(good, MutableTensorView(nullptr, DType::kBF16, {0, s.hidden}),
               "output: expected dtype f32");
  expect_error(good, MutableTensorView(nullptr, DType::kF32, {0, s.hidden - 1}),
               "output: expected");
  expect_error(good, MutableTensorView(), "output: missing");

  // A null output pointer is accepted only where the output is empty.
  std::vector<float> x(s.hidden, 0.5f), l(s.num_experts, 0.25f);
  RunInputs one;
  one.input = TensorView(x.data(), DType::kF32, {1, s.hidden});
  one.router_logits = TensorView(l.data(), DType::kF32, {1, s.num_experts});
  expect_error(one, MutableTensorView(nullptr, DType::kF32, {1, s.hidden}), "output: missing");
}

// route(), the routing every backend shares, takes zero tokens too (null logits included).
TEST(ZeroTokens, RouteTakesZeroTokens) {
  const LayerSpec s = zero_token_spec(DType::kF32);
  std::vector<uint8_t> buf(route_maps_bytes(0, s.slots(), s.num_experts) + 64);
  void* aligned = buf.data() + (64 - reinterpret_cast<uintptr_t>(buf.data()) % 64) % 64;
  RouteMapsView maps = carve_route_maps(aligned, 0, s.slots(), s.num_experts);
  RunInputs in;
  in.input = TensorView(nullptr, DType::kF32, {0, s.hidden});
  in.router_logits = TensorView(nullptr, DType::kF32, {0, s.num_experts});
  const Status st = route(s, in, TensorView(), &maps);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(maps.tokens, 0);
  for (int64_t e = 0; e < s.num_experts; ++e) EXPECT_EQ(maps.expert_counts[e], 0);
}

}  // namespace
}  // namespace qmoe::test
