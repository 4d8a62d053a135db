// What the blocked routing writes for the generic path besides the maps and the plan
// (DeviceRoutingArgs::plan_setups and gather): the grouped GEMMs' group arrays, bitwise those the
// standalone setup kernel (launch_group_setup) writes from the plan, and the gathered input,
// bitwise launch_gather's, with the same error word. Everything starts poisoned, so a slot or row
// nobody writes fails.

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>
#include <tuple>

#include "cuda/layer/stages.h"
#include "gpu_routing_util.h"

namespace qmoe {
namespace {

using namespace gpu_routing_test;
using cuda::GroupSchedule;
using cuda::GroupSetup;

constexpr uint8_t kPoison = 0x7F;

// Device arrays of one setup (group_setup.h) for max_groups slots, poisoned, with `words` 32-bit
// words per stride array.
struct SetupArrays {
  GpuBuffer shapes, ptrs[5], consts[GroupSetup::kConsts];
  size_t bytes_of(int g, int words) const { return static_cast<size_t>(g) * words * 4; }

  ::testing::AssertionResult init(const GroupSetup& like, GroupSetup* out) {
    *out = like;
    const int g = like.max_groups;
    auto poisoned = [](GpuBuffer* b, size_t n) { return b->allocate(n, kPoison); };
    auto r = poisoned(&shapes, bytes_of(g, 3));
    for (int i = 0; r && i < 5; ++i) r = poisoned(&ptrs[i], static_cast<size_t>(g) * 8);
    for (int i = 0; r && i < GroupSetup::kConsts; ++i) {
      r = poisoned(&consts[i], bytes_of(g, like.consts[i].words));
    }
    if (!r) return r;
    out->shapes = shapes.as<int32_t>();
    out->ptr_a = static_cast<const void**>(ptrs[0].get());
    out->ptr_b = static_cast<const void**>(ptrs[1].get());
    out->ptr_d = static_cast<void**>(ptrs[2].get());
    out->ptr_s = static_cast<const void**>(ptrs[3].get());
    out->ptr_z = static_cast<const void**>(ptrs[4].get());
    for (int i = 0; i < GroupSetup::kConsts; ++i) out->consts[i].at = consts[i].as<uint32_t>();
    return ::testing::AssertionSuccess();
  }

