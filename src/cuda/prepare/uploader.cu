// uploader.h: the staged copy of a large pageable source.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "core/parallel.h"
#include "cuda/common/cuda_check.h"
#include "cuda/prepare/uploader.h"

namespace qmoe::cuda {

Uploader::Uploader(int workers) : workers_(std::max(1, workers)) {}

Uploader::~Uploader() { release(); }

void Uploader::release() {
  for (Worker& w : w_) {
    // Every copy synchronized its stream before returning: nothing is in flight here.
    for (int b = 0; b < 2; ++b) {
      if (w.pinned[b] != nullptr) cudaFreeHost(w.pinned[b]);
      if (w.done[b] != nullptr) cudaEventDestroy(w.done[b]);
    }
    if (w.stream != nullptr) cudaStreamDestroy(w.stream);
  }
  w_.clear();
  pinned_ = false;
}

Status Uploader::pin() {
  if (pinned_) return Status::ok();
  QMOE_CUDA_TRY(cudaGetDevice(&device_));
  w_.resize(static_cast<size_t>(workers_));
  for (Worker& w : w_) {
    QMOE_CUDA_TRY(cudaStreamCreateWithFlags(&w.stream, cudaStreamNonBlocking));
    for (int b = 0; b < 2; ++b) {
      QMOE_CUDA_TRY(cudaEventCreateWithFlags(&w.done[b], cudaEventDisableTiming));
      if (cudaHostAlloc(&w.pinned[b], kChunk, cudaHostAllocDefault) != cudaSuccess) {
        cudaGetLastError();  // no pinned memory to be had: copy as the driver does
        release();
        pin_failed_ = true;
        return Status::ok();
      }
    }
  }
  pinned_ = true;
  return Status::ok();
}

Status Uploader::copy(void* dst, const void* src, size_t bytes, const char* what) {
  if (bytes == 0) return Status::ok();
  bool pageable = true;
  cudaPointerAttributes attr;
  if (cudaPointerGetAttributes(&attr, src) != cudaSuccess) {
    cudaGetLastError();
  } else {
    pageable = attr.type == cudaMemoryTypeUnregistered;
  }
  if (pageable && bytes >= kStaged && !pin_failed_) QMOE_RETURN_IF_ERROR(pin());
  if (!pageable || bytes < kStaged || !pinned_) {
    return cuda_status(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault),
                       (std::string("upload of ") + what).c_str());
  }
  // Worker i copies chunks i, i + W, ...: the workers move through the source together, so the
  // pages each memcpy reads stay close to the others'.
  const size_t chunks = (bytes + kChunk - 1) / kChunk;
  const int used = static_cast<int>(std::min<size_t>(w_.size(), chunks));
  std::vector<Status> result(static_cast<size_t>(used), Status::ok());
  auto run = [&](int64_t i) {
    Worker& w = w_[static_cast<size_t>(i)];
    Status& st = result[static_cast<size_t>(i)];
    auto fail = [&](cudaError_t e, const char* call) {
      st = cuda_status(e, (std::string(call) + " (upload of " + what + ")").c_str());
    };
    cudaError_t e = cudaSetDevice(device_);
    if (e != cudaSuccess) return fail(e, "cudaSetDevice");
    int turn = 0;
    for (size_t c = static_cast<size_t>(i); c < chunks; c += static_cast<size_t>(used), ++turn) {
      const int b = turn % 2;
      const size_t off = c * kChunk, n = std::min(kChunk, bytes - off);
      // The chunk's last copy (two turns ago) must have left it before memcpy refills it.
      if (turn >= 2 && (e = cudaEventSynchronize(w.done[b])) != cudaSuccess) {
        return fail(e, "cudaEventSynchronize");
      }
      std::memcpy(w.pinned[b], static_cast<const char*>(src) + off, n);
      e = cudaMemcpyAsync(static_cast<char*>(dst) + off, w.pinned[b], n, cudaMemcpyHostToDevice,
                          w.stream);
      if (e != cudaSuccess) return fail(e, "cudaMemcpyAsync");
      if ((e = cudaEventRecord(w.done[b], w.stream)) != cudaSuccess) {
        return fail(e, "cudaEventRecord");
      }
    }
    if ((e = cudaStreamSynchronize(w.stream)) != cudaSuccess) fail(e, "cudaStreamSynchronize");
  };
  run_parts(used, run);
  for (const Status& s : result) QMOE_RETURN_IF_ERROR(s);
  return Status::ok();
}

}  // namespace qmoe::cuda
