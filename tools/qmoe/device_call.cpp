#ifdef QMOE_WITH_CUDA

#include "device_call.h"

namespace qmoe::cli {

namespace {

// A device copy of a host tensor (absent stays absent).
Status to_device(const TensorView& host, cuda::DeviceBuffer* buf, TensorView* dev) {
  *dev = host;
  if (!host.present()) return Status::ok();
  QMOE_RETURN_IF_ERROR(buf->upload(host.data, host.bytes()));
  dev->data = buf->get();
  return Status::ok();
}

}  // namespace

Status DeviceCall::stage(const PreparedLayer& layer, const RunInputs& host_in,
                         const MutableTensorView& host_out) {
  int64_t tokens = 0;
  QMOE_RETURN_IF_ERROR(check_run(layer.spec(), host_in, host_out, &tokens));
  in = host_in;
  QMOE_RETURN_IF_ERROR(to_device(host_in.input, &x, &in.input));
  QMOE_RETURN_IF_ERROR(to_device(host_in.router_logits, &logits, &in.router_logits));
  QMOE_RETURN_IF_ERROR(to_device(host_in.router_weights, &router_weights, &in.router_weights));
  QMOE_RETURN_IF_ERROR(y.allocate(host_out.bytes()));
  out = host_out;
  out.data = y.get();
  ws_bytes = layer.workspace_size(tokens);
  return ws.allocate(ws_bytes);  // cudaMalloc aligns to at least 256 bytes
}

}  // namespace qmoe::cli

#endif  // QMOE_WITH_CUDA
