// 64-byte aligned host memory: the CPU backend's workspace and route maps require it.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <memory>

namespace qmoe::cli {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<void, FreeDeleter>;

inline AlignedBuffer aligned_buffer(size_t bytes) {
  const size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
  return AlignedBuffer(std::aligned_alloc(64, rounded));
}

}  // namespace qmoe::cli
