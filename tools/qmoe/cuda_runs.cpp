// Timed runs on the CUDA backend: the tensors are staged in device memory, calls go on one stream
// and are timed with events. Compiled only in builds with CUDA.
#ifdef QMOE_WITH_CUDA

#include <cuda_runtime.h>

#include <string>

#include "cuda/common/cuda_check.h"
#include "device_call.h"
#include "execute.h"

namespace qmoe::cli {

namespace {

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
  DeviceCall call;
  QMOE_RETURN_IF_ERROR(call.stage(layer, in, out));
  const RunInputs& din = call.in;
  const MutableTensorView& dout = call.out;
  cuda::DeviceBuffer& y = call.y;
  cuda::DeviceBuffer& ws = call.ws;
  const size_t bytes = call.ws_bytes;

  Stream st;
  QMOE_RETURN_IF_ERROR(cuda::cuda_status(cudaStreamCreateWithFlags(&st.s, cudaStreamNonBlocking),
                                         "cudaStreamCreate"));
  QMOE_RETURN_IF_ERROR(cuda::cuda_status(cudaEventCreate(&st.start), "cudaEventCreate"));
  QMOE_RETURN_IF_ERROR(cuda::cuda_status(cudaEventCreate(&st.stop), "cudaEventCreate"));
  QMOE_RETURN_IF_ERROR(layer.run(din, dout, ws.get(), bytes, st.s, nullptr));
  QMOE_RETURN_IF_ERROR(cuda::cuda_status(cudaStreamSynchronize(st.s), "warm-up run"));
  QMOE_RETURN_IF_ERROR(layer.take_deferred_error());
  // Whole calls first, timed between two events with nothing else in between; then the same
  // number of profiled calls for the per-stage split (a profile waits for its own events).
  for (int r = 0; r < repeat; ++r) {
    QMOE_RETURN_IF_ERROR(cuda::cuda_status(cudaEventRecord(st.start, st.s), "cudaEventRecord"));
    QMOE_RETURN_IF_ERROR(layer.run(din, dout, ws.get(), bytes, st.s, nullptr));
    QMOE_RETURN_IF_ERROR(cuda::cuda_status(cudaEventRecord(st.stop, st.s), "cudaEventRecord"));
    QMOE_RETURN_IF_ERROR(cuda::cuda_status(cudaEventSynchronize(st.stop), "timed run"));
    float ms = 0;
    QMOE_RETURN_IF_ERROR(
        cuda::cuda_status(cudaEventElapsedTime(&ms, st.start, st.stop), "cudaEventElapsedTime"));
    runs->ms.push_back(ms);
  }
  for (int r = 0; r < repeat; ++r) {
    RunProfile p;
    QMOE_RETURN_IF_ERROR(layer.run(din, dout, ws.get(), bytes, st.s, &p));
    runs->profiles.push_back(p);
  }
  QMOE_RETURN_IF_ERROR(cuda::cuda_status(cudaStreamSynchronize(st.s), "timed runs"));
  QMOE_RETURN_IF_ERROR(layer.take_deferred_error());
  return cuda::cuda_status(cudaMemcpy(out.data, y.get(), out.bytes(), cudaMemcpyDeviceToHost),
                           "cudaMemcpy (output)");
}

}  // namespace qmoe::cli

#endif  // QMOE_WITH_CUDA
