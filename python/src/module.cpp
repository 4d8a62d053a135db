// qmoe Python bindings: the _qmoe extension module. Thin by design: every check and every number
// comes from the C++ library; python/qmoe/ holds the Pythonic layer (names, defaults, torch).
#include <string>

#include "common.h"

namespace qmoe_py {

namespace {

// DLPack type codes (dlpack.h DLDataTypeCode): 0 int, 1 uint, 2 float, 4 bfloat.
constexpr uint8_t kDlInt = 0, kDlUInt = 1, kDlFloat = 2, kDlBfloat = 4;

bool dtype_from_dl(const nb::dlpack::dtype& t, qmoe::DType* out) {
  if (t.lanes != 1) return false;
  if (t.code == kDlFloat && t.bits == 32)
    *out = qmoe::DType::kF32;
  else if (t.code == kDlFloat && t.bits == 16)
    *out = qmoe::DType::kF16;
  else if (t.code == kDlBfloat && t.bits == 16)
    *out = qmoe::DType::kBF16;
  else if (t.code == kDlFloat && t.bits == 64)
    *out = qmoe::DType::kF64;
  else if (t.code == kDlUInt && t.bits == 8)
    *out = qmoe::DType::kU8;
  else if (t.code == kDlInt && t.bits == 8)
    *out = qmoe::DType::kI8;
  else if (t.code == kDlInt && t.bits == 32)
    *out = qmoe::DType::kI32;
  else
    return false;
  return true;
}

}  // namespace

qmoe::DType dtype_of(const ArrayInfo& a, const char* what) {
  qmoe::DType d;
  const nb::dlpack::dtype t = a.dtype;
  if (!dtype_from_dl(t, &d)) {
    throw_invalid(std::string(what) + ": unsupported element type (DLPack code " +
                  std::to_string(t.code) + ", " + std::to_string(t.bits) +
                  " bits); expected f32, f16, bf16, f64, u8, i8 or i32");
  }
  return d;
}

void check_dense(const ArrayInfo& a, const char* what) {
  for (size_t i = 0; i < a.ndim; ++i) {
    if (a.shape[i] == 0) return;  // empty: no element to misplace, whatever the strides say
  }
  int64_t expect = 1;
  for (size_t i = a.ndim; i-- > 0;) {
    if (a.shape[i] != 1 && a.strides[i] != expect) {
      throw_invalid(std::string(what) +
                    ": expected a contiguous (dense, row-major) array; got strides that are "
                    "not; pass a contiguous copy");
    }
    expect *= a.shape[i];
  }
}

qmoe::TensorView view_of(const ArrayInfo& a, qmoe::DType dtype, const char* what) {
  if (a.ndim > static_cast<size_t>(qmoe::kMaxRank)) {
    throw_invalid(std::string(what) + ": expected at most " + std::to_string(qmoe::kMaxRank) +
                  " dimensions, got " + std::to_string(a.ndim));
  }
  if (a.itemsize != qmoe::dtype_size(dtype)) {
    throw_invalid(std::string(what) + ": elements of " + std::to_string(a.itemsize) +
                  " bytes cannot hold dtype " + qmoe::dtype_name(dtype));
  }
  check_dense(a, what);
  qmoe::TensorView v;
  v.data = a.data;
  v.dtype = dtype;
  v.rank = static_cast<int>(a.ndim);
  for (int i = 0; i < v.rank; ++i) v.dims[i] = a.shape[i];
  // An empty array may have no address; keep it "present" so the checks report its shape. Nothing
  // reads an empty tensor's bytes.
  alignas(256) static const char kEmpty[256] = {};
  if (v.data == nullptr) v.data = kEmpty;
  return v;
}

qmoe::TensorView view_of(const ArrayInfo& a, const char* what) {
  return view_of(a, dtype_of(a, what), what);
}

qmoe::TensorView named_view(const std::string& name, const std::pair<InArray, std::string>& t) {
  const ArrayInfo a = array_info(t.first);
  if (a.device_type != nb::device::cpu::value) {
    throw_invalid(name + ": expected a host (CPU) array; weights are read on the host at prepare");
  }
  if (t.second.empty()) return view_of(a, name.c_str());
  qmoe::DType d;
  if (!qmoe::parse_dtype(t.second, &d)) throw_invalid(name + ": unknown dtype '" + t.second + "'");
  return view_of(a, d, name.c_str());
}

}  // namespace qmoe_py

NB_MODULE(_qmoe, m) {
  using namespace qmoe_py;
  m.doc() = "qmoe: quantized Mixture-of-Experts layers (C++ core bindings)";
  nb::exception<StatusError>(m, "Error", PyExc_RuntimeError);
  m.attr("version") = "0.1.0";
#ifdef QMOE_WITH_CUDA
  m.attr("built_with_cuda") = true;
#else
  m.attr("built_with_cuda") = false;
#endif
  bind_spec(m);
  bind_quantize(m);
  bind_layer(m);
}