  ::testing::AssertionResult same_as(const SetupArrays& o, const GroupSetup& s) const {
    const int g = s.max_groups;
    auto cmp = [](const char* what, const GpuBuffer& a, const GpuBuffer& b, size_t n) {
      std::vector<uint8_t> x, y;
      auto r = copy_back(static_cast<const uint8_t*>(a.get()), static_cast<int64_t>(n), &x);
      if (r) r = copy_back(static_cast<const uint8_t*>(b.get()), static_cast<int64_t>(n), &y);
      if (r) r = same_bits(what, x, y);
      return r;
    };
    auto r = cmp("shapes", shapes, o.shapes, bytes_of(g, 3));
    const char* names[] = {"ptr_a", "ptr_b", "ptr_d", "ptr_s", "ptr_z"};
    for (int i = 0; r && i < 5; ++i)
      r = cmp(names[i], ptrs[i], o.ptrs[i], static_cast<size_t>(g) * 8);
    for (int i = 0; r && i < GroupSetup::kConsts; ++i) {
      r = cmp("stride", consts[i], o.consts[i], bytes_of(g, s.consts[i].words));
    }
    return r;
  }
};

// A setup with arbitrary (never dereferenced) bases and strides, words per stride as CUTLASS's
// (shuffled A: 3, B and D: 2, scales: 4).
GroupSetup some_setup(int max_groups, bool zeros, std::mt19937_64& rng) {
  GroupSetup s;
  s.max_groups = max_groups;
  s.n = 1536;
  s.k = 2048;
  auto base = [&rng]() { return reinterpret_cast<char*>((rng() & 0xFFFFFFFF00ull) | 0x100ull); };
  s.a = base();
  s.a_expert = 1536 * 1024;
  s.b = base();
  s.b_row = 4096;
  s.d = base();
  s.d_row = 1536;
  s.s = base();
  s.s_expert = 16 * 1536 * 2;
  s.z = zeros ? base() : nullptr;
  s.z_expert = 16 * 1536 * 4;
  const int words[GroupSetup::kConsts] = {3, 2, 2, 4};
  for (int i = 0; i < GroupSetup::kConsts; ++i) {
    s.consts[i].words = words[i];
    for (int w = 0; w < 4; ++w) s.consts[i].value[w] = static_cast<uint32_t>(rng());
  }
  return s;
}

// bf16 rows of H values; a few tokens carry a NaN or an infinity.
std::vector<uint16_t> some_input(int64_t tokens, int64_t hidden, std::mt19937_64& rng) {
  std::vector<uint16_t> x(static_cast<size_t>(tokens * hidden));
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (uint16_t& v : x) v = static_cast<uint16_t>(num::f32_bits(d(rng)) >> 16);
  for (int64_t t = 5; t < tokens; t += 37) {
    x[static_cast<size_t>(t * hidden + (t * 7) % hidden)] = (t % 2) ? 0x7FC0 : 0xFF80;
  }
  return x;
}

// Token counts on and off the 8-token parts and 32-token blocks of the route kernel, the full
// plan and a shard's, one setup or two (with and without zeros, and slots past the touched
// experts where max_groups is below E), H a multiple of 8 but not of 16 and ld past it; a row
// narrow enough to be one column share and one wide enough for several (the last one short),
// ld past H cutting a share.
TEST(DeviceRouting, BlockedPathWritesTheGroupArraysAndGathers) {
  QMOE_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  for (const auto& [experts, hidden, ld] : {std::tuple<int64_t, int64_t, int64_t>{8, 136, 160},
                                            {128, 136, 160},
                                            {512, 136, 160},
                                            {128, 2056, 2568}}) {
    for (int64_t t : {65, 77, 300, 2001}) {
      const LayerSpec s =
          valid_spec(RoutingMethod::kSoftmaxTopK, experts, 8, 0, TieBreak::kLowerIndex, true, rng);
      const Problem p = make_problem(s, t, DType::kF32, false, Values::kGaussian, rng());
      ASSERT_TRUE(cuda::routing_writes_setups(t, p.slots(), p.experts()));
      for (const auto& [first, count] :
           {std::pair<int64_t, int64_t>{0, experts}, {experts / 4, experts / 2}}) {
        SCOPED_TRACE(p.describe() + ", H " + std::to_string(hidden) + ", ld " + std::to_string(ld) +
                     ", seed " + std::to_string(seed) + ", plan [" + std::to_string(first) + ", +" +
                     std::to_string(count) + ")");
        DeviceProblem d;
        ASSERT_TRUE(d.init(p, RoutingPath::kBlocked));
        GpuBuffer dt, dn, ds, x, xg, xw, err, err_want;
        ASSERT_TRUE(dt.allocate(static_cast<size_t>(count) * 4));
        ASSERT_TRUE(dn.allocate(4));
        ASSERT_TRUE(ds.allocate(static_cast<size_t>(count + 1) * 4));
        d.args.plan_touched = dt.as<int32_t>();
        d.args.plan_n_touched = dn.as<int32_t>();
        d.args.plan_tile_start = ds.as<int32_t>();
        d.args.plan_first = static_cast<int>(first);
        d.args.plan_experts = static_cast<int>(count);
        // Two setups: every slot, and fewer slots than experts (a call's min(L, routes)).
        SetupArrays got[2], want[2];
        const int groups[2] = {static_cast<int>(count), std::max(1, static_cast<int>(count) / 3)};
        for (int i = 0; i < 2; ++i) {
          const GroupSetup like = some_setup(groups[i], i == 1, rng);
          ASSERT_TRUE(got[i].init(like, &d.args.plan_setups[i]));
        }
        d.args.plan_setup_count = 2;
        const int64_t routes = t * p.slots();
        ASSERT_TRUE(x.upload(some_input(t, hidden, rng)));
        ASSERT_TRUE(xg.allocate(static_cast<size_t>(routes * ld) * 2, kPoison));
        ASSERT_TRUE(xw.allocate(static_cast<size_t>(routes * ld) * 2, kPoison));
        ASSERT_TRUE(err.upload(std::vector<int32_t>{0, kNoToken}));
        ASSERT_TRUE(err_want.upload(std::vector<int32_t>{0, kNoToken}));
        d.args.gather.input = x.get();
        d.args.gather.bf16 = true;
        d.args.gather.hidden = hidden;
        d.args.gather.out = xg.get();
        d.args.gather.ld = ld;
        d.args.gather.error = err.as<int32_t>();
        d.args.gather.error_bit = cuda::kErrorInput;
        ASSERT_TRUE(cuda::launch_routing_path(d.args, RoutingPath::kBlocked, d.temp.get(),
                                              d.temp_bytes, nullptr)
                        .is_ok());
        // The standalone writers from the plan and maps the routing left.
        GroupSchedule sched;
        sched.touched = dt.as<int32_t>();
        sched.n_touched = dn.as<int32_t>();
        sched.offsets = d.args.maps.expert_offsets + first;
        for (int i = 0; i < 2; ++i) {
          GroupSetup w;
          ASSERT_TRUE(want[i].init(d.args.plan_setups[i], &w));
          ASSERT_TRUE(cuda::launch_group_setup(w, sched, nullptr, false).is_ok());
        }
        ASSERT_TRUE(cuda::launch_gather(x.get(), DType::kBF16, hidden, d.args.maps.permuted_route,
                                        p.slots(), routes, xw.get(), ld, err_want.as<int32_t>(),
                                        nullptr)
                        .is_ok());
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        for (int i = 0; i < 2; ++i) EXPECT_TRUE(got[i].same_as(want[i], d.args.plan_setups[i]));
        std::vector<uint16_t> gx, wx;
        ASSERT_TRUE(copy_back(xg.as<uint16_t>(), routes * ld, &gx));
        ASSERT_TRUE(copy_back(xw.as<uint16_t>(), routes * ld, &wx));
        EXPECT_TRUE(same_bits("gathered rows", gx, wx));
        std::vector<int32_t> ge, we;
        ASSERT_TRUE(copy_back(err.as<int32_t>(), 2, &ge));
        ASSERT_TRUE(copy_back(err_want.as<int32_t>(), 2, &we));
        EXPECT_TRUE(same_bits("error word", ge, we));
        EXPECT_EQ(ge[0], cuda::kErrorInput);  // the inputs hold non-finite values
        // The maps stay the host's.
        Maps got_maps, want_maps;
        ASSERT_TRUE(d.download(&got_maps));
        ASSERT_TRUE(host_route(p, &want_maps));
        EXPECT_TRUE(same_maps(got_maps, want_maps));
      }
    }
  }
}

// Setups or a gather the arguments cannot hold are refused before any launch.
TEST(DeviceRouting, BlockedPathRefusesBadSetupsAndGathers) {
  QMOE_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed());
  const LayerSpec s =
      valid_spec(RoutingMethod::kSoftmaxTopK, 128, 8, 0, TieBreak::kLowerIndex, true, rng);
  const Problem p = make_problem(s, 100, DType::kF32, false, Values::kGaussian, rng());
  GpuBuffer dt, dn, ds;
  ASSERT_TRUE(dt.allocate(128 * 4));
  ASSERT_TRUE(dn.allocate(4));
  ASSERT_TRUE(ds.allocate(129 * 4));
  auto run = [&](const std::function<void(DeviceRoutingArgs*)>& change) {
    DeviceProblem d;
    EXPECT_TRUE(d.init(p, RoutingPath::kBlocked));
    d.args.plan_touched = dt.as<int32_t>();
    d.args.plan_n_touched = dn.as<int32_t>();
    d.args.plan_tile_start = ds.as<int32_t>();
    change(&d.args);
    return cuda::launch_routing_path(d.args, RoutingPath::kBlocked, d.temp.get(), d.temp_bytes,
                                     nullptr);
  };
  GpuBuffer shapes;
  ASSERT_TRUE(shapes.allocate(4096));
  Status st = run([&](DeviceRoutingArgs* a) {
    a->plan_setup_count = 1;
    a->plan_setups[0].shapes = shapes.as<int32_t>();
    a->plan_setups[0].max_groups = 129;  // more slots than the plan's experts
  });
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("args.plan_setups[0]"), std::string::npos) << st.message();
  st = run([&](DeviceRoutingArgs* a) { a->plan_setup_count = 3; });
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("args.plan_setup_count"), std::string::npos) << st.message();
  GpuBuffer x;
  ASSERT_TRUE(x.allocate(1 << 16));
  st = run([&](DeviceRoutingArgs* a) {
    a->gather.input = x.get();
    a->gather.out = x.get();
    a->gather.error = dn.as<int32_t>();
    a->gather.hidden = 12;  // not a multiple of 8
    a->gather.ld = 16;
  });
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("args.gather"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace qmoe
