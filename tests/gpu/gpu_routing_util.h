// Helpers shared by the device routing tests (test_gpu_routing.cpp, test_gpu_routing_contract.cpp):
// problems (specs, logits, router weights), the host's route() and the device's into owned maps,
// and bitwise comparisons of every map array.
#pragma once

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

namespace qmoe::gpu_routing_test {

using cuda::DeviceRoutingArgs;
using cuda::RoutingPath;
using test::fresh_seed;
using test::GpuBuffer;

inline constexpr int32_t kNoToken = std::numeric_limits<int32_t>::max();

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

inline LayerSpec routing_spec(RoutingMethod method, int64_t experts, int top_k, int num_shared = 0,
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
inline void pick_groups(LayerSpec* s, std::mt19937_64& rng) {
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
inline Problem make_problem(const LayerSpec& spec, int64_t tokens, DType dtype, bool with_rw,
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

inline ::testing::AssertionResult host_route(const Problem& p, Maps* out) {
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

inline ::testing::AssertionResult device_route(const Problem& p, RoutingPath path, Maps* out) {
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

inline std::string show(int32_t v) { return std::to_string(v); }
inline std::string show(float v) {
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
inline ::testing::AssertionResult same_maps(const Maps& got, const Maps& want) {
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
inline ::testing::AssertionResult matches_host(const Problem& p,
                                               RoutingPath path = RoutingPath::kAuto) {
  Maps want, got;
  auto r = host_route(p, &want);
  if (r) r = device_route(p, path, &got);
  if (r) r = same_maps(got, want);
  if (!r) r << "\n  case: " << p.describe();
  return r;
}

inline const RoutingMethod kMethods[] = {RoutingMethod::kSoftmaxTopK, RoutingMethod::kTopKSoftmax,
                                         RoutingMethod::kSparseMixer, RoutingMethod::kGroupedTopK,
                                         RoutingMethod::kTopKSigmoid};
inline const DType kDtypes[] = {DType::kF32, DType::kF16, DType::kBF16};

// A valid spec for `method` on E experts with k (clamped, or 2 for the sparse mixer).
inline LayerSpec valid_spec(RoutingMethod method, int64_t experts, int k, int shared, TieBreak ties,
                            bool normalize, std::mt19937_64& rng) {
  const int n = static_cast<int>(experts) - shared;
  if (method == RoutingMethod::kSparseMixer) k = 2;
  LayerSpec s = routing_spec(method, experts, std::min(k, n), shared, ties, normalize);
  if (method == RoutingMethod::kGroupedTopK) pick_groups(&s, rng);
  return s;
}

}  // namespace qmoe::gpu_routing_test
