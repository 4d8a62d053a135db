// MoE layer shapes of real models, with the routing, activation and default weight format each
// uses. The synthetic runs of `qmoe run` and `qmoe make-layer` start from one of these.
#pragma once

#include <string>
#include <vector>

#include "qmoe/layer.h"

namespace qmoe::cli {

struct Preset {
  std::string name;   // "qwen3-30b-a3b"
  std::string model;  // "Qwen3-30B-A3B"
  std::string note;   // what the preset leaves out of the real model, if anything
  LayerSpec spec;     // act_dtype f32; fc1/fc2/fc3 in the preset's default format
};

const std::vector<Preset>& presets();
// nullptr for an unknown name.
const Preset* find_preset(const std::string& name);
// "qwen3-30b-a3b, qwen3.6-35b-a3b, ..." for messages.
std::string preset_names();

constexpr const char* kDefaultPreset = "qwen3-30b-a3b";

}  // namespace qmoe::cli
