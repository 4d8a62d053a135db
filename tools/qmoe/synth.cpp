#include "synth.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <mutex>
#include <thread>

#include "core/tensor_check.h"
#include "record.h"

namespace qmoe::cli {

namespace {

uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Streams of the generator: one per tensor role.
enum Stream : uint64_t {
  kFc1Weights = 1,
  kFc2Weights,
  kFc3Weights,
  kFc1Bias,
  kFc2Bias,
  kFc3Bias,
  kRouterBias,
  kInput,
  kLogits,
};

uint64_t stream_seed(uint64_t seed, uint64_t stream, uint64_t index) {
  return mix64(mix64(mix64(seed) + stream) + index);
}

// splitmix64: one multiply-xorshift per draw, cheap enough for billions of weights.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next() {
    s_ += 0x9E3779B97F4A7C15ull;
    return mix64(s_);
  }
  // The sum of four 16-bit uniforms (Irwin-Hall, n = 4), standardized to mean 0 and variance 1.
  // Its tails stop at +-3.46 sigma, which is close enough to a Gaussian for synthetic weights.
  float normal() {
    const uint64_t r = next();
    const uint32_t sum = static_cast<uint32_t>((r & 0xFFFF) + ((r >> 16) & 0xFFFF) +
                                               ((r >> 32) & 0xFFFF) + (r >> 48));
    return (static_cast<float>(sum) - kMean) * kInvStd;
  }

 private:
  static constexpr float kMean = 4 * 65535.0f / 2;
  // 1 / sqrt(4 * (65536^2 - 1) / 12)
  static constexpr float kInvStd = 2.64290735e-05f;
  uint64_t s_;
};

void fill_act(DType t, int64_t n, uint64_t seed, float stddev, std::vector<uint8_t>* out) {
  out->resize(static_cast<size_t>(n) * dtype_size(t));
  Rng rng(seed);
  for (int64_t i = 0; i < n; ++i) store_float(out->data(), t, i, stddev * rng.normal());
}

struct FcJob {
  QuantizedFc* fc;
  Stream stream;
};

// Generates and quantizes every (FC, expert) on `threads` workers.
Status quantize_all(const std::vector<FcJob>& jobs, int64_t experts, uint64_t seed, int threads) {
  const size_t tasks = jobs.size() * static_cast<size_t>(experts);
  std::atomic<size_t> next{0};
  std::mutex mu;
  Status first;
  auto worker = [&] {
    std::vector<float> w;
    for (;;) {
      const size_t t = next.fetch_add(1);
      if (t >= tasks) return;
      // Expert-major order keeps the workers on the same FC at the same time.
      const FcJob& job = jobs[t % jobs.size()];
      const int64_t e = static_cast<int64_t>(t / jobs.size());
      QuantizedFc* fc = job.fc;
      w.resize(static_cast<size_t>(fc->n * fc->k));
      Rng rng(stream_seed(seed, job.stream, static_cast<uint64_t>(e)));
      const float stddev = 1.0f / std::sqrt(static_cast<float>(fc->k));
      for (float& x : w) x = stddev * rng.normal();
      const Status s = quantize_expert(w.data(), e, fc);
      if (!s.is_ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (first.is_ok()) first = s;
        next.store(tasks);
        return;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int i = 1; i < threads; ++i) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  return first;
}

}  // namespace

LayerWeights SyntheticLayer::weights() const {
  const int64_t e = spec.num_experts;
  auto bias = [&](const std::vector<uint8_t>& b, int64_t n) {
    return b.empty() ? TensorView() : TensorView(b.data(), spec.act_dtype, {e, n});
  };
  LayerWeights w;
  w.fc1 = fc1.view(bias(bias1, spec.fc1_rows()));
  w.fc2 = fc2.view(bias(bias2, spec.hidden));
  if (spec.has_fc3()) w.fc3 = fc3.view(bias(bias3, spec.inter));
  if (!router_bias.empty()) {
    w.router_bias =
        TensorView(router_bias.data(), DType::kF32, {static_cast<int64_t>(router_bias.size())});
  }
  return w;
}

Status make_synthetic_layer(const LayerSpec& spec, uint64_t seed, int threads,
                            SyntheticLayer* out) {
  QMOE_RETURN_IF_ERROR(check_spec(spec));
  const double layer_bytes =
      static_cast<double>(expert_bytes(spec)) * static_cast<double>(spec.num_experts);
  warn_if_short_of_memory(layer_bytes, "synthesizing the layer's weights");
  StepNote note("synthesizing and quantizing " + std::to_string(spec.num_experts) + " experts (" +
                std::to_string(static_cast<int64_t>(layer_bytes / 1e6)) + " MB)");
  SyntheticLayer& l = *out;
  l = SyntheticLayer();
  l.spec = spec;
  const int64_t e = spec.num_experts, h = spec.hidden, i = spec.inter;
  QMOE_RETURN_IF_ERROR(allocate_fc(spec.fc1, e, spec.fc1_rows(), h, &l.fc1));
  QMOE_RETURN_IF_ERROR(allocate_fc(spec.fc2, e, h, i, &l.fc2));
  std::vector<FcJob> jobs = {{&l.fc1, kFc1Weights}, {&l.fc2, kFc2Weights}};
  if (spec.has_fc3()) {
    QMOE_RETURN_IF_ERROR(allocate_fc(spec.fc3, e, i, h, &l.fc3));
    jobs.push_back({&l.fc3, kFc3Weights});
  }
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  QMOE_RETURN_IF_ERROR(quantize_all(jobs, e, seed, threads));

  const DType t = spec.act_dtype;
  if (spec.has_fc1_bias)
    fill_act(t, e * spec.fc1_rows(), stream_seed(seed, kFc1Bias, 0), 0.1f, &l.bias1);
  if (spec.has_fc2_bias) fill_act(t, e * h, stream_seed(seed, kFc2Bias, 0), 0.1f, &l.bias2);
  if (spec.has_fc3() && spec.has_fc3_bias) {
    fill_act(t, e * i, stream_seed(seed, kFc3Bias, 0), 0.1f, &l.bias3);
  }
  if (spec.routing.method == RoutingMethod::kGroupedTopK) {
    Rng rng(stream_seed(seed, kRouterBias, 0));
    l.router_bias.resize(static_cast<size_t>(e - spec.routing.num_shared));
    for (float& b : l.router_bias) b = 0.1f * rng.normal();
  }
  return Status::ok();
}

void make_synthetic_inputs(const LayerSpec& spec, int64_t tokens, uint64_t seed,
                           SyntheticInputs* out) {
  const DType t = spec.act_dtype;
  fill_act(t, tokens * spec.hidden, stream_seed(seed, kInput, 0), 1.0f, &out->x);
  fill_act(t, tokens * spec.num_experts, stream_seed(seed, kLogits, 0), 2.0f, &out->logits);
  out->inputs = RunInputs();
  out->inputs.input = TensorView(out->x.data(), t, {tokens, spec.hidden});
  out->inputs.router_logits = TensorView(out->logits.data(), t, {tokens, spec.num_experts});
}

}  // namespace qmoe::cli
