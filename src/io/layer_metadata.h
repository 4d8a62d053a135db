// The qmoe.* metadata keys of a layer file: what ORT's QMoE attributes cannot say (routing methods
// beyond softmax-top-k and sparse mixer, their parameters, tie-breaking, combine mode, FP4 layout).
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "qmoe/io.h"
#include "qmoe/layer.h"
#include "qmoe/ort.h"
#include "qmoe/status.h"

namespace qmoe {

// The qmoe.* keys of one file, parsed and validated; a field is applied only when its key was
// given.
struct LayerFileExtensions {
  OrtSemantics semantics = OrtSemantics::kCuda;
  bool has_method = false, has_n_group = false, has_topk_group = false, has_scaling = false;
  bool has_eps = false, has_ties = false, has_combine = false, has_fp4_layout = false;
  bool has_shared_weight = false;
  RoutingMethod method = RoutingMethod::kSoftmaxTopK;
  int n_group = 1, topk_group = 1;
  float routed_scaling_factor = 1.0f, sparse_mixer_eps = 0.01f;
  TieBreak ties = TieBreak::kLowerIndex;
  CombineMode combine = CombineMode::kScaleOutput;
  SharedWeight shared_weight = SharedWeight::kSigmoid;
  Fp4Layout fp4_layout = Fp4Layout::kNPacked;
  // Local experts: the router's expert count and the first held expert (0 when absent).
  bool has_num_experts = false;
  int num_experts = 0, first_expert = 0;
};

// Parses every key starting with "qmoe."; an unknown qmoe.* key or a bad value is an error naming
// the key. Other keys are ignored (they are ORT attributes).
Status parse_layer_extensions(const std::map<std::string, std::string>& metadata,
                              LayerFileExtensions* out);

// Applies the routing and local-expert fields to spec (after layer_from_ort built it, with E from
// FC1: with qmoe.num_experts, FC1's count becomes local_experts).
void apply_layer_extensions(const LayerFileExtensions& ext, LayerSpec* spec);

// The ORT attributes that describe spec, or kUnsupported naming what they cannot express.
Status ort_attributes_for_spec(const LayerSpec& spec, OrtQMoEAttributes* out);

// The qmoe.* keys that, added to ort_attributes_for_spec(), reproduce spec.
std::map<std::string, std::string> layer_extension_keys(const LayerSpec& spec);

// Builds a layer (attributes, spec, weights) from a layer file's metadata and its tensors under
// their layer-file names, then check_layer(); load_layer_file() and model packs
// (docs/model-pack.md) read layers through it. l->file is left alone.
Status layer_from_parts(const std::map<std::string, std::string>& meta,
                        const std::vector<std::pair<std::string, TensorView>>& tensors,
                        LoadedLayer* l);

}  // namespace qmoe
