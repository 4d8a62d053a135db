// A mixed-input grouped GEMM on CUTLASS 3.x for SM90: quantized weights read as their codes,
// converted and scaled in registers (no dequantized copy), times bf16/f16 activations on wgmma,
// fp32 out. Same schedule contract as cutlass_grouped.h: a setup kernel derives each group's shape
// and pointers on the device from the GroupSchedule, so the call never synchronizes and can be
// captured in a CUDA graph. One launch covers every touched expert (there is no scratch, so no
// waves).
//
// The product is transposed as in cutlass_grouped.h, the weights being CUTLASS's A operand (the
// one the mixed-input collective converts in registers):
//
//            CUTLASS M = n (features)     N = the group's rows      K
//   A  =  codes of expert e  [n, k]  row-major (K-contiguous); int4: low nibble = even k
//   S  =  scales of expert e [k / chunk, n]  n contiguous
//   Z  =  zeros of expert e  [k / chunk, n]  as S (kinds with a zero term)
//   B  =  A rows of the group  [rows, lda]  column-major (K-contiguous)
//   D  =  C rows of the group  [rows, ldc]  column-major: D(m, r) = c[(row0 + r) * ldc + m]
//   D(m, r) = sum_k (float)(act(w(m, k))) * B(k, r), w = q * S [+ Z] per MixedCodes below
//
// One instance per MixedCodes, activation dtype and tile (cutlass_mixed_instances.h):
//
//   kind       codes (A)                         scale, zero               w, rounded once to act
//   kInt4      signed int4 q - 8 (ORT's q ^ 8,   act dtype, none           (q - 8) * s, the scale
//              a prepared copy, shuffled)                                  rounded to act first
//   kInt8      signed int8 q - 128 (ORT's        act dtype, none           (q - 128) * s, as kInt4
//              q ^ 0x80, a prepared copy,                                  (int8 without zero
//              shuffled)                                                   points)
//   kInt4Zero  kInt4's signed copy (shuffled)    f32 s, f32 -(zp - 8) s    q' s + z in f32
//   kInt8Zero  kInt8's signed copy (shuffled)    f32 s, f32 -(zp - 128) s  q' s + z in f32
//   kE4m3      ORT's e4m3 codes as they are      f32 s                     e4m3(q) s in f32: the
//              (fp8, fp8_block), or MXFP4's                                dequantize path's value
//              exact e4m3 copy (fp4_e4m3.h)      (MXFP4: per 64 K)
//
// The f32 kinds convert each code to f32, scale (and shift) there and round once to the activation
// dtype, as the dequantize path does; their only difference from it is z, rounded once in f32
// (exact whenever s has at most 16 significant bits, as f16/bf16 scales do). kInt4 and kInt8 keep
// the activation-dtype scale: CUTLASS's shuffled int4 / int8 conversions are fastest there (the
// codes are exact in bf16/f16, one multiply by the scale follows), and their error was measured
// within the 2x budget (tests/gpu/test_gpu_mixed.cpp).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/gemm/group_setup.h"
#include "cuda/gemm/grouped_gemm.h"
#include "qmoe/format.h"
#include "qmoe/layer.h"
#include "qmoe/status.h"

