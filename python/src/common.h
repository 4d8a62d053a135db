// qmoe Python bindings: what the binding files share. Status -> exception, array <-> TensorView.
//
// Arrays cross the boundary as nanobind ndarrays (DLPack): numpy, torch and cupy arrays arrive
// without a copy, on the host or the device. Every array must be dense and row-major; a strided
// view is an error naming the argument rather than a silent copy, so that an output written by
// qmoe is always the caller's own memory.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <map>
#include <stdexcept>
#include <string>
#include <utility>

#include "qmoe/qmoe.h"

namespace qmoe_py {

namespace nb = nanobind;

// Thrown for a non-ok Status; registered as qmoe.Error (a RuntimeError) carrying Status text.
class StatusError : public std::runtime_error {
 public:
  explicit StatusError(const qmoe::Status& st)
      : std::runtime_error(st.to_string()), code_(st.code()) {}
  qmoe::StatusCode code() const { return code_; }

 private:
  qmoe::StatusCode code_;
};

inline void throw_if_error(const qmoe::Status& st) {
  if (!st.is_ok()) throw StatusError(st);
}

[[noreturn]] inline void throw_invalid(const std::string& msg) {
  throw StatusError(qmoe::Status::invalid(msg));
}

// Read-only input arrays (numpy arrays from a read-only buffer are accepted) and writable outputs.
using InArray = nb::ndarray<nb::ro>;
using OutArray = nb::ndarray<>;

// What the helpers below read of an array, whichever its constness.
struct ArrayInfo {
  const void* data;
  nb::dlpack::dtype dtype;
  size_t itemsize;
  size_t ndim;
  int64_t shape[8];
  int64_t strides[8];
  int device_type;
  int device_id;
};

template <class A>
ArrayInfo array_info(const A& a) {
  ArrayInfo r{a.data(), a.dtype(), a.itemsize(), a.ndim(), {}, {}, a.device_type(), a.device_id()};
  for (size_t i = 0; i < a.ndim() && i < 8; ++i) {
    r.shape[i] = static_cast<int64_t>(a.shape(i));
    r.strides[i] = a.stride(i);
  }
  return r;
}

// The DLPack element type of an array as a qmoe DType; throws naming `what` when qmoe has none.
qmoe::DType dtype_of(const ArrayInfo& a, const char* what);

// A view of a dense row-major array. `dtype` overrides the DLPack type when the caller passes
// raw bytes of a type DLPack cannot name (float8, bf16 held as uint16); its size must match.
qmoe::TensorView view_of(const ArrayInfo& a, const char* what);
qmoe::TensorView view_of(const ArrayInfo& a, qmoe::DType dtype, const char* what);

// Throws unless `a` is dense and row-major (strides in elements, as DLPack gives them).
void check_dense(const ArrayInfo& a, const char* what);

// Named tensors as Python passes them: name -> (array, dtype name or "" for the array's own type).
// The dtype name lets raw bytes stand for types DLPack cannot carry everywhere (float8, bf16).
using NamedArrays = std::map<std::string, std::pair<InArray, std::string>>;

// The view of one named tensor, its dtype override applied.
qmoe::TensorView named_view(const std::string& name, const std::pair<InArray, std::string>& t);

void bind_spec(nb::module_& m);
void bind_layer(nb::module_& m);
void bind_quantize(nb::module_& m);

}  // namespace qmoe_py
