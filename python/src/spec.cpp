// qmoe Python bindings: the spec types. Enums take the names the C++ library prints (format_info
// names, routing_method_name, activation_name, dtype_name), so a Python string and a C++ name are
// the same word. Structs expose their fields read-write; nested structs are references into
// their parent (spec.routing.top_k = 8 edits spec).
#include <nanobind/stl/map.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>

#include <map>
#include <string>
#include <vector>

#include "common.h"

namespace qmoe_py {

namespace {

void bind_enums(nb::module_& m) {
  nb::enum_<qmoe::WeightFormat> wf(m, "WeightFormat");
#define QMOE_X(id, name, ...) wf.value(name, qmoe::WeightFormat::id);
  QMOE_WEIGHT_FORMATS(QMOE_X)
#undef QMOE_X

  nb::enum_<qmoe::DType>(m, "DType")
      .value("f32", qmoe::DType::kF32)
      .value("f16", qmoe::DType::kF16)
      .value("bf16", qmoe::DType::kBF16)
      .value("f64", qmoe::DType::kF64)
      .value("u8", qmoe::DType::kU8)
      .value("i8", qmoe::DType::kI8)
      .value("i32", qmoe::DType::kI32)
      .value("f8e4m3", qmoe::DType::kF8E4M3)
      .value("f8e8m0", qmoe::DType::kF8E8M0);

  nb::enum_<qmoe::Activation>(m, "Activation")
      .value("identity", qmoe::Activation::kIdentity)
      .value("relu", qmoe::Activation::kRelu)
      .value("gelu", qmoe::Activation::kGelu)
      .value("silu", qmoe::Activation::kSilu)
      .value("swiglu", qmoe::Activation::kSwiGlu)
      .value("geglu", qmoe::Activation::kGeGlu);

  nb::enum_<qmoe::GluLayout>(m, "GluLayout")
      .value("separate_fc3", qmoe::GluLayout::kSeparateFc3)
      .value("interleaved", qmoe::GluLayout::kInterleaved)
      .value("concatenated", qmoe::GluLayout::kConcatenated);

  nb::enum_<qmoe::RoutingMethod>(m, "RoutingMethod")
      .value("softmax_topk", qmoe::RoutingMethod::kSoftmaxTopK)
      .value("topk_softmax", qmoe::RoutingMethod::kTopKSoftmax)
      .value("sparse_mixer", qmoe::RoutingMethod::kSparseMixer)
      .value("grouped_topk", qmoe::RoutingMethod::kGroupedTopK)
      .value("topk_sigmoid", qmoe::RoutingMethod::kTopKSigmoid);

  nb::enum_<qmoe::TieBreak>(m, "TieBreak")
      .value("lower", qmoe::TieBreak::kLowerIndex)
      .value("higher", qmoe::TieBreak::kHigherIndex);

  nb::enum_<qmoe::SharedWeight>(m, "SharedWeight")
      .value("sigmoid", qmoe::SharedWeight::kSigmoid)
      .value("one", qmoe::SharedWeight::kOne);

  nb::enum_<qmoe::CombineMode>(m, "CombineMode")
      .value("scale_output", qmoe::CombineMode::kScaleOutput)
      .value("scale_input", qmoe::CombineMode::kScaleInput);

  nb::enum_<qmoe::Fp4Layout>(m, "Fp4Layout")
      .value("n_packed", qmoe::Fp4Layout::kNPacked)
      .value("k_packed", qmoe::Fp4Layout::kKPacked);

  nb::enum_<qmoe::BackendKind>(m, "Backend")
      .value("cpu", qmoe::BackendKind::kCpu)
      .value("cuda", qmoe::BackendKind::kCuda);

  nb::enum_<qmoe::OrtSemantics>(m, "OrtSemantics")
      .value("cuda", qmoe::OrtSemantics::kCuda)
      .value("cpu", qmoe::OrtSemantics::kCpu);
}

void bind_structs(nb::module_& m) {
  nb::class_<qmoe::FcFormat>(m, "FcFormat")
      .def(nb::init<>())
      .def_rw("format", &qmoe::FcFormat::format)
      .def_rw("block_size", &qmoe::FcFormat::block_size)
      .def_rw("zero_points", &qmoe::FcFormat::zero_points)
      .def_rw("scale_dtype", &qmoe::FcFormat::scale_dtype)
      .def_rw("fp4_layout", &qmoe::FcFormat::fp4_layout)
      .def("__repr__", [](const qmoe::FcFormat& f) { return "FcFormat(" + f.to_string() + ")"; });
  m.def("default_fc_format", &qmoe::default_fc_format, nb::arg("format"),
        "The natural FcFormat of a format: default block, symmetric, native scale dtype.");

  nb::class_<qmoe::ActivationSpec>(m, "ActivationSpec")
      .def(nb::init<>())
      .def_rw("kind", &qmoe::ActivationSpec::kind)
      .def_rw("glu", &qmoe::ActivationSpec::glu)
      .def_rw("alpha", &qmoe::ActivationSpec::alpha)
      .def_rw("beta", &qmoe::ActivationSpec::beta)
      .def_rw("limit", &qmoe::ActivationSpec::limit)
      .def_rw("limit_after_activation", &qmoe::ActivationSpec::limit_after_activation)
      .def_prop_ro("gated", &qmoe::ActivationSpec::gated);

  nb::class_<qmoe::RoutingSpec>(m, "RoutingSpec")
      .def(nb::init<>())
      .def_rw("method", &qmoe::RoutingSpec::method)
      .def_rw("top_k", &qmoe::RoutingSpec::top_k)
      .def_rw("normalize", &qmoe::RoutingSpec::normalize)
      .def_rw("ties", &qmoe::RoutingSpec::ties)
      .def_rw("num_shared", &qmoe::RoutingSpec::num_shared)
      .def_rw("shared_weight", &qmoe::RoutingSpec::shared_weight)
      .def_rw("sparse_mixer_eps", &qmoe::RoutingSpec::sparse_mixer_eps)
      .def_rw("n_group", &qmoe::RoutingSpec::n_group)
      .def_rw("topk_group", &qmoe::RoutingSpec::topk_group)
      .def_rw("routed_scaling_factor", &qmoe::RoutingSpec::routed_scaling_factor)
      .def_rw("combine", &qmoe::RoutingSpec::combine);

  nb::class_<qmoe::LayerSpec>(m, "LayerSpec")
      .def(nb::init<>())
      .def_rw("hidden", &qmoe::LayerSpec::hidden)
      .def_rw("inter", &qmoe::LayerSpec::inter)
      .def_rw("num_experts", &qmoe::LayerSpec::num_experts)
      .def_rw("first_expert", &qmoe::LayerSpec::first_expert)
      .def_rw("local_experts", &qmoe::LayerSpec::local_experts)
      .def_prop_ro("weight_experts", &qmoe::LayerSpec::weight_experts)
      .def_rw("activation", &qmoe::LayerSpec::activation)
      .def_rw("routing", &qmoe::LayerSpec::routing)
      .def_rw("fc1", &qmoe::LayerSpec::fc1)
      .def_rw("fc2", &qmoe::LayerSpec::fc2)
      .def_rw("fc3", &qmoe::LayerSpec::fc3)
      .def_rw("has_fc1_bias", &qmoe::LayerSpec::has_fc1_bias)
      .def_rw("has_fc2_bias", &qmoe::LayerSpec::has_fc2_bias)
      .def_rw("has_fc3_bias", &qmoe::LayerSpec::has_fc3_bias)
      .def_rw("act_dtype", &qmoe::LayerSpec::act_dtype)
      .def_prop_ro("has_fc3", &qmoe::LayerSpec::has_fc3)
      .def_prop_ro("fc1_rows", &qmoe::LayerSpec::fc1_rows)
      .def_prop_ro("slots", &qmoe::LayerSpec::slots)
      .def(
          "check", [](const qmoe::LayerSpec& s) { throw_if_error(qmoe::check_spec(s)); },
          "Raises qmoe.Error unless the spec alone is valid (shapes, attributes, formats).")
      .def("flops", &qmoe::layer_flops, nb::arg("tokens"))
      .def("expert_bytes", &qmoe::expert_bytes);
}

// Builds a spec from ORT QMoE attributes (strings, as in a layer file's metadata) and the
// shapes of ORT's input tensors (name -> array; the arrays are only looked at, not kept).
qmoe::LayerSpec spec_from_ort(const std::map<std::string, std::string>& attributes,
                              const NamedArrays& tensors, qmoe::OrtSemantics semantics) {
  qmoe::OrtQMoEAttributes attrs;
  throw_if_error(qmoe::ort_attributes_from_map(attributes, &attrs));
  std::vector<qmoe::TensorView> inputs(qmoe::kNumOrtInputs);
  for (const auto& [name, arr] : tensors) {
    int index = -1;
    for (int i = 0; i < qmoe::kNumOrtInputs; ++i) {
      if (name == qmoe::ort_input_name(i)) index = i;
    }
    if (index < 0) throw_invalid(name + ": not an ORT QMoE input name");
    // The views only carry shapes and dtypes here; float8 tensors arrive as bytes.
    inputs[index] = named_view(name, arr);
  }
  qmoe::OrtImportOptions options;
  options.semantics = semantics;
  qmoe::LayerSpec spec;
  qmoe::LayerWeights weights;
  throw_if_error(qmoe::layer_from_ort(attrs, inputs.data(), options, &spec, &weights));
  return spec;
}

}  // namespace

void bind_spec(nb::module_& m) {
  bind_enums(m);
  bind_structs(m);
  m.def("spec_from_ort", &spec_from_ort, nb::arg("attributes"), nb::arg("tensors"),
        nb::arg("semantics") = qmoe::OrtSemantics::kCuda);
  m.def("layer_file_metadata", [](const qmoe::LayerSpec& spec) {
    std::map<std::string, std::string> md;
    throw_if_error(qmoe::layer_file_metadata(spec, &md));
    return md;
  });
  m.def("quantization_error_budget", &qmoe::quantization_error_budget, nb::arg("format"));
}

}  // namespace qmoe_py
