#include "core/tensor_check.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "core/parallel.h"

namespace qmoe {

Status expect_tensor(const TensorView& v, const std::string& name, DType dtype, const int64_t* dims,
                     int rank) {
  const std::string want = std::string(dtype_name(dtype)) + " " + shape_string(dims, rank);
  if (!v.given()) return Status::invalid(name + ": missing, expected " + want);
  bool same = v.rank == rank;
  for (int i = 0; same && i < rank; ++i) same = v.dims[i] == dims[i];
  if (!same || !dtype_matches(v.dtype, dtype)) {
    return Status::invalid(name + ": expected " + want + ", got " + dtype_name(v.dtype) + " " +
                           v.shape_string());
  }
  return Status::ok();
}

namespace {

// A value is non-finite exactly when its exponent field is all ones (e4m3: exponent and mantissa
// all ones, its only NaN, as it has no infinity; e8m0: 0xFF), so the scan tests bits, not floats.
// The bits that are all ones in a non-finite element of a float dtype; 0 for other dtypes.
uint64_t non_finite_mask(DType t) {
  switch (t) {
    case DType::kF32:
      return 0x7F800000u;
    case DType::kF16:
      return 0x7C00u;
    case DType::kBF16:
      return 0x7F80u;
    case DType::kF64:
      return 0x7FF0000000000000ull;
    case DType::kF8E4M3:
      return 0x7Fu;
    case DType::kF8E8M0:
      return 0xFFu;
    default:
      return 0;
  }
}

template <typename U>
int64_t first_bad_of(const uint8_t* data, int64_t begin, int64_t end, U mask) {
  // Blocks of 1024 counted without a branch (the compiler vectorizes the count), then the exact
  // index in the block that has one.
  constexpr int64_t kBlock = 1024;
  // Elements are read with memcpy: a tensor of a file need not be aligned to its element size.
  auto at = [data](int64_t i) {
    U u;
    std::memcpy(&u, data + i * static_cast<int64_t>(sizeof(U)), sizeof(U));
    return u;
  };
  for (int64_t b0 = begin; b0 < end; b0 += kBlock) {
    const int64_t b1 = std::min(end, b0 + kBlock);
    unsigned count = 0;
    for (int64_t i = b0; i < b1; ++i) count += static_cast<unsigned>((at(i) & mask) == mask);
    if (count == 0) continue;
    for (int64_t i = b0; i < b1; ++i) {
      if ((at(i) & mask) == mask) return i;
    }
  }
  return -1;
}

// The first non-finite element of [begin, end) of `bytes`-byte elements, or -1.
int64_t first_bad(const uint8_t* data, int64_t begin, int64_t end, size_t bytes, uint64_t mask) {
  switch (bytes) {
    case 1:
      return first_bad_of<uint8_t>(data, begin, end, static_cast<uint8_t>(mask));
    case 2:
      return first_bad_of<uint16_t>(data, begin, end, static_cast<uint16_t>(mask));
    case 4:
      return first_bad_of<uint32_t>(data, begin, end, static_cast<uint32_t>(mask));
    default:
      return first_bad_of<uint64_t>(data, begin, end, mask);
  }
}

}  // namespace

Status expect_finite(const TensorView& v, const std::string& name) {
  if (!v.present()) return Status::ok();
  const uint64_t mask = non_finite_mask(v.dtype);
  if (mask == 0) return Status::ok();
  const size_t elem = dtype_size(v.dtype);
  const int64_t n = v.numel();
  const uint8_t* data = static_cast<const uint8_t*>(v.data);
  // A tensor of gigabytes (DeepSeek-V3's FP8 experts) is scanned by several threads, each over a
  // contiguous part; the error names the lowest bad index whatever the split.
  constexpr int64_t kPerThread = int64_t{64} << 20;  // bytes
  const int64_t bytes = n * static_cast<int64_t>(elem);
  const int64_t threads = std::max<int64_t>(
      1, std::min<int64_t>(
             {bytes / kPerThread, 16, static_cast<int64_t>(std::thread::hardware_concurrency())}));
  std::vector<int64_t> bad(static_cast<size_t>(threads), -1);
  const int64_t part = (n + threads - 1) / threads;
  auto scan = [&](int64_t t) {
    bad[static_cast<size_t>(t)] =
        first_bad(data, std::min(n, t * part), std::min(n, (t + 1) * part), elem, mask);
  };
  run_parts(threads, scan);
  for (int64_t i : bad) {
    if (i < 0) continue;
    const float x = v.dtype == DType::kF8E4M3   ? num::e4m3_to_f32(data[i])
                    : v.dtype == DType::kF8E8M0 ? num::e8m0_to_f32(data[i])
                                                : load_float(v.data, v.dtype, i);
    return Status::invalid(name + ": non-finite value " + std::to_string(x) + " at flat index " +
                           std::to_string(i));
  }
  return Status::ok();
}

}  // namespace qmoe
