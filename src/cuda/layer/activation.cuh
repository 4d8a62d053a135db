// The activations in fp32 on the device: the CPU backend's formulas (src/cpu/activation.h), shared
// by the generic path's activation kernel and the decode kernels' FC1 epilogue.
#pragma once

#include "qmoe/layer.h"

namespace qmoe::cuda {

__device__ __forceinline__ float sigmoid_dev(float x) { return 1.0f / (1.0f + expf(-x)); }

__device__ __forceinline__ float gelu_tanh_dev(float x) {
  return 0.5f * x * (1.0f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x)));
}

__device__ __forceinline__ float scalar_act(Activation kind, float x) {
  switch (kind) {
    case Activation::kRelu:
      return x > 0.0f ? x : 0.0f;
    case Activation::kGelu:
      return gelu_tanh_dev(x);
    case Activation::kSilu:
      return x * sigmoid_dev(x);
    default:
      return x;
  }
}

__device__ __forceinline__ float swiglu_dev(const ActivationSpec& a, float gate, float lin) {
  const float l = fminf(fmaxf(lin, -a.limit), a.limit) + a.beta;
  if (a.limit_after_activation) return fminf(gate * sigmoid_dev(a.alpha * gate), a.limit) * l;
  const float g = fminf(gate, a.limit);
  return g * sigmoid_dev(a.alpha * g) * l;
}

// A gated activation of one (gate, linear) pair: SwiGLU or GeGLU.
__device__ __forceinline__ float gated_act(const ActivationSpec& a, float gate, float lin) {
  return a.kind == Activation::kSwiGlu ? swiglu_dev(a, gate, lin) : gelu_tanh_dev(gate) * lin;
}

// A gated output from FC1's raw dot products, g (gate) and l (linear), with the route's scale and
// the rows' biases. Every kernel that applies a gated activation computes it here (the activation
// kernels, the mixed-input GEMM's FC1 epilogue), so their bits agree.
__device__ __forceinline__ float act_of_dots(const ActivationSpec& a, float scale, float g,
                                             float l, float bg, float bl) {
  return gated_act(a, scale * g + bg, scale * l + bl);
}

__device__ __forceinline__ bool is_gated(Activation k) {
  return k == Activation::kSwiGlu || k == Activation::kGeGlu;
}

}  // namespace qmoe::cuda
