// qmoe Python bindings: the host quantizers (qmoe/quantize.h). quantize_fc turns fp32 weights
// [E, N, K] into ORT's raw tensors; dequantize_fc reads them back to fp32 (what a plain-torch
// reference runs on). Tensors travel as {"weight", "scales", "zero_points", "global_scale"} ->
// (numpy array, dtype name): bf16 and float8 elements are held in uint16 / uint8 arrays.
#include <nanobind/stl/map.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "common.h"

namespace qmoe_py {

namespace {

using Pair = std::pair<nb::object, std::string>;

// A numpy array owning a copy of `bytes`, with the element type numpy has for `dtype` (or an
// unsigned integer of its size).
nb::object numpy_array(const void* bytes, qmoe::DType dtype, const int64_t* dims, int rank) {
  size_t n = 1;
  size_t shape[qmoe::kMaxRank];
  for (int i = 0; i < rank; ++i) {
    shape[i] = static_cast<size_t>(dims[i]);
    n *= shape[i];
  }
  const size_t size = qmoe::dtype_size(dtype);
  auto* buf = new std::vector<uint8_t>(n * size);
  if (n) std::memcpy(buf->data(), bytes, n * size);
  nb::capsule owner(buf, [](void* p) noexcept { delete static_cast<std::vector<uint8_t>*>(p); });
  nb::dlpack::dtype t;
  switch (dtype) {
    case qmoe::DType::kF32:
      t = nb::dtype<float>();
      break;
    case qmoe::DType::kF16:
      t = {uint8_t(nb::dlpack::dtype_code::Float), 16, 1};
      break;
    case qmoe::DType::kF64:
      t = nb::dtype<double>();
      break;
    case qmoe::DType::kI8:
      t = nb::dtype<int8_t>();
      break;
    case qmoe::DType::kI32:
      t = nb::dtype<int32_t>();
      break;
    default:  // u8, bf16, float8: unsigned integers of their size
      t = {uint8_t(nb::dlpack::dtype_code::UInt), uint8_t(8 * size), 1};
  }
  nb::ndarray<nb::numpy> a(buf->data(), static_cast<size_t>(rank), shape, owner, nullptr, t);
  return a.cast();
}

std::map<std::string, Pair> quantize(const qmoe::FcFormat& format, const InArray& w) {
  const ArrayInfo a = array_info(w);
  if (a.device_type != nb::device::cpu::value) throw_invalid("w: expected a host (CPU) array");
  const qmoe::TensorView v = view_of(a, "w");
  if (v.dtype != qmoe::DType::kF32 || v.rank != 3) {
    throw_invalid(std::string("w: expected f32 [experts, n, k], got ") + qmoe::dtype_name(v.dtype) +
                  " " + v.shape_string());
  }
  qmoe::QuantizedFc q;
  qmoe::Status st;
  {
    nb::gil_scoped_release release;
    st = qmoe::quantize_fc(format, static_cast<const float*>(v.data), v.dims[0], v.dims[1],
                           v.dims[2], &q);
  }
  throw_if_error(st);
  const qmoe::FcWeights fw = q.view();
  std::map<std::string, Pair> out;
  auto put = [&](const char* name, const qmoe::TensorView& t) {
    if (t.present()) {
      out[name] = {numpy_array(t.data, t.dtype, t.dims, t.rank), qmoe::dtype_name(t.dtype)};
    }
  };
  put("weight", fw.weight);
  put("scales", fw.scales);
  put("zero_points", fw.zero_points);
  put("global_scale", fw.global_scale);
  return out;
}

nb::object dequantize(const qmoe::FcFormat& format, const NamedArrays& tensors, int64_t experts,
                      int64_t n, int64_t k) {
  qmoe::FcWeights fw;
  for (const auto& [name, t] : tensors) {
    qmoe::TensorView v = named_view(name, t);
    if (name == "weight")
      fw.weight = v;
    else if (name == "scales")
      fw.scales = v;
    else if (name == "zero_points")
      fw.zero_points = v;
    else if (name == "global_scale")
      fw.global_scale = v;
    else
      throw_invalid(name + ": expected weight, scales, zero_points or global_scale");
  }
  // dequantize_fc checks the format, the sizes and every tensor's shape before reading.
  if (experts < 1 || n < 1 || k < 1 || experts * n * k > (int64_t(1) << 34)) {
    throw_invalid("experts, n, k: expected positive sizes of at most 2^34 values in all");
  }
  std::vector<float> out(static_cast<size_t>(experts * n * k));
  throw_if_error(qmoe::dequantize_fc(format, fw, experts, n, k, out.data()));
  const int64_t dims[3] = {experts, n, k};
  return numpy_array(out.data(), qmoe::DType::kF32, dims, 3);
}

}  // namespace

void bind_quantize(nb::module_& m) {
  m.def("quantize_fc", &quantize, nb::arg("format"), nb::arg("w"),
        "Quantizes fp32 weights [experts, n, k] (y = x W^T) into ORT's raw tensors.");
  m.def("dequantize_fc", &dequantize, nb::arg("format"), nb::arg("tensors"), nb::arg("experts"),
        nb::arg("n"), nb::arg("k"), "Dequantizes raw FC tensors to fp32 [experts, n, k].");
}

}  // namespace qmoe_py
