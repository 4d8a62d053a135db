// Builds random layers for tests: Gaussian fp32 weights quantized with the library's quantizers,
// random biases, inputs and router logits, all from one seed.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "core/numeric.h"
#include "core/tensor_check.h"
#include "qmoe/backend.h"
#include "qmoe/quantize.h"
#include "test_util.h"

namespace qmoe::test {

struct TestLayer {
  LayerSpec spec;
  QuantizedFc fc1, fc2, fc3;
  std::vector<uint8_t> bias1, bias2, bias3;  // in spec.act_dtype
  std::vector<float> router_bias;
  LayerWeights weights;
};

// Random values stored as dtype t.
inline std::vector<uint8_t> random_tensor(DType t, int64_t n, uint64_t seed, float stddev) {
  std::vector<float> v = gaussian(static_cast<size_t>(n), seed, stddev);
  std::vector<uint8_t> bytes(static_cast<size_t>(n) * dtype_size(t));
  for (int64_t i = 0; i < n; ++i) store_float(bytes.data(), t, i, v[i]);
  return bytes;
}

inline void make_fc(const FcFormat& f, int64_t e, int64_t n, int64_t k, uint64_t seed,
                    QuantizedFc* out) {
  std::vector<float> w = gaussian(static_cast<size_t>(e * n * k), seed, 1.0f / std::sqrt(float(k)));
  Status s = quantize_fc(f, w.data(), e, n, k, out);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
}

// Fills tl->weights from the owned buffers (call again after moving a TestLayer).
inline void bind_weights(TestLayer* tl) {
  const LayerSpec& s = tl->spec;
  const DType bt = s.act_dtype;
  auto bias_view = [&](const std::vector<uint8_t>& b, int64_t n) {
    return b.empty() ? TensorView() : TensorView(b.data(), bt, {s.num_experts, n});
  };
  tl->weights.fc1 = tl->fc1.view(bias_view(tl->bias1, s.fc1_rows()));
  tl->weights.fc2 = tl->fc2.view(bias_view(tl->bias2, s.hidden));
  if (s.has_fc3()) tl->weights.fc3 = tl->fc3.view(bias_view(tl->bias3, s.inter));
  tl->weights.router_bias = tl->router_bias.empty()
                                ? TensorView()
                                : TensorView(tl->router_bias.data(), DType::kF32,
                                             {static_cast<int64_t>(tl->router_bias.size())});
}

inline void make_layer(const LayerSpec& spec, uint64_t seed, TestLayer* tl) {
  tl->spec = spec;
  const LayerSpec& s = tl->spec;
  make_fc(s.fc1, s.num_experts, s.fc1_rows(), s.hidden, seed + 1, &tl->fc1);
  make_fc(s.fc2, s.num_experts, s.hidden, s.inter, seed + 2, &tl->fc2);
  if (s.has_fc3()) make_fc(s.fc3, s.num_experts, s.inter, s.hidden, seed + 3, &tl->fc3);
  if (s.has_fc1_bias)
    tl->bias1 = random_tensor(s.act_dtype, s.num_experts * s.fc1_rows(), seed + 4, 0.1f);
  if (s.has_fc2_bias)
    tl->bias2 = random_tensor(s.act_dtype, s.num_experts * s.hidden, seed + 5, 0.1f);
  if (s.has_fc3_bias)
    tl->bias3 = random_tensor(s.act_dtype, s.num_experts * s.inter, seed + 6, 0.1f);
  if (s.routing.method == RoutingMethod::kGroupedTopK) {
    tl->router_bias =
        gaussian(static_cast<size_t>(s.num_experts - s.routing.num_shared), seed + 7, 0.1f);
  }
  bind_weights(tl);
}

struct TestInputs {
  std::vector<uint8_t> x, logits, router_weights;
  RunInputs in;
};

inline void make_inputs(const LayerSpec& s, int64_t tokens, uint64_t seed, bool with_router_weights,
                        TestInputs* ti) {
  ti->x = random_tensor(s.act_dtype, tokens * s.hidden, seed + 11, 1.0f);
  ti->logits = random_tensor(s.act_dtype, tokens * s.num_experts, seed + 12, 2.0f);
  ti->in.input = TensorView(ti->x.data(), s.act_dtype, {tokens, s.hidden});
  ti->in.router_logits = TensorView(ti->logits.data(), s.act_dtype, {tokens, s.num_experts});
  if (with_router_weights) {
    std::vector<float> v = gaussian(static_cast<size_t>(tokens * s.num_experts), seed + 13, 1.0f);
    ti->router_weights.resize(v.size() * dtype_size(s.act_dtype));
    for (size_t i = 0; i < v.size(); ++i)
      store_float(ti->router_weights.data(), s.act_dtype, i, std::fabs(v[i]));
    ti->in.router_weights =
        TensorView(ti->router_weights.data(), s.act_dtype, {tokens, s.num_experts});
  }
}

// A small SwiGLU layer in format f (both FCs), the default starting point of most tests.
inline LayerSpec small_spec(WeightFormat f, int64_t hidden = 256, int64_t inter = 128,
                            int64_t experts = 8, int k = 2) {
  LayerSpec s;
  s.hidden = hidden;
  s.inter = inter;
  s.num_experts = experts;
  s.routing.top_k = k;
  s.routing.normalize = true;
  s.activation.kind = Activation::kSwiGlu;
  s.activation.glu = GluLayout::kInterleaved;
  s.fc1 = default_fc_format(f);
  s.fc2 = default_fc_format(f);
  s.fc3 = default_fc_format(f);
  return s;
}

// Local experts: the shard of `whole` holding experts [first, first + count) (LayerSpec::
// first_expert, local_experts). Its weights are views into whole's tensors, which must outlive it:
// every weight tensor has the experts as its leading dimension, so the shard's experts are one
// contiguous slice. Only spec and weights are set (the buffers stay whole's).
inline TensorView slice_experts(TensorView v, int64_t first, int64_t count) {
  if (!v.present()) return v;
  const size_t per_expert = v.bytes() / static_cast<size_t>(v.dims[0]);
  v.data = static_cast<const uint8_t*>(v.data) + first * per_expert;
  v.dims[0] = count;
  return v;
}

inline FcWeights slice_fc(const FcWeights& w, int64_t first, int64_t count) {
  return {slice_experts(w.weight, first, count), slice_experts(w.scales, first, count),
          slice_experts(w.bias, first, count), slice_experts(w.zero_points, first, count),
          slice_experts(w.global_scale, first, count)};
}

inline TestLayer make_shard(const TestLayer& whole, int64_t first, int64_t count) {
  TestLayer s;
  s.spec = whole.spec;
  s.spec.first_expert = first;
  s.spec.local_experts = count;
  s.weights.fc1 = slice_fc(whole.weights.fc1, first, count);
  s.weights.fc2 = slice_fc(whole.weights.fc2, first, count);
  if (whole.spec.has_fc3()) s.weights.fc3 = slice_fc(whole.weights.fc3, first, count);
  s.weights.router_bias = whole.weights.router_bias;  // routing is over all E: not sliced
  return s;
}

// A view of `shape` (any rank up to kMaxRank) on `data`, which may be null (an empty tensor).
template <typename View, typename Ptr>
View shaped_view(Ptr data, DType t, const std::vector<int64_t>& shape) {
  View v;
  v.data = data;
  v.dtype = t;
  v.rank = static_cast<int>(shape.size());
  for (int i = 0; i < v.rank; ++i) v.dims[i] = shape[i];
  return v;
}

}  // namespace qmoe::test
