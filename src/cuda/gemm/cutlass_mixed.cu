// cutlass_mixed.h's host side: which FCs and arguments the mixed-input kernel takes, the prepared
// copy, its workspace, and the dispatch to the instances. No CUTLASS header here.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/formats/codec.h"
#include "core/formats/fp4_e4m3.h"
#include "core/numeric.h"
#include "cuda/gemm/cutlass_mixed.h"
#include "cuda/gemm/cutlass_mixed_instances.h"
#include "qmoe/quantize.h"

namespace qmoe::cuda {
namespace {

bool fail(std::string* why, const std::string& what) {
  if (why) *why = what;
  return false;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

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

bool glu_rows_fit(GluRows glu, int64_t n, int64_t inter, std::string* why) {
  if (glu == GluRows::kNone || (inter > 0 && n == 2 * inter)) return true;
  return fail(why, "glu: expected n = 2 inter, got n " + std::to_string(n) + ", inter " +
                       std::to_string(inter));
}

static_assert(formats::kFp4E4m3Chunk % kMixedTileK == 0, "MXFP4's e4m3 chunk: whole K tiles");

int64_t mixed_chunk(const FcFormat& f, int64_t k) {
  if (f.format == WeightFormat::kMxFp4) return formats::kFp4E4m3Chunk;
  return f.block_size == 0 ? k : f.block_size;
}

const char* mixed_codes_name(MixedCodes c) {
  switch (c) {
    case MixedCodes::kInt4:
      return "int4";
    case MixedCodes::kInt4Zero:
      return "int4+zero";
    case MixedCodes::kInt8Zero:
      return "int8+zero";
    case MixedCodes::kE4m3:
      return "e4m3";
    case MixedCodes::kInt8:
      return "int8";
    default:
      return "none";
  }
}

MixedCodes mixed_codes_for(const FcFormat& f, DType act, int64_t n, int64_t k, std::string* why) {
  const auto none = [why](const std::string& what) {
    fail(why, what);
    return MixedCodes::kNone;
  };
  MixedCodes c = MixedCodes::kNone;
  switch (f.format) {
    case WeightFormat::kInt4:
      c = f.zero_points ? MixedCodes::kInt4Zero : MixedCodes::kInt4;
      break;
    case WeightFormat::kInt8:
      c = f.zero_points ? MixedCodes::kInt8Zero : MixedCodes::kInt8;
      break;
    case WeightFormat::kFp8:
    case WeightFormat::kFp8Block:
    case WeightFormat::kMxFp4:
      c = MixedCodes::kE4m3;
      break;
    default:
      return none("format " + f.to_string() + " (int4, int8, fp8, fp8_block or mxfp4 only)");
  }
  if (act != DType::kBF16 && act != DType::kF16) {
    return none(std::string("activation dtype ") + dtype_name(act) + " (bf16 or f16 only)");
  }
  if (f.format != WeightFormat::kFp8 && f.format != WeightFormat::kMxFp4 &&
      f.scale_dtype != DType::kF32 && f.scale_dtype != DType::kF16 &&
      f.scale_dtype != DType::kBF16) {
    return none(std::string("scale dtype ") + dtype_name(f.scale_dtype));
  }
  if (k <= 0 || k % kMixedTileK != 0) {
    return none("k = " + std::to_string(k) + " not a multiple of " + std::to_string(kMixedTileK));
  }
  const int64_t chunk = mixed_chunk(f, k);
  if (chunk != k && (chunk % kMixedTileK != 0 || k % chunk != 0)) {
    return none("block size " + std::to_string(f.block_size) + " (a multiple of " +
                std::to_string(kMixedTileK) + " dividing k, or per channel)");
  }
  const int64_t rows = mixed_codes_shuffled(c) ? kMixedShuffleRows : 8;
  if (n <= 0 || n % rows != 0) {
    return none("n = " + std::to_string(n) + " not a multiple of " + std::to_string(rows));
  }
  if (n > INT32_MAX || k > INT32_MAX) return none("n or k beyond int32");
  return c;
}

void mixed_prepare(MixedCodes c, const FcFormat& f, DType act, int64_t experts, int64_t n,
                   int64_t k, const uint8_t* codes, const uint8_t* scales,
                   const uint8_t* zero_points, const float* global_scale, MixedCopy* out) {
  using formats::packed_bytes;
  using formats::read_bits;
  const int64_t chunk = mixed_chunk(f, k), kb = k / chunk;
  const int bits = f.info().code_bits;
  const int64_t mid = int64_t{1} << (bits - 1);  // ORT's implicit zero point
  out->chunk = chunk;
  out->exact = true;
  if (f.format == WeightFormat::kMxFp4) {  // the e4m3 copy and its f32 scales, chunk by chunk
    std::vector<uint8_t> k_packed;
    const uint8_t* src = codes;
    if (f.fp4_layout == Fp4Layout::kNPacked) {
      k_packed.resize(static_cast<size_t>(experts * n * (k / 2)));
      fp4_repack(Fp4Layout::kNPacked, codes, experts, n, k, k_packed.data());
      src = k_packed.data();
    }
    out->codes.resize(static_cast<size_t>(experts * n * k));
    out->scales.assign(static_cast<size_t>(experts * kb * n * 4), 0);
    out->zeros.clear();
    const int64_t blocks = k / 32;  // e8m0 codes per row
    for (int64_t e = 0; e < experts; ++e) {
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t b = 0; b < kb; ++b) {
          float s = 0.0f;
          const bool ok = formats::mxfp4_chunk_to_e4m3<formats::kFp4E4m3Chunk>(
              src + (e * n + r) * (k / 2) + b * (chunk / 2), scales + (e * n + r) * blocks + 2 * b,
              formats::kFp4E4m3Chunk, global_scale[e],
              &out->codes[static_cast<size_t>((e * n + r) * k + b * chunk)], &s);
          out->exact = out->exact && ok;
          std::memcpy(&out->scales[static_cast<size_t>(((e * kb + b) * n + r) * 4)], &s, 4);
        }
      }
    }
    return;
  }
  // Codes: int4's q in [0, 16) becomes the int4 two's complement of q - 8 (its top bit flipped,
  // both nibbles of a byte at once), int8's q in [0, 256) the int8 of q - 128 (the same flip);
  // e4m3 codes are read as ORT stores them.
  out->codes.clear();
  if (mixed_codes_shuffled(c)) {
    const uint8_t flip = bits == 8 ? 0x80 : 0x88;
    out->codes.resize(static_cast<size_t>(experts * n * (k * bits / 8)));
    for (size_t i = 0; i < out->codes.size(); ++i) out->codes[i] = codes[i] ^ flip;
  }
  // Scales [E, kb, n] from ORT's [E, n, kb] (int; kb = 1 per channel), fp8_block's
  // [E, ceil(n / bs), kb] (one per bs rows) or fp8's global [E]; zeros beside them.
  const int64_t sb = mixed_scale_bytes(c);
  const size_t es = dtype_size(f.scale_dtype);
  out->scales.assign(static_cast<size_t>(experts * kb * n * sb), 0);
  out->zeros.assign(mixed_has_zeros(c) ? static_cast<size_t>(experts * kb * n) : 0, 0.0f);
  for (int64_t e = 0; e < experts; ++e) {
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t b = 0; b < kb; ++b) {
        float s = 0.0f;
        if (f.format == WeightFormat::kFp8) {
          s = global_scale[e];
        } else if (f.format == WeightFormat::kFp8Block) {
          const int64_t rb = formats::ceil_div(n, chunk);
          s = scale_to_f32(scales + ((e * rb + r / chunk) * kb + b) * es, f.scale_dtype);
        } else {
          s = scale_to_f32(scales + ((e * n + r) * kb + b) * es, f.scale_dtype);
        }
        const size_t at = static_cast<size_t>((e * kb + b) * n + r);
        if (sb == 2) {
          const uint16_t h = act == DType::kBF16 ? num::f32_to_bf16(s) : num::f32_to_f16(s);
          std::memcpy(&out->scales[at * 2], &h, 2);
        } else {
          std::memcpy(&out->scales[at * 4], &s, 4);
        }
        if (!mixed_has_zeros(c)) continue;
        // Per channel: one stream along n per expert; blocked: one stream per row along kb.
        int64_t zp = mid;
        if (f.zero_points) {
          zp = f.block_size == 0
                   ? read_bits(zero_points + e * packed_bytes(n, bits), r, bits)
                   : read_bits(zero_points + (e * n + r) * packed_bytes(kb, bits), b, bits);
        }
        // The signed codes are q - mid already.
        out->zeros[at] = -static_cast<float>(zp - mid) * s;
      }
    }
  }
}

