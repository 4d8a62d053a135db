// The activation configurations every backend is tested with: each kind, each gated layout, and
// the clamped SwiGLU variants of gpt-oss.
#pragma once

#include <limits>
#include <string>
#include <vector>

#include "qmoe/layer.h"

namespace qmoe::test {

inline std::vector<ActivationSpec> activation_cases() {
  const float inf = std::numeric_limits<float>::infinity();
  return {
      {Activation::kIdentity, GluLayout::kInterleaved, 1, 0, inf, false},
      {Activation::kRelu, GluLayout::kInterleaved, 1, 0, inf, false},
      {Activation::kGelu, GluLayout::kInterleaved, 1, 0, inf, false},
      {Activation::kSilu, GluLayout::kInterleaved, 1, 0, inf, false},
      {Activation::kSwiGlu, GluLayout::kInterleaved, 1, 0, inf, false},
      {Activation::kSwiGlu, GluLayout::kConcatenated, 1, 0, inf, false},
      {Activation::kSwiGlu, GluLayout::kSeparateFc3, 1, 0, inf, false},
      {Activation::kSwiGlu, GluLayout::kInterleaved, 1.702f, 1.0f, 0.5f, false},  // gpt-oss
      {Activation::kSwiGlu, GluLayout::kConcatenated, 1.702f, 1.0f, 0.3f, true},
      {Activation::kGeGlu, GluLayout::kInterleaved, 1, 0, inf, false},
      {Activation::kGeGlu, GluLayout::kSeparateFc3, 1, 0, inf, false},
  };
}

inline std::string activation_case_name(const ActivationSpec& a) {
  return std::string(activation_name(a.kind)) + " glu " + std::to_string(static_cast<int>(a.glu)) +
         " alpha " + std::to_string(a.alpha) + " limit " + std::to_string(a.limit);
}

}  // namespace qmoe::test
