// cutlass_mixed.h's host side: which FCs and arguments the mixed-input kernel takes, the prepared
// copy, its workspace, and the dispatch to the per-dtype instances. No CUTLASS header here.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/numeric.h"
#include "cuda/gemm/cutlass_mixed.h"
#include "cuda/gemm/cutlass_mixed_instances.h"

namespace qmoe::cuda {
namespace {

bool fail(std::string* why, const std::string& what) {
  if (why) *why = what;
  return false;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The scale block along K: the format's block, or all of K for per-channel scales.
int64_t chunk_of(const FcFormat& f, int64_t k) { return f.block_size == 0 ? k : f.block_size; }

float scale_to_f32(const uint8_t* p, DType dt) {
  uint16_t h;
  switch (dt) {
    case DType::kF16:
      std::memcpy(&h, p, 2);
      return num::f16_to_f32(h);
    case DType::kBF16:
      std::memcpy(&h, p, 2);
      return num::bf16_to_f32(h);
    default: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
  }
}

}  // namespace

bool mixed_int4_supported(const FcFormat& f, DType act, int64_t n, int64_t k, std::string* why) {
  if (f.format != WeightFormat::kInt4) return fail(why, "format " + f.to_string() + " (int4 only)");
  if (f.zero_points) return fail(why, "zero points (symmetric int4 only)");
  if (act != DType::kBF16 && act != DType::kF16) {
    return fail(why, std::string("activation dtype ") + dtype_name(act) + " (bf16 or f16 only)");
  }
  if (f.scale_dtype != DType::kF32 && f.scale_dtype != DType::kF16 &&
      f.scale_dtype != DType::kBF16) {
    return fail(why, std::string("scale dtype ") + dtype_name(f.scale_dtype));
  }
  if (k <= 0 || k % kMixedTileK != 0) {
    return fail(why,
                "k = " + std::to_string(k) + " not a multiple of " + std::to_string(kMixedTileK));
  }
  const int64_t chunk = chunk_of(f, k);
  if (chunk != k && (chunk % kMixedTileK != 0 || k % chunk != 0)) {
    return fail(why, "block size " + std::to_string(f.block_size) + " (a multiple of " +
                         std::to_string(kMixedTileK) + " dividing k, or per channel)");
  }
  if (n <= 0 || n % 8 != 0) return fail(why, "n = " + std::to_string(n) + " not a multiple of 8");
  if (n > INT32_MAX || k > INT32_MAX) return fail(why, "n or k beyond int32");
  return true;
}

void mixed_int4_prepare(const FcFormat& f, DType act, int64_t experts, int64_t n, int64_t k,
                        const uint8_t* codes, const uint8_t* scales,
                        std::vector<uint8_t>* codes_out, std::vector<uint16_t>* scales_out) {
  // Codes: q in [0, 16) with zero point 8 -> the int4 two's complement of q - 8, which is q with
  // its top bit flipped; both nibbles of a byte at once.
  const size_t code_bytes = static_cast<size_t>(experts * n * (k / 2));
  codes_out->resize(code_bytes);
  for (size_t i = 0; i < code_bytes; ++i) (*codes_out)[i] = codes[i] ^ 0x88;
  // Scales: ORT's [E, n, kb] (kb = 1 per channel) -> [E, kb, n], rounded to the activation dtype.
  const int64_t kb = k / chunk_of(f, k);
  const size_t es = dtype_size(f.scale_dtype);
  scales_out->resize(static_cast<size_t>(experts * kb * n));
  for (int64_t e = 0; e < experts; ++e) {
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t b = 0; b < kb; ++b) {
        const float s = scale_to_f32(scales + ((e * n + r) * kb + b) * es, f.scale_dtype);
        (*scales_out)[(e * kb + b) * n + r] =
            act == DType::kBF16 ? num::f32_to_bf16(s) : num::f32_to_f16(s);
      }
    }
  }
}

bool mixed_gemm_can_implement(const MixedGemmArgs& a, std::string* why) {
  FcFormat f;
  f.format = WeightFormat::kInt4;
  f.block_size = a.chunk == a.k ? 0 : static_cast<int>(a.chunk);
  if (a.chunk <= 0) return fail(why, "chunk = " + std::to_string(a.chunk) + " (expected > 0)");
  if (!mixed_int4_supported(f, a.dtype, a.n, a.k, why)) return false;
  // 16-byte TMA rows: lda in activations; D's contiguous extent in floats.
  if (a.lda < a.k || a.lda % 8 != 0) return fail(why, "lda not >= k and a multiple of 8");
  if (a.ldc < a.n || a.ldc % 4 != 0) return fail(why, "ldc not >= n and a multiple of 4");
  if (!aligned16(a.a) || !aligned16(a.c) || !aligned16(a.codes) || !aligned16(a.scales)) {
    return fail(why, "a, c, codes or scales not 16-byte aligned");
  }
  return true;
}

size_t mixed_gemm_workspace_bytes(DType dtype, int64_t max_groups, int sm_count) {
  if (max_groups <= 0) return 0;
  if (dtype == DType::kBF16)
    return cutlass_detail::mixed_workspace_bytes<true>(max_groups, sm_count);
  if (dtype == DType::kF16)
    return cutlass_detail::mixed_workspace_bytes<false>(max_groups, sm_count);
  return 0;
}

Status launch_mixed_grouped_gemm(const MixedGemmArgs& args, int sm_count, void* workspace,
                                 size_t workspace_bytes, cudaStream_t stream) {
  std::string why;
  if (!mixed_gemm_can_implement(args, &why)) {
    return Status::invalid("launch_mixed_grouped_gemm: args: " + why);
  }
  if (args.max_groups <= 0) {
    return Status::invalid("launch_mixed_grouped_gemm: args.max_groups: expected > 0, got " +
                           std::to_string(args.max_groups));
  }
  if (sm_count <= 0) {
    return Status::invalid("launch_mixed_grouped_gemm: sm_count: expected > 0, got " +
                           std::to_string(sm_count));
  }
  if (args.sched.touched == nullptr || args.sched.n_touched == nullptr ||
      args.sched.offsets == nullptr) {
    return Status::invalid("launch_mixed_grouped_gemm: args.sched: expected device pointers");
  }
  const size_t need = mixed_gemm_workspace_bytes(args.dtype, args.max_groups, sm_count);
  if (workspace == nullptr || workspace_bytes < need ||
      reinterpret_cast<uintptr_t>(workspace) % 256 != 0) {
    return Status::invalid("launch_mixed_grouped_gemm: workspace: expected " +
                           std::to_string(need) + " bytes, 256-byte aligned, got " +
                           std::to_string(workspace == nullptr ? 0 : workspace_bytes));
  }
  return args.dtype == DType::kBF16
             ? cutlass_detail::mixed_launch<true>(args, sm_count, workspace, stream)
             : cutlass_detail::mixed_launch<false>(args, sm_count, workspace, stream);
}

}  // namespace qmoe::cuda