bool mixed_gemm_can_implement(const MixedGemmArgs& a, std::string* why) {
  // The kind's shape rules, through a format of that kind with the arguments' chunk.
  FcFormat f;
  switch (a.codes_kind) {
    case MixedCodes::kInt4:
    case MixedCodes::kInt4Zero:
      f.format = WeightFormat::kInt4;
      break;
    case MixedCodes::kInt8Zero:
    case MixedCodes::kInt8:
      f.format = WeightFormat::kInt8;
      break;
    case MixedCodes::kE4m3:
      f.format = WeightFormat::kFp8Block;
      break;
    default:
      return fail(why, "codes_kind: none");
  }
  f.zero_points = mixed_has_zeros(a.codes_kind);
  f.block_size = a.chunk == a.k ? 0 : static_cast<int>(a.chunk);
  if (f.format == WeightFormat::kFp8Block && f.block_size == 0) f.format = WeightFormat::kFp8;
  if (a.chunk <= 0) return fail(why, "chunk = " + std::to_string(a.chunk) + " (expected > 0)");
  if (a.tile_n != 128 && !mixed_has_tile(a.codes_kind, a.dtype, a.tile_n)) {
    return fail(why, "tile_n = " + std::to_string(a.tile_n) + " (128, or 32 / 64 / 144 where " +
                         mixed_codes_name(a.codes_kind) + " has that tile)");
  }
  if (mixed_codes_for(f, a.dtype, a.n, a.k, why) != a.codes_kind) return false;
  if (mixed_has_zeros(a.codes_kind) && (a.zeros == nullptr || !aligned16(a.zeros))) {
    return fail(why, "zeros: expected a 16-byte aligned pointer");
  }
  // 16-byte TMA rows: lda in activations; D's contiguous extent in floats.
  if (a.lda < a.k || a.lda % 8 != 0) return fail(why, "lda not >= k and a multiple of 8");
  if (!aligned16(a.a) || !aligned16(a.codes) || !aligned16(a.scales)) {
    return fail(why, "a, codes or scales not 16-byte aligned");
  }
  if (a.act_epilogue) {  // rows of n / 2 channels in the activation dtype; c unused
    if (!mixed_has_act_epilogue(a.codes_kind, a.dtype, a.tile_n)) {
      return fail(why, std::string("act_epilogue: no such instance for ") +
                           mixed_codes_name(a.codes_kind) + ", tile_n " + std::to_string(a.tile_n));
    }
    if (!a.act.gated() || a.act.glu == GluLayout::kSeparateFc3) {
      return fail(why, "act_epilogue: expected a gated activation of FC1's own rows");
    }
    if (a.n % kMixedShuffleRows != 0 || a.act_out == nullptr || a.ld_act < a.n / 2) {
      return fail(why, "act_epilogue: expected n a multiple of 16, act_out and ld_act >= n / 2");
    }
    return true;
  }
  if (a.ldc < a.n || a.ldc % 8 != 0) return fail(why, "ldc not >= n and a multiple of 8");
  if (!aligned16(a.c)) return fail(why, "c not 16-byte aligned");
  return true;
}