namespace qmoe::cuda {

// The K tile of the mixed-input kernel: a scale block must be a multiple of it (or all of K).
constexpr int64_t kMixedTileK = 64;
// The narrow tile's M (weight rows; cutlass_mixed_narrow.cuh's NarrowTileShape).
constexpr int64_t kMixedNarrowTileM = 256;

// The kernel instances by code type and scale form (table above). kNone: no instance takes the FC.
enum class MixedCodes : int { kNone = -1, kInt4 = 0, kInt4Zero, kInt8Zero, kE4m3, kInt8 };
constexpr int kMixedCodesCount = 5;
const char* mixed_codes_name(MixedCodes c);
// Bits per code, bytes per scale (and zero) element, and whether the kind has a zero term (host
// and the instances share these).
constexpr int mixed_code_bits(MixedCodes c) {
  return c == MixedCodes::kInt4 || c == MixedCodes::kInt4Zero ? 4 : 8;
}
constexpr int64_t mixed_scale_bytes(MixedCodes c) {
  return c == MixedCodes::kInt4 || c == MixedCodes::kInt8 ? 2 : 4;
}
constexpr bool mixed_has_zeros(MixedCodes c) {
  return c == MixedCodes::kInt4Zero || c == MixedCodes::kInt8Zero;
}
// Whether the kind reads its codes shuffled into the wgmma fragment order
// (cutlass_mixed_shuffle.cuh) rather than K-contiguous: the integer kinds. For kInt4 and kInt8
// the order feeds the fast conversion, the kernel's main cost; for all four it makes the signed
// codes word for word the decode path's (CudaLayer::decode_copy_of: one copy for both paths; the
// zero kinds' f32 conversion follows the load, so the order does not reach it). Their n must
// then be a multiple of kMixedShuffleRows.
constexpr bool mixed_codes_shuffled(MixedCodes c) {
  return c == MixedCodes::kInt4 || c == MixedCodes::kInt4Zero || c == MixedCodes::kInt8 ||
         c == MixedCodes::kInt8Zero;
}
constexpr int64_t kMixedShuffleRows = 16, kMixedShuffleCols = 16;

// FC1's row order in the prepared copy of a layer whose gated activation runs in FC1's epilogue
// (MixedGemmArgs::act_epilogue, cutlass_act_epilogue.cuh): each 16-row band holds eight channels'
// gate rows, then the same channels' linear rows. The source row (ORT's order, I channels) of
// prepared row r, with c = (r / 16) 8 + r % 8 its channel and h = (r / 8) % 2 its half:
//   kConcatenated (gate rows [0, I), linear rows [I, 2I)):  c + h I
//   kInterleaved (gate row 2c, linear row 2c + 1):          2c + h
// kNone is the identity (every other FC, and layers that keep the activation kernel).
enum class GluRows : int { kNone = 0, kConcatenated, kInterleaved };
// The band order's two maps (the epilogue and the activation kernel read the order through
// them): prepared row r's channel, and channel c's gate row (its linear row is 8 further).
__host__ __device__ constexpr int64_t glu_band_channel(int64_t r) { return (r / 16) * 8 + r % 8; }
__host__ __device__ constexpr int64_t glu_band_gate_row(int64_t c) { return (c / 8) * 16 + c % 8; }
__host__ __device__ constexpr int64_t glu_source_row(GluRows g, int64_t inter, int64_t r) {
  const int64_t c = glu_band_channel(r), h = (r / 8) % 2;
  return g == GluRows::kConcatenated ? c + h * inter : g == GluRows::kInterleaved ? 2 * c + h : r;
}
static_assert(glu_band_gate_row(glu_band_channel(37)) == 37 &&
                  glu_band_channel(glu_band_gate_row(21) + 8) == 21,
              "a band row's channel and a channel's gate (and linear) row are inverse");
// Whether an FC of n rows can take the band order of `glu` (n = 2 inter; kNone takes any); the
// reason in `why` where not.
bool glu_rows_fit(GluRows glu, int64_t n, int64_t inter, std::string* why);

struct MixedGemmArgs {
  MixedCodes codes_kind = MixedCodes::kInt4;
  DType dtype = DType::kBF16;  // of the activations (and of kInt4's scales): kBF16 or kF16
  const void* a = nullptr;     // [rows, lda] activations, row p = route position p
  int64_t lda = 0;
  void* c = nullptr;  // [rows, ldc] in mixed_out_dtype(dtype); rows of touched experts,
                      // columns < n are written
  int64_t ldc = 0;
  int64_t n = 0, k = 0;
  const uint8_t* codes = nullptr;  // [E, n, k * bits / 8] (table above; shuffled kinds in
                                   // cutlass_mixed_shuffle.cuh's order)
  const void* scales = nullptr;    // [E, k / chunk, n] (the prepared copy)
  const float* zeros = nullptr;    // [E, k / chunk, n] f32, kinds with a zero term only
  int64_t chunk = 0;               // the scale block along K (k for per-channel scales)
  GroupSchedule sched;             // tile_start is not read
  int max_groups = 0;              // an upper bound of *sched.n_touched (min(E, routes))
  int tile_n = 128;  // the tile's rows: 128, or 32 / 64 / 144 where the kind has them (below)
  // Programmatic dependent launch of the setup kernel and the GEMM (cutlass_grouped_kernel.cuh's
  // pdl_gemm_kernel): each waits for the previous kernel before it touches memory.
  bool pdl = false;
  // FC1 with its gated activation in the epilogue (cutlass_act_epilogue.cuh; the kinds, dtypes
  // and tiles of mixed_has_act_epilogue, codes in GluRows order, n = 2 I): c and ldc are not
  // used; channel i of row p becomes act(gate, linear) in the activation dtype at
  // act_out[p * ld_act + i].
  bool act_epilogue = false;
  ActivationSpec act;
  void* act_out = nullptr;
  int64_t ld_act = 0;
  // Another kernel has written this launch's group arrays (mixed_gemm_setup below, after the
  // kernel before the GEMM): the launch runs the GEMM alone.
  bool setup_written = false;
};

// The element of the GEMM's rows (c) for activations of `act`: bf16 rows for bf16 activations, as
// ORT's grouped GEMM writes them (FC1's rows go through the activation, which rounds its output
// to bf16 anyway, and FC2's into the fp32 weighted combine: fp32 rows doubled the epilogue's
// writes and both readers' traffic), fp32 rows for f16 (f16's range, 65504, is narrower than
// FC1's and FC2's sums may reach; bf16's is fp32's).
constexpr DType mixed_out_dtype(DType act) {
  return act == DType::kBF16 ? DType::kBF16 : DType::kF32;
}

// Whether the kind's tile of tile_n rows (for this dtype) has the activation-epilogue form: the
// narrow tile (32) of bf16 kInt4 and kInt8.
bool mixed_has_act_epilogue(MixedCodes c, DType dtype, int tile_n);

// Whether the instance list holds the kind's tile of tile_n rows for this activation dtype: every
// kind has the 128-row one (bf16 and f16), the others (32, 64, 144) exist for bf16 and some kinds
// only.
bool mixed_has_tile(MixedCodes c, DType dtype, int tile_n);
// Whether the kind has the narrow (32-row) tile for this activation dtype (bf16: kInt4, kInt8,
// kE4m3).
bool mixed_has_narrow_tile(MixedCodes c, DType dtype);

// The kind that runs an FC of this format, activation dtype and [n, k] shape, or kNone (with the
// reason in `why`): int4 and int8 with or without zero points, fp8 and fp8_block, MXFP4 (through
// its e4m3 copy, where prepare finds it exact), bf16/f16 activations, k a multiple of
// kMixedTileK, scale blocks per channel or a multiple of kMixedTileK dividing k (fp8_block: the
// square block along k), n a multiple of 8 (of kMixedShuffleRows for the shuffled kinds).
// Host-only.
MixedCodes mixed_codes_for(const FcFormat& f, DType act, int64_t n, int64_t k,
                           std::string* why = nullptr);
// The prepared copy's scale block along k: the format's block, all of k for per-channel scales,
// formats::kFp4E4m3Chunk for MXFP4's e4m3 copy.
int64_t mixed_chunk(const FcFormat& f, int64_t k);

// The prepared copy of one FC of E experts (host side), built from ORT's tensors (codes, scales,
// zero points, fp8's global scale [E]) for mixed_codes_for(f, act, n, k) = c.
struct MixedCopy {
  std::vector<uint8_t> codes;   // the integer kinds: the signed copy (K-contiguous here; the
                                // kernel reads it shuffled, mixed_shuffle_codes); MXFP4: the
                                // e4m3 copy; empty: ORT's codes serve (fp8, fp8_block)
  std::vector<uint8_t> scales;  // [E, k / chunk, n], mixed_scale_bytes(c) each
  std::vector<float> zeros;     // [E, k / chunk, n]; empty without a zero term
  int64_t chunk = 0;            // the scale block along k
  bool exact = true;            // MXFP4: whether every chunk converted exactly (fp4_e4m3.h);
                                // false: the copy must not be used
};
void mixed_prepare(MixedCodes c, const FcFormat& f, DType act, int64_t experts, int64_t n,
                   int64_t k, const uint8_t* codes, const uint8_t* scales,
                   const uint8_t* zero_points, const float* global_scale, MixedCopy* out);

// The shuffle of `bits`-bit codes [experts, n, k * bits / 8] (K-contiguous; int4: low nibble =
// even k) into the kernel's order, out of place (out 8-byte aligned) on `stream`; bits 4 or 8, n
// a multiple of kMixedShuffleRows, k of kMixedShuffleCols. `flip` also flips each code's top bit
// (ORT's codes to kInt4's / kInt8's signed copy in the same pass). The kernel follows the orders
// drawn in cutlass_mixed_shuffle.cuh; mixed_shuffle_codes_host, its twin for the tests, places
// each code by CuTe's layout of the whole matrix instead, element by element (no flip).
// `glu` (with `inter`, n = 2 inter) reorders the rows as glu_source_row() draws (FC1 of a layer
// with the activation in its epilogue).
Status mixed_shuffle_codes(const uint8_t* in, uint8_t* out, int64_t experts, int64_t n, int64_t k,
                           int bits, bool flip, cudaStream_t stream, GluRows glu = GluRows::kNone,
                           int64_t inter = 0);
void mixed_shuffle_codes_host(const uint8_t* in, uint8_t* out, int64_t experts, int64_t n,
                              int64_t k, int bits);

// Whether these arguments can run (the kind's shape rules, plus strides and 16-byte aligned
// pointers); `why` names the first that cannot. Host-only.
bool mixed_gemm_can_implement(const MixedGemmArgs& args, std::string* why = nullptr);

// Workspace bytes of one launch over up to max_groups groups on sm_count multiprocessors, with
// either of the kind's tiles: the per-group shape, pointer and stride arrays plus CUTLASS's TMA
// descriptors. 0 for a dtype or kind without a kernel or max_groups <= 0. Exact, and
// nondecreasing in max_groups.
size_t mixed_gemm_workspace_bytes(MixedCodes c, DType dtype, int64_t max_groups, int sm_count);

// The CTAs per SM a launch of the tile over an FC of n output features and up to `groups`
// experts runs: the narrow tile two (cutlass_two_ctas.cuh: four consumer warps per scheduler
// instead of two, each CTA with half the stages) where its tiles fill two CTAs on every SM, else
// one. Measured (bench/results/2026-12-05-h200-narrow-two-ctas.md): two CTAs took 7-14% off
// qwen3-30b-a3b INT4 / INT8, DeepSeek-V3 bf16 and qwen3.6-35b-a3b INT4 at 12-384 tokens, but
// Mixtral's FC2 (16 tiles x 8 experts = 128 < 264) took 171 us against 103 with one CTA and half
// the stages.
int mixed_ctas_per_sm(int tile_n, int64_t n, int64_t groups, int sm_count);

// How many CTAs per SM of the instance of this kind, dtype, tile, epilogue and residency
// (ctas_per_sm) the current device holds at once (the occupancy API); invalid for a combination
// without an instance.
Status mixed_gemm_residency(MixedCodes c, DType dtype, int tile_n, bool act_epilogue,
                            int ctas_per_sm, int* resident);

// Launches the setup kernel (none where args.setup_written) and the GEMM on `stream`; `workspace`
// holds at least mixed_gemm_workspace_bytes(args.codes_kind, args.dtype, args.max_groups,
// sm_count) bytes, 256-byte aligned.
Status launch_mixed_grouped_gemm(const MixedGemmArgs& args, int sm_count, void* workspace,
                                 size_t workspace_bytes, cudaStream_t stream);

// The group arrays launch_mixed_grouped_gemm's setup kernel would write for `args` in `workspace`
// (checked as there), for a kernel that runs before the GEMM to write them instead
// (DeviceRoutingArgs::plan_setups); the launch then takes args.setup_written.
Status mixed_gemm_setup(const MixedGemmArgs& args, int sm_count, void* workspace,
                        size_t workspace_bytes, GroupSetup* setup);

}  // namespace qmoe::cuda
