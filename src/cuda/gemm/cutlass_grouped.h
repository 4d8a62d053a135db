// The grouped GEMM of grouped_gemm.h on CUTLASS 3.x (CuTe) for SM90: TMA loads, wgmma, a
// warp-specialized persistent kernel (KernelPtrArrayTmaWarpSpecializedCooperative) over
// cutlass::gemm::GroupProblemShape. Same contract as launch_grouped_gemm(): the groups' shapes and
// pointers are derived ON THE DEVICE from the GroupSchedule by a small setup kernel, the host
// passes no problem shapes (the persistent grid is one CTA per SM), so the call never synchronizes
// and can be captured in a CUDA graph.
//
// The product is computed transposed (D^T = B A^T), so that the expert's N (the wide, fixed
// dimension) fills CUTLASS's M tile and a group's rows (few for small token counts, ragged always)
// run along its N tile:
//
//            CUTLASS M = n (features)     N = the group's rows      K
//   A  =  B_g  [n, ldb]     row-major (K-contiguous)
//   B  =  A rows of the group  [rows, lda]  column-major (K-contiguous)
//   D  =  C rows of the group  [rows, ldc]  column-major: D(m, r) = c[(row0 + r) * ldc + m]
//
// TMA clips every tile at the group's extents, so ragged rows read zeros and write nothing past
// the group; a group without rows has no tiles.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "cuda/gemm/grouped_gemm.h"
#include "qmoe/status.h"

namespace qmoe::cuda {

// Whether the CUTLASS kernel can run these arguments (bf16/f16; TMA needs 16-byte aligned bases
// and strides; D's contiguous extent n a multiple of 4 floats); `why`, when given, names the first
// argument that rules it out. Host-only, no device call.
bool cutlass_gemm_can_implement(const GroupedGemmArgs& args, std::string* why = nullptr);

// Workspace bytes one launch needs for waves of up to max_groups groups on a device with sm_count
// multiprocessors: the per-group shape, pointer and stride arrays plus CUTLASS's own workspace
// (TMA descriptors per SM). 0 for a dtype the kernel does not take. Exact, and nondecreasing in
// max_groups.
size_t cutlass_gemm_workspace_bytes(DType dtype, int64_t max_groups, int sm_count);

// Launches the setup kernel and the GEMM on `stream`. `workspace` holds at least
// cutlass_gemm_workspace_bytes(args.dtype, args.max_groups, sm_count) bytes, 256-byte aligned.
// args.max_tiles is not used (the grid is persistent).
Status launch_cutlass_grouped_gemm(const GroupedGemmArgs& args, int sm_count, void* workspace,
                                   size_t workspace_bytes, cudaStream_t stream);

}  // namespace qmoe::cuda