bool mixed_has_act_epilogue(MixedCodes c, DType dtype, int tile_n) {
  if (dtype != DType::kBF16 && dtype != DType::kF16) return false;
  const bool bf16 = dtype == DType::kBF16;
#define QMOE_MIXED_HAS_ACT(kCodes, kBf16, kTileN, kAct, kCtas) \
  if (kAct && kTileN == tile_n && c == kCodes && bf16 == kBf16) return true;
  QMOE_MIXED_INSTANCES(QMOE_MIXED_HAS_ACT)
#undef QMOE_MIXED_HAS_ACT
  return false;
}

bool mixed_has_tile(MixedCodes c, DType dtype, int tile_n) {
  if (dtype != DType::kBF16 && dtype != DType::kF16) return false;
  const bool bf16 = dtype == DType::kBF16;
#define QMOE_MIXED_HAS(kCodes, kBf16, kTileN, kAct, kCtas) \
  if (kTileN == tile_n && c == kCodes && bf16 == kBf16) return true;
  QMOE_MIXED_INSTANCES(QMOE_MIXED_HAS)
#undef QMOE_MIXED_HAS
  return false;
}

bool mixed_has_narrow_tile(MixedCodes c, DType dtype) { return mixed_has_tile(c, dtype, 32); }

size_t mixed_gemm_workspace_bytes(MixedCodes c, DType dtype, int64_t max_groups, int sm_count) {
  if (max_groups <= 0 || (dtype != DType::kBF16 && dtype != DType::kF16)) return 0;
  const bool bf16 = dtype == DType::kBF16;
  // Any of the kind's tiles may run a call: the largest of their needs.
  size_t bytes = 0;
#define QMOE_MIXED_BYTES(kCodes, kBf16, kTileN, kAct, kCtas)                                       \
  if (c == kCodes && bf16 == kBf16) {                                                              \
    bytes =                                                                                        \
        std::max(bytes, cutlass_detail::mixed_workspace_bytes<kCodes, kBf16, kTileN, kAct, kCtas>( \
                            max_groups, sm_count));                                                \
  }
  QMOE_MIXED_INSTANCES(QMOE_MIXED_BYTES)
#undef QMOE_MIXED_BYTES
  return bytes;
}

