// AWQ and compressed-tensors "pack-quantized" projections, read into qmoe's int4/int8 rows.
// Both hold an unsigned code, an unsigned zero point and a float scale per (row, group), and
// dequantize as (code - zero) * scale, which is qmoe's integer formula (docs/formats.md), so every
// code, zero and scale is copied, never recomputed.
//
// AWQ, AutoAWQ's WQLinear_GEMM (version "gemm"), a projection with logical W [N, K], 4 bits, groups
// of g along K:
//
//   qweight i32 [K, N/8]    nibble i (bits [4i, 4i + 4)) of qweight[k, c] = code of W[8c + o(i), k]
//   qzeros  i32 [K/g, N/8]  nibble i of qzeros[G, c]                  = zero of (G, n = 8c + o(i))
//   scales  f16 [K/g, N]
//   o = {0, 2, 4, 6, 1, 3, 5, 7}  (the order AutoAWQ packs nibbles in, for its dequantize kernel)
//
//   W[n, k] = (code - zero) * scales[k / g, n]       (zeros stored as is; no +1 as GPTQ v1)
//
// compressed-tensors, format "pack-quantized" (compressed_tensors' PackedQuantizationCompressor
// and pack_to_int32), b = 4 or 8 bits, p = 32 / b codes per int32, W [N, K]:
//
//   weight_packed     i32 [N, K/p]       bits [b*j, b*j + b) of word [n, r] = u of W[n, p*r + j]
//   weight_scale      f   [N, K/g]       ([N, 1] for strategy "channel")
//   weight_zero_point i32 [ceil(N/p), K/g] packed along N the same way (asymmetric only; older
//                     checkpoints store it unpacked, i8 [N, K/g], signed)
//   weight_shape      i64 [2] = [N, K]
//
//   u = q + 2^(b-1): the signed code q in [-2^(b-1), 2^(b-1)) shifted to unsigned before packing,
//   the zero point likewise, so W = (q - zp) * scale = (u - uzp) * scale; symmetric: zp = 0,
//   uzp = 2^(b-1), qmoe's implicit zero point.
//
// A word of weight_packed read as 4 little-endian bytes is exactly a qmoe row's bytes (int4: low
// nibble = even k), so compressed-tensors rows are copied whole.
#include <cstring>

#include "convert/experts.h"

namespace qmoe::convert {

namespace {

constexpr int kAwqOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};

std::string dims(int64_t n, int64_t k) {
  return "[N, K] = [" + std::to_string(n) + ", " + std::to_string(k) + "]";
}

uint32_t nibble_of(const TensorView& v, int64_t i, int j, int bits) {
  const auto w = static_cast<uint32_t>(static_cast<const int32_t*>(v.data)[i]);
  return (w >> (bits * j)) & ((1u << bits) - 1u);
}

// Writes zero point `zero` of (row, group G) into fc's zero-point streams.
void put_zero(QuantizedFc* fc, int64_t row, int64_t G, int64_t groups, int bits, uint32_t zero) {
  if (fc->format.block_size > 0) {
    put_code(fc->zero_points.data() + row * ((groups * bits + 7) / 8), G, bits, zero);
  } else {
    put_code(fc->zero_points.data(), row, bits, zero);
  }
}

}  // namespace

Status tensor_error(const Checkpoint& c, const std::string& name, const std::string& what) {
  TensorView v;
  std::string file;
  QMOE_RETURN_IF_ERROR(c.tensor(name, &v, &file));
  return Status::invalid(file + ": tensor '" + name + "': " + what);
}

Status resolve_awq(const Checkpoint& c, const AwqConfig& a, DType* scale_dtype, ProjTensors* p,
                   int64_t* bytes) {
  const int64_t group = a.group_size > 0 ? a.group_size : p->k;
  if (p->n % 8 != 0 || p->k % 8 != 0 || p->k % group != 0) {
    return tensor_error(c, p->name + ".qweight",
                        dims(p->n, p->k) + " does not fit AWQ's packing with group_size " +
                            std::to_string(group) + " (N and K multiples of 8, K of the group)");
  }
  const int64_t groups = p->k / group;
  QMOE_RETURN_IF_ERROR(c.expect(p->name + ".qweight", DType::kI32, {p->k, p->n / 8}, &p->qweight));
  QMOE_RETURN_IF_ERROR(c.expect(p->name + ".qzeros", DType::kI32, {groups, p->n / 8}, &p->qzeros));
  QMOE_RETURN_IF_ERROR(
      expect_scales(c, p->name + ".scales", scale_dtype, groups, p->n, &p->scales));
  *bytes += static_cast<int64_t>(p->qweight.bytes() + p->scales.bytes() + p->qzeros.bytes());
  return Status::ok();
}

void transcode_awq(const ProjTensors& p, const AwqConfig& a, int64_t row0, int64_t stride,
                   QuantizedFc* fc) {
  const int64_t group = a.group_size > 0 ? a.group_size : p.k;
  const int64_t groups = p.k / group, words = p.n / 8;
  const int64_t row_bytes = p.k / 2;
  const size_t ssize = dtype_size(p.scales.dtype);
  const auto* scales = static_cast<const uint8_t*>(p.scales.data);
  // An 8 x 8 nibble transpose per tile: eight words of consecutive k (each holding 8 n) become,
  // for each of those n, one little-endian word of 8 consecutive k, i.e. 4 bytes of its row.
  const auto* q = static_cast<const uint32_t*>(p.qweight.data);
  for (int64_t k0 = 0; k0 < p.k; k0 += 8) {
    for (int64_t w = 0; w < words; ++w) {
      uint32_t in[8];
      for (int j = 0; j < 8; ++j) in[j] = q[(k0 + j) * words + w];
      for (int i = 0; i < 8; ++i) {
        uint32_t out = 0;
        for (int j = 0; j < 8; ++j) out |= ((in[j] >> (4 * i)) & 15u) << (4 * j);
        const int64_t row = row0 + (8 * w + kAwqOrder[i]) * stride;
        std::memcpy(fc->weight.data() + row * row_bytes + k0 / 2, &out, 4);
      }
    }
  }
  for (int64_t G = 0; G < groups; ++G) {
    for (int64_t w = 0; w < words; ++w) {
      for (int i = 0; i < 8; ++i) {
        const int64_t n = 8 * w + kAwqOrder[i], row = row0 + n * stride;
        put_zero(fc, row, G, groups, 4, nibble_of(p.qzeros, G * words + w, i, 4));
        std::memcpy(fc->scales.data() + (row * groups + G) * ssize, scales + (G * p.n + n) * ssize,
                    ssize);
      }
    }
  }
}

