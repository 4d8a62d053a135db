// A quantized shared MLP wider than the routed experts, cut into experts of I rows after it has
// been transcoded whole (shared_experts.cpp draws why the slices add up to the MLP).
//
// The wide expert is transcoded exactly as any expert (GPTQ's act-order reordering included: it
// permutes the wide intermediate index, and any cut of a permuted MLP still sums to it), into FC1
// [2S, H] with rows gate0, up0, gate1, up1, ... and FC2 [H, S]. Slice c then takes
//
//   FC1 rows [2cI, 2(c+1)I)         whole rows: codes, scales, zero points copied as they are
//   FC2 columns [cI, (c+1)I)        in every row: codes c*I.., and the groups they lie in
//
// Integer formats only (what GPTQ, AWQ and compressed-tensors' pack-quantized become). A group of
// FC2 must not straddle a cut: with block b, I must be a multiple of b (GPTQ's groups divide the
// intermediate sizes of the models that have wide shared experts); one group per row (block 0)
// keeps the row's scale and zero point in every slice. Every value is copied, none recomputed:
// the slices dequantize bit for bit to the wide expert's columns.
#include <algorithm>
#include <cstring>
#include <memory>

#include "convert/experts.h"
#include "qmoe/format.h"

namespace qmoe::convert {

namespace {

// Element i of a little-endian array of `bits`-bit fields (bits 4 or 8: no field straddles a
// byte).
uint8_t get_field(const uint8_t* p, int64_t i, int bits) {
  if (bits == 8) return p[i];
  return static_cast<uint8_t>((p[i / 2] >> (4 * (i % 2))) & 0xF);
}

void put_field(uint8_t* p, int64_t i, int bits, uint8_t v) {
  if (bits == 8) {
    p[i] = v;
    return;
  }
  uint8_t& b = p[i / 2];
  const int shift = 4 * static_cast<int>(i % 2);
  b = static_cast<uint8_t>((b & ~(0xF << shift)) | ((v & 0xF) << shift));
}

Status check_integer(const QuantizedFc& wide, const QuantizedFc& out) {
  const FcFormat& f = out.format;
  const int bits = f.info().code_bits;
  if (f.info().kind != FormatKind::kInteger || (bits != 4 && bits != 8) ||
      wide.format.to_string() != f.to_string()) {
    return Status::unsupported("slicing a shared expert: format " + f.to_string() +
                               " (int4 or int8 only, the same in both)");
  }
  return Status::ok();
}

}  // namespace

Status slice_rows(const QuantizedFc& wide, int64_t row0, QuantizedFc* out) {
  QMOE_RETURN_IF_ERROR(check_integer(wide, *out));
  const FcFormat& f = out->format;
  const int bits = f.info().code_bits;
  const int64_t n = out->n;
  if (wide.k != out->k || row0 < 0 || row0 + n > wide.n) {
    return Status::invalid("slicing a shared expert: rows [" + std::to_string(row0) + ", " +
                           std::to_string(row0 + n) + ") of " + std::to_string(wide.n));
  }
  // Codes, and (blockwise) scales and zero points, are whole rows of equal size.
  auto rows = [&](const std::vector<uint8_t>& from, std::vector<uint8_t>* to) {
    const size_t row_bytes = to->size() / static_cast<size_t>(n);
    std::memcpy(to->data(), from.data() + static_cast<size_t>(row0) * row_bytes, to->size());
  };
  rows(wide.weight, &out->weight);
  if (f.block_size > 0) {
    rows(wide.scales, &out->scales);
    if (f.zero_points) rows(wide.zero_points, &out->zero_points);
    return Status::ok();
  }
  // One group per row: scale r of [n]; zero points packed along n.
  rows(wide.scales, &out->scales);
  if (f.zero_points) {
    std::fill(out->zero_points.begin(), out->zero_points.end(), 0);  // the padding field too
    for (int64_t r = 0; r < n; ++r) {
      put_field(out->zero_points.data(), r, bits,
                get_field(wide.zero_points.data(), row0 + r, bits));
    }
  }
  return Status::ok();
}

Status slice_columns(const QuantizedFc& wide, int64_t col0, QuantizedFc* out) {
  QMOE_RETURN_IF_ERROR(check_integer(wide, *out));
  const FcFormat& f = out->format;
  const int bits = f.info().code_bits;
  const int64_t n = out->n, k = out->k, b = f.block_size;
  if (wide.n != n || col0 < 0 || col0 + k > wide.k || (col0 * bits) % 8 != 0 ||
      (b > 0 && (col0 % b != 0 || k % b != 0))) {
    return Status::unsupported("slicing a shared expert: columns [" + std::to_string(col0) + ", " +
                               std::to_string(col0 + k) + ") of " + std::to_string(wide.k) +
                               " with block " + std::to_string(b) +
                               " (the cut must fall on a group boundary)");
  }
  const size_t wide_row = wide.weight.size() / static_cast<size_t>(n);
  const size_t out_row = out->weight.size() / static_cast<size_t>(n);
  for (int64_t r = 0; r < n; ++r) {  // byte-aligned: col0 * bits is a multiple of 8
    std::memcpy(out->weight.data() + r * out_row,
                wide.weight.data() + r * wide_row + col0 * bits / 8, out_row);
  }
  if (b == 0) {  // one group per row: the row's scale and zero point hold for every slice
    out->scales = wide.scales;
    if (f.zero_points) out->zero_points = wide.zero_points;
    return Status::ok();
  }
  const int64_t groups = k / b, wide_groups = wide.k / b, g0 = col0 / b;
  const size_t ss = dtype_size(f.scale_dtype);
  for (int64_t r = 0; r < n; ++r) {
    std::memcpy(out->scales.data() + (r * groups) * ss,
                wide.scales.data() + (r * wide_groups + g0) * ss, groups * ss);
  }
  if (f.zero_points) {
    std::fill(out->zero_points.begin(), out->zero_points.end(), 0);  // the padding field too
    const size_t wide_zrow = wide.zero_points.size() / static_cast<size_t>(n);
    const size_t out_zrow = out->zero_points.size() / static_cast<size_t>(n);
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t g = 0; g < groups; ++g) {
        put_field(out->zero_points.data() + r * out_zrow, g, bits,
                  get_field(wide.zero_points.data() + r * wide_zrow, g0 + g, bits));
      }
    }
  }
  return Status::ok();
}

Status convert_slice(const ExpertTensors& t, SourceFormat from, const MoeModelConfig& cfg,
                     ExpertScratch* s, ExpertStats* stats) {
  if (!s->wide) s->wide = std::make_unique<ExpertScratch>();
  ExpertScratch& w = *s->wide;
  const int64_t S = t.gate.n, H = t.gate.k, I = s->fc2.k;
  if (w.fc1.n != 2 * S || w.fc1.k != H || w.fc2.k != S) {
    QMOE_RETURN_IF_ERROR(allocate_fc(s->fc1.format, 1, 2 * S, H, &w.fc1));
    QMOE_RETURN_IF_ERROR(allocate_fc(s->fc2.format, 1, H, S, &w.fc2));
  }
  // Each slice transcodes the whole MLP again: a shared MLP is one of many experts, and a worker
  // keeps no state between the experts it is given.
  QMOE_RETURN_IF_ERROR(convert_expert(t, from, cfg, &w, stats));
  QMOE_RETURN_IF_ERROR(slice_rows(w.fc1, 2 * t.slice * I, &s->fc1));
  return slice_columns(w.fc2, t.slice * I, &s->fc2);
}

}  // namespace qmoe::convert
