// Layer files: a safetensors file holding ORT QMoE inputs 2..20 under their ORT names, the ORT
// attributes and qmoe.* keys in __metadata__ (docs/layer-file.md).
#include <string>
#include <vector>

#include "io/layer_metadata.h"
#include "qmoe/io.h"

namespace qmoe {

namespace {

Status in_file(const std::string& path, const Status& s) {
  if (s.is_ok()) return s;
  return Status(s.code(), path + ": " + s.message());
}

// The ORT input index a layer-file tensor name stands for, -1 for none. Inputs 0, 1 and 14 are
// per-call (they belong in an input file).
int layer_tensor_index(const std::string& name) {
  for (int i = kOrtFc1Weights; i < kNumOrtInputs; ++i) {
    if (i != kOrtRouterWeights && name == ort_input_name(i)) return i;
  }
  return -1;
}

Status collect_inputs(const std::vector<std::pair<std::string, TensorView>>& tensors,
                      TensorView* inputs, TensorView* router_bias) {
  for (const auto& [name, v] : tensors) {
    if (name == kRouterCorrectionBiasName) {
      *router_bias = v;
      continue;
    }
    const int i = layer_tensor_index(name);
    if (i >= 0) {
      inputs[i] = v;
      continue;
    }
    if (name == ort_input_name(kOrtInput) || name == ort_input_name(kOrtRouterProbs) ||
        name == ort_input_name(kOrtRouterWeights)) {
      return Status::invalid("tensor '" + name +
                             "' is a per-call input: it belongs in an input "
                             "file, not in a layer file");
    }
    return Status::invalid("unexpected tensor '" + name +
                           "' (a layer file holds ORT QMoE inputs "
                           "fc1_experts_weights .. fc2_act_block_scale, except router_weights, "
                           "and router_correction_bias)");
  }
  return Status::ok();
}

void add(std::vector<NamedTensor>* out, int ort_index, const TensorView& v) {
  if (v.present()) out->push_back({ort_input_name(ort_index), v});
}

}  // namespace

Status layer_from_parts(const std::map<std::string, std::string>& meta,
                        const std::vector<std::pair<std::string, TensorView>>& tensors,
                        LoadedLayer* l) {
  QMOE_RETURN_IF_ERROR(ort_attributes_from_map(meta, &l->attributes));
  LayerFileExtensions ext;
  QMOE_RETURN_IF_ERROR(parse_layer_extensions(meta, &ext));
  l->import_options.semantics = ext.semantics;
  if (ext.has_fp4_layout) {
    if (l->attributes.quant_type != "fp4" && l->attributes.quant_type != "nvfp4") {
      return Status::invalid(
          "metadata qmoe.fp4_layout applies to quant_type fp4 or nvfp4, got quant_type '" +
          l->attributes.quant_type + "'");
    }
    // For FP4, ORT's weights_prepacked says the same thing: 0 = N-packed, 1 = K-packed.
    l->attributes.weights_prepacked = ext.fp4_layout == Fp4Layout::kKPacked ? 1 : 0;
  }

  TensorView inputs[kNumOrtInputs];
  TensorView router_bias;
  QMOE_RETURN_IF_ERROR(collect_inputs(tensors, inputs, &router_bias));
  QMOE_RETURN_IF_ERROR(
      layer_from_ort(l->attributes, inputs, l->import_options, &l->spec, &l->weights));
  apply_layer_extensions(ext, &l->spec);
  if (router_bias.present() && l->spec.routing.method != RoutingMethod::kGroupedTopK) {
    return Status::invalid(std::string("tensor '") + kRouterCorrectionBiasName +
                           "' is used only by grouped_topk routing, but the layer routes with " +
                           routing_method_name(l->spec.routing.method));
  }
  l->weights.router_bias = router_bias;
  return check_layer(l->spec, l->weights);
}

Status load_layer_file(const std::string& path, LoadedLayer* out) {
  LoadedLayer l;
  QMOE_RETURN_IF_ERROR(SafetensorsFile::open(path, &l.file));
  std::vector<std::pair<std::string, TensorView>> tensors;
  for (const std::string& name : l.file->names()) tensors.emplace_back(name, *l.file->find(name));
  QMOE_RETURN_IF_ERROR(in_file(path, layer_from_parts(l.file->metadata(), tensors, &l)));
  *out = std::move(l);
  return Status::ok();
}

Status layer_file_metadata(const LayerSpec& spec, std::map<std::string, std::string>* metadata) {
  OrtQMoEAttributes attrs;
  QMOE_RETURN_IF_ERROR(ort_attributes_for_spec(spec, &attrs));
  *metadata = ort_attributes_to_map(attrs);
  for (const auto& kv : layer_extension_keys(spec)) (*metadata)[kv.first] = kv.second;
  return Status::ok();
}

Status save_layer_file(const std::string& path, const LayerSpec& spec, const LayerWeights& w) {
  QMOE_RETURN_IF_ERROR(in_file(path, check_layer(spec, w)));
  std::map<std::string, std::string> metadata;
  QMOE_RETURN_IF_ERROR(in_file(path, layer_file_metadata(spec, &metadata)));
  std::vector<NamedTensor> tensors;
  add(&tensors, kOrtFc1Weights, w.fc1.weight);
  add(&tensors, kOrtFc1Scales, w.fc1.scales);
  add(&tensors, kOrtFc1Bias, w.fc1.bias);
  add(&tensors, kOrtFc2Weights, w.fc2.weight);
  add(&tensors, kOrtFc2Scales, w.fc2.scales);
  add(&tensors, kOrtFc2Bias, w.fc2.bias);
  if (spec.has_fc3()) {
    add(&tensors, kOrtFc3Weights, w.fc3.weight);
    add(&tensors, kOrtFc3Scales, w.fc3.scales);
    add(&tensors, kOrtFc3Bias, w.fc3.bias);
    add(&tensors, kOrtFc3ZeroPoints, w.fc3.zero_points);
  }
  add(&tensors, kOrtFc1ZeroPoints, w.fc1.zero_points);
  add(&tensors, kOrtFc2ZeroPoints, w.fc2.zero_points);
  add(&tensors, kOrtFc1GlobalScale, w.fc1.global_scale);
  add(&tensors, kOrtFc2GlobalScale, w.fc2.global_scale);
  if (spec.routing.method == RoutingMethod::kGroupedTopK && w.router_bias.present()) {
    tensors.push_back({kRouterCorrectionBiasName, w.router_bias});
  }
  return write_safetensors(path, tensors, metadata);
}

// ---- input / output files ----

Status load_input_file(const std::string& path, LoadedInputs* out) {
  LoadedInputs l;
  QMOE_RETURN_IF_ERROR(SafetensorsFile::open(path, &l.file));
  for (const std::string& name : l.file->names()) {
    if (name != "input" && name != "router_probs" && name != "router_weights") {
      return Status::invalid(path + ": unexpected tensor '" + name +
                             "' (an input file holds input, router_probs and optionally "
                             "router_weights)");
    }
  }
  QMOE_RETURN_IF_ERROR(l.file->get("input", &l.inputs.input));
  QMOE_RETURN_IF_ERROR(l.file->get("router_probs", &l.inputs.router_logits));
  if (const TensorView* rw = l.file->find("router_weights")) l.inputs.router_weights = *rw;
  *out = std::move(l);
  return Status::ok();
}

Status save_input_file(const std::string& path, const RunInputs& in) {
  std::vector<NamedTensor> tensors = {{"input", in.input}, {"router_probs", in.router_logits}};
  if (in.router_weights.present()) tensors.push_back({"router_weights", in.router_weights});
  return write_safetensors(path, tensors);
}

Status save_output_file(const std::string& path, const TensorView& output) {
  return write_safetensors(path, {{"output", output}});
}

}  // namespace qmoe
