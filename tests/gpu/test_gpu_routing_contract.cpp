// The device routing's contract: the non-finite rule, argument errors that launch nothing, the
// temp-size contract, and capture in a CUDA graph (the matching tests: test_gpu_routing.cpp).

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "gpu_routing_util.h"

namespace qmoe {
namespace {

using namespace gpu_routing_test;

// ---------------------------------------------------------------------------------------------
// Tests

// A token with a non-finite logit or router weight: routed as if its logits were zero (ids,
// counts, offsets and orders equal the host's on that substitution), every slot weight NaN, the
// error word records the kind and the lowest such token; every other token is bitwise the
// host's.
TEST(DeviceRouting, NonFiniteInputsMarkTheTokenAndSpareTheOthers) {
  QMOE_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const float kNaN = std::numeric_limits<float>::quiet_NaN();
  const float kInf = std::numeric_limits<float>::infinity();
  struct Case {
    float logit, weight;  // the value planted (0: none planted there)
  };
  const Case cases[] = {{kNaN, 0}, {kInf, 0}, {-kInf, 0}, {0, kNaN}, {0, kInf}, {kNaN, -kInf}};
  int i = 0;
  for (int64_t tokens : {6, 40, 100}) {  // the fused path, then the blocked one
    for (const Case& c : cases) {
      const RoutingMethod method = kMethods[i % 5];
      const LayerSpec s = valid_spec(method, 64, 4, 1, TieBreak::kLowerIndex, true, rng);
      Problem p = make_problem(s, tokens, kDtypes[i % 3], true, Values::kGaussian, rng());
      const int64_t e = p.experts();
      const int64_t bad_hi = tokens - 1;
      const int64_t bad_lo = std::uniform_int_distribution<int64_t>(0, tokens - 2)(rng);
      // The reference: the bad tokens' logits zeroed and router weights made finite.
      Problem ref = p;
      for (int64_t t : {bad_lo, bad_hi}) {
        for (int64_t j = 0; j < e; ++j) {
          store_float(ref.logits.data(), p.dtype, t * e + j, 0.0f);
          store_float(ref.rw.data(), p.dtype, t * e + j, 1.0f);
        }
        // Plant in a routed column for one token and in the shared column for the other.
        const int64_t col =
            t == bad_hi ? e - 1 : std::uniform_int_distribution<int64_t>(0, e - 2)(rng);
        if (c.logit != 0) store_float(p.logits.data(), p.dtype, t * e + col, c.logit);
        if (c.weight != 0) store_float(p.rw.data(), p.dtype, t * e + col, c.weight);
      }
      Maps want, got;
      ASSERT_TRUE(host_route(ref, &want));
      ASSERT_TRUE(device_route(p, RoutingPath::kAuto, &got));
      const std::string what = p.describe() + ", seed " + std::to_string(seed);
      const int32_t bits =
          (c.logit != 0 ? cuda::kErrorLogits : 0) | (c.weight != 0 ? cuda::kErrorRouterWeights : 0);
      EXPECT_EQ(got.error[0], bits) << what;
      EXPECT_EQ(got.error[1], bad_lo) << what;
      ASSERT_TRUE(same_bits("expert_ids", got.ids, want.ids)) << what;
      ASSERT_TRUE(same_bits("expert_counts", got.counts, want.counts)) << what;
      ASSERT_TRUE(same_bits("expert_offsets", got.offsets, want.offsets)) << what;
      ASSERT_TRUE(same_bits("permuted_route", got.permuted, want.permuted)) << what;
      ASSERT_TRUE(same_bits("route_position", got.position, want.position)) << what;
      const int slots = p.slots();
      for (int64_t t = 0; t < tokens; ++t) {
        for (int j = 0; j < slots; ++j) {
          const size_t r = static_cast<size_t>(t * slots + j);
          if (t == bad_lo || t == bad_hi) {
            EXPECT_TRUE(std::isnan(got.w[r])) << "token " << t << " slot " << j << ": " << what;
          } else {
            ASSERT_EQ(num::f32_bits(got.w[r]), num::f32_bits(want.w[r]))
                << "token " << t << " slot " << j << ": " << what;
          }
        }
      }
      ++i;
    }
  }
}

// Each bad argument is refused with kInvalidArgument naming it, and nothing is launched: the
// poisoned maps, temp and the error word are untouched afterwards. The unmodified arguments
// then route correctly (so the checks are not vacuous).
TEST(DeviceRouting, BadArgumentsAreRefusedWithoutLaunching) {
  QMOE_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  for (int64_t tokens : {5, 40}) {
    LayerSpec s = routing_spec(RoutingMethod::kGroupedTopK, 64, 4, 0, TieBreak::kLowerIndex, true);
    s.routing.n_group = 8;
    s.routing.topk_group = 2;
    const Problem p = make_problem(s, tokens, DType::kF32, true, Values::kGaussian, rng());
    DeviceProblem d;
    ASSERT_TRUE(d.init(p, RoutingPath::kAuto));
    struct Bad {
      const char* name;  // expected in the message
      DeviceRoutingArgs args;
      void* temp;
      size_t temp_bytes;
      RoutingPath path;
    };
    std::vector<Bad> bad;
    auto add = [&](const char* name, auto mutate) {
      Bad b{name, d.args, d.temp.get(), d.temp_bytes, RoutingPath::kAuto};
      mutate(&b);
      bad.push_back(b);
    };
    add("args.logits", [](Bad* b) { b->args.logits = nullptr; });
    add("args.maps", [](Bad* b) { b->args.maps.expert_ids = nullptr; });
    add("args.maps", [](Bad* b) { b->args.maps.route_position = nullptr; });
    add("args.maps", [](Bad* b) { b->args.maps.tokens = b->args.tokens - 1; });
    add("args.maps", [](Bad* b) { b->args.maps.slots += 1; });
    add("args.error", [](Bad* b) { b->args.error = nullptr; });
    add("args.router_bias", [](Bad* b) { b->args.router_bias = nullptr; });
    add("args.logits_dtype", [](Bad* b) { b->args.logits_dtype = DType::kI32; });
    add("args.rw_dtype", [](Bad* b) { b->args.rw_dtype = DType::kU8; });
    add("num_experts", [](Bad* b) { b->args.num_experts = cuda::kGeneralMaxExperts + 1; });
    add("num_experts", [](Bad* b) { b->args.num_experts = 0; });
    add("routing.top_k", [](Bad* b) { b->args.routing.top_k = 0; });
    add("routing.top_k", [](Bad* b) { b->args.routing.top_k = 65; });
    add("routing.top_k", [](Bad* b) { b->args.routing.top_k = 33; });  // > 2 groups x 8
    add("routing.top_k", [](Bad* b) {
      b->args.routing.method = RoutingMethod::kSparseMixer;
      b->args.routing.top_k = 3;
    });
    add("routing.n_group", [](Bad* b) { b->args.routing.n_group = 7; });
    add("routing.topk_group", [](Bad* b) { b->args.routing.topk_group = 9; });
    add("routing.num_shared", [](Bad* b) { b->args.routing.num_shared = 64; });
    add("routing.ties", [](Bad* b) { b->args.routing.ties = static_cast<TieBreak>(7); });
    add("routing.method", [](Bad* b) { b->args.routing.method = static_cast<RoutingMethod>(9); });
    add("tokens", [](Bad* b) { b->args.tokens = -1; });
    add("args.plan_first", [](Bad* b) { b->args.plan_first = -1; });
    add("args.plan_first", [](Bad* b) { b->args.plan_experts = b->args.num_experts + 1; });
    add("args.plan_first", [](Bad* b) {  // a range past E
      b->args.plan_first = 60;
      b->args.plan_experts = 8;
    });
    if (tokens > cuda::kFusedMaxTokens) {
      add("temp", [](Bad* b) { b->temp = nullptr; });
      add("temp", [](Bad* b) { b->temp_bytes -= 1; });
      add("temp", [](Bad* b) { b->temp = static_cast<char*>(b->temp) + 64; });
      add("path", [](Bad* b) { b->path = RoutingPath::kFused; });
    }
    for (const Bad& b : bad) {
      const Status st = cuda::launch_routing_path(b.args, b.path, b.temp, b.temp_bytes, nullptr);
      EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << b.name << ": " << st.to_string();
      EXPECT_NE(st.message().find(b.name), std::string::npos)
          << "expected '" << b.name << "' in: " << st.message();
    }
    CUDA_ASSERT(cudaDeviceSynchronize());
    for (const GpuBuffer* buf : {&d.maps_buf, &d.temp}) {
      std::vector<uint8_t> bytes;
      ASSERT_TRUE(buf->download(&bytes));
      const auto it = std::find_if(bytes.begin(), bytes.end(), [](uint8_t v) { return v != 0xFF; });
      ASSERT_TRUE(it == bytes.end()) << "byte " << (it - bytes.begin()) << " written";
    }
    std::vector<int32_t> err;
    ASSERT_TRUE(d.error.download(&err));
    EXPECT_EQ(err, (std::vector<int32_t>{0, kNoToken}));

    const Status st = cuda::launch_routing(d.args, d.temp.get(), d.temp_bytes, nullptr);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    CUDA_ASSERT(cudaDeviceSynchronize());
    Maps want, got;
    ASSERT_TRUE(host_route(p, &want));
    ASSERT_TRUE(d.download(&got));
    ASSERT_TRUE(same_maps(got, want)) << p.describe() << ", seed " << seed;
  }
}

// general_routing_temp_bytes: 0 where the fused path applies, the general path's size
// elsewhere, monotone in tokens, repeatable, and an error (with 0 bytes) for invalid sizes.
TEST(DeviceRouting, TempBytesContract) {
  QMOE_REQUIRE_GPU();
  size_t bytes = 1;
  for (int64_t e : {8, 512}) {
    for (int64_t t = 0; t <= cuda::kFusedMaxTokens; ++t) {
      ASSERT_TRUE(cuda::general_routing_temp_bytes(t, 16, e, &bytes).is_ok());
      EXPECT_EQ(bytes, 0u) << "T=" << t << " E=" << e;
    }
  }
  const struct {
    int slots;
    int64_t experts;
  } shapes[] = {{2, 8}, {8, 128}, {16, 512}, {17, 64}, {9, 257}, {4, 1024}, {16, 16384}};
  for (const auto& sh : shapes) {
    size_t prev = 0;
    std::vector<int64_t> ts;
    for (int64_t t = 0; t < 300; ++t) ts.push_back(t);
    for (int64_t t = 300; t < (int64_t{1} << 24); t = t * 9 / 8 + 1) ts.push_back(t);
    for (int64_t t : ts) {
      ASSERT_TRUE(cuda::general_routing_temp_bytes(t, sh.slots, sh.experts, &bytes).is_ok());
      const bool fused = cuda::fused_routing_applies(t, sh.slots, sh.experts);
      if (!fused) {
        size_t general = 0, again = 0;
        ASSERT_TRUE(cuda::general_path_temp_bytes(t, sh.slots, sh.experts, &general).is_ok());
        ASSERT_TRUE(cuda::general_routing_temp_bytes(t, sh.slots, sh.experts, &again).is_ok());
        // Enough for the general path, and for the blocked one where it runs; never more than
        // the two together at the blocked path's largest count.
        EXPECT_GE(bytes, general);
        const int64_t tb = std::min<int64_t>(t, cuda::kBlockedMaxTokens);
        const size_t blocked = cuda::blocked_routing_applies(tb, sh.slots, sh.experts)
                                   ? cuda::routing_detail::blocked_path_temp_bytes(tb, sh.experts)
                                   : 0;
        EXPECT_GE(bytes, blocked);
        EXPECT_LE(bytes, general + blocked);
        EXPECT_EQ(bytes, again);
        if (t > 0) EXPECT_GT(bytes, 0u);
        // At least the sorted keys and the route ids.
        EXPECT_GE(bytes, 2 * sizeof(int32_t) * static_cast<size_t>(t * sh.slots));
      }
      ASSERT_GE(bytes, prev) << "T=" << t << " slots=" << sh.slots << " E=" << sh.experts;
      prev = bytes;
    }
  }
  EXPECT_FALSE(cuda::general_routing_temp_bytes(-1, 2, 8, &bytes).is_ok());
  EXPECT_EQ(bytes, 0u);
  EXPECT_FALSE(cuda::general_routing_temp_bytes(9, 2, 0, &bytes).is_ok());
  EXPECT_FALSE(
      cuda::general_routing_temp_bytes(9, 2, cuda::kGeneralMaxExperts + 1, &bytes).is_ok());
  EXPECT_FALSE(cuda::general_routing_temp_bytes(int64_t{1} << 30, 4, 8, &bytes).is_ok());
  EXPECT_FALSE(cuda::general_routing_temp_bytes(9, 0, 8, &bytes).is_ok());
  EXPECT_FALSE(cuda::general_routing_temp_bytes(9, 2, 8, nullptr).is_ok());
}

// Both paths record into a CUDA graph (global capture mode: no synchronizing or unsafe call),
// and each replay, on re-poisoned outputs, gives the host's maps; E = 8192 needs the shared
// memory opt-in.
TEST(DeviceRouting, CapturesInACudaGraph) {
  QMOE_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  struct Shape {
    RoutingMethod method;
    int64_t experts, tokens;
  };
  const Shape shapes[] = {{RoutingMethod::kTopKSoftmax, 128, 5},
                          {RoutingMethod::kSoftmaxTopK, 256, 300},
                          {RoutingMethod::kTopKSigmoid, 8192, 20}};
  for (const Shape& sh : shapes) {
    const LayerSpec s = valid_spec(sh.method, sh.experts, 8, 1, TieBreak::kLowerIndex, true, rng);
    const Problem p = make_problem(s, sh.tokens, DType::kBF16, false, Values::kGaussian, rng());
    DeviceProblem d;
    ASSERT_TRUE(d.init(p, RoutingPath::kAuto));
    cudaStream_t stream;
    CUDA_ASSERT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CUDA_ASSERT(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    const Status st = cuda::launch_routing(d.args, d.temp.get(), d.temp_bytes, stream);
    cudaGraph_t graph = nullptr;
    const cudaError_t end = cudaStreamEndCapture(stream, &graph);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    CUDA_ASSERT(end);
    cudaGraphExec_t exec = nullptr;
    CUDA_ASSERT(cudaGraphInstantiate(&exec, graph, 0));
    Maps want;
    ASSERT_TRUE(host_route(p, &want));
    for (int replay = 0; replay < 2; ++replay) {
      CUDA_ASSERT(cudaMemsetAsync(d.maps_buf.get(), 0xFF, d.maps_buf.bytes(), stream));
      CUDA_ASSERT(cudaGraphLaunch(exec, stream));
      CUDA_ASSERT(cudaStreamSynchronize(stream));
      Maps got;
      ASSERT_TRUE(d.download(&got));
      ASSERT_TRUE(same_maps(got, want))
          << p.describe() << ", replay " << replay << ", seed " << seed;
    }
    CUDA_ASSERT(cudaGraphExecDestroy(exec));
    CUDA_ASSERT(cudaGraphDestroy(graph));
    CUDA_ASSERT(cudaStreamDestroy(stream));
  }
}

}  // namespace
}  // namespace qmoe
