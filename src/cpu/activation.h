// qmoe CPU backend: activations on one route's FC1 output, in fp32 (ORT's formulas).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "qmoe/layer.h"

namespace qmoe::cpu {

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

inline float gelu_tanh(float x) {
  return 0.5f * x * (1.0f + std::tanh(0.7978845608f * (x + 0.044715f * x * x * x)));
}

inline float scalar_activation(Activation kind, float x) {
  switch (kind) {
    case Activation::kRelu:
      return x > 0.0f ? x : 0.0f;
    case Activation::kGelu:
      return gelu_tanh(x);
    case Activation::kSilu:
      return x * sigmoid(x);
    default:
      return x;
  }
}

inline float swiglu(const ActivationSpec& a, float gate, float lin) {
  const float l = std::min(std::max(lin, -a.limit), a.limit) + a.beta;
  if (a.limit_after_activation) {
    return std::min(gate * sigmoid(a.alpha * gate), a.limit) * l;
  }
  const float g = std::min(gate, a.limit);
  return g * sigmoid(a.alpha * g) * l;
}

// h: FC1 output of one route (2I values for fused gated layouts, I otherwise); h3: FC3 output
// (separate gated layout only). Writes I values to out.
inline void apply_activation(const ActivationSpec& a, int64_t inter, const float* h,
                             const float* h3, float* out) {
  if (!a.gated()) {
    for (int64_t i = 0; i < inter; ++i) out[i] = scalar_activation(a.kind, h[i]);
    return;
  }
  for (int64_t i = 0; i < inter; ++i) {
    float gate, lin;
    switch (a.glu) {
      case GluLayout::kInterleaved:
        gate = h[2 * i], lin = h[2 * i + 1];
        break;
      case GluLayout::kConcatenated:
        gate = h[i], lin = h[inter + i];
        break;
      default:
        gate = h[i], lin = h3[i];
        break;
    }
    out[i] = a.kind == Activation::kSwiGlu ? swiglu(a, gate, lin) : gelu_tanh(gate) * lin;
  }
}

}  // namespace qmoe::cpu
