// Prepare-time packing on the device: the layouts the kernels read (mma_pack.h's decode layout,
// cutlass_mixed.h's mixed-input copy, K-packed FP4), built from ORT's tensors already in device
// memory. Prepare uploads each tensor once and packs it here, so a layer's load costs its upload;
// packing on the host and uploading every packed copy took about 1 s per Qwen3-30B-A3B layer and
// over a minute per DeepSeek-V3 layer.
//
// Each function is the device twin of a host function, bit for bit (tests/gpu/test_gpu_prepare.cpp
// compares every format, map and dtype); the host functions stay the oracle and serve the tools:
//
//   device_pack_int / _fp4 / _fp8   mma_pack_int / mma_pack_fp4 / mma_pack_fp8
//   device_pack_scales              mma_pack_scales
//   device_pack_zero_points         mma_pack_zero_points
//   device_gated_row_scales         mma_gated_row_scales
//   device_fp4_k_packed             fp4_repack(Fp4Layout::kNPacked, ...)
//   device_mixed_scales             mixed_prepare (its scales and zeros)
//   device_mxfp4_e4m3               mixed_prepare of MXFP4 (its e4m3 codes and scales)
//   device_mxfp4_e4m3_rows          formats::mxfp4_chunk_to_e4m3<128> over every chunk
//
// Every pointer is device memory; outputs are written whole (padding included) and must not overlap
// the inputs. The launches go to `stream`; a launch error is returned, nothing waits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/formats/mma_pack.h"
#include "cuda/gemm/cutlass_mixed.h"
#include "qmoe/format.h"
#include "qmoe/status.h"

namespace qmoe::cuda {

// out: experts * s.words_per_expert() words.
Status device_pack_int(const MmaPackShape& s, const uint8_t* raw, int64_t experts, uint32_t* out,
                       cudaStream_t stream);
// raw: K-packed E2M1 codes [E, N, K / 2].
Status device_pack_fp4(const MmaPackShape& s, const uint8_t* raw, int64_t experts, uint32_t* out,
                       cudaStream_t stream);
// raw_linear: as mma_pack_fp8's (a separate FC3's rows), or null.
Status device_pack_fp8(const MmaPackShape& s, const uint8_t* raw, const uint8_t* raw_linear,
                       int64_t experts, uint32_t* out, cudaStream_t stream);

// out: experts * s.tiles * 16 * s.scale_blocks entries of elem_bytes (scales) or of one byte
// (zero points).
Status device_pack_scales(const MmaPackShape& s, const uint8_t* scales, int elem_bytes,
                          int64_t experts, uint8_t* out, cudaStream_t stream);
Status device_pack_zero_points(const MmaPackShape& s, const uint8_t* zp, int64_t experts,
                               uint8_t* out, cudaStream_t stream);
// out: experts * 2 * s.units * s.k_blocks() entries of elem_bytes.
Status device_gated_row_scales(const MmaPackShape& s, const uint8_t* gate, const uint8_t* linear,
                               int elem_bytes, int64_t block_rows, int64_t experts, uint8_t* out,
                               cudaStream_t stream);

// ORT's N-packed FP4 codes [E, K, N / 2] as K-packed ones [E, N, K / 2] (n and k even).
Status device_fp4_k_packed(const uint8_t* n_packed, int64_t experts, int64_t n, int64_t k,
                           uint8_t* out, cudaStream_t stream);

// The scales of the mixed-input copy of an FC for mixed_codes_for(f, act, n, k) = c
// (mixed_prepare's result; the signed kinds' codes come from mixed_shuffle_codes with its flip):
// [E, k / chunk, n] of mixed_scale_bytes(c) each, with the zeros beside them (zeros_out null for
// kinds without a zero term). chunk is mixed_prepare's (block_size, or k per channel). `glu`
// (with `inter`) orders the rows as the codes' shuffle does (glu_source_row, cutlass_mixed.h).
Status device_mixed_scales(MixedCodes c, const FcFormat& f, DType act, int64_t experts, int64_t n,
                           int64_t k, const uint8_t* scales, const uint8_t* zero_points,
                           const float* global_scale, void* scales_out, float* zeros_out,
                           cudaStream_t stream, GluRows glu = GluRows::kNone, int64_t inter = 0);

// MXFP4's e4m3 copy (fp4_e4m3.h, mixed_prepare's MXFP4 result): K-packed codes [E, n, k / 2],
// e8m0 scales [E, n, k / 32] and the global scales [E] become e4m3 codes [E, n, k] and f32
// scales [E, k / 64, n]. *inexact (device memory, zeroed by the caller) becomes nonzero where a
// chunk does not convert exactly.
Status device_mxfp4_e4m3(const uint8_t* codes, const uint8_t* scales, const float* global_scale,
                         int64_t experts, int64_t n, int64_t k, uint8_t* codes_out,
                         float* scales_out, int32_t* inexact, cudaStream_t stream);

// MXFP4's copy for the FP8 GEMM (fp4_e4m3.h's 128-K chunks, cutlass_fp8.h's row scales): K-packed
// codes [E, n, k / 2], e8m0 scales [E, n, k / 32] and the global scales [E] become e4m3 codes
// [E, n, kq] and f32 scales [E, n, kq / 128], kq = k rounded up to 128 (codes past k zero).
// *inexact as device_mxfp4_e4m3's.
Status device_mxfp4_e4m3_rows(const uint8_t* codes, const uint8_t* scales,
                              const float* global_scale, int64_t experts, int64_t n, int64_t k,
                              int64_t kq, uint8_t* codes_out, float* scales_out, int32_t* inexact,
                              cudaStream_t stream);

}  // namespace qmoe::cuda
