// qmoe Python bindings: a prepared layer. It owns everything the C++ layer borrows (a copy of the
// weights, or the mapped layer file) so that Python can drop the arrays it prepared from.
//
// run() takes DLPack arrays (numpy, torch, cupy; host or device) and checks where they live;
// _run_ptr() takes raw addresses for the torch operator, which has checked its tensors already
// and wants the shortest path to the C++ call. Both release the GIL while the layer runs, so
// several Python threads may run one layer at once (each with its own workspace and stream).
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common.h"

namespace qmoe_py {

namespace {

struct alignas(64) Line {
  char bytes[64];
};

// The weight tensor a layer-file / ORT name stands for; nullptr for names that are not weights.
qmoe::TensorView* weight_slot(qmoe::LayerWeights& w, const std::string& name) {
  struct Fc {
    const char* prefix;
    qmoe::FcWeights* fc;
  } fcs[] = {{"fc1_", &w.fc1}, {"fc2_", &w.fc2}, {"fc3_", &w.fc3}};
  for (const Fc& f : fcs) {
    const std::string p = f.prefix;
    if (name == p + "experts_weights") return &f.fc->weight;
    if (name == p + "scales") return &f.fc->scales;
    if (name == p + "experts_bias") return &f.fc->bias;
    if (name == p + "zero_points") return &f.fc->zero_points;
    if (name == p + "global_scale") return &f.fc->global_scale;
  }
  if (name == qmoe::kRouterCorrectionBiasName) return &w.router_bias;
  return nullptr;
}

qmoe::PrepareOptions make_options(int num_threads, int device, size_t max_dequant_bytes,
                                  const std::string& tune_file, const std::string& act_quant) {
  qmoe::PrepareOptions o;
  o.act_quant = act_quant;
  o.num_threads = num_threads;
  o.device = device;
  o.max_dequant_bytes = max_dequant_bytes;
  o.tune_file = tune_file;
  return o;
}

}  // namespace

class Layer {
 public:
  // From a spec and named weight tensors (host arrays, copied).
  static Layer* prepare(const qmoe::LayerSpec& spec, const NamedArrays& tensors,
                        qmoe::BackendKind backend, int num_threads, int device,
                        size_t max_dequant_bytes, const std::string& tune_file,
                        const std::string& act_quant) {
    std::unique_ptr<Layer> l(new Layer());
    l->spec_ = spec;
    for (const auto& [name, t] : tensors) {
      qmoe::TensorView* slot = weight_slot(l->weights_, name);
      if (slot == nullptr) {
        throw_invalid(name +
                      ": not a layer weight name (fc1_experts_weights, fc1_scales, "
                      "fc1_experts_bias, fc1_zero_points, fc1_global_scale, the same for "
                      "fc2_ and fc3_, router_correction_bias)");
      }
      qmoe::TensorView v = named_view(name, t);
      const size_t bytes = v.bytes();
      l->storage_.emplace_back(new Line[bytes / sizeof(Line) + 1]);
      std::memcpy(l->storage_.back().get(), v.data, bytes);
      v.data = l->storage_.back().get();
      *slot = v;
    }
    l->prepare_now(backend, make_options(num_threads, device, max_dequant_bytes, tune_file, act_quant));
    return l.release();
  }

  // From a layer file (docs/layer-file.md); act_dtype overrides the file's activation dtype.
  static Layer* from_file(const std::string& path, qmoe::BackendKind backend,
                          std::optional<qmoe::DType> act_dtype, int num_threads, int device,
                          size_t max_dequant_bytes, const std::string& tune_file,
                          const std::string& act_quant) {
    std::unique_ptr<Layer> l(new Layer());
    l->file_ = std::make_unique<qmoe::LoadedLayer>();
    throw_if_error(qmoe::load_layer_file(path, l->file_.get()));
    l->spec_ = l->file_->spec;
    if (act_dtype) l->spec_.act_dtype = *act_dtype;
    l->weights_ = l->file_->weights;
    l->prepare_now(backend, make_options(num_threads, device, max_dequant_bytes, tune_file, act_quant));
    return l.release();
  }

  const qmoe::LayerSpec& spec() const { return spec_; }
  qmoe::BackendKind backend() const { return layer_->backend(); }
  int device() const { return device_; }
  size_t workspace_size(int64_t max_tokens) const {
    if (max_tokens < 0)
      throw_invalid("max_tokens: expected >= 0, got " + std::to_string(max_tokens));
    return layer_->workspace_size(max_tokens);
  }
  std::string dispatch_choice(int64_t tokens) const { return layer_->dispatch_choice(tokens); }
  std::vector<std::string> dispatch_candidates(int64_t tokens) const {
    return layer_->dispatch_candidates(tokens);
  }
  void apply_tune_file(const std::string& path) { throw_if_error(layer_->apply_tune_file(path)); }
  void force_dispatch(const std::string& choice) { throw_if_error(layer_->force_dispatch(choice)); }
  void take_deferred_error() {
    qmoe::Status st;
    {
      nb::gil_scoped_release release;
      st = layer_->take_deferred_error();
    }
    throw_if_error(st);
  }

