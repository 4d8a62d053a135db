// Dequantization of the touched experts of one wave into a dense scratch, the B operand of the
// generic path's grouped GEMM. Every element is computed with the host's fp32 formula
// (docs/formats.md), so an f32 result equals dequantize_row<float> bit for bit; bf16 and f16
// results are that value rounded to nearest even.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/dequant/device_fc.h"
#include "qmoe/status.h"

namespace qmoe::cuda {

struct DequantArgs {
  DeviceFc fc;
  DType out_dtype = DType::kBF16;      // kBF16, kF16 or kF32
  void* out = nullptr;                 // slot s at out + s * slot_stride elements: [fc.n, ld]
  int64_t ld = 0;                      // >= fc.k, a multiple of 8; columns [k, ld) are written as 0
  int64_t slot_stride = 0;             // >= fc.n * ld
  const int32_t* touched = nullptr;    // [E] expert ids by touched index
  const int32_t* n_touched = nullptr;  // [1]
  int first_group = 0;                 // slot s holds touched index first_group + s
  int max_groups = 0;                  // slots in the scratch
};

// Validates and launches on `stream` (asynchronous, no allocation, graph-capturable).
Status launch_dequant(const DequantArgs& args, cudaStream_t stream);

// The same from an FP4 FC's packed copy (fc.packed_words, dequant_packed.cu): the same fp32 values.
Status launch_dequant_packed(const DequantArgs& args, cudaStream_t stream);

}  // namespace qmoe::cuda
