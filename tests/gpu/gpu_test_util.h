// Helpers for the GPU suite: skip where no device exists (saying so), device buffers that start
// poisoned, and CUDA calls that fail the test instead of aborting.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "qmoe/backend.h"
#include "test_util.h"

namespace qmoe::test {

// True when a CUDA device the backend can run on is present.
inline bool gpu_present() { return backend_available(BackendKind::kCuda); }

}  // namespace qmoe::test

// First statement of every GPU test.
#define QMOE_REQUIRE_GPU()                                                                \
  do {                                                                                    \
    if (!::qmoe::test::gpu_present()) GTEST_SKIP() << "no CUDA device: GPU test skipped"; \
  } while (0)

#define CUDA_ASSERT(expr)                                                  \
  do {                                                                     \
    cudaError_t e_ = (expr);                                               \
    ASSERT_EQ(e_, cudaSuccess) << #expr << ": " << cudaGetErrorString(e_); \
  } while (0)

namespace qmoe::test {

// cudaMemset and cudaMemcpy from pageable host memory are issued to the legacy default stream and
// may return before the device has done them (a pageable copy returns once the bytes are staged
// for DMA); the tests' kernels run on non-blocking streams, which do not wait for that stream. So
// each such call is followed by this wait, or a poison could land after a kernel's stores, or an
// input after its loads (under load from other processes on the GPU it did: a blocked routing
// path counted poisoned masks).
inline cudaError_t legacy_stream_done() { return cudaStreamSynchronize(cudaStreamLegacy); }

// A device allocation for tests, filled with `poison` bytes on creation (0xFF is NaN in every float
// type), with optional canary bytes after the end.
class GpuBuffer {
 public:
  GpuBuffer() = default;
  GpuBuffer(const GpuBuffer&) = delete;
  GpuBuffer& operator=(const GpuBuffer&) = delete;
  ~GpuBuffer() {
    if (p_) cudaFree(p_);
  }
  // Allocates bytes + canary, poisons [0, bytes) and writes 0xA5 canaries after it.
  ::testing::AssertionResult allocate(size_t bytes, uint8_t poison = 0xFF, size_t canary = 0) {
    if (p_) cudaFree(p_);
    p_ = nullptr;
    bytes_ = bytes;
    canary_ = canary;
    cudaError_t e = cudaMalloc(&p_, bytes + canary + 1);
    if (e == cudaSuccess) e = cudaMemset(p_, poison, bytes);
    if (e == cudaSuccess && canary) e = cudaMemset(static_cast<char*>(p_) + bytes, 0xA5, canary);
    if (e == cudaSuccess) e = legacy_stream_done();
    if (e != cudaSuccess) return ::testing::AssertionFailure() << cudaGetErrorString(e);
    return ::testing::AssertionSuccess();
  }
  // offset: the data starts that many bytes into the allocation (the bytes before it stay
  // poisoned), for inputs off alignment.
  ::testing::AssertionResult upload(const void* host, size_t bytes, size_t offset = 0) {
    auto r = allocate(bytes + offset);
    if (!r) return r;
    cudaError_t e =
        cudaMemcpy(static_cast<char*>(p_) + offset, host, bytes, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = legacy_stream_done();
    if (e != cudaSuccess) return ::testing::AssertionFailure() << cudaGetErrorString(e);
    return ::testing::AssertionSuccess();
  }
  template <typename T>
  ::testing::AssertionResult upload(const std::vector<T>& v) {
    return upload(v.data(), v.size() * sizeof(T));
  }
  template <typename T>
  ::testing::AssertionResult download(std::vector<T>* v) const {
    v->resize(bytes_ / sizeof(T));
    cudaError_t e = cudaMemcpy(v->data(), p_, v->size() * sizeof(T), cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) return ::testing::AssertionFailure() << cudaGetErrorString(e);
    return ::testing::AssertionSuccess();
  }
  // Whether the canary bytes after the end are intact.
  ::testing::AssertionResult canary_intact() const {
    std::vector<uint8_t> c(canary_);
    cudaError_t e =
        cudaMemcpy(c.data(), static_cast<char*>(p_) + bytes_, canary_, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) return ::testing::AssertionFailure() << cudaGetErrorString(e);
    for (size_t i = 0; i < canary_; ++i) {
      if (c[i] != 0xA5)
        return ::testing::AssertionFailure() << "canary byte " << i << " overwritten";
    }
    return ::testing::AssertionSuccess();
  }
  void* get() const { return p_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0, canary_ = 0;
};

}  // namespace qmoe::test
