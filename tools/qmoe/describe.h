// One-line, human descriptions of a layer for the CLI's reports.
#pragma once

#include <string>

#include "qmoe/layer.h"

namespace qmoe::cli {

// "H 2048, I 768, E 128"
std::string describe_shape(const LayerSpec& s);
// "top-8 softmax_topk, normalized" (+ groups, shared experts, combine mode, tie-break)
std::string describe_routing(const LayerSpec& s);
// "swiglu interleaved (alpha 1.702, beta 1, limit 7)"
std::string describe_activation(const LayerSpec& s);
// "fc1 int4 b128, fc2 int4 b128"
std::string describe_formats(const LayerSpec& s);

}  // namespace qmoe::cli
