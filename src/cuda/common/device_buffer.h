// An owning device allocation (prepare-time only: run() never allocates).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/common/cuda_check.h"

namespace qmoe::cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), bytes_(o.bytes_) {
    o.p_ = nullptr;
    o.bytes_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = o.p_;
      bytes_ = o.bytes_;
      o.p_ = nullptr;
      o.bytes_ = 0;
    }
    return *this;
  }
  ~DeviceBuffer() { reset(); }

  Status allocate(size_t bytes) {
    reset();
    QMOE_CUDA_TRY(cudaMalloc(&p_, bytes > 0 ? bytes : 1));
    bytes_ = bytes;
    return Status::ok();
  }
  // Allocates and copies `bytes` from host memory; returns once they are on the device. (A copy
  // from pageable memory may return when the bytes are staged for DMA, and it runs on the legacy
  // default stream, for which a caller's non-blocking stream does not wait.)
  Status upload(const void* host, size_t bytes) {
    QMOE_RETURN_IF_ERROR(allocate(bytes));
    if (bytes > 0) {
      QMOE_CUDA_TRY(cudaMemcpy(p_, host, bytes, cudaMemcpyHostToDevice));
      QMOE_CUDA_TRY(cudaStreamSynchronize(cudaStreamLegacy));
    }
    return Status::ok();
  }
  void reset() {
    if (p_) cudaFree(p_);
    p_ = nullptr;
    bytes_ = 0;
  }
  void* get() const { return p_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace qmoe::cuda
