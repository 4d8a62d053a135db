// The generic path's chain of kernels: where the blocked routing runs and FC1 and FC2 take the
// mixed-input GEMM, the routing's kernels write both GEMMs' group arrays and gather the input
// (CudaLayer::run, DeviceRoutingArgs::plan_setups and gather). An input that is not 16-byte
// aligned takes the other chain (the gather kernel and the GEMMs' setup kernels) on the same
// layer, so the two chains meet on the same inputs: the outputs must be bitwise equal (the same
// arrays, the same gathered rows, the same GEMMs), and the oracle's budget holds.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "gpu_layer_harness.h"

namespace qmoe::test {
namespace {

// bf16 INT4 (the narrow tile's activation epilogue, the taller tiles' activation kernel), INT8
// and INT4 with zero points (f32 scales and zeros in the group arrays), a shard of local experts
// (the plan's local slots), at 65, 100 and 333 tokens with the tile the layer picks, and each
// tile forced at 100.
TEST(GpuGenericChain, RoutingWrittenSetupsKeepTheBits) {
  QMOE_REQUIRE_GPU();
  struct Case {
    WeightFormat f;
    bool zero_points;
    int64_t first, held;  // held 0: all E
  };
  const Case cases[] = {{WeightFormat::kInt4, false, 0, 0},
                        {WeightFormat::kInt8, false, 0, 0},
                        {WeightFormat::kInt4, true, 0, 0},
                        {WeightFormat::kInt4, false, 4, 8}};
  for (const Case& c : cases) {
    LayerSpec s = small_spec(c.f, 256, 128, 16, 4);
    s.act_dtype = DType::kBF16;
    for (FcFormat* f : {&s.fc1, &s.fc2}) {
      f->block_size = 64;
      f->scale_dtype = DType::kF32;
      f->zero_points = c.zero_points;
    }
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE(s.fc1.to_string() + (c.held > 0 ? ", local experts" : "") + ", seed " +
                 std::to_string(seed));
    TestLayer whole;
    make_layer(s, seed, &whole);
    const TestLayer tl = c.held > 0 ? make_shard(whole, c.first, c.held) : whole;
    auto check = [&](int64_t tokens, int tile) {
      SCOPED_TRACE(std::to_string(tokens) + " tokens, tile " + std::to_string(tile));
      PrepareOptions o = with_gemm("cutlass", with_dispatch("generic"));
      o.mixed_tile = tile;
      std::unique_ptr<PreparedLayer> layer;
      ASSERT_TRUE(prepare_layer(BackendKind::kCuda, tl.spec, tl.weights, o, &layer).is_ok());
      TestInputs ti;
      make_inputs(tl.spec, tokens, seed + static_cast<uint64_t>(tokens), false, &ti);
      // The oracle's budget where the output is the whole layer's (a shard's is partial).
      const bool oracle = c.held == 0 && tile == 0;
      GpuRun planned, kernels;
      gpu_run(tl, ti, &planned, o, 0x7F, oracle, layer.get(), 0);
      gpu_run(tl, ti, &kernels, o, 0x7F, false, layer.get(), 2);
      EXPECT_TRUE(planned.out == kernels.out) << "the two chains' outputs differ";
      if (oracle) EXPECT_LE(planned.error, gpu_budget(tl.spec.act_dtype));
    };
    for (int64_t tokens : {65, 100, 333}) check(tokens, 0);
    for (int tile : {32, 64, 128}) check(100, tile);
  }
}

}  // namespace
}  // namespace qmoe::test