  void run(const InArray& input, const InArray& router_logits, const OutArray& out,
           const OutArray& workspace, const std::optional<InArray>& router_weights,
           uintptr_t stream) {
    qmoe::RunInputs in;
    in.input = device_view(array_info(input), "input");
    in.router_logits = device_view(array_info(router_logits), "router_logits");
    if (router_weights)
      in.router_weights = device_view(array_info(*router_weights), "router_weights");
    const qmoe::TensorView o = device_view(array_info(out), "out");
    qmoe::MutableTensorView ov;
    ov.data = const_cast<void*>(o.data);
    ov.dtype = o.dtype;
    ov.rank = o.rank;
    std::memcpy(ov.dims, o.dims, sizeof(ov.dims));
    const ArrayInfo ws = array_info(workspace);
    check_place(ws, "workspace");
    check_dense(ws, "workspace");
    size_t ws_bytes = ws.itemsize;
    for (size_t i = 0; i < ws.ndim; ++i) ws_bytes *= static_cast<size_t>(ws.shape[i]);
    run_views(in, ov, const_cast<void*>(ws.data), ws_bytes, stream);
  }

  // The torch operator's path: contiguous [T, H] input and output, [T, E] logits (and router
  // weights), already checked for device and dtype by the caller.
  void run_ptr(int64_t tokens, uintptr_t x, int x_dtype, uintptr_t logits, int logits_dtype,
               uintptr_t router_weights, int rw_dtype, uintptr_t out, uintptr_t workspace,
               size_t workspace_bytes, uintptr_t stream) {
    const int64_t h = spec_.hidden, e = spec_.num_experts;
    qmoe::RunInputs in;
    in.input =
        qmoe::TensorView(reinterpret_cast<const void*>(x), qmoe::DType(x_dtype), {tokens, h});
    in.router_logits = qmoe::TensorView(reinterpret_cast<const void*>(logits),
                                        qmoe::DType(logits_dtype), {tokens, e});
    if (router_weights) {
      in.router_weights = qmoe::TensorView(reinterpret_cast<const void*>(router_weights),
                                           qmoe::DType(rw_dtype), {tokens, e});
    }
    qmoe::MutableTensorView ov(reinterpret_cast<void*>(out), qmoe::DType(x_dtype), {tokens, h});
    run_views(in, ov, reinterpret_cast<void*>(workspace), workspace_bytes, stream);
  }

  // The fp64 oracle on this layer's weights (host arrays): [T, H] doubles.
  nb::ndarray<nb::numpy, double> reference(const InArray& input, const InArray& router_logits,
                                           const std::optional<InArray>& router_weights) {
    qmoe::RunInputs in;
    in.input = host_view(array_info(input), "input");
    in.router_logits = host_view(array_info(router_logits), "router_logits");
    if (router_weights)
      in.router_weights = host_view(array_info(*router_weights), "router_weights");
    auto* out = new std::vector<double>();
    nb::capsule owner(out, [](void* p) noexcept { delete static_cast<std::vector<double>*>(p); });
    qmoe::Status st;
    {
      nb::gil_scoped_release release;
      st = qmoe::reference_forward(spec_, weights_, in, out);
    }
    throw_if_error(st);
    const size_t t = out->size() / static_cast<size_t>(spec_.hidden);
    return nb::ndarray<nb::numpy, double>(out->data(), {t, static_cast<size_t>(spec_.hidden)},
                                          owner);
  }

 private:
  Layer() = default;

  void prepare_now(qmoe::BackendKind backend, const qmoe::PrepareOptions& options) {
    device_ = options.device;
    qmoe::Status st;
    {
      nb::gil_scoped_release release;
      st = qmoe::prepare_layer(backend, spec_, weights_, options, &layer_);
    }
    throw_if_error(st);
  }

