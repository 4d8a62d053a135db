// The fp64 oracle. Deliberately plain and independent of the CPU backend's code: it shares only
// route() (the routing is defined as fp32 arithmetic and must be bitwise the same everywhere) and
// dequantize_row<double> (exact). Each touched expert's matrices are dequantized once in double;
// every product and sum after that is in double.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <thread>
#include <vector>

#include "core/tensor_check.h"
#include "qmoe/backend.h"
#include "qmoe/quantize.h"
#include "qmoe/routing.h"

namespace qmoe {
namespace {

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double gelu(double x) {
  return 0.5 * x * (1.0 + std::tanh(0.7978845608 * (x + 0.044715 * x * x * x)));
}

double activate(const ActivationSpec& a, double gate, double lin) {
  const double limit = a.limit;
  switch (a.kind) {
    case Activation::kIdentity:
      return gate;
    case Activation::kRelu:
      return gate > 0 ? gate : 0;
    case Activation::kGelu:
      return gelu(gate);
    case Activation::kSilu:
      return gate * sigmoid(gate);
    case Activation::kGeGlu:
      return gelu(gate) * lin;
    case Activation::kSwiGlu: {
      const double l = std::min(std::max(lin, -limit), limit) + a.beta;
      if (a.limit_after_activation) return std::min(gate * sigmoid(a.alpha * gate), limit) * l;
      const double g = std::min(gate, limit);
      return g * sigmoid(a.alpha * g) * l;
    }
  }
  return 0;
}

std::vector<double> dequantize_expert(const FcFormat& f, const FcWeights& w, int64_t n, int64_t k,
                                      int64_t e) {
  std::vector<double> m(static_cast<size_t>(n * k));
  for (int64_t r = 0; r < n; ++r) dequantize_row<double>(f, w, n, k, e, r, m.data() + r * k);
  return m;
}

// y[n] = sum_k W[n, k] x[k] + bias[e, n]
void matvec(const std::vector<double>& w, const TensorView& bias, int64_t e, int64_t n, int64_t k,
            const double* x, double* y) {
  for (int64_t r = 0; r < n; ++r) {
    double acc = 0;
    for (int64_t c = 0; c < k; ++c) acc += w[r * k + c] * x[c];
    if (bias.present()) acc += load_float(bias.data, bias.dtype, e * n + r);
    y[r] = acc;
  }
}

}  // namespace

Status reference_forward(const LayerSpec& s, const LayerWeights& w, const RunInputs& in,
                         std::vector<double>* out) {
  QMOE_RETURN_IF_ERROR(check_layer(s, w));
  int64_t tokens = 0;
  QMOE_RETURN_IF_ERROR(check_inputs(s, in, &tokens));
  if (tokens == 0) {  // an empty output; the (possibly null) data pointers are not read
    out->clear();
    return Status::ok();
  }
  const int64_t H = s.hidden, I = s.inter, N1 = s.fc1_rows();
  const int slots = s.slots();

  std::vector<char> map_buf(route_maps_bytes(tokens, slots, s.num_experts) + 64);
  void* aligned = map_buf.data() + (64 - reinterpret_cast<uintptr_t>(map_buf.data()) % 64) % 64;
  RouteMapsView maps = carve_route_maps(aligned, tokens, slots, s.num_experts);
  QMOE_RETURN_IF_ERROR(route(s, in, w.router_bias, &maps));

  std::vector<double> x(static_cast<size_t>(tokens * H));
  for (int64_t i = 0; i < tokens * H; ++i) {
    x[i] = load_float(in.input.data, in.input.dtype, i);
    if (!std::isfinite(x[i])) {
      return Status::invalid("input: non-finite value at token " + std::to_string(i / H));
    }
  }

  // y_route[r]: expert output of route r (before the routing weight for kScaleOutput).
  const int64_t routes = tokens * slots;
  std::vector<double> y_route(static_cast<size_t>(routes * H));
  std::atomic<int64_t> next{0};
  auto worker = [&] {
    std::vector<double> xin(H), h(N1), h3(I), a(I);
    for (;;) {
      const int64_t we = next.fetch_add(1);  // index in the weights; router index e
      if (we >= s.weight_experts()) return;
      const int64_t e = s.first_expert + we;
      if (maps.expert_counts[e] == 0) continue;
      const auto w1 = dequantize_expert(s.fc1, w.fc1, N1, H, we);
      const auto w2 = dequantize_expert(s.fc2, w.fc2, H, I, we);
      std::vector<double> w3;
      if (s.has_fc3()) w3 = dequantize_expert(s.fc3, w.fc3, I, H, we);
      for (int32_t p = maps.expert_offsets[e]; p < maps.expert_offsets[e + 1]; ++p) {
        const int64_t r = maps.permuted_route[p];
        const int64_t t = r / slots;
        const double scale =
            s.routing.combine == CombineMode::kScaleInput ? double(maps.weights[r]) : 1.0;
        for (int64_t c = 0; c < H; ++c) xin[c] = scale * x[t * H + c];
        matvec(w1, w.fc1.bias, we, N1, H, xin.data(), h.data());
        if (s.has_fc3()) matvec(w3, w.fc3.bias, we, I, H, xin.data(), h3.data());
        for (int64_t i = 0; i < I; ++i) {
          double gate = h[i], lin = 0;
          if (s.activation.gated()) {
            switch (s.activation.glu) {
              case GluLayout::kInterleaved:
                gate = h[2 * i], lin = h[2 * i + 1];
                break;
              case GluLayout::kConcatenated:
                gate = h[i], lin = h[I + i];
                break;
              case GluLayout::kSeparateFc3:
                gate = h[i], lin = h3[i];
                break;
            }
          }
          a[i] = activate(s.activation, gate, lin);
        }
        matvec(w2, w.fc2.bias, we, H, I, a.data(), y_route.data() + r * H);
      }
    }
  };
  const int threads =
      std::max(1, std::min(8, static_cast<int>(std::thread::hardware_concurrency())));
  std::vector<std::thread> pool;
  for (int i = 1; i < threads; ++i) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();

  out->assign(static_cast<size_t>(tokens * H), 0.0);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int j = 0; j < slots; ++j) {
      const int64_t r = t * slots + j;
      if (!s.holds_expert(maps.expert_ids[r])) continue;  // another shard's expert
      const double wt = s.routing.combine == CombineMode::kScaleInput ? 1.0 : maps.weights[r];
      for (int64_t c = 0; c < H; ++c) (*out)[t * H + c] += wt * y_route[r * H + c];
    }
  }
  return Status::ok();
}

}  // namespace qmoe
