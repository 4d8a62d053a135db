// Device routing against the host's route(): every map array (ids, weights, counts, offsets,
// permuted order, positions) must be bitwise equal, on both paths, for every method and option,
// on Gaussian and on tie-heavy logits (a handful of levels, +0 and -0 among them). Also: the
// non-finite rule, argument errors that launch nothing, the temp-size contract, and capture in
// a CUDA graph.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <new>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor_check.h"
#include "cuda/layer/stages.h"
#include "cuda/routing/device_routing.h"
#include "cuda/routing/routing_internal.cuh"
#include "gpu_test_util.h"
#include "qmoe/layer.h"
#include "qmoe/routing.h"
#include "test_util.h"

namespace qmoe {
namespace {

using cuda::DeviceRoutingArgs;
using cuda::RoutingPath;
using test::fresh_seed;
using test::GpuBuffer;

constexpr int32_t kNoToken = std::numeric_limits<int32_t>::max();

// ---------------------------------------------------------------------------------------------
// Problems

// kOneLane: Gaussian, with the experts of one warp lane (index % 32 == 3) raised above the rest,
// so that a token's picks all come from one lane's share.
enum class Values { kGaussian, kTieHeavy, kOneLane };

struct Problem {
  LayerSpec spec;
  int64_t tokens = 0;
  DType dtype = DType::kF32;    // of the logits and the router weights
  std::vector<uint8_t> logits;  // [T, E] (never empty, so its data pointer is set)
  std::vector<uint8_t> rw;      // [T, E] or empty: no router weights
  std::vector<float> bias;      // [E - num_shared], kGroupedTopK only