  // Throws unless the array lives where this layer runs.
  void check_place(const ArrayInfo& a, const char* what) const {
    const bool cuda = layer_->backend() == qmoe::BackendKind::kCuda;
    const int want = cuda ? nb::device::cuda::value : nb::device::cpu::value;
    if (a.device_type != want || (cuda && a.device_id != device_)) {
      throw_invalid(std::string(what) + ": expected an array on " +
                    (cuda ? "cuda:" + std::to_string(device_) : std::string("the CPU")) +
                    " (where the layer was prepared), got one on device type " +
                    std::to_string(a.device_type) + " id " + std::to_string(a.device_id));
    }
  }
  qmoe::TensorView device_view(const ArrayInfo& a, const char* what) const {
    check_place(a, what);
    return view_of(a, what);
  }
  qmoe::TensorView host_view(const ArrayInfo& a, const char* what) const {
    if (a.device_type != nb::device::cpu::value) {
      throw_invalid(std::string(what) + ": expected a host (CPU) array");
    }
    return view_of(a, what);
  }

  void run_views(const qmoe::RunInputs& in, const qmoe::MutableTensorView& out, void* ws,
                 size_t ws_bytes, uintptr_t stream) {
    // The CUDA layer computes in spec.act_dtype; an input of another type would be misread.
    if (in.input.dtype != spec_.act_dtype) {
      throw_invalid(std::string("input: expected dtype ") + qmoe::dtype_name(spec_.act_dtype) +
                    " (the layer's act_dtype), got " + qmoe::dtype_name(in.input.dtype));
    }
    qmoe::Status st;
    {
      nb::gil_scoped_release release;
      st = layer_->run(in, out, ws, ws_bytes, reinterpret_cast<void*>(stream));
    }
    throw_if_error(st);
  }

  qmoe::LayerSpec spec_;
  qmoe::LayerWeights weights_;
  std::vector<std::unique_ptr<Line[]>> storage_;
  std::unique_ptr<qmoe::LoadedLayer> file_;
  std::unique_ptr<qmoe::PreparedLayer> layer_;
  int device_ = 0;
};

// Writes a layer file from a spec and named weight tensors (host arrays).
void save_layer_file(const std::string& path, const qmoe::LayerSpec& spec,
                     const NamedArrays& tensors) {
  qmoe::LayerWeights w;
  for (const auto& [name, t] : tensors) {
    qmoe::TensorView* slot = weight_slot(w, name);
    if (slot == nullptr) throw_invalid(name + ": not a layer weight name");
    *slot = named_view(name, t);
  }
  throw_if_error(qmoe::check_layer(spec, w));
  throw_if_error(qmoe::save_layer_file(path, spec, w));
}

void bind_layer(nb::module_& m) {
  m.def("save_layer_file", &save_layer_file, nb::arg("path"), nb::arg("spec"), nb::arg("tensors"));
  m.def("backend_available", &qmoe::backend_available, nb::arg("backend"));
  nb::class_<Layer>(m, "Layer")
      .def_static("prepare", &Layer::prepare, nb::arg("spec"), nb::arg("tensors"),
                  nb::arg("backend"), nb::arg("num_threads") = 0, nb::arg("device") = 0,
                  nb::arg("max_dequant_bytes") = 0, nb::arg("tune_file") = "",
                  nb::arg("act_quant") = "", nb::rv_policy::take_ownership)
      .def_static("from_file", &Layer::from_file, nb::arg("path"), nb::arg("backend"),
                  nb::arg("act_dtype") = nb::none(), nb::arg("num_threads") = 0,
                  nb::arg("device") = 0, nb::arg("max_dequant_bytes") = 0,
                  nb::arg("tune_file") = "", nb::arg("act_quant") = "",
                  nb::rv_policy::take_ownership)
      // A copy: a prepared layer's spec does not change.
      .def_prop_ro("spec", [](const Layer& l) { return qmoe::LayerSpec(l.spec()); })
      .def_prop_ro("backend", &Layer::backend)
      .def_prop_ro("device", &Layer::device)
      .def("workspace_size", &Layer::workspace_size, nb::arg("max_tokens"))
      .def("dispatch_choice", &Layer::dispatch_choice, nb::arg("tokens"))
      .def("dispatch_candidates", &Layer::dispatch_candidates, nb::arg("tokens"))
      .def("apply_tune_file", &Layer::apply_tune_file, nb::arg("path"))
      .def("force_dispatch", &Layer::force_dispatch, nb::arg("choice"))
      .def("take_deferred_error", &Layer::take_deferred_error)
      .def("run", &Layer::run, nb::arg("input"), nb::arg("router_logits"), nb::arg("out"),
           nb::arg("workspace"), nb::arg("router_weights") = nb::none(), nb::arg("stream") = 0)
      .def("_run_ptr", &Layer::run_ptr)
      .def("reference", &Layer::reference, nb::arg("input"), nb::arg("router_logits"),
           nb::arg("router_weights") = nb::none());
}

}  // namespace qmoe_py
