// The weight-format traits table, generated from QMOE_WEIGHT_FORMATS, and the shape rules every
// format follows (see docs/formats.md).
#include "qmoe/format.h"

#include <string>

namespace qmoe {

namespace {

// clang-format off
constexpr FormatInfo kFormatInfo[] = {
#define QMOE_X(id, name, ort, bits, kind, rule, block, zp, global, summary) \
  {WeightFormat::id, name, ort, bits, FormatKind::kind, BlockRule::rule,     \
   block, zp, global, summary},
    QMOE_WEIGHT_FORMATS(QMOE_X)
#undef QMOE_X
};
// clang-format on
static_assert(sizeof(kFormatInfo) / sizeof(kFormatInfo[0]) == kNumWeightFormats,
              "one traits entry per format");

constexpr bool table_is_in_enum_order() {
  for (int i = 0; i < kNumWeightFormats; ++i) {
    if (static_cast<int>(kFormatInfo[i].id) != i) return false;
  }
  return true;
}
static_assert(table_is_in_enum_order(), "format_info() indexes the table by enum value");

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
bool is_pow2(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

std::string join_scale_dtypes(const FormatInfo& info) {
  switch (info.kind) {
    case FormatKind::kInteger:
      return "f32, f16 or bf16";
    case FormatKind::kFp4:
      return info.id == WeightFormat::kNvFp4 ? "f8e4m3" : "f8e8m0";
    case FormatKind::kFp8:
      return info.block_rule == BlockRule::kSquare ? "f32, f16 or bf16"
                                                   : "f32 (the per-expert global scale)";
  }
  return "?";
}

bool scale_dtype_ok(const FormatInfo& info, DType t) {
  const bool float_scale = t == DType::kF32 || t == DType::kF16 || t == DType::kBF16;
  switch (info.kind) {
    case FormatKind::kInteger:
      return float_scale;
    case FormatKind::kFp4:
      return t == (info.id == WeightFormat::kNvFp4 ? DType::kF8E4M3 : DType::kF8E8M0);
    case FormatKind::kFp8:
      return info.block_rule == BlockRule::kSquare ? float_scale : t == DType::kF32;
  }
  return false;
}

void set_shape(int64_t* dims, int* rank, std::initializer_list<int64_t> v) {
  *rank = 0;
  for (int64_t d : v) dims[(*rank)++] = d;
}

}  // namespace

const FormatInfo& format_info(WeightFormat f) {
  const int i = static_cast<int>(f);
  return kFormatInfo[(i >= 0 && i < kNumWeightFormats) ? i : 0];
}

bool parse_weight_format(const std::string& name, WeightFormat* out) {
  for (const FormatInfo& info : kFormatInfo) {
    if (name == info.name) {
      *out = info.id;
      return true;
    }
  }
  return false;
}

std::string FcFormat::to_string() const {
  const FormatInfo& fi = info();
  std::string s = fi.name;
  bool float_scales = false;
  switch (fi.kind) {
    case FormatKind::kInteger:
      s += block_size == 0 ? " per-channel" : " b" + std::to_string(block_size);
      if (zero_points) s += " zp";
      float_scales = true;
      break;
    case FormatKind::kFp4:
      if (fp4_layout == Fp4Layout::kNPacked) s += " (N-packed)";
      break;
    case FormatKind::kFp8:
      if (fi.block_rule == BlockRule::kSquare) {
        s += " b" + std::to_string(block_size);
        float_scales = true;
      }
      break;
  }
  if (float_scales && scale_dtype != DType::kF32) {
    s += std::string(" (") + dtype_name(scale_dtype) + " scales)";
  }
  return s;
}

FcFormat default_fc_format(WeightFormat f) {
  FcFormat out;
  out.format = f;
  const FormatInfo& fi = format_info(f);
  out.block_size = fi.default_block;
  out.zero_points = false;
  out.fp4_layout = Fp4Layout::kKPacked;
  switch (fi.kind) {
    case FormatKind::kInteger:
    case FormatKind::kFp8:
      out.scale_dtype = DType::kF32;
      break;
    case FormatKind::kFp4:
      out.scale_dtype = f == WeightFormat::kNvFp4 ? DType::kF8E4M3 : DType::kF8E8M0;
      break;
  }
  return out;
}

Status check_fc_format(const FcFormat& f, int64_t n, int64_t k, const char* what) {
  const std::string w(what);
  const int fi_index = static_cast<int>(f.format);
  if (fi_index < 0 || fi_index >= kNumWeightFormats) {
    return Status::invalid(w + ": unknown weight format " + std::to_string(fi_index));
  }
  const FormatInfo& fi = f.info();
  if (n < 1) return Status::invalid(w + ": N must be >= 1, got " + std::to_string(n));
  if (k < 1) return Status::invalid(w + ": K must be >= 1, got " + std::to_string(k));
  if (!scale_dtype_ok(fi, f.scale_dtype)) {
    return Status::invalid(w + ": scale_dtype " + dtype_name(f.scale_dtype) + " is not valid for " +
                           fi.name + " (expected " + join_scale_dtypes(fi) + ")");
  }
  if (f.zero_points && !fi.zero_points_allowed) {
    return Status::invalid(w + ": zero points are only defined for integer formats, not " +
                           fi.name);
  }
  const std::string bs = std::to_string(f.block_size);
  switch (fi.block_rule) {
    case BlockRule::kIntBlocks:
      if (f.block_size == 0) break;
      if (!is_pow2(f.block_size) || f.block_size < 16 || f.block_size > 256) {
        return Status::invalid(w + ": block_size " + bs +
                               " is not a power of two in [16, 256] (or 0 for per-channel scales)");
      }
      if (k % f.block_size != 0) {
        return Status::invalid(w + ": block_size " + bs +
                               " does not divide K = " + std::to_string(k));
      }
      break;
    case BlockRule::kFixed:
      if (f.block_size != fi.default_block) {
        return Status::invalid(w + ": block_size " + bs + " is not valid for " + fi.name +
                               " (expected " + std::to_string(fi.default_block) + ")");
      }
      if (k % fi.default_block != 0) {
        return Status::invalid(w + ": K = " + std::to_string(k) + " is not a multiple of the " +
                               fi.name + " block " + std::to_string(fi.default_block));
      }
      if (f.fp4_layout == Fp4Layout::kNPacked && n % 2 != 0) {
        return Status::invalid(w + ": N = " + std::to_string(n) +
                               " must be even for the N-packed fp4 layout");
      }
      break;
    case BlockRule::kNone:
      if (f.block_size != 0) {
        return Status::invalid(w + ": block_size " + bs + " is not valid for " + fi.name +
                               " (expected 0: one global scale per expert)");
      }
      break;
    case BlockRule::kSquare:
      if (f.block_size < 1) {
        return Status::invalid(w + ": block_size " + bs + " is not valid for " + fi.name +
                               " (expected >= 1)");
      }
      break;
  }
  return Status::ok();
}

FcTensorShapes fc_tensor_shapes(const FcFormat& f, int64_t experts, int64_t n, int64_t k) {
  const FormatInfo& fi = f.info();
  FcTensorShapes s{};
  s.weight_dtype = DType::kU8;
  s.scale_dtype = f.scale_dtype;
  s.global_scale = fi.global_scale_required;
  const int bits = fi.code_bits;
  switch (fi.kind) {
    case FormatKind::kInteger: {
      set_shape(s.weight, &s.weight_rank, {experts, n, ceil_div(k * bits, 8)});
      if (f.block_size == 0) {
        set_shape(s.scale, &s.scale_rank, {experts, n});
        if (f.zero_points)
          set_shape(s.zero_point, &s.zero_point_rank, {experts, ceil_div(n * bits, 8)});
      } else {
        const int64_t blocks = k / f.block_size;
        set_shape(s.scale, &s.scale_rank, {experts, n, blocks});
        if (f.zero_points) {
          set_shape(s.zero_point, &s.zero_point_rank, {experts, n, ceil_div(blocks * bits, 8)});
        }
      }
      break;
    }
    case FormatKind::kFp4:
      if (f.fp4_layout == Fp4Layout::kNPacked) {
        set_shape(s.weight, &s.weight_rank, {experts, k, n / 2});
      } else {
        set_shape(s.weight, &s.weight_rank, {experts, n, k / 2});
      }
      set_shape(s.scale, &s.scale_rank, {experts, n, k / fi.default_block});
      break;
    case FormatKind::kFp8:
      s.weight_dtype = DType::kF8E4M3;
      set_shape(s.weight, &s.weight_rank, {experts, n, k});
      if (fi.block_rule == BlockRule::kSquare) {
        const int64_t bs = f.block_size;
        set_shape(s.scale, &s.scale_rank, {experts, ceil_div(n, bs), ceil_div(k, bs)});
      }
      break;
  }
  return s;
}

int64_t fc_bytes_per_expert(const FcFormat& f, int64_t n, int64_t k) {
  const FcTensorShapes s = fc_tensor_shapes(f, 1, n, k);
  auto count = [](const int64_t* dims, int rank) {
    int64_t c = rank > 0 ? 1 : 0;
    for (int i = 0; i < rank; ++i) c *= dims[i];
    return c;
  };
  int64_t bytes = count(s.weight, s.weight_rank) * static_cast<int64_t>(dtype_size(s.weight_dtype));
  bytes += count(s.scale, s.scale_rank) * static_cast<int64_t>(dtype_size(s.scale_dtype));
  bytes += count(s.zero_point, s.zero_point_rank);
  if (s.global_scale) bytes += 4;
  return bytes;
}

}  // namespace qmoe
