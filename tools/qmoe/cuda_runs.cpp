// Timed runs on the CUDA backend: the tensors are staged in device memory, calls go on one stream
// and are timed with events. Compiled only in builds with CUDA.
#ifdef QMOE_WITH_CUDA

#include <cuda_runtime.h>

#include <string>

#include "execute.h"

namespace qmoe::cli {

namespace {

Status cuda_check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::ok();
  return Status::internal(std::string(what) + ": " + cudaGetErrorString(e));
}

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (p_) cudaFree(p_);
  }
  Status allocate(size_t bytes) {
    return cuda_check(cudaMalloc(&p_, bytes > 0 ? bytes : 1), "cudaMalloc");
  }
  void* get() const { return p_; }

 private:
  void* p_ = nullptr;
};

// A device copy of a host tensor (absent stays absent).
Status to_device(const TensorView& host, DeviceBuffer* buf, TensorView* dev) {
  *dev = host;
  if (!host.present()) return Status::ok();
  QMOE_RETURN_IF_ERROR(buf->allocate(host.bytes()));
  QMOE_RETURN_IF_ERROR(cuda_check(
      cudaMemcpy(buf->get(), host.data, host.bytes(), cudaMemcpyHostToDevice), "cudaMemcpy"));
  dev->data = buf->get();
  return Status::ok();
}

struct Stream {
  cudaStream_t s = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  ~Stream() {
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
    if (s) cudaStreamDestroy(s);
  }
};

}  // namespace

Status time_cuda_runs(PreparedLayer& layer, const RunInputs& in, const MutableTensorView& out,
                      int repeat, TimedRuns* runs) {
  int64_t tokens = 0;
  QMOE_RETURN_IF_ERROR(check_run(layer.spec(), in, out, &tokens));
  DeviceBuffer x, logits, weights, y, ws;
  RunInputs din;
  QMOE_RETURN_IF_ERROR(to_device(in.input, &x, &din.input));
  QMOE_RETURN_IF_ERROR(to_device(in.router_logits, &logits, &din.router_logits));
  QMOE_RETURN_IF_ERROR(to_device(in.router_weights, &weights, &din.router_weights));
  QMOE_RETURN_IF_ERROR(y.allocate(out.bytes()));
  MutableTensorView dout = out;
  dout.data = y.get();
  const size_t bytes = layer.workspace_size(tokens);
  QMOE_RETURN_IF_ERROR(ws.allocate(bytes));  // cudaMalloc aligns to at least 256 bytes

  Stream st;
  QMOE_RETURN_IF_ERROR(
      cuda_check(cudaStreamCreateWithFlags(&st.s, cudaStreamNonBlocking), "cudaStreamCreate"));
  QMOE_RETURN_IF_ERROR(cuda_check(cudaEventCreate(&st.start), "cudaEventCreate"));
  QMOE_RETURN_IF_ERROR(cuda_check(cudaEventCreate(&st.stop), "cudaEventCreate"));
  QMOE_RETURN_IF_ERROR(layer.run(din, dout, ws.get(), bytes, st.s, nullptr));
  QMOE_RETURN_IF_ERROR(cuda_check(cudaStreamSynchronize(st.s), "warm-up run"));
  QMOE_RETURN_IF_ERROR(layer.take_deferred_error());
  // Whole calls first, timed between two events with nothing else in between; then the same
  // number of profiled calls for the per-stage split (a profile waits for its own events).
  for (int r = 0; r < repeat; ++r) {
    QMOE_RETURN_IF_ERROR(cuda_check(cudaEventRecord(st.start, st.s), "cudaEventRecord"));
    QMOE_RETURN_IF_ERROR(layer.run(din, dout, ws.get(), bytes, st.s, nullptr));
    QMOE_RETURN_IF_ERROR(cuda_check(cudaEventRecord(st.stop, st.s), "cudaEventRecord"));
    QMOE_RETURN_IF_ERROR(cuda_check(cudaEventSynchronize(st.stop), "timed run"));
    float ms = 0;
    QMOE_RETURN_IF_ERROR(
        cuda_check(cudaEventElapsedTime(&ms, st.start, st.stop), "cudaEventElapsedTime"));
    runs->ms.push_back(ms);
  }
  for (int r = 0; r < repeat; ++r) {
    RunProfile p;
    QMOE_RETURN_IF_ERROR(layer.run(din, dout, ws.get(), bytes, st.s, &p));
    runs->profiles.push_back(p);
  }
  QMOE_RETURN_IF_ERROR(cuda_check(cudaStreamSynchronize(st.s), "timed runs"));
  QMOE_RETURN_IF_ERROR(layer.take_deferred_error());
  return cuda_check(cudaMemcpy(out.data, y.get(), out.bytes(), cudaMemcpyDeviceToHost),
                    "cudaMemcpy (output)");
}

}  // namespace qmoe::cli

#endif  // QMOE_WITH_CUDA
