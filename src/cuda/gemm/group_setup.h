// One grouped GEMM call's per-group arrays (the CUTLASS ptr-array kernels' problem shapes,
// pointers and strides), described in bytes, so that kernels outside the CUTLASS units can write
// them. The mixed-input GEMM's own setup kernel writes them this way (launch_group_setup), and so
// does the blocked routing's offsets kernel, which knows each touched expert's slot, rows and
// first row as it builds the plan: a generic call then launches no setup kernels
// (DeviceRoutingArgs::plan_setups). Host declarations (includable from plain C++).
//
// Slot j of the max_groups slots, for touched index j (expert e, its rows [row0, row0 + rows));
// slots past the touched count get no rows and expert 0's pointers:
//
//   shapes[j]      = (n, rows, k)              three int32 (cute::Shape<int, int, int>)
//   ptr_a[j]       = a + e * a_expert          the expert's codes
//   ptr_b[j]       = b + row0 * b_row          the group's activation rows
//   ptr_d[j]       = d + row0 * d_row          its output rows
//   ptr_s[j]       = s + e * s_expert          its scales
//   ptr_z[j]       = z + e * z_expert          its zeros; null where z is null
//   consts[i].at[j] = consts[i].value          the four stride arrays: one value for every slot,
//                                              the stride types' bytes (built on the host)
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/gemm/grouped_gemm.h"
#include "qmoe/status.h"

namespace qmoe::cuda {

// An array of one value: slot j's `words` 32-bit words at at + j * words.
struct GroupConst {
  uint32_t* at = nullptr;
  int words = 0;  // 1..4
  uint32_t value[4] = {0, 0, 0, 0};
};

struct GroupSetup {
  int max_groups = 0;
  int32_t* shapes = nullptr;  // [max_groups][3]
  const void** ptr_a = nullptr;
  const void** ptr_b = nullptr;
  void** ptr_d = nullptr;
  const void** ptr_s = nullptr;
  const void** ptr_z = nullptr;
  int32_t n = 0, k = 0;
  const char* a = nullptr;
  int64_t a_expert = 0;  // bytes per expert
  const char* b = nullptr;
  int64_t b_row = 0;  // bytes per row
  char* d = nullptr;
  int64_t d_row = 0;
  const char* s = nullptr;
  int64_t s_expert = 0;
  const char* z = nullptr;  // null: no zeros (ptr_z[j] = null)
  int64_t z_expert = 0;
  static constexpr int kConsts = 4;  // stride_a, stride_b, stride_d, stride_s
  GroupConst consts[kConsts];
  bool on() const { return shapes != nullptr; }
};

// The writes of every slot j < setup.max_groups from the plan (sched.touched, n_touched and
// offsets), in one small kernel; pdl as launch_plan's.
Status launch_group_setup(const GroupSetup& setup, const GroupSchedule& sched, cudaStream_t stream,
                          bool pdl);

}  // namespace qmoe::cuda
