// The grouped GEMMs (src/cuda/gemm/grouped_gemm.h, and CUTLASS's, cutlass_grouped.h) against an
// fp64 host GEMM of the same rounded inputs, on random schedules: ragged expert counts (0, 1, 15,
// 127, 128, 129, 300, large ones, one expert holding every row), waves that start past group 0 and
// stop before the last, ragged N, small and large K, every dtype. The CUTLASS cases also run once
// eagerly and once through a CUDA graph and compare the bits, on a poisoned workspace.
// Everything the kernel must not touch is poisoned and checked afterwards: C rows of groups outside
// the launched waves, C columns n..ldc, A and B padding along K (NaN, so reading it shows up).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/numeric.h"
#include "cuda/gemm/cutlass_grouped.h"
#include "cuda/gemm/grouped_gemm.h"
#include "gpu_test_util.h"
#include "test_util.h"

namespace qmoe::test {
namespace {

using cuda::GroupedGemmArgs;
using cuda::kGemmTileM;

constexpr uint32_t kPoisonBits = 0xFFFFFFFFu;  // GpuBuffer's 0xFF fill, a NaN
// Past the kernels' grid (at most 65535 rows of up to 8 M tiles): blocks must loop over tiles.
constexpr int64_t kBeyondGrid = 65535 * 8 + 5000;

// The schedule arrays exactly as the routing stage lays them out; unused tail entries are filled
// with garbage that would send a kernel reading them out of bounds.
struct Schedule {
  int num_experts = 0;
  std::vector<int> counts;       // by expert id
  std::vector<int32_t> touched;  // [E], first n_touched valid, ascending
  int n_touched = 0;
  std::vector<int32_t> offsets;     // [E + 1]
  std::vector<int32_t> tile_start;  // [E + 1] by touched index, first n_touched + 1 valid
  int64_t rows = 0;
};

Schedule make_schedule(const std::vector<int>& counts, bool touch_empty) {
  Schedule s;
  s.num_experts = static_cast<int>(counts.size());
  s.counts = counts;
  s.offsets.assign(s.num_experts + 1, 0);
  for (int e = 0; e < s.num_experts; ++e) s.offsets[e + 1] = s.offsets[e] + counts[e];
  s.rows = s.offsets[s.num_experts];
  s.touched.assign(s.num_experts, 0x7FFF0000);
  s.tile_start.assign(s.num_experts + 1, -0x7FFF0000);
  s.tile_start[0] = 0;
  for (int e = 0; e < s.num_experts; ++e) {
    if (counts[e] == 0 && !touch_empty) continue;
    const int i = s.n_touched++;
    s.touched[i] = e;
    s.tile_start[i + 1] = s.tile_start[i] + (counts[e] + kGemmTileM - 1) / kGemmTileM;
  }
  return s;
}

struct Wave {
  int first_group = 0;
  int max_groups = 1;
  int64_t extra_tiles = 0;  // grid rows beyond the wave's exact tile count
};

struct Case {
  DType dtype = DType::kBF16;
  int64_t n = 0, k = 0;
  int64_t lda_pad = 0, ldb_pad = 0, ldc_pad = 0;  // leading dimension minus k (k, n for C)
  int64_t b_gap = 0;                              // extra elements between the groups' B
  std::vector<int> counts;                        // by expert id (shuffled before use)
  bool touch_empty = false;                       // touched also lists experts with no rows
  std::vector<Wave> waves;
  bool graph = false;  // launch through a captured CUDA graph
  // CUTLASS's kernel on a poisoned workspace; it runs eagerly and through a graph, which must
  // agree bit for bit (`graph` is then ignored).
  bool cutlass = false;
};

float round_to(DType t, float v) {
  if (t == DType::kBF16) return num::bf16_to_f32(num::f32_to_bf16(v));
  if (t == DType::kF16) return num::f16_to_f32(num::f32_to_f16(v));
  return v;
}

// Host values (already rounded to the dtype; NaN marks padding) -> device bytes of the dtype.
std::vector<uint8_t> encode(DType t, const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * dtype_size(t));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == DType::kF32) {
      std::memcpy(out.data() + 4 * i, &v[i], 4);
    } else {
      const uint16_t h = t == DType::kBF16 ? num::f32_to_bf16(v[i]) : num::f32_to_f16(v[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

int wave_end(const Schedule& s, const Wave& w) {
  return static_cast<int>(std::min<int64_t>(int64_t{w.first_group} + w.max_groups, s.n_touched));
}

// Error bounds. Both paths form each product exactly (bf16/f16 products fit fp32; fmaf rounds
// once per term) and round once per accumulation step in fp32 (u = 2^-24). For a sum of K terms the
// classic bound is |err| <= gamma_K * sum|a_k b_k|, gamma_K ~ K u; tensor cores may truncate
// instead of rounding to nearest inside an mma (u -> 2u), hence the per-element bound 2 K 2^-23
// sum|a_k b_k| (a factor 2 margin over that). For the norm: with random signs the step errors
// u |s_j| (|s_j| ~ sqrt(j)) add as a random walk to ~ u K / sqrt(6) against a result of ~ sqrt(K),
// a relative error ~ 0.4 sqrt(K) u. The bound 4 sqrt(K) 2^-23 = 8 sqrt(K) u (K = 2080: 2.2e-5;
// K = 32: 2.7e-6) leaves a margin of 20 over that estimate and of ~10 over what an H200 gave
// (K = 2080: 2.1e-6 bf16, 2.5e-6 f16, 4e-7 f32 at K = 544), while any indexing or pipelining error
// (a wrong row, column or K step) gives O(1e-2) or more.
double norm_bound(int64_t k) {
  return 4.0 * std::sqrt(static_cast<double>(k)) * std::ldexp(1.0, -23);
}
double element_bound(int64_t k, double abs_sum) {
  return 2.0 * static_cast<double>(k) * std::ldexp(1.0, -23) * abs_sum + 1e-30;
}

void run_case(const Case& c) {
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  std::vector<int> counts = c.counts;
  std::shuffle(counts.begin(), counts.end(), rng);
  const Schedule s = make_schedule(counts, c.touch_empty);
  const int64_t n = c.n, k = c.k;
  const int64_t lda = k + c.lda_pad, ldb = k + c.ldb_pad, ldc = n + c.ldc_pad;
  const int64_t b_stride = n * ldb + c.b_gap;
  const float kNaN = std::nanf("");

  // Which touched groups some wave launches; rows of the others stay poison.
  std::vector<char> launched(s.n_touched, 0);
  for (const Wave& w : c.waves) {
    for (int g = w.first_group; g < wave_end(s, w); ++g) launched[g] = 1;
  }
  std::vector<int> group_of_row(s.rows, -1);
  for (int g = 0; g < s.n_touched; ++g) {
    const int e = s.touched[g];
    for (int p = s.offsets[e]; p < s.offsets[e + 1]; ++p) group_of_row[p] = g;
  }

  // A: N(0, 1) rounded to the dtype; K padding and the rows of unlaunched groups are NaN, so a
  // kernel that reads them writes NaN into a checked row.
  std::vector<float> a = gaussian(static_cast<size_t>(s.rows * lda), rng());
  for (int64_t p = 0; p < s.rows; ++p) {
    const bool live = group_of_row[p] >= 0 && launched[group_of_row[p]];
    for (int64_t kk = 0; kk < lda; ++kk) {
      float& v = a[p * lda + kk];
      v = (live && kk < k) ? round_to(c.dtype, v) : kNaN;
    }
  }
  // Weights of every expert [n, k], rounded.
  std::vector<std::vector<float>> w(s.num_experts);
  for (int e = 0; e < s.num_experts; ++e) {
    w[e] = gaussian(static_cast<size_t>(n * k), rng());
    for (float& v : w[e]) v = round_to(c.dtype, v);
  }

  GpuBuffer d_a, d_c, d_touched, d_n_touched, d_offsets, d_tile_start;
  ASSERT_TRUE(d_a.upload(encode(c.dtype, a)));
  ASSERT_TRUE(d_touched.upload(s.touched));
  ASSERT_TRUE(d_n_touched.upload(std::vector<int32_t>{s.n_touched}));
  ASSERT_TRUE(d_offsets.upload(s.offsets));
  ASSERT_TRUE(d_tile_start.upload(s.tile_start));
  const size_t c_bytes = static_cast<size_t>(s.rows * ldc) * sizeof(float);
  ASSERT_TRUE(d_c.allocate(c_bytes, 0xFF, /*canary=*/256));

  // One dequantized scratch per wave: its groups' B at b_stride, K padding and gaps NaN.
  std::vector<std::unique_ptr<GpuBuffer>> scratch;
  std::vector<GroupedGemmArgs> launches;
  for (const Wave& wv : c.waves) {
    const int end = wave_end(s, wv);
    const int groups = std::max(end - wv.first_group, 1);
    std::vector<float> b(static_cast<size_t>(groups * b_stride), kNaN);
    for (int g = wv.first_group; g < end; ++g) {
      const std::vector<float>& we = w[s.touched[g]];
      float* dst = b.data() + (g - wv.first_group) * b_stride;
      for (int64_t r = 0; r < n; ++r) std::copy_n(&we[r * k], k, dst + r * ldb);
    }
    scratch.push_back(std::make_unique<GpuBuffer>());
    ASSERT_TRUE(scratch.back()->upload(encode(c.dtype, b)));

    GroupedGemmArgs args;
    args.dtype = c.dtype;
    args.a = d_a.get();
    args.lda = lda;
    args.b = scratch.back()->get();
    args.ldb = ldb;
    args.b_stride = b_stride;
    args.c = d_c.as<float>();
    args.ldc = ldc;
    args.n = n;
    args.k = k;
    args.sched.touched = d_touched.as<int32_t>();
    args.sched.n_touched = d_n_touched.as<int32_t>();
    args.sched.offsets = d_offsets.as<int32_t>();
    args.sched.tile_start = d_tile_start.as<int32_t>();
    args.first_group = wv.first_group;
    args.max_groups = wv.max_groups;
    const int64_t tiles =
        end > wv.first_group ? s.tile_start[end] - s.tile_start[wv.first_group] : 0;
    args.max_tiles = tiles + wv.extra_tiles;
    launches.push_back(args);
  }

  // CUTLASS's workspace: one per wave (a graph holds all waves' arguments), starting as NaN bytes.
  int sm_count = 0;
  CUDA_ASSERT(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0));
  std::vector<std::unique_ptr<GpuBuffer>> workspaces;
  for (const GroupedGemmArgs& args : launches) {
    workspaces.push_back(std::make_unique<GpuBuffer>());
    if (!c.cutlass) continue;
    const size_t bytes = cuda::cutlass_gemm_workspace_bytes(c.dtype, args.max_groups, sm_count);
    ASSERT_GT(bytes, 0u);
    ASSERT_TRUE(workspaces.back()->allocate(bytes, 0xFF, /*canary=*/256));
  }
  auto launch_all = [&](cudaStream_t stream) {
    for (size_t i = 0; i < launches.size(); ++i) {
      const Status st =
          c.cutlass ? cuda::launch_cutlass_grouped_gemm(launches[i], sm_count, workspaces[i]->get(),
                                                        workspaces[i]->bytes(), stream)
                    : cuda::launch_grouped_gemm(launches[i], stream);
      EXPECT_TRUE(st.is_ok()) << st.to_string();
    }
  };
  auto run_graph = [&](cudaStream_t stream) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_ASSERT(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    launch_all(stream);
    CUDA_ASSERT(cudaStreamEndCapture(stream, &graph));
    CUDA_ASSERT(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_ASSERT(cudaGraphLaunch(exec, stream));
    CUDA_ASSERT(cudaStreamSynchronize(stream));
    CUDA_ASSERT(cudaGraphExecDestroy(exec));
    CUDA_ASSERT(cudaGraphDestroy(graph));
  };

  cudaStream_t stream;
  CUDA_ASSERT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<uint32_t> eager_bits;
  if (c.cutlass) {
    launch_all(stream);
    CUDA_ASSERT(cudaStreamSynchronize(stream));
    ASSERT_TRUE(d_c.download(&eager_bits));
    CUDA_ASSERT(cudaMemset(d_c.get(), 0xFF, c_bytes));
    for (auto& w : workspaces) {
      EXPECT_TRUE(w->canary_intact());
      CUDA_ASSERT(cudaMemset(w->get(), 0xFF, w->bytes()));
    }
    CUDA_ASSERT(legacy_stream_done());
    run_graph(stream);
  } else if (c.graph) {
    run_graph(stream);
  } else {
    launch_all(stream);
    CUDA_ASSERT(cudaStreamSynchronize(stream));
  }
  CUDA_ASSERT(cudaGetLastError());
  CUDA_ASSERT(cudaStreamDestroy(stream));

  std::vector<uint32_t> c_bits;
  ASSERT_TRUE(d_c.download(&c_bits));
  EXPECT_TRUE(d_c.canary_intact());
  if (c.cutlass) {
    EXPECT_TRUE(c_bits == eager_bits) << "graph replay differs from the eager run";
    for (auto& w : workspaces) EXPECT_TRUE(w->canary_intact());
  }

  double err2 = 0, ref2 = 0, worst_ratio = 0;
  int64_t checked = 0, poison_broken = 0, nan_written = 0, element_fail = 0;
  std::vector<double> ref(n), abs_sum(n);
  for (int64_t p = 0; p < s.rows; ++p) {
    const uint32_t* row = c_bits.data() + p * ldc;
    const int g = group_of_row[p];
    if (g < 0 || !launched[g]) {
      for (int64_t j = 0; j < ldc; ++j) poison_broken += row[j] != kPoisonBits;
      continue;
    }
    for (int64_t j = n; j < ldc; ++j) poison_broken += row[j] != kPoisonBits;
    const float* ap = &a[p * lda];
    const std::vector<float>& we = w[s.touched[g]];
    for (int64_t j = 0; j < n; ++j) {
      const float* bp = &we[j * k];
      double sum = 0, asum = 0;
      for (int64_t kk = 0; kk < k; ++kk) {
        const double t = static_cast<double>(ap[kk]) * bp[kk];
        sum += t;
        asum += std::fabs(t);
      }
      float got;
      std::memcpy(&got, &row[j], 4);
      if (std::isnan(got)) {
        ++nan_written;
        continue;
      }
      const double d = got - sum;
      err2 += d * d;
      ref2 += sum * sum;
      const double ratio = std::fabs(d) / element_bound(k, asum);
      worst_ratio = std::max(worst_ratio, ratio);
      element_fail += ratio > 1.0;
      ++checked;
    }
  }
  const double rel = ref2 > 0 ? std::sqrt(err2 / ref2) : 0.0;
  std::printf(
      "[gemm%s] %s n=%lld k=%lld rows=%lld checked=%lld rel=%.3g (bound %.3g) "
      "worst element err/bound=%.3g\n",
      c.cutlass ? " cutlass" : "", dtype_name(c.dtype), static_cast<long long>(n),
      static_cast<long long>(k), static_cast<long long>(s.rows), static_cast<long long>(checked),
      rel, norm_bound(k), worst_ratio);
  EXPECT_GT(checked, 0) << "the case launches no rows: it tests nothing";
  EXPECT_EQ(nan_written, 0) << "NaN (or unwritten poison) in rows the launch covers";
  EXPECT_EQ(poison_broken, 0) << "writes outside the launched groups or past column n";
  EXPECT_EQ(element_fail, 0) << "elements past 2 K 2^-23 sum|a b| (worst ratio " << worst_ratio
                             << ")";
  EXPECT_LE(rel, norm_bound(k));
}

// Counts covering the tile edges, zero rows, and a few large groups.
std::vector<int> edge_counts() { return {0, 1, 15, 127, 128, 129, 300, 0, 2, 640, 1000, 33, 256}; }

TEST(GpuGemm, Bf16SeveralWavesRaggedN) {
  QMOE_REQUIRE_GPU();
  Case c;
  c.dtype = DType::kBF16;
  c.n = 200;
  c.k = 2048 + 32;
  c.ldc_pad = 8;
  c.b_gap = 64;
  c.counts = edge_counts();  // 11 touched
  // Groups 0 and 4..5 stay unlaunched; the last wave is cut short by n_touched.
  c.waves = {{1, 3, 0}, {6, 3, 2}, {9, 100, 5}};
  run_case(c);
}

TEST(GpuGemm, Bf16EmptyTouchedGroupsAndPaddedK) {
  QMOE_REQUIRE_GPU();
  Case c;
  c.dtype = DType::kBF16;
  c.n = 8;
  c.k = 32;
  c.lda_pad = 32;
  c.ldb_pad = 64;
  c.ldc_pad = 1;  // odd ldc: the scalar store path
  c.counts = {0, 1, 0, 0, 129, 15, 0, 300, 128, 0, 127, 2};
  c.touch_empty = true;  // zero-tile groups inside the binary search
  c.waves = {{2, 4, 0}, {6, 5, 3}};
  run_case(c);
}

TEST(GpuGemm, F16FullTilesThroughGraph) {
  QMOE_REQUIRE_GPU();
  Case c;
  c.dtype = DType::kF16;
  c.n = 256;
  c.k = 64;
  c.lda_pad = 32;
  c.ldc_pad = 3;
  c.counts = edge_counts();
  c.graph = true;
  c.waves = {{1, 4, 0}, {5, 4, 1}, {9, 4, 0}};  // group 0 unlaunched
  run_case(c);
}

TEST(GpuGemm, F16RaggedN72LargeK) {
  QMOE_REQUIRE_GPU();
  Case c;
  c.dtype = DType::kF16;
  c.n = 72;
  c.k = 2048 + 32;
  c.ldb_pad = 32;
  c.counts = {1, 15, 128, 129, 1500, 0, 300};
  // One wave over everything from group 1, its bound on tiles past what one grid covers.
  c.waves = {{1, 1 << 30, kBeyondGrid}};
  run_case(c);
}

TEST(GpuGemm, F32RaggedN) {
  QMOE_REQUIRE_GPU();
  Case c;
  c.dtype = DType::kF32;
  c.n = 200;
  c.k = 544;
  c.lda_pad = 32;
  c.ldc_pad = 4;
  c.counts = edge_counts();
  c.waves = {{1, 2, 0}, {3, 3, 4}, {8, 100, 0}};  // groups 0 and 6..7 unlaunched
  run_case(c);
}

TEST(GpuGemm, F32SmallNK) {
  QMOE_REQUIRE_GPU();
  Case c;
  c.dtype = DType::kF32;
  c.n = 8;
  c.k = 32;
  c.ldc_pad = 5;
  c.counts = {129, 0, 1, 127, 0, 128, 15};
  c.touch_empty = true;
  // Group 2 unlaunched; the last wave's bound on tiles is past what one grid covers.
  c.waves = {{0, 2, 1}, {3, 2, 0}, {5, 7, kBeyondGrid}};
  run_case(c);
}

TEST(GpuGemm, Bf16LargeK64AndWideN) {
  QMOE_REQUIRE_GPU();
  Case c;
  c.dtype = DType::kBF16;
  c.n = 640;
  c.k = 64;
  c.counts = {2000, 0, 129, 700, 1};
  c.waves = {{0, 2, 0}, {2, 1, 0}};  // touched group 3 unlaunched
  run_case(c);
}

// Every invalid field gives a non-ok Status naming it; max_tiles == 0 launches nothing.
// Small poisoned buffers and arguments every GEMM accepts, for the argument checks.
struct ArgBuffers {
  GpuBuffer a, b, c, sched;
  ::testing::AssertionResult allocate() {
    for (GpuBuffer* buf : {&a, &b, &c}) {
      auto r = buf->allocate(4096);
      if (!r) return r;
    }
    return sched.allocate(256);
  }
  GroupedGemmArgs valid() const {
    const int32_t* s = sched.as<int32_t>();
    GroupedGemmArgs g;
    g.dtype = DType::kBF16;
    g.a = a.get();
    g.lda = 64;
    g.b = b.get();
    g.ldb = 32;
    g.b_stride = 8 * 32;
    g.c = c.as<float>();
    g.ldc = 8;
    g.n = 8;
    g.k = 32;
    g.sched = {s, s, s, s};
    g.first_group = 0;
    g.max_groups = 2;
    return g;
  }
};

TEST(GpuGemm, ArgumentErrors) {
  QMOE_REQUIRE_GPU();
  ArgBuffers bufs;
  ASSERT_TRUE(bufs.allocate());
  GpuBuffer& d_a = bufs.a;
  GpuBuffer& d_c = bufs.c;
  GroupedGemmArgs good = bufs.valid();
  good.max_tiles = 0;  // valid and launches nothing: the poisoned schedule is never read
  {
    const Status st = cuda::launch_grouped_gemm(good, nullptr);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    CUDA_ASSERT(cudaDeviceSynchronize());
    std::vector<uint32_t> c_bits;
    ASSERT_TRUE(d_c.download(&c_bits));
    for (uint32_t v : c_bits) ASSERT_EQ(v, kPoisonBits) << "max_tiles == 0 wrote C";
  }

  const char* misaligned = static_cast<const char*>(d_a.get()) + 8;
  struct Bad {
    const char* field;
    void (*mutate)(GroupedGemmArgs*, const void*);
  };
  const Bad bads[] = {
      {"a", [](GroupedGemmArgs* g, const void*) { g->a = nullptr; }},
      {"a", [](GroupedGemmArgs* g, const void* m) { g->a = m; }},
      {"b", [](GroupedGemmArgs* g, const void*) { g->b = nullptr; }},
      {"b", [](GroupedGemmArgs* g, const void* m) { g->b = m; }},
      {"c", [](GroupedGemmArgs* g, const void*) { g->c = nullptr; }},
      {"c", [](GroupedGemmArgs* g,
               const void* m) { g->c = const_cast<float*>(static_cast<const float*>(m)); }},
      {"sched.touched", [](GroupedGemmArgs* g, const void*) { g->sched.touched = nullptr; }},
      {"sched.n_touched", [](GroupedGemmArgs* g, const void*) { g->sched.n_touched = nullptr; }},
      {"sched.offsets", [](GroupedGemmArgs* g, const void*) { g->sched.offsets = nullptr; }},
      {"sched.tile_start", [](GroupedGemmArgs* g, const void*) { g->sched.tile_start = nullptr; }},
      {"k", [](GroupedGemmArgs* g, const void*) { g->k = 48; }},
      {"k", [](GroupedGemmArgs* g, const void*) { g->k = 0; }},
      {"k", [](GroupedGemmArgs* g, const void*) { g->k = -32; }},
      {"n", [](GroupedGemmArgs* g, const void*) { g->n = 0; }},
      {"n", [](GroupedGemmArgs* g, const void*) { g->n = -8; }},
      {"lda", [](GroupedGemmArgs* g, const void*) { g->lda = 16; }},
      {"lda", [](GroupedGemmArgs* g, const void*) { g->lda = 40; }},
      {"ldb", [](GroupedGemmArgs* g, const void*) { g->ldb = 0; }},
      {"ldb", [](GroupedGemmArgs* g, const void*) { g->ldb = 48; }},
      {"ldc", [](GroupedGemmArgs* g, const void*) { g->ldc = 7; }},
      {"max_groups", [](GroupedGemmArgs* g, const void*) { g->max_groups = 0; }},
      {"max_groups", [](GroupedGemmArgs* g, const void*) { g->max_groups = -1; }},
      {"max_tiles", [](GroupedGemmArgs* g, const void*) { g->max_tiles = -1; }},
      {"first_group", [](GroupedGemmArgs* g, const void*) { g->first_group = -1; }},
      {"b_stride", [](GroupedGemmArgs* g, const void*) { g->b_stride = 8 * 32 - 8; }},
      {"b_stride", [](GroupedGemmArgs* g, const void*) { g->b_stride = 8 * 32 + 4; }},
      {"dtype", [](GroupedGemmArgs* g, const void*) { g->dtype = DType::kF64; }},
      {"dtype", [](GroupedGemmArgs* g, const void*) { g->dtype = DType::kI8; }},
  };
  for (const Bad& b : bads) {
    GroupedGemmArgs args = good;
    args.max_tiles = 1;  // would launch if the check let it through
    b.mutate(&args, misaligned);
    const Status st = cuda::launch_grouped_gemm(args, nullptr);
    EXPECT_FALSE(st.is_ok()) << "field " << b.field;
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.message().find(std::string("args.") + b.field + ":"), std::string::npos)
        << "message does not name " << b.field << ": " << st.message();
  }
  CUDA_ASSERT(cudaDeviceSynchronize());
  CUDA_ASSERT(cudaGetLastError());
  std::vector<uint32_t> c_bits;
  ASSERT_TRUE(d_c.download(&c_bits));
  for (uint32_t v : c_bits) ASSERT_EQ(v, kPoisonBits) << "a rejected call wrote C";
}

// CUTLASS's kernel (cutlass_grouped.h). Its schedule comes from the same arrays; tile_start and
// max_tiles are not read. Each case runs eagerly and through a graph (bitwise equal).

TEST(GpuCutlassGemm, Bf16RaggedWavesCutShort) {
  QMOE_REQUIRE_GPU();
  Case c;
  c.cutlass = true;
  c.dtype = DType::kBF16;
  c.n = 200;
  c.k = 2048 + 32;
  c.ldc_pad = 8;
  c.b_gap = 64;
  c.counts = edge_counts();  // 11 touched
  // Groups 0 and 4..5 stay unlaunched; the last wave's slots past n_touched have no rows.
  c.waves = {{1, 3, 0}, {6, 3, 0}, {9, 40, 0}};
  run_case(c);
}

TEST(GpuCutlassGemm, F16MinimumMultiplesEmptyTouchedGroups) {
  QMOE_REQUIRE_GPU();
  Case c;
  c.cutlass = true;
  c.dtype = DType::kF16;
  c.n = 4;  // D's 16-byte vectors
  c.k = 8;  // TMA's 16-byte rows
  c.lda_pad = 8;
  c.ldb_pad = 16;
  c.ldc_pad = 4;
  c.counts = {0, 1, 0, 0, 129, 15, 0, 300, 128, 0, 127, 2};
  c.touch_empty = true;  // groups without rows inside a wave
  c.waves = {{2, 4, 0}, {6, 5, 0}};
  run_case(c);
}

TEST(GpuCutlassGemm, Bf16OneExpertHoldsEveryRow) {
  QMOE_REQUIRE_GPU();
  Case c;
  c.cutlass = true;
  c.dtype = DType::kBF16;
  c.n = 384;
  c.k = 512 + 8;  // K not a multiple of the 64-wide K tile
  c.counts = {0, 0, 0, 3001, 0, 0};
  c.waves = {{0, 6, 0}};  // one touched group, five empty slots
  run_case(c);
}

TEST(GpuCutlassGemm, F16FewRowsWideN) {
  QMOE_REQUIRE_GPU();
  Case c;
  c.cutlass = true;
  c.dtype = DType::kF16;
  c.n = 1536;  // qwen3-30b-a3b's FC1 rows: 12 M tiles
  c.k = 2048;
  c.ldc_pad = 32;
  c.counts = {8, 0, 3, 17, 1, 0, 5, 2, 9, 1};  // decode-sized groups: one ragged N tile each
  c.waves = {{0, 8, 0}};
  run_case(c);
}

TEST(GpuCutlassGemm, Bf16LargeGroupsThroughOneWave) {
  QMOE_REQUIRE_GPU();
  Case c;
  c.cutlass = true;
  c.dtype = DType::kBF16;
  c.n = 640;
  c.k = 256;
  c.lda_pad = 32;
  c.counts = {2000, 0, 129, 700, 1, 256, 255, 257};
  c.waves = {{0, 8, 0}};
  run_case(c);
}

// Which arguments the CUTLASS kernel takes; a refused or under-sized call launches nothing.
TEST(GpuCutlassGemm, CanImplementAndArgumentErrors) {
  QMOE_REQUIRE_GPU();
  ArgBuffers bufs;
  ASSERT_TRUE(bufs.allocate());
  GpuBuffer d_ws;
  GroupedGemmArgs good = bufs.valid();
  good.lda = good.ldb = good.k = 8;  // CUTLASS's minimum multiples
  good.n = good.ldc = 4;
  good.b_stride = 4 * 8;
  std::string why;
  EXPECT_TRUE(cuda::cutlass_gemm_can_implement(good, &why)) << why;
  const char* misaligned = static_cast<const char*>(bufs.a.get()) + 8;
  struct Bad {
    const char* what;
    void (*mutate)(GroupedGemmArgs*, const void*);
  };
  const Bad bads[] = {
      {"dtype", [](GroupedGemmArgs* g, const void*) { g->dtype = DType::kF32; }},
      {"k", [](GroupedGemmArgs* g, const void*) { g->k = 12; }},
      {"lda", [](GroupedGemmArgs* g, const void*) { g->lda = 12; }},
      {"ldb", [](GroupedGemmArgs* g, const void*) { g->ldb = 12; }},
      {"b_stride", [](GroupedGemmArgs* g, const void*) { g->b_stride = 36; }},
      {"n", [](GroupedGemmArgs* g, const void*) { g->n = 6; }},
      {"ldc", [](GroupedGemmArgs* g, const void*) { g->ldc = 6; }},
      {"aligned", [](GroupedGemmArgs* g, const void* m) { g->a = m; }},
      {"aligned", [](GroupedGemmArgs* g, const void* m) { g->b = m; }},
  };
  int sm_count = 0;
  CUDA_ASSERT(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0));
  const size_t need = cuda::cutlass_gemm_workspace_bytes(DType::kBF16, 2, sm_count);
  ASSERT_GT(need, 0u);
  EXPECT_EQ(cuda::cutlass_gemm_workspace_bytes(DType::kF32, 2, sm_count), 0u);
  EXPECT_LE(need, cuda::cutlass_gemm_workspace_bytes(DType::kBF16, 3, sm_count));
  ASSERT_TRUE(d_ws.allocate(need));
  for (const Bad& b : bads) {
    GroupedGemmArgs args = good;
    b.mutate(&args, misaligned);
    EXPECT_FALSE(cuda::cutlass_gemm_can_implement(args, &why)) << b.what;
    EXPECT_NE(why.find(b.what), std::string::npos) << b.what << ": " << why;
    const Status st =
        cuda::launch_cutlass_grouped_gemm(args, sm_count, d_ws.get(), d_ws.bytes(), nullptr);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << b.what;
  }
  Status st = cuda::launch_cutlass_grouped_gemm(good, sm_count, d_ws.get(), need - 1, nullptr);
  EXPECT_NE(st.message().find("workspace"), std::string::npos) << st.to_string();
  st = cuda::launch_cutlass_grouped_gemm(good, 0, d_ws.get(), need, nullptr);
  EXPECT_NE(st.message().find("sm_count"), std::string::npos) << st.to_string();
  CUDA_ASSERT(cudaDeviceSynchronize());
  std::vector<uint32_t> c_bits;
  ASSERT_TRUE(bufs.c.download(&c_bits));
  for (uint32_t v : c_bits) ASSERT_EQ(v, kPoisonBits) << "a rejected call wrote C";
}

}  // namespace
}  // namespace qmoe::test
