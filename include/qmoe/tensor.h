// qmoe: element types and non-owning tensor views. Views carry a shape so that every entry point
// can check what it was handed against what the layer expects, and name the argument when they
// differ.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace qmoe {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kF64,
  kU8,
  kI8,
  kI32,
  kF8E4M3,  // float8e4m3fn: no infinities, 0x7F/0xFF are NaN, max 448
  kF8E8M0,  // float8e8m0fnu: 2^(code-127), 0xFF is NaN
  // Checkpoint metadata (token ids, packed codes, shapes): read and passed through, never computed
  // with.
  kI64,
  kI16,
  kU16,
  kU32,
  kU64,
  kBool,
  kF8E5M2,
};

size_t dtype_size(DType t);
const char* dtype_name(DType t);  // "f32", "bf16", "f8e4m3", ...
// Parses dtype_name() spellings; false when unknown.
bool parse_dtype(const std::string& name, DType* out);

constexpr int kMaxRank = 4;

// A borrowed, dense, row-major tensor. data == nullptr means "absent" (an optional input not
// given), except for an empty tensor: one with a shape (rank >= 1) and a zero dimension may carry
// a null pointer, as torch and DLPack give empty tensors one; given() counts it as given.
struct TensorView {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int rank = 0;
  int64_t dims[kMaxRank] = {0, 0, 0, 0};

  TensorView() = default;
  TensorView(const void* d, DType t, std::initializer_list<int64_t> shape);

  bool present() const { return data != nullptr; }
  bool given() const { return data != nullptr || (rank >= 1 && numel() == 0); }
  int64_t dim(int i) const { return dims[i]; }
  int64_t numel() const;
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  std::string shape_string() const;  // "[8, 1536, 16]"
};

// The same, writable (outputs).
struct MutableTensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  int rank = 0;
  int64_t dims[kMaxRank] = {0, 0, 0, 0};

  MutableTensorView() = default;
  MutableTensorView(void* d, DType t, std::initializer_list<int64_t> shape);

  int64_t numel() const;
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  TensorView as_const() const;
};

std::string shape_string(const int64_t* dims, int rank);

}  // namespace qmoe
