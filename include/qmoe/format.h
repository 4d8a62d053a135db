// qmoe: weight formats. QMOE_WEIGHT_FORMATS is the one list of formats: it generates the enum, the
// traits table (format_info), the test parameter lists and the README table (`qmoe info
// --formats`). Adding a format means adding one line here and its traits in src/core/formats/.
#pragma once

#include <cstdint>
#include <string>

#include "qmoe/status.h"
#include "qmoe/tensor.h"

namespace qmoe {

enum class FormatKind : uint8_t { kInteger, kFp4, kFp8 };

// How a format's block_size may be chosen.
enum class BlockRule : uint8_t {
  kIntBlocks,  // 0 = one scale per output channel, else a power of two in [16, 256] dividing K
  kFixed,      // exactly default_block (nvfp4 16, mxfp4 32)
  kNone,       // no blocks: one fp32 global scale per expert (fp8)
  kSquare,     // square blocks of block_size x block_size over (N, K), edge blocks may be partial
};

// X(id, name, ort_quant_type, code_bits, kind, block_rule, default_block, zero_points_allowed,
//   global_scale_required, summary)
#define QMOE_WEIGHT_FORMATS(X)                                          \
  X(kInt2, "int2", "int", 2, kInteger, kIntBlocks, 64, true, false,     \
    "2-bit integer, (q - zp) * scale, symmetric zp = 2")                \
  X(kInt3, "int3", "int", 3, kInteger, kIntBlocks, 64, true, false,     \
    "3-bit integer, row-local LSB-first bitstream, symmetric zp = 4")   \
  X(kInt4, "int4", "int", 4, kInteger, kIntBlocks, 128, true, false,    \
    "4-bit integer, low nibble = even k, symmetric zp = 8")             \
  X(kInt8, "int8", "int", 8, kInteger, kIntBlocks, 128, true, false,    \
    "8-bit integer, symmetric zp = 128")                                \
  X(kNvFp4, "nvfp4", "nvfp4", 4, kFp4, kFixed, 16, false, true,         \
    "E2M1 codes, e4m3 scale per 16, fp32 global scale per expert")      \
  X(kMxFp4, "mxfp4", "fp4", 4, kFp4, kFixed, 32, false, true,           \
    "E2M1 codes, e8m0 scale per 32, fp32 global scale per expert")      \
  X(kFp8, "fp8", "fp8", 8, kFp8, kNone, 0, false, true,                 \
    "e4m3 weights, fp32 global scale per expert")                       \
  X(kFp8Block, "fp8_block", "fp8", 8, kFp8, kSquare, 128, false, false, \
    "e4m3 weights, fp32/fp16/bf16 scale per 128x128 block (DeepSeek-V3)")

enum class WeightFormat : uint8_t {
#define QMOE_X(id, ...) id,
  QMOE_WEIGHT_FORMATS(QMOE_X)
#undef QMOE_X
};

#define QMOE_X(...) +1
constexpr int kNumWeightFormats = 0 QMOE_WEIGHT_FORMATS(QMOE_X);
#undef QMOE_X

struct FormatInfo {
  WeightFormat id;
  const char* name;
  const char* ort_quant_type;
  int code_bits;
  FormatKind kind;
  BlockRule block_rule;
  int default_block;
  bool zero_points_allowed;
  bool global_scale_required;
  const char* summary;
};

const FormatInfo& format_info(WeightFormat f);
bool parse_weight_format(const std::string& name, WeightFormat* out);

// ORT stores FP4 weights transposed on CUDA ([E, K, N/2], N packed: byte (k, j) holds n = 2j in the
// low nibble); checkpoints store them row-major ([E, N, K/2], low nibble = even k).
enum class Fp4Layout : uint8_t { kNPacked, kKPacked };

// The quantization of one FC (one projection, all experts).
struct FcFormat {
  WeightFormat format = WeightFormat::kInt4;
  int block_size = 128;             // see BlockRule; ints: 0 = per output channel
  bool zero_points = false;         // integer formats only: asymmetric with explicit zero points
  DType scale_dtype = DType::kF32;  // ints, fp8_block: f32/f16/bf16; nvfp4: f8e4m3; mxfp4: f8e8m0
  Fp4Layout fp4_layout = Fp4Layout::kKPacked;

  const FormatInfo& info() const { return format_info(format); }
  int bits() const { return info().code_bits; }
  std::string to_string() const;  // "int4 b128 zp", "nvfp4", "fp8_block b128 (bf16 scales)"
};

// Builds the natural FcFormat of a format (default block, symmetric, native scale dtype).
FcFormat default_fc_format(WeightFormat f);

// Checks an FcFormat for a logical [N, K] projection; `what` names the FC in messages ("fc1").
Status check_fc_format(const FcFormat& f, int64_t n, int64_t k, const char* what);

// The tensors one FC holds, for E experts of logical [N, K] (y = x W^T, W is [N, K]).
// A rank of 0 means the tensor does not exist for this format.
struct FcTensorShapes {
  DType weight_dtype;
  int weight_rank;
  int64_t weight[3];  // ints [E, N, ceil(K*bits/8)]; fp4 N-packed [E, K, N/2], K-packed [E, N,
                      // K/2]; fp8 [E, N, K]
  DType scale_dtype;
  int scale_rank;
  int64_t scale[3];  // ints [E, N] or [E, N, K/bs]; fp4 [E, N, K/bs]; fp8_block [E, ceil(N/bs),
                     // ceil(K/bs)]
  int zero_point_rank;
  int64_t zero_point[3];  // u8 LSB-first: [E, ceil(N*bits/8)] per channel, [E, N,
                          // ceil(K/bs*bits/8)] blocked
  bool global_scale;      // f32 [E]
};
FcTensorShapes fc_tensor_shapes(const FcFormat& f, int64_t experts, int64_t n, int64_t k);

// Bytes of one expert's FC (weights + scales + zero points + global scale), as read by a kernel.
int64_t fc_bytes_per_expert(const FcFormat& f, int64_t n, int64_t k);

}  // namespace qmoe
