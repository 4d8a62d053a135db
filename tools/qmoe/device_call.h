// One call of a layer staged on the device for timing: the inputs copied to device memory, a
// device output of the same shape and an exactly sized workspace. CUDA builds only.
#pragma once

#ifdef QMOE_WITH_CUDA

#include "cuda/common/device_buffer.h"
#include "qmoe/backend.h"

namespace qmoe::cli {

struct DeviceCall {
  cuda::DeviceBuffer x, logits, router_weights, y, ws;
  RunInputs in;           // device views of the inputs
  MutableTensorView out;  // device view of the output
  size_t ws_bytes = 0;    // layer.workspace_size(T)

  Status stage(const PreparedLayer& layer, const RunInputs& host_in,
               const MutableTensorView& host_out);
};

}  // namespace qmoe::cli

#endif  // QMOE_WITH_CUDA