int mixed_ctas_per_sm(int tile_n, int64_t n, int64_t groups, int sm_count) {
  if (tile_n != 32) return 1;
  const int64_t tiles = (n + kMixedNarrowTileM - 1) / kMixedNarrowTileM * groups;
  return tiles >= 2 * static_cast<int64_t>(sm_count) ? 2 : 1;
}

Status mixed_gemm_residency(MixedCodes c, DType dtype, int tile_n, bool act_epilogue,
                            int ctas_per_sm, int* resident) {
  const bool bf16 = dtype == DType::kBF16;
  if (dtype == DType::kBF16 || dtype == DType::kF16) {
#define QMOE_MIXED_RESIDENCY(kCodes, kBf16, kTileN, kAct, kCtas)                          \
  if (c == kCodes && bf16 == kBf16 && tile_n == kTileN && act_epilogue == kAct &&         \
      ctas_per_sm == kCtas) {                                                             \
    return cutlass_detail::mixed_residency<kCodes, kBf16, kTileN, kAct, kCtas>(resident); \
  }
    QMOE_MIXED_INSTANCES(QMOE_MIXED_RESIDENCY)
#undef QMOE_MIXED_RESIDENCY
  }
  return Status::invalid("mixed_gemm_residency: no instance for codes_kind " +
                         std::string(mixed_codes_name(c)) + ", tile_n " + std::to_string(tile_n) +
                         (act_epilogue ? " with the activation epilogue" : "") + " at " +
                         std::to_string(ctas_per_sm) + " CTAs per SM");
}

