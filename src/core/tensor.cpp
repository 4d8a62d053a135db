#include "qmoe/tensor.h"

#include <cstring>

namespace qmoe {

namespace {
struct DTypeEntry {
  DType type;
  const char* name;
  size_t size;
};
constexpr DTypeEntry kDTypes[] = {
    {DType::kF32, "f32", 4},       {DType::kF16, "f16", 2},       {DType::kBF16, "bf16", 2},
    {DType::kF64, "f64", 8},       {DType::kU8, "u8", 1},         {DType::kI8, "i8", 1},
    {DType::kI32, "i32", 4},       {DType::kF8E4M3, "f8e4m3", 1}, {DType::kF8E8M0, "f8e8m0", 1},
    {DType::kI64, "i64", 8},       {DType::kI16, "i16", 2},       {DType::kU16, "u16", 2},
    {DType::kU32, "u32", 4},       {DType::kU64, "u64", 8},       {DType::kBool, "bool", 1},
    {DType::kF8E5M2, "f8e5m2", 1},
};

template <typename View>
void fill_shape(View* v, std::initializer_list<int64_t> shape) {
  v->rank = static_cast<int>(shape.size() > kMaxRank ? kMaxRank : shape.size());
  int i = 0;
  for (int64_t d : shape) {
    if (i == kMaxRank) break;
    v->dims[i++] = d;
  }
}

int64_t product(const int64_t* dims, int rank) {
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) n *= dims[i];
  return n;
}
}  // namespace

size_t dtype_size(DType t) {
  for (const auto& e : kDTypes)
    if (e.type == t) return e.size;
  return 0;
}

const char* dtype_name(DType t) {
  for (const auto& e : kDTypes)
    if (e.type == t) return e.name;
  return "?";
}

bool parse_dtype(const std::string& name, DType* out) {
  for (const auto& e : kDTypes) {
    if (name == e.name) {
      *out = e.type;
      return true;
    }
  }
  return false;
}

TensorView::TensorView(const void* d, DType t, std::initializer_list<int64_t> shape)
    : data(d), dtype(t) {
  fill_shape(this, shape);
}

int64_t TensorView::numel() const { return product(dims, rank); }
std::string TensorView::shape_string() const { return qmoe::shape_string(dims, rank); }

MutableTensorView::MutableTensorView(void* d, DType t, std::initializer_list<int64_t> shape)
    : data(d), dtype(t) {
  fill_shape(this, shape);
}

int64_t MutableTensorView::numel() const { return product(dims, rank); }

TensorView MutableTensorView::as_const() const {
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.rank = rank;
  std::memcpy(v.dims, dims, sizeof(dims));
  return v;
}

std::string shape_string(const int64_t* dims, int rank) {
  std::string s = "[";
  for (int i = 0; i < rank; ++i) {
    if (i) s += ", ";
    s += std::to_string(dims[i]);
  }
  return s + "]";
}

}  // namespace qmoe