  int64_t experts() const { return spec.num_experts; }
  int slots() const { return spec.slots(); }
  std::string describe() const {
    const RoutingSpec& r = spec.routing;
    std::ostringstream s;
    s << routing_method_name(r.method) << " E=" << spec.num_experts << " T=" << tokens
      << " k=" << r.top_k << " shared=" << r.num_shared << "/"
      << shared_weight_name(r.shared_weight)
      << " ties=" << (r.ties == TieBreak::kHigherIndex ? "higher" : "lower")
      << " normalize=" << r.normalize << " rw=" << !rw.empty() << " dtype=" << dtype_name(dtype);
    if (r.method == RoutingMethod::kGroupedTopK) {
      s << " n_group=" << r.n_group << " topk_group=" << r.topk_group;
    }
    return s.str();
  }
};

LayerSpec routing_spec(RoutingMethod method, int64_t experts, int top_k, int num_shared = 0,
                       TieBreak ties = TieBreak::kLowerIndex, bool normalize = false) {
  LayerSpec s;
  s.num_experts = experts;
  s.routing.method = method;
  s.routing.top_k = top_k;
  s.routing.num_shared = num_shared;
  s.routing.ties = ties;
  s.routing.normalize = normalize;
  s.routing.routed_scaling_factor = 2.5f;
  return s;
}

// Makes a grouped spec valid: n_group a divisor of n (random, at most 32), topk_group random,
// top_k clamped to the experts the kept groups hold.
void pick_groups(LayerSpec* s, std::mt19937_64& rng) {
  RoutingSpec& r = s->routing;
  const int n = static_cast<int>(s->num_experts) - r.num_shared;
  std::vector<int> divisors;
  for (int d = 1; d <= std::min(n, 32); ++d) {
    if (n % d == 0) divisors.push_back(d);
  }
  r.n_group = divisors[std::uniform_int_distribution<size_t>(0, divisors.size() - 1)(rng)];
  r.topk_group = std::uniform_int_distribution<int>(1, r.n_group)(rng);
  r.top_k = std::min(r.top_k, r.topk_group * (n / r.n_group));
}

// Fills logits (and router weights, bias) for spec: Gaussian values, or values drawn from a few
// levels so that equal scores (ties, +0 against -0, 0 / 0 in the sparse mixer) are common.
Problem make_problem(const LayerSpec& spec, int64_t tokens, DType dtype, bool with_rw,
                     Values values, uint64_t seed) {
  static const float kLogitLevels[] = {-2.0f, -0.5f, -0.0f, 0.0f, 0.75f, 1.5f};
  static const float kWeightLevels[] = {0.0f, 0.25f, 1.0f};
  static const float kBiasLevels[] = {0.0f, 0.125f};
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> level6(0, 5), level3(0, 2), level2(0, 1);
  const bool ties = values == Values::kTieHeavy;
  Problem p;
  p.spec = spec;
  p.tokens = tokens;
  p.dtype = dtype;
  const int64_t n = tokens * spec.num_experts;
  p.logits.resize(std::max<size_t>(4, static_cast<size_t>(n) * dtype_size(dtype)));
  for (int64_t i = 0; i < n; ++i) {
    float v = ties ? kLogitLevels[level6(rng)] : 2.0f * normal(rng);
    if (values == Values::kOneLane && i % spec.num_experts % 32 == 3) v += 12.0f;
    store_float(p.logits.data(), dtype, i, v);
  }
  if (with_rw) {
    p.rw.resize(std::max<size_t>(4, static_cast<size_t>(n) * dtype_size(dtype)));
    for (int64_t i = 0; i < n; ++i) {
      store_float(p.rw.data(), dtype, i,
                  ties ? kWeightLevels[level3(rng)] : std::fabs(normal(rng)));
    }
  }
  if (spec.routing.method == RoutingMethod::kGroupedTopK) {
    p.bias.resize(static_cast<size_t>(spec.num_experts - spec.routing.num_shared));
    for (float& b : p.bias) b = ties ? kBiasLevels[level2(rng)] : 0.1f * normal(rng);
  }
  return p;
}

// ---------------------------------------------------------------------------------------------
// Running both sides

struct Maps {
  std::vector<int32_t> ids, counts, offsets, permuted, position;
  std::vector<float> w;
  int32_t error[2] = {0, kNoToken};
};

struct AlignedBuffer {
  explicit AlignedBuffer(size_t n) {
    data = static_cast<char*>(::operator new(std::max<size_t>(n, 64), std::align_val_t(64)));
  }
  ~AlignedBuffer() { ::operator delete(data, std::align_val_t(64)); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  char* data;
};

::testing::AssertionResult host_route(const Problem& p, Maps* out) {
  const int64_t t = p.tokens, e = p.experts();
  const int slots = p.slots();
  AlignedBuffer buf(route_maps_bytes(t, slots, e));
  RouteMapsView maps = carve_route_maps(buf.data, t, slots, e);
  RunInputs in;
  in.router_logits = TensorView(p.logits.data(), p.dtype, {t, e});
  if (!p.rw.empty()) in.router_weights = TensorView(p.rw.data(), p.dtype, {t, e});
  TensorView bias;
  if (!p.bias.empty()) {
    bias = TensorView(p.bias.data(), DType::kF32, {static_cast<int64_t>(p.bias.size())});
  }
  const Status s = route(p.spec, in, bias, &maps);
  if (!s.is_ok()) return ::testing::AssertionFailure() << "host route: " << s.to_string();
  const int64_t r = t * slots;
  out->ids.assign(maps.expert_ids, maps.expert_ids + r);
  out->w.assign(maps.weights, maps.weights + r);
  out->counts.assign(maps.expert_counts, maps.expert_counts + e);
  out->offsets.assign(maps.expert_offsets, maps.expert_offsets + e + 1);
  out->permuted.assign(maps.permuted_route, maps.permuted_route + r);
  out->position.assign(maps.route_position, maps.route_position + r);
  return ::testing::AssertionSuccess();
}

template <typename T>
::testing::AssertionResult copy_back(const T* device, int64_t n, std::vector<T>* out) {
  out->resize(static_cast<size_t>(n));
  if (n == 0) return ::testing::AssertionSuccess();
  const cudaError_t e = cudaMemcpy(out->data(), device, n * sizeof(T), cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) return ::testing::AssertionFailure() << cudaGetErrorString(e);
  return ::testing::AssertionSuccess();
}

// Device copies of a problem's inputs and poisoned outputs (maps, error word, temp).
struct DeviceProblem {
  GpuBuffer logits, rw, bias, maps_buf, error, temp;
  DeviceRoutingArgs args;
  size_t temp_bytes = 0;

  ::testing::AssertionResult init(const Problem& p, RoutingPath path) {
    const int slots = p.slots();
    auto r = logits.upload(p.logits);
    if (r && !p.rw.empty()) r = rw.upload(p.rw);
    if (r && !p.bias.empty()) r = bias.upload(p.bias);
    if (r) r = maps_buf.allocate(route_maps_bytes(p.tokens, slots, p.experts()));
    if (r) r = error.upload(std::vector<int32_t>{0, kNoToken});
    if (!r) return r;
    const Status s =
        path == RoutingPath::kGeneral
            ? cuda::general_path_temp_bytes(p.tokens, slots, p.experts(), &temp_bytes)
            : cuda::general_routing_temp_bytes(p.tokens, slots, p.experts(), &temp_bytes);
    if (!s.is_ok()) return ::testing::AssertionFailure() << "temp bytes: " << s.to_string();
    r = temp.allocate(temp_bytes);
    if (!r) return r;
    args = DeviceRoutingArgs();
    args.routing = p.spec.routing;
    args.num_experts = static_cast<int>(p.experts());
    args.tokens = p.tokens;
    args.logits = logits.get();
    args.logits_dtype = p.dtype;
    args.router_weights = p.rw.empty() ? nullptr : rw.get();
    args.rw_dtype = p.dtype;
    args.router_bias = p.bias.empty() ? nullptr : bias.as<float>();
    args.maps = carve_route_maps(maps_buf.get(), p.tokens, slots, p.experts());
    args.error = error.as<int32_t>();
    if (args.maps.expert_ids == nullptr) return ::testing::AssertionFailure() << "carve failed";
    return ::testing::AssertionSuccess();
  }