namespace {

// launch_mixed_grouped_gemm's and mixed_gemm_setup's checks; the instance's CTAs per SM.
Status check_mixed_launch(const MixedGemmArgs& args, int sm_count, const void* workspace,
                          size_t workspace_bytes, const char* what, int* ctas) {
  const std::string fn(what);
  std::string why;
  if (!mixed_gemm_can_implement(args, &why)) return Status::invalid(fn + ": args: " + why);
  if (args.max_groups <= 0) {
    return Status::invalid(fn + ": args.max_groups: expected > 0, got " +
                           std::to_string(args.max_groups));
  }
  if (sm_count <= 0) {
    return Status::invalid(fn + ": sm_count: expected > 0, got " + std::to_string(sm_count));
  }
  if (args.sched.touched == nullptr || args.sched.n_touched == nullptr ||
      args.sched.offsets == nullptr) {
    return Status::invalid(fn + ": args.sched: expected device pointers");
  }
  const size_t need =
      mixed_gemm_workspace_bytes(args.codes_kind, args.dtype, args.max_groups, sm_count);
  if (workspace == nullptr || workspace_bytes < need ||
      reinterpret_cast<uintptr_t>(workspace) % 256 != 0) {
    return Status::invalid(fn + ": workspace: expected " + std::to_string(need) +
                           " bytes, 256-byte aligned, got " +
                           std::to_string(workspace == nullptr ? 0 : workspace_bytes));
  }
  *ctas = mixed_ctas_per_sm(args.tile_n, args.n, args.max_groups, sm_count);
  return Status::ok();
}

}  // namespace

Status launch_mixed_grouped_gemm(const MixedGemmArgs& args, int sm_count, void* workspace,
                                 size_t workspace_bytes, cudaStream_t stream) {
  int ctas = 1;
  QMOE_RETURN_IF_ERROR(check_mixed_launch(args, sm_count, workspace, workspace_bytes,
                                          "launch_mixed_grouped_gemm", &ctas));
  const bool bf16 = args.dtype == DType::kBF16;
#define QMOE_MIXED_LAUNCH(kCodes, kBf16, kTileN, kAct, kCtas)                                   \
  if (args.codes_kind == kCodes && bf16 == kBf16 && args.tile_n == kTileN &&                    \
      args.act_epilogue == kAct && ctas == kCtas) {                                             \
    return cutlass_detail::mixed_launch<kCodes, kBf16, kTileN, kAct, kCtas>(args, sm_count,     \
                                                                            workspace, stream); \
  }
  QMOE_MIXED_INSTANCES(QMOE_MIXED_LAUNCH)
#undef QMOE_MIXED_LAUNCH
  return Status::internal("launch_mixed_grouped_gemm: no instance for codes_kind " +
                          std::string(mixed_codes_name(args.codes_kind)) + ", tile_n " +
                          std::to_string(args.tile_n));
}

Status mixed_gemm_setup(const MixedGemmArgs& args, int sm_count, void* workspace,
                        size_t workspace_bytes, GroupSetup* setup) {
  if (setup == nullptr) return Status::invalid("mixed_gemm_setup: setup: null");
  int ctas = 1;
  QMOE_RETURN_IF_ERROR(
      check_mixed_launch(args, sm_count, workspace, workspace_bytes, "mixed_gemm_setup", &ctas));
  const bool bf16 = args.dtype == DType::kBF16;
#define QMOE_MIXED_SETUP(kCodes, kBf16, kTileN, kAct, kCtas)                                 \
  if (args.codes_kind == kCodes && bf16 == kBf16 && args.tile_n == kTileN &&                 \
      args.act_epilogue == kAct && ctas == kCtas) {                                          \
    *setup = cutlass_detail::mixed_setup<kCodes, kBf16, kTileN, kAct, kCtas>(args, sm_count, \
                                                                             workspace);     \
    return Status::ok();                                                                     \
  }
  QMOE_MIXED_INSTANCES(QMOE_MIXED_SETUP)
#undef QMOE_MIXED_SETUP
  return Status::internal("mixed_gemm_setup: no instance for codes_kind " +
                          std::string(mixed_codes_name(args.codes_kind)) + ", tile_n " +
                          std::to_string(args.tile_n));
}

}  // namespace qmoe::cuda
