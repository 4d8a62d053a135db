// Prepare's host-to-device copies. A copy from pageable host memory goes through the driver's own
// staging, one thread copying into a pinned bounce buffer and the DMA waiting for it; a layer of
// gigabytes (DeepSeek-V3's routed experts are 11 GB) then loads at the speed of one memcpy thread.
// The Uploader splits a large pageable copy over worker threads instead, each with its own stream
// and two pinned chunks in turn: one is filled by memcpy while the other is in flight, and the
// workers' copies overlap on the link.
//
//   source          bytes        path
//   device / pinned any          cudaMemcpy (DMA straight from the source)
//   pageable        < kStaged    cudaMemcpy (the driver stages it)
//   pageable        >= kStaged   the workers: W parts of whole chunks, each part
//                                memcpy -> pinned[0] -> H2D | memcpy -> pinned[1] -> H2D | ...
//
// The pinned chunks are allocated on the first staged copy and kept until the Uploader is
// destroyed (prepare holds one for the whole layer); a failure to pin falls back to cudaMemcpy.
// Every copy is complete when copy() returns.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

#include "qmoe/status.h"

namespace qmoe::cuda {

class Uploader {
 public:
  static constexpr size_t kChunk = size_t{4} << 20;
  static constexpr size_t kStaged = size_t{64} << 20;

  // workers: the threads of a staged copy (at least 1).
  explicit Uploader(int workers);
  ~Uploader();
  Uploader(const Uploader&) = delete;
  Uploader& operator=(const Uploader&) = delete;

  // Copies `bytes` from src (host or device memory) to the device memory dst of the current
  // device; `what` names the tensor in errors.
  Status copy(void* dst, const void* src, size_t bytes, const char* what);

 private:
  struct Worker {
    cudaStream_t stream = nullptr;
    void* pinned[2] = {nullptr, nullptr};
    cudaEvent_t done[2] = {nullptr, nullptr};
  };
  Status pin();  // allocates the workers' streams, chunks and events once
  void release();

  int workers_;
  int device_ = 0;
  bool pinned_ = false, pin_failed_ = false;
  std::vector<Worker> w_;
};

}  // namespace qmoe::cuda
