// The standalone writer of group_setup.h's arrays: a thread per slot.
#include "cuda/common/cuda_check.h"
#include "cuda/common/pdl.cuh"
#include "cuda/gemm/group_setup.cuh"

namespace qmoe::cuda {
namespace {

__global__ void group_setup_kernel(const GroupSetup g, const GroupSchedule sched) {
  pdl_wait();  // the plan, or the kernel before the FC (programmatic dependent launch)
  pdl_trigger();
  const int n_touched = *sched.n_touched;
  for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < g.max_groups;
       j += gridDim.x * blockDim.x) {
    int64_t e = 0, row0 = 0;
    int32_t rows = 0;
    if (j < n_touched) {
      e = sched.touched[j];
      row0 = sched.offsets[e];
      rows = sched.offsets[e + 1] - sched.offsets[e];
    }
    write_group_slot(g, j, e, row0, rows);
  }
}

}  // namespace

Status launch_group_setup(const GroupSetup& setup, const GroupSchedule& sched, cudaStream_t stream,
                          bool pdl) {
  if (!setup.on() || setup.max_groups <= 0) {
    return Status::invalid("launch_group_setup: setup: expected arrays and max_groups > 0");
  }
  if (sched.touched == nullptr || sched.n_touched == nullptr || sched.offsets == nullptr) {
    return Status::invalid("launch_group_setup: sched: expected device pointers");
  }
  constexpr int kThreads = 128;
  const int blocks = (setup.max_groups + kThreads - 1) / kThreads;
  QMOE_CUDA_TRY(launch_maybe_pdl(&group_setup_kernel, dim3(blocks), dim3(kThreads), 0, stream, pdl,
                                 setup, sched));
  QMOE_CUDA_CHECK_LAUNCH("group_setup_kernel");
  return Status::ok();
}

}  // namespace qmoe::cuda
