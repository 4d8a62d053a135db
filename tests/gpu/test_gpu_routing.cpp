// Device routing against the host's route(): every map array (ids, weights, counts, offsets,
// permuted order, positions) must be bitwise equal, on both paths, for every method and option,
// on Gaussian and on tie-heavy logits (a handful of levels, +0 and -0 among them), and the plan
// the routing's kernels build. The contract (the non-finite rule, argument errors that launch
// nothing, the temp-size contract, capture in a CUDA graph): test_gpu_routing_contract.cpp; the
// helpers both use: gpu_routing_util.h.

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "gpu_routing_util.h"

namespace qmoe {
namespace {

using namespace gpu_routing_test;

// ---------------------------------------------------------------------------------------------
// Tests

// Every method x ties x normalize x router_weights x shared experts (both weight rules);
// experts, tokens, dtypes and value kinds cycle through their lists along the product, k is
// random in 1..16.
TEST(DeviceRouting, EveryMethodAndOptionMatchesHost) {
  QMOE_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const int64_t experts[] = {8, 64, 128, 256, 512};
  const int64_t tokens[] = {1, 2, 7, 8, 9, 64, 65};
  int i = 0;
  for (RoutingMethod method : kMethods) {
    for (TieBreak ties : {TieBreak::kLowerIndex, TieBreak::kHigherIndex}) {
      for (bool normalize : {false, true}) {
        for (bool with_rw : {false, true}) {
          for (int shared : {0, 1, 2}) {
            const int k = std::uniform_int_distribution<int>(1, 16)(rng);
            LayerSpec s = valid_spec(method, experts[i % 5], k, shared, ties, normalize, rng);
            if (shared > 0 && (i / 2) % 2 == 1) s.routing.shared_weight = SharedWeight::kOne;
            const Values v = (i / 3) % 2 ? Values::kTieHeavy : Values::kGaussian;
            const Problem p = make_problem(s, tokens[i % 7], kDtypes[i % 3], with_rw, v, rng());
            ASSERT_TRUE(matches_host(p)) << "seed " << seed;
            ++i;
          }
        }
      }
    }
  }
}

// f16 and bf16 logits are decoded exactly; every method on each dtype, both value kinds.
TEST(DeviceRouting, LogitDtypesMatchHost) {
  QMOE_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  for (DType dtype : kDtypes) {
    for (RoutingMethod method : kMethods) {
      for (Values v : {Values::kGaussian, Values::kTieHeavy}) {
        const LayerSpec s = valid_spec(method, 128, 6, 1, TieBreak::kLowerIndex, true, rng);
        const Problem p = make_problem(s, 33, dtype, v == Values::kTieHeavy, v, rng());
        ASSERT_TRUE(matches_host(p)) << "seed " << seed;
      }
    }
  }
}

// Token counts on both sides of the fused limit and large ones (the big counts on two
// configurations only).
TEST(DeviceRouting, TokenCountsMatchHost) {
  QMOE_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  for (int64_t t : {0, 1, 2, 7, 8, 9, 64, 65, 1000, 4096}) {
    const Problem a = make_problem(routing_spec(RoutingMethod::kTopKSoftmax, 128, 8), t,
                                   DType::kBF16, false, Values::kGaussian, rng());
    ASSERT_TRUE(matches_host(a)) << "seed " << seed;
    const LayerSpec s =
        routing_spec(RoutingMethod::kSoftmaxTopK, 64, 6, 1, TieBreak::kHigherIndex, true);
    const Problem b = make_problem(s, t, DType::kF16, true, Values::kTieHeavy, rng());
    ASSERT_TRUE(matches_host(b)) << "seed " << seed;
  }
}

// k = 1..16 over expert counts up to 1024 (and 640: above the fused limit, not a power of two),
// then the widest routers: 2048 (3 warps a block) and 16384 (one warp, 128 KiB of shared memory).
TEST(DeviceRouting, ExpertCountsAndTopKMatchHost) {
  QMOE_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const int64_t experts[] = {8, 64, 128, 256, 512, 1024, 640};
  const int64_t tokens[] = {3, 8, 9, 33};
  const RoutingMethod methods[] = {RoutingMethod::kSoftmaxTopK, RoutingMethod::kTopKSoftmax,
                                   RoutingMethod::kGroupedTopK, RoutingMethod::kTopKSigmoid};
  for (int k = 1; k <= 16; ++k) {
    const int64_t e = k > 8 && experts[k % 7] == 8 ? 64 : experts[k % 7];
    const TieBreak ties = k % 2 ? TieBreak::kHigherIndex : TieBreak::kLowerIndex;
    const LayerSpec s = valid_spec(methods[k % 4], e, k, k % 3, ties, k % 5 < 3, rng);
    const Values v = k % 3 == 1 ? Values::kTieHeavy : Values::kGaussian;
    const Problem p = make_problem(s, tokens[k % 4], kDtypes[k % 3], k % 4 == 2, v, rng());
    ASSERT_TRUE(matches_host(p)) << "seed " << seed;
  }
  for (int64_t e : {1024, 2048, 16384}) {
    for (RoutingMethod method : kMethods) {
      const LayerSpec s = valid_spec(method, e, 16, 1, TieBreak::kLowerIndex, true, rng);
      const Problem p = make_problem(s, 9, DType::kBF16, false, Values::kGaussian, rng());
      ASSERT_TRUE(matches_host(p)) << "seed " << seed;
    }
  }
}

// Expert counts that leave lanes with unequal shares (E not a multiple of 32, E < 32) and the
// largest fused one, every method, on both paths; value kinds include picks all from one lane
// (each lane keeps two candidates and rescans for more) and a sparse mixer that keeps most
// experts in its sums.
TEST(DeviceRouting, ExpertCountsOffTheWarpMatchHost) {
  QMOE_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const int64_t experts[] = {1, 5, 33, 60, 257, 300, 512, 1000};
  const Values values[] = {Values::kGaussian, Values::kTieHeavy, Values::kOneLane};
  int i = 0;
  for (int64_t e : experts) {
    for (RoutingMethod method : kMethods) {
      if (method == RoutingMethod::kSparseMixer && e < 2) continue;
      for (int64_t tokens : {1, 9, 70}) {
        const int shared = e > 2 ? i % 2 : 0;
        const int k = std::uniform_int_distribution<int>(1, 16)(rng);
        const TieBreak ties = i % 2 ? TieBreak::kHigherIndex : TieBreak::kLowerIndex;
        LayerSpec s = valid_spec(method, e, k, shared, ties, (i / 2) % 2 == 0, rng);
        s.routing.sparse_mixer_eps = i % 3 == 0 ? 0.5f : 0.01f;
        const Problem p =
            make_problem(s, tokens, kDtypes[i % 3], i % 5 == 4, values[(i / 3) % 3], rng());
        ASSERT_TRUE(matches_host(p)) << "seed " << seed;
        ++i;
      }
    }
  }
}

// DeepSeek-V3's shape (256 routed experts, 8 groups, 4 kept, k = 8, scaling 2.5, normalized),
// with and without a shared expert (weight 1, as DeepSeek-V3 adds it), then smaller groupings,
// groups of one included.
TEST(DeviceRouting, GroupedTopKLikeDeepSeekMatchesHost) {
  QMOE_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  struct Shape {
    int64_t experts;
    int shared, n_group, topk_group, k;
  };
  const Shape shapes[] = {{256, 0, 8, 4, 8}, {257, 1, 8, 4, 8}, {64, 0, 4, 2, 4},
                          {16, 0, 16, 4, 3}, {32, 2, 1, 1, 5},  {96, 0, 3, 2, 16}};
  for (const Shape& sh : shapes) {
    for (int64_t t : {1, 8, 9, 1000}) {
      for (Values v : {Values::kGaussian, Values::kTieHeavy}) {
        const TieBreak ties =
            v == Values::kTieHeavy ? TieBreak::kHigherIndex : TieBreak::kLowerIndex;
        LayerSpec s =
            routing_spec(RoutingMethod::kGroupedTopK, sh.experts, sh.k, sh.shared, ties, true);
        s.routing.n_group = sh.n_group;
        s.routing.topk_group = sh.topk_group;
        if (sh.experts == 257) s.routing.shared_weight = SharedWeight::kOne;
        const Problem p = make_problem(s, t, DType::kF32, false, v, rng());
        ASSERT_TRUE(matches_host(p)) << "seed " << seed;
      }
    }
  }
}

// Where both paths apply (T <= kFusedMaxTokens), the general path gives the fused path's maps
// (and the host's); T = 0 gives zero counts and offsets on both.
TEST(DeviceRouting, GeneralPathEqualsFusedPathForFewTokens) {
  QMOE_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const int64_t experts[] = {8, 64, 512};
  for (int64_t t = 0; t <= cuda::kFusedMaxTokens; t += (t < 10 ? 1 : 9)) {
    for (int m = 0; m < 5; ++m) {
      const int shared = static_cast<int>((t + m) % 3);
      const int k = std::uniform_int_distribution<int>(1, cuda::kFusedMaxSlots - shared)(rng);
      const TieBreak ties = m % 2 ? TieBreak::kHigherIndex : TieBreak::kLowerIndex;
      const LayerSpec s =
          valid_spec(kMethods[m], experts[(t + m) % 3], k, shared, ties, (t + m) % 2 == 0, rng);
      const Values v = t % 2 ? Values::kTieHeavy : Values::kGaussian;
      const Problem p = make_problem(s, t, kDtypes[m % 3], m % 2 == 1, v, rng());
      ASSERT_TRUE(cuda::fused_routing_applies(t, p.slots(), p.experts()));
      Maps fused, general;
      ASSERT_TRUE(device_route(p, RoutingPath::kFused, &fused)) << p.describe();
      ASSERT_TRUE(device_route(p, RoutingPath::kGeneral, &general)) << p.describe();
      ASSERT_TRUE(same_maps(general, fused)) << p.describe() << ", seed " << seed;
      ASSERT_TRUE(matches_host(p, RoutingPath::kFused)) << "seed " << seed;
    }
  }
}

// The blocked path (kFusedMaxTokens < T <= kBlockedMaxTokens) against the host and the general
// path, bitwise: token counts on and off its 32-token blocks up to its limit, every method, E up
// to its limit, up to 16 slots, tie-heavy values (exact ties resolved by index, which the
// blocks' masks must keep in route-id order). It refuses what it does not take.
TEST(DeviceRouting, BlockedPathEqualsGeneralPathAndHost) {
  QMOE_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const int64_t experts[] = {8, 128, 512};
  int i = 0;
  for (int64_t t : std::vector<int64_t>{65, 96, 333, 1000, 4099, cuda::kBlockedMaxTokens}) {
    for (int m = 0; m < 5; ++m, ++i) {
      const int shared = i % 3;
      const int k = std::uniform_int_distribution<int>(1, cuda::kFusedMaxSlots - shared)(rng);
      const TieBreak ties = i % 2 ? TieBreak::kHigherIndex : TieBreak::kLowerIndex;
      const LayerSpec s = valid_spec(kMethods[m], experts[i % 3], k, shared, ties, i % 2 == 0, rng);
      const Values v = i % 2 ? Values::kTieHeavy : Values::kGaussian;
      const Problem p = make_problem(s, t, kDtypes[i % 3], i % 4 == 1, v, rng());
      ASSERT_TRUE(cuda::blocked_routing_applies(t, p.slots(), p.experts()));
      Maps blocked, general;
      ASSERT_TRUE(device_route(p, RoutingPath::kBlocked, &blocked)) << p.describe();
      ASSERT_TRUE(device_route(p, RoutingPath::kGeneral, &general)) << p.describe();
      ASSERT_TRUE(same_maps(blocked, general)) << p.describe() << ", seed " << seed;
      ASSERT_TRUE(matches_host(p, RoutingPath::kBlocked)) << "seed " << seed;
    }
  }
  EXPECT_FALSE(cuda::blocked_routing_applies(cuda::kBlockedMaxTokens + 1, 8, 128));
  EXPECT_FALSE(cuda::blocked_routing_applies(100, 8, cuda::kFusedMaxExperts + 1));
  EXPECT_FALSE(cuda::blocked_routing_applies(100, cuda::kFusedMaxSlots + 1, 128));
  const LayerSpec s =
      valid_spec(RoutingMethod::kSoftmaxTopK, 1000, 4, 0, TieBreak::kLowerIndex, true, rng);
  const Problem p = make_problem(s, 100, DType::kF32, false, Values::kGaussian, rng());
  DeviceProblem d;
  ASSERT_TRUE(d.init(p, RoutingPath::kBlocked));
  const Status st =
      cuda::launch_routing_path(d.args, RoutingPath::kBlocked, d.temp.get(), d.temp_bytes, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("the blocked path needs"), std::string::npos) << st.message();
}

// The plan (touched experts ascending, then -1 to entry E - 1; their number; the exclusive
// prefix of their tiles of 128 routes) as the fused kernel (up to 64 tokens) and the blocked
// path's offsets kernel (from 65) build it, and as launch_plan builds it after the general path,
// bitwise against the host's from the host's counts. The outputs start
// poisoned, so an entry neither writes fails. Also for a layer's local experts [first, first + L):
// the plan of those alone, by local index (plan_first / plan_experts; launch_plan from counts +
// first). The FC1 -> FC2 counters (plan_ready), poisoned, come back zero for every planned expert
// and untouched past them.
TEST(DeviceRouting, PlanMatchesHostOnEveryPath) {
  QMOE_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  constexpr int kTileM = 128;
  for (int64_t experts : {8, 128, 512}) {
    for (int64_t t : {1, 3, 7, 64, 65, 300, 2000}) {
      const LayerSpec s =
          valid_spec(RoutingMethod::kSoftmaxTopK, experts, 8, 0, TieBreak::kLowerIndex, true, rng);
      const Problem p = make_problem(s, t, DType::kF32, false, Values::kGaussian, rng());
      Maps want;
      ASSERT_TRUE(host_route(p, &want));
      for (const auto& [first, count] : {std::pair<int64_t, int64_t>{0, experts},
                                         {experts / 4, experts / 2},
                                         {experts - 3, 3}}) {
        std::vector<int32_t> touched(static_cast<size_t>(count), -1), tile_start;
        int32_t n_touched = 0, tiles = 0;
        for (int64_t e = 0; e < count; ++e) {
          const int32_t c = want.counts[static_cast<size_t>(first + e)];
          if (c == 0) continue;
          touched[static_cast<size_t>(n_touched++)] = static_cast<int32_t>(e);
          tile_start.push_back(tiles);
          tiles += (c + kTileM - 1) / kTileM;
        }
        tile_start.push_back(tiles);
        const RoutingPath own =
            t <= cuda::kFusedMaxTokens ? RoutingPath::kFused : RoutingPath::kBlocked;
        ASSERT_TRUE(cuda::routing_builds_plan(t, p.slots(), p.experts()));
        for (RoutingPath path : {own, RoutingPath::kGeneral}) {
          SCOPED_TRACE(p.describe() +
                       (path == RoutingPath::kFused     ? ", fused"
                        : path == RoutingPath::kBlocked ? ", blocked"
                                                        : ", general") +
                       ", seed " + std::to_string(seed) + ", plan [" + std::to_string(first) +
                       ", +" + std::to_string(count) + ")");
          DeviceProblem d;
          ASSERT_TRUE(d.init(p, path));
          GpuBuffer dt, dn, ds, dr;
          ASSERT_TRUE(dt.upload(std::vector<int32_t>(static_cast<size_t>(count), 0x7F7F7F7F)));
          ASSERT_TRUE(dr.upload(std::vector<int32_t>(static_cast<size_t>(count) + 1, 0x7F7F7F7F)));
          ASSERT_TRUE(dn.upload(std::vector<int32_t>{0x7F7F7F7F}));
          ASSERT_TRUE(ds.upload(std::vector<int32_t>(static_cast<size_t>(count) + 1, 0x7F7F7F7F)));
          if (path != RoutingPath::kGeneral) {  // the routing's kernels build the plan
            d.args.plan_touched = dt.as<int32_t>();
            d.args.plan_n_touched = dn.as<int32_t>();
            d.args.plan_tile_start = ds.as<int32_t>();
            d.args.plan_tile_m = kTileM;
            d.args.plan_ready = dr.as<int32_t>();
            d.args.plan_first = static_cast<int>(first);
            d.args.plan_experts = static_cast<int>(count);
          }
          ASSERT_TRUE(
              cuda::launch_routing_path(d.args, path, d.temp.get(), d.temp_bytes, nullptr).is_ok());
          if (path == RoutingPath::kGeneral) {
            ASSERT_TRUE(cuda::launch_plan(d.args.maps.expert_counts + first, count,
                                          dt.as<int32_t>(), dn.as<int32_t>(), ds.as<int32_t>(),
                                          dr.as<int32_t>(), nullptr)
                            .is_ok());
          }
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          std::vector<int32_t> got_touched, got_n, got_start;
          ASSERT_TRUE(copy_back(dt.as<int32_t>(), count, &got_touched));
          ASSERT_TRUE(copy_back(dn.as<int32_t>(), 1, &got_n));
          ASSERT_TRUE(copy_back(ds.as<int32_t>(), n_touched + 1, &got_start));
          EXPECT_EQ(got_n[0], n_touched);
          EXPECT_TRUE(same_bits("touched", got_touched, touched));
          EXPECT_TRUE(same_bits("tile_start", got_start, tile_start));
          std::vector<int32_t> got_ready, want_ready(static_cast<size_t>(count), 0);
          want_ready.push_back(0x7F7F7F7F);
          ASSERT_TRUE(copy_back(dr.as<int32_t>(), count + 1, &got_ready));
          EXPECT_TRUE(same_bits("ready", got_ready, want_ready));
        }
      }
    }
  }
}

}  // namespace
}  // namespace qmoe