Status resolve_compressed(const Checkpoint& c, const CompressedTensorsConfig& q, DType* scale_dtype,
                          ProjTensors* p, int64_t* bytes) {
  const int64_t per = 32 / q.bits;
  const int64_t group = q.group_size > 0 ? q.group_size : p->k;
  const std::string packed = p->name + ".weight_packed";
  if (p->k % per != 0 || p->k % group != 0) {
    return tensor_error(c, packed,
                        dims(p->n, p->k) + " does not fit " + std::to_string(q.bits) +
                            "-bit pack-quantized with group_size " + std::to_string(group) +
                            " (K a multiple of " + std::to_string(per) + " and of the group)");
  }
  const int64_t groups = p->k / group;
  QMOE_RETURN_IF_ERROR(c.expect(packed, DType::kI32, {p->n, p->k / per}, &p->qweight));
  TensorView shape;
  const std::string shape_name = p->name + ".weight_shape";
  QMOE_RETURN_IF_ERROR(c.expect(shape_name, DType::kI64, {2}, &shape));
  int64_t s[2];
  std::memcpy(s, shape.data, sizeof(s));
  if (s[0] != p->n || s[1] != p->k) {
    return tensor_error(c, shape_name,
                        "holds [" + std::to_string(s[0]) + ", " + std::to_string(s[1]) +
                            "], expected " + dims(p->n, p->k) + " from config.json");
  }
  if (c.has(p->name + ".weight_g_idx")) {
    return tensor_error(c, p->name + ".weight_g_idx",
                        "activation-ordered groups (actorder 'group') are not supported");
  }
  QMOE_RETURN_IF_ERROR(
      expect_scales(c, p->name + ".weight_scale", scale_dtype, p->n, groups, &p->scales));
  *bytes += static_cast<int64_t>(p->qweight.bytes() + p->scales.bytes() + shape.bytes());
  if (q.sym) return Status::ok();
  const std::string zp = p->name + ".weight_zero_point";
  std::string file;
  QMOE_RETURN_IF_ERROR(c.tensor(zp, &p->qzeros, &file));
  if (p->qzeros.dtype == DType::kI32) {
    QMOE_RETURN_IF_ERROR(c.expect(zp, DType::kI32, {(p->n + per - 1) / per, groups}, &p->qzeros));
  } else {
    QMOE_RETURN_IF_ERROR(c.expect(zp, DType::kI8, {p->n, groups}, &p->qzeros));
    // Unpacked zero points are signed; each must be a code of the format.
    const auto* z = static_cast<const int8_t*>(p->qzeros.data);
    const int half = 1 << (q.bits - 1);
    for (int64_t i = 0; i < p->n * groups; ++i) {
      if (z[i] < -half || z[i] >= half) {
        return tensor_error(c, zp,
                            "zero point " + std::to_string(z[i]) + " at [" +
                                std::to_string(i / groups) + ", " + std::to_string(i % groups) +
                                "] is outside the " + std::to_string(q.bits) + "-bit range [" +
                                std::to_string(-half) + ", " + std::to_string(half - 1) + "]");
      }
    }
  }
  *bytes += static_cast<int64_t>(p->qzeros.bytes());
  return Status::ok();
}

void transcode_compressed(const ProjTensors& p, const CompressedTensorsConfig& q, int64_t row0,
                          int64_t stride, QuantizedFc* fc) {
  const int bits = q.bits;
  const int64_t per = 32 / bits;
  const int64_t groups = q.group_size > 0 ? p.k / q.group_size : 1;
  const int64_t row_bytes = p.k * bits / 8;
  const size_t scale_row = static_cast<size_t>(groups) * dtype_size(p.scales.dtype);
  const auto* packed = static_cast<const uint8_t*>(p.qweight.data);
  const auto* scales = static_cast<const uint8_t*>(p.scales.data);
  for (int64_t n = 0; n < p.n; ++n) {
    const int64_t row = row0 + n * stride;
    std::memcpy(fc->weight.data() + row * row_bytes, packed + n * row_bytes,
                static_cast<size_t>(row_bytes));
    std::memcpy(fc->scales.data() + row * scale_row, scales + n * scale_row, scale_row);
    if (q.sym) continue;
    for (int64_t G = 0; G < groups; ++G) {
      uint32_t zero;
      if (p.qzeros.dtype == DType::kI32) {
        zero = nibble_of(p.qzeros, (n / per) * groups + G, static_cast<int>(n % per), bits);
      } else {
        zero = static_cast<uint32_t>(static_cast<const int8_t*>(p.qzeros.data)[n * groups + G] +
                                     (1 << (bits - 1)));
      }
      put_zero(fc, row, G, groups, bits, zero);
    }
  }
}

}  // namespace qmoe::convert
