// The FP8 grouped GEMM (cuda/gemm/cutlass_fp8.h) on its own, against an fp64 host GEMM of the
// same e4m3 codes and f32 scales, far tighter than the layer tests' FP8 budget: both tiles (64
// and 128 rows), both weight-scale forms (128 x 128 blocks, one per row and 128 columns), K of 1
// to 5 scale blocks (the mainloop's K loop with odd and even counts), n not a multiple of 128
// (a partial weight tile, an odd count of them in a cluster of two), ragged groups (0, 1, 63,
// 64, 65, 127..129, 300 rows), untouched experts and group slots past n_touched. C starts
// poisoned: every row of a touched expert must be written in columns < n and left alone in
// columns n..ldc; the activations' padding past k holds NaN codes, which would show if read; a
// graph replay equals the eager call bit for bit.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/numeric.h"
#include "cuda/gemm/cutlass_fp8.h"
#include "gpu_test_util.h"
#include "test_util.h"

namespace qmoe::test {
namespace {

using cuda::kFp8ScaleBlock;

struct Fp8Case {
  std::string name;
  int64_t n = 0, k = 0;
  bool row_scales = false;
  int tile = 128;
  std::vector<int> counts;  // rows by expert id
};

constexpr uint8_t kNanCode = 0x7F;    // e4m3fn NaN: padding that must never be read
constexpr uint16_t kPoison = 0xFFFF;  // bf16 NaN: C before the call

// A random finite e4m3 code near N(0, sd) (never NaN).
uint8_t random_code(std::mt19937_64& rng, float sd) {
  std::normal_distribution<float> nd(0.0f, sd);
  const uint8_t c = num::f32_to_e4m3(nd(rng));
  return (c & 0x7F) == 0x7F ? static_cast<uint8_t>(c ^ 1) : c;
}

// A positive scale 2^e (1 + u), e in [-6, 2]: the scales differ by block, so a promotion with
// another block's scale shows.
float random_scale(std::mt19937_64& rng) {
  std::uniform_int_distribution<int> ed(-6, 2);
  std::uniform_real_distribution<float> ud(0.0f, 1.0f);
  return std::ldexp(1.0f + ud(rng), ed(rng));
}

// Runs one case: returns C's bits after an eager call and after a graph replay of the same call.
void run_case(const Fp8Case& c, uint64_t seed) {
  SCOPED_TRACE(c.name + ", seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int E = static_cast<int>(c.counts.size());
  const int64_t n = c.n, k = c.k, kb = k / kFp8ScaleBlock;
  const int64_t lda = k + 16, ldc = n + 8;
  std::vector<int32_t> offsets(E + 1, 0), touched(E, -1);
  int n_touched = 0;
  for (int e = 0; e < E; ++e) {
    offsets[e + 1] = offsets[e] + c.counts[e];
    if (c.counts[e] > 0) touched[n_touched++] = e;
  }
  const int64_t rows = offsets[E];
  const int max_groups = n_touched + 2;  // slots past n_touched get no rows

  // Weights [E, n, k], activations [rows, lda] (NaN past k), their scales.
  std::vector<uint8_t> w(static_cast<size_t>(E * n * k)), a(static_cast<size_t>(rows * lda));
  for (auto& v : w) v = random_code(rng, 24.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < lda; ++j) {
      a[static_cast<size_t>(r * lda + j)] = j < k ? random_code(rng, 60.0f) : kNanCode;
    }
  }
  const int64_t sa_rows = c.row_scales ? n : (n + kFp8ScaleBlock - 1) / kFp8ScaleBlock;
  std::vector<float> sa(static_cast<size_t>(E * sa_rows * kb)), sb(static_cast<size_t>(rows * kb));
  for (auto& v : sa) v = random_scale(rng);
  for (auto& v : sb) v = random_scale(rng);

  GpuBuffer dw, da, dsa, dsb, dc, dtouched, dn, doff, dws;
  ASSERT_TRUE(dw.upload(w));
  ASSERT_TRUE(da.upload(a));
  ASSERT_TRUE(dsa.upload(sa));
  ASSERT_TRUE(dsb.upload(sb));
  ASSERT_TRUE(dtouched.upload(touched));
  ASSERT_TRUE(dn.upload(std::vector<int32_t>{n_touched}));
  ASSERT_TRUE(doff.upload(offsets));
  const size_t c_bytes = static_cast<size_t>(std::max<int64_t>(rows, 1) * ldc) * 2;
  ASSERT_TRUE(dc.allocate(c_bytes));
  int sms = 0;
  CUDA_ASSERT(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const size_t ws_bytes = cuda::fp8_gemm_workspace_bytes(max_groups, sms);
  ASSERT_GT(ws_bytes, 0u);
  ASSERT_TRUE(dws.allocate(ws_bytes));

  cuda::Fp8GemmArgs g;
  g.a = da.as<uint8_t>();
  g.a_scales = dsb.as<float>();
  g.lda = lda;
  g.c = dc.as<uint16_t>();
  g.ldc = ldc;
  g.n = n;
  g.k = k;
  g.codes = dw.as<uint8_t>();
  g.w_scales = dsa.as<float>();
  g.row_scales = c.row_scales;
  g.sched.touched = dtouched.as<int32_t>();
  g.sched.n_touched = dn.as<int32_t>();
  g.sched.offsets = doff.as<int32_t>();
  g.max_groups = max_groups;
  g.tile_n = c.tile;

  // Eager, on a poisoned C and workspace.
  cudaStream_t stream = nullptr;
  CUDA_ASSERT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  Status st = cuda::launch_fp8_grouped_gemm(g, sms, dws.get(), ws_bytes, stream);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  CUDA_ASSERT(cudaStreamSynchronize(stream));
  std::vector<uint16_t> eager;
  ASSERT_TRUE(dc.download(&eager));

  // The same call captured in a graph, replayed on C and the workspace poisoned again.
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CUDA_ASSERT(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  st = cuda::launch_fp8_grouped_gemm(g, sms, dws.get(), ws_bytes, stream);
  CUDA_ASSERT(cudaStreamEndCapture(stream, &graph));
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  CUDA_ASSERT(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_ASSERT(cudaMemset(dc.get(), 0xFF, c_bytes));
  CUDA_ASSERT(cudaMemset(dws.get(), 0xFF, ws_bytes));
  CUDA_ASSERT(legacy_stream_done());
  CUDA_ASSERT(cudaGraphLaunch(exec, stream));
  CUDA_ASSERT(cudaStreamSynchronize(stream));
  std::vector<uint16_t> replay;
  ASSERT_TRUE(dc.download(&replay));
  CUDA_ASSERT(cudaGraphExecDestroy(exec));
  CUDA_ASSERT(cudaGraphDestroy(graph));
  CUDA_ASSERT(cudaStreamDestroy(stream));
  EXPECT_EQ(replay, eager) << "the graph replay differs from the eager call";

  // The fp64 reference. Per element the bound is bf16's rounding of the result (2^-8 |ref|) plus
  // 2^-9 of the sum of |terms| for the tensor cores' accumulation within each 128-column block
  // (about 14 significant bits on Hopper's FP8 wgmma, four k32 steps) and the fp32 promotions.
  // With random signs the sum of |terms| is about sqrt(K) |ref|, so the bound stays a few percent
  // of |ref|: a block promoted with another block's scales, or dropped, is off by tens of percent.
  std::vector<float> wf(w.size()), af(a.size());
  for (size_t i = 0; i < w.size(); ++i) wf[i] = num::e4m3_to_f32(w[i]);
  for (size_t i = 0; i < a.size(); ++i) af[i] = num::e4m3_to_f32(a[i]);
  int64_t bad = 0, unwritten = 0, touched_pad = 0, checked = 0;
  double worst = 0;
  for (int e = 0; e < E; ++e) {
    for (int64_t r = offsets[e]; r < offsets[e + 1]; ++r) {
      for (int64_t m = 0; m < ldc; ++m) {
        const uint16_t bits = eager[static_cast<size_t>(r * ldc + m)];
        if (m >= n) {
          touched_pad += bits != kPoison;
          continue;
        }
        const double got = num::bf16_to_f32(bits);
        if (!std::isfinite(got)) {
          ++unwritten;
          continue;
        }
        double ref = 0, mag = 0;
        const float* wr = &wf[static_cast<size_t>((e * n + m) * k)];
        const float* ar = &af[static_cast<size_t>(r * lda)];
        for (int64_t b = 0; b < kb; ++b) {
          const int64_t srow = c.row_scales ? m : m / kFp8ScaleBlock;
          const double s =
              static_cast<double>(sa[static_cast<size_t>((e * sa_rows + srow) * kb + b)]) *
              sb[static_cast<size_t>(r * kb + b)];
          double dot = 0, adot = 0;
          for (int64_t j = b * kFp8ScaleBlock; j < (b + 1) * kFp8ScaleBlock; ++j) {
            dot += static_cast<double>(wr[j]) * ar[j];
            adot += std::fabs(static_cast<double>(wr[j]) * ar[j]);
          }
          ref += s * dot;
          mag += s * adot;
        }
        const double err = std::fabs(got - ref);
        const double tol = std::ldexp(std::fabs(ref), -8) + std::ldexp(mag, -9);
        ++checked;
        if (err > tol) ++bad;
        worst = std::max(worst, err / tol);
      }
    }
  }
  EXPECT_GT(checked, 0) << "the case has no rows: it tests nothing";
  EXPECT_EQ(unwritten, 0) << "NaN (unwritten poison) in rows of touched experts";
  EXPECT_EQ(touched_pad, 0) << "writes in columns n..ldc";
  EXPECT_EQ(bad, 0) << "elements off the fp64 reference (worst " << worst << " of the bound)";
}

TEST(GpuFp8Gemm, BothTilesBothScaleFormsAndEveryKLoopShapeMatchTheHost) {
  QMOE_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  const std::vector<int> ragged = {0, 1, 129, 64, 300, 0, 63, 128, 65, 127};
  std::vector<Fp8Case> cases = {
      {"blocks, 128 rows, K 5 blocks, n 200", 200, 640, false, 128, ragged},
      {"blocks, 64 rows, K 4 blocks, n 200", 200, 512, false, 64, ragged},
      {"blocks, 128 rows, K 3 blocks, n 72 (one weight tile)", 72, 384, false, 128, {65, 0, 2}},
      {"blocks, 64 rows, K 1 block, n 256", 256, 128, false, 64, {3, 140, 0, 17}},
      {"rows, 128 rows, K 2 blocks, n 136", 136, 256, true, 128, ragged},
      {"rows, 64 rows, K 5 blocks, n 128", 128, 640, true, 64, ragged},
      {"rows, 128 rows, K 4 blocks, n 8", 8, 512, true, 128, {1, 0, 70}},
      {"rows, 64 rows, K 3 blocks, every row on one expert", 264, 384, true, 64, {0, 0, 333}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    run_case(cases[i], seed + i);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace qmoe::test