  ::testing::AssertionResult download(Maps* out) const {
    const RouteMapsView& m = args.maps;
    const int64_t r = args.tokens * m.slots, e = m.experts;
    auto res = copy_back(m.expert_ids, r, &out->ids);
    if (res) res = copy_back(m.weights, r, &out->w);
    if (res) res = copy_back(m.expert_counts, e, &out->counts);
    if (res) res = copy_back(m.expert_offsets, e + 1, &out->offsets);
    if (res) res = copy_back(m.permuted_route, r, &out->permuted);
    if (res) res = copy_back(m.route_position, r, &out->position);
    if (!res) return res;
    const cudaError_t c =
        cudaMemcpy(out->error, error.get(), sizeof(out->error), cudaMemcpyDeviceToHost);
    if (c != cudaSuccess) return ::testing::AssertionFailure() << cudaGetErrorString(c);
    return ::testing::AssertionSuccess();
  }
};

::testing::AssertionResult device_route(const Problem& p, RoutingPath path, Maps* out) {
  DeviceProblem d;
  auto r = d.init(p, path);
  if (!r) return r;
  cudaStream_t stream = nullptr;
  cudaError_t c = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (c != cudaSuccess) return ::testing::AssertionFailure() << cudaGetErrorString(c);
  const Status s = cuda::launch_routing_path(d.args, path, d.temp.get(), d.temp_bytes, stream);
  c = cudaStreamSynchronize(stream);
  cudaStreamDestroy(stream);
  if (!s.is_ok()) return ::testing::AssertionFailure() << "launch_routing: " << s.to_string();
  if (c != cudaSuccess) return ::testing::AssertionFailure() << cudaGetErrorString(c);
  return d.download(out);
}

// ---------------------------------------------------------------------------------------------
// Comparing

std::string show(int32_t v) { return std::to_string(v); }
std::string show(float v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.9g (0x%08x)", v, num::f32_bits(v));
  return buf;
}

template <typename T>
::testing::AssertionResult same_bits(const char* name, const std::vector<T>& got,
                                     const std::vector<T>& want) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure()
           << name << ": " << got.size() << " entries, expected " << want.size();
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      return ::testing::AssertionFailure()
             << name << ": first mismatch at " << i << " of " << got.size() << ": device "
             << show(got[i]) << ", host " << show(want[i]);
    }
  }
  return ::testing::AssertionSuccess();
}

// Every array bitwise, the error word untouched, no NaN weight.
::testing::AssertionResult same_maps(const Maps& got, const Maps& want) {
  auto r = same_bits("expert_ids", got.ids, want.ids);
  if (r) r = same_bits("weights", got.w, want.w);
  if (r) r = same_bits("expert_counts", got.counts, want.counts);
  if (r) r = same_bits("expert_offsets", got.offsets, want.offsets);
  if (r) r = same_bits("permuted_route", got.permuted, want.permuted);
  if (r) r = same_bits("route_position", got.position, want.position);
  if (!r) return r;
  for (size_t i = 0; i < got.w.size(); ++i) {
    if (std::isnan(got.w[i])) return ::testing::AssertionFailure() << "NaN weight at " << i;
  }
  if (got.error[0] != 0 || got.error[1] != kNoToken) {
    return ::testing::AssertionFailure()
           << "error word set: " << got.error[0] << ", token " << got.error[1];
  }
  return ::testing::AssertionSuccess();
}

// Host route() and the device on `path` agree bitwise.
::testing::AssertionResult matches_host(const Problem& p, RoutingPath path = RoutingPath::kAuto) {
  Maps want, got;
  auto r = host_route(p, &want);
  if (r) r = device_route(p, path, &got);
  if (r) r = same_maps(got, want);
  if (!r) r << "\n  case: " << p.describe();
  return r;
}

const RoutingMethod kMethods[] = {RoutingMethod::kSoftmaxTopK, RoutingMethod::kTopKSoftmax,
                                  RoutingMethod::kSparseMixer, RoutingMethod::kGroupedTopK,
                                  RoutingMethod::kTopKSigmoid};
const DType kDtypes[] = {DType::kF32, DType::kF16, DType::kBF16};

// A valid spec for `method` on E experts with k (clamped, or 2 for the sparse mixer).
LayerSpec valid_spec(RoutingMethod method, int64_t experts, int k, int shared, TieBreak ties,
                     bool normalize, std::mt19937_64& rng) {
  const int n = static_cast<int>(experts) - shared;
  if (method == RoutingMethod::kSparseMixer) k = 2;
  LayerSpec s = routing_spec(method, experts, std::min(k, n), shared, ties, normalize);
  if (method == RoutingMethod::kGroupedTopK) pick_groups(&s, rng);
  return s;
}

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
