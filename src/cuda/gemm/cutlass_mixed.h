// A mixed-input grouped GEMM on CUTLASS 3.x for SM90: INT4 weights read as packed codes, converted
// and scaled in registers (no dequantized copy), times bf16/f16 activations on wgmma, fp32 out.
// Same schedule contract as cutlass_grouped.h: a setup kernel derives each group's shape and
// pointers on the device from the GroupSchedule, so the call never synchronizes and can be
// captured in a CUDA graph. One launch covers every touched expert (there is no scratch, so no
// waves).
//
// The product is transposed as in cutlass_grouped.h, the weights being CUTLASS's A operand (the
// one the mixed-input collective converts in registers):
//
//            CUTLASS M = n (features)     N = the group's rows      K
//   A  =  codes of expert e  [n, k]  int4, row-major (K-contiguous), low nibble = even k
//   S  =  scales of expert e [k / chunk, n]  activation dtype, n contiguous
//   B  =  A rows of the group  [rows, lda]  column-major (K-contiguous)
//   D  =  C rows of the group  [rows, ldc]  column-major: D(m, r) = c[(row0 + r) * ldc + m]
//   D(m, r) = sum_k (float)(act(q(m, k) * S(k / chunk, m))) * B(k, r)
//
// The prepared copy (built once at prepare, mixed_int4_prepare): ORT's unsigned codes q in [0, 16)
// with the implicit zero point 8 become signed int4 q - 8 (each nibble XOR 8, exact), in ORT's
// own order; the scales are transposed per expert to [k / chunk, n] and rounded to the activation
// dtype (exact where they are stored in it already).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/gemm/grouped_gemm.h"
#include "qmoe/format.h"
#include "qmoe/status.h"

namespace qmoe::cuda {

// The K tile of the mixed-input kernel: a scale block must be a multiple of it (or all of K).
constexpr int64_t kMixedTileK = 64;

struct MixedGemmArgs {
  DType dtype = DType::kBF16;  // of the activations and the prepared scales: kBF16 or kF16
  const void* a = nullptr;     // [rows, lda] activations, row p = route position p
  int64_t lda = 0;
  float* c = nullptr;  // [rows, ldc]; rows of touched experts, columns < n are written
  int64_t ldc = 0;
  int64_t n = 0, k = 0;
  const uint8_t* codes = nullptr;  // [E, n, k / 2] signed int4 (the prepared copy)
  const void* scales = nullptr;    // [E, k / chunk, n] in dtype (the prepared copy)
  int64_t chunk = 0;               // the scale block along K (k for per-channel scales)
  GroupSchedule sched;             // tile_start is not read
  int max_groups = 0;              // an upper bound of *sched.n_touched (min(E, routes))
};

// Whether an FC of this format, activation dtype and [n, k] shape has a mixed-input kernel:
// symmetric INT4, bf16/f16 activations, k a multiple of kMixedTileK, scale blocks per channel or
// a multiple of kMixedTileK dividing k, n a multiple of 8 (16-byte scale rows). Host-only.
bool mixed_int4_supported(const FcFormat& f, DType act, int64_t n, int64_t k,
                          std::string* why = nullptr);

// The prepared copy of one FC of E experts from ORT's host tensors (codes [E, n, k/2] u8, scales
// [E, n, k / bs] or [E, n] in f.scale_dtype): signed codes and transposed scales (see above), the
// scales as bf16/f16 bits. Requires mixed_int4_supported().
void mixed_int4_prepare(const FcFormat& f, DType act, int64_t experts, int64_t n, int64_t k,
                        const uint8_t* codes, const uint8_t* scales,
                        std::vector<uint8_t>* codes_out, std::vector<uint16_t>* scales_out);

// Whether these arguments can run (as mixed_int4_supported, plus strides and 16-byte aligned
// pointers); `why` names the first that cannot. Host-only.
bool mixed_gemm_can_implement(const MixedGemmArgs& args, std::string* why = nullptr);

// Workspace bytes of one launch over up to max_groups groups on sm_count multiprocessors: the
// per-group shape, pointer and stride arrays plus CUTLASS's TMA descriptors. 0 for a dtype
// without a kernel or max_groups <= 0. Exact, and nondecreasing in max_groups.
size_t mixed_gemm_workspace_bytes(DType dtype, int64_t max_groups, int sm_count);

// Launches the setup kernel and the GEMM on `stream`; `workspace` holds at least
// mixed_gemm_workspace_bytes(args.dtype, args.max_groups, sm_count) bytes, 256-byte aligned.
Status launch_mixed_grouped_gemm(const MixedGemmArgs& args, int sm_count, void* workspace,
                                 size_t workspace_bytes, cudaStream_t stream);

}  // namespace qmoe::cuda
