// GPTQ projections (AutoGPTQ / GPTQModel packing, drawn in experts.h) read into qmoe's int4/int8,
// act-order (desc_act) checkpoints included.
//
// Act-order: GPTQ quantizes the columns of W [N, K] in the order of decreasing Hessian diagonal and
// cuts that order into groups of g, so group G holds g columns scattered over K. The codes stay in
// the original column order and g_idx[k] names the group of column k:
//
//   W[n, k] = scales[g_idx[k], n] * (code[k, n] - zero[g_idx[k], n])
//
// qmoe's blocks are contiguous runs of K, and the two FCs differ:
//
// - FC2 (down_proj, K = I): the intermediate index is internal to the expert,
//   y = sum_i down[:, i] * silu(gate_i . x) * (up_i . x), a sum that any order of i keeps. With p
//   the stable sort of the I columns by g_idx, group G becomes columns [G*g, (G+1)*g) when every
//   group has exactly g columns (GPTQ's groups do). FC2 column j takes source column p[j] and FC1
//   rows 2j, 2j + 1 take gate and up row p[j]; each group keeps its scales and zeros: exact.
//
//     g = 4, g_idx of down_proj's columns 0..7:  1 0 1 0 0 1 0 1
//     p = 1 3 4 6 | 0 2 5 7                       FC2 block 0 | block 1
//     FC1 rows (gate, up) of intermediate index:  1 3 4 6 0 2 5 7
//
// - FC1 (gate/up, K = H, the layer input): the input order is fixed. A g_idx of k / g (static
//   groups, or none at all) transcodes exactly; any other is dequantized and requantized with
//   qmoe's quantizer, the error reported. So is a down_proj g_idx whose groups are not all of g
//   columns (no GPTQ writes one).
//
// GPTQ experts carry no biases, so there is no FC1 bias to reorder.
#include <algorithm>
#include <cstring>

#include "convert/experts.h"
#include "core/numeric.h"

namespace qmoe::convert {

namespace {

int64_t group_size(const GptqConfig& g, const ProjTensors& p) {
  return g.group_size > 0 ? g.group_size : p.k;
}

// Where source row n of a projection lands in an FC: row0 + stride * order(n), order the inverse
// of the intermediate permutation (the identity when empty).
struct Rows {
  int64_t row0, stride;
  const std::vector<int64_t>& inverse;
  int64_t operator()(int64_t n) const {
    return row0 + stride * (inverse.empty() ? n : inverse[static_cast<size_t>(n)]);
  }
};

const int32_t* g_idx_of(const ProjTensors& p) {
  return p.g_idx.present() ? static_cast<const int32_t*>(p.g_idx.data) : nullptr;
}

// True when every column k is in group k / g (no g_idx, or a trivial one).
bool contiguous_groups(const ProjTensors& p, int64_t group) {
  const int32_t* gi = g_idx_of(p);
  for (int64_t k = 0; gi && k < p.k; ++k) {
    if (gi[k] != k / group) return false;
  }
  return true;
}

// The stable sort of p's K columns by g_idx into *perm and its inverse into *inverse, when every
// group has exactly `group` columns; false (both empty) otherwise.
bool group_order(const ProjTensors& p, int64_t group, std::vector<int64_t>* perm,
                 std::vector<int64_t>* inverse) {
  const int32_t* gi = g_idx_of(p);
  const int64_t groups = p.k / group;
  std::vector<int64_t> next(static_cast<size_t>(groups), 0);
  for (int64_t k = 0; k < p.k; ++k) ++next[static_cast<size_t>(gi[k])];  // range checked
  for (int64_t G = 0; G < groups; ++G) {
    if (next[static_cast<size_t>(G)] != group) return false;
    next[static_cast<size_t>(G)] = G * group;  // the first column of block G
  }
  perm->assign(static_cast<size_t>(p.k), -1);
  inverse->assign(static_cast<size_t>(p.k), -1);
  for (int64_t k = 0; k < p.k; ++k) {
    const int64_t j = next[static_cast<size_t>(gi[k])]++;
    (*perm)[static_cast<size_t>(j)] = k;
    (*inverse)[static_cast<size_t>(k)] = j;
  }
  // A permutation: every position filled exactly once (each group's count was g).
  for (int64_t j = 0; j < p.k; ++j) {
    if ((*perm)[static_cast<size_t>(j)] < 0) {
      perm->clear();
      inverse->clear();
      return false;
    }
  }
  return true;
}

uint32_t field(const TensorView& v, int64_t row, int64_t col, int64_t j, int bits) {
  const auto word =
      static_cast<uint32_t>(static_cast<const int32_t*>(v.data)[row * v.dims[1] + col]);
  return (word >> (bits * j)) & ((1u << bits) - 1u);
}

// Writes projection p's codes, scales and zero points into rows `rows` of expert 0 of fc, FC
// column j taking source column perm[j] (all in order when perm is empty; perm keeps every group
// contiguous, so group G's scales stay group G's). Sets *exact to false when a zero point is
// outside what fc can hold (a symmetric fc holds only 2^(bits-1); an asymmetric one
// 0 .. 2^bits - 1).
void transcode(const ProjTensors& p, const GptqConfig& g, const Rows& rows,
               const std::vector<int64_t>& perm, QuantizedFc* fc, bool* exact) {
  const int bits = g.bits;
  const int64_t per = 32 / bits;
  const int64_t groups = p.k / group_size(g, p);
  const int64_t row_bytes = p.k * bits / 8;
  const int64_t zp_row_bytes = (groups * bits + 7) / 8;
  const size_t ssize = dtype_size(p.scales.dtype);
  const uint32_t mid = 1u << (bits - 1), top = (1u << bits) - 1u;
  const auto* scales = static_cast<const uint8_t*>(p.scales.data);
  // A GPTQ word holds p consecutive k of one n, code j in bits [b*j, b*j + b): read as 4
  // little-endian bytes that is exactly qmoe's row layout (int4: low nibble = even k; int8: one
  // byte per k). So the codes move as a transpose of 32-bit words, qweight[r, n] -> word r of
  // row n, in tiles so that both sides stay in cache; reordered columns are then gathered within
  // each row from a copy in source order.
  std::vector<uint8_t> in_order(perm.empty() ? 0 : static_cast<size_t>(p.n * row_bytes));
  auto row_of = [&](int64_t n) {
    return perm.empty() ? fc->weight.data() + rows(n) * row_bytes : in_order.data() + n * row_bytes;
  };
  const auto* qweight = static_cast<const uint32_t*>(p.qweight.data);
  const int64_t words = p.k / per;
  constexpr int64_t kTile = 32;
  for (int64_t r0 = 0; r0 < words; r0 += kTile) {
    for (int64_t n0 = 0; n0 < p.n; n0 += kTile) {
      for (int64_t r = r0; r < std::min(words, r0 + kTile); ++r) {
        for (int64_t n = n0; n < std::min(p.n, n0 + kTile); ++n) {
          std::memcpy(row_of(n) + r * 4, qweight + r * p.n + n, 4);
        }
      }
    }
  }
  const int64_t* from = perm.data();
  for (int64_t n = 0; n < p.n && !perm.empty(); ++n) {
    const uint8_t* in = row_of(n);
    uint8_t* out = fc->weight.data() + rows(n) * row_bytes;
    if (bits == 8) {
      for (int64_t j = 0; j < p.k; ++j) out[j] = in[from[j]];
      continue;
    }
    auto code = [in](int64_t k) { return (in[k / 2] >> (4 * (k & 1))) & 15u; };
    for (int64_t j = 0; j < p.k; j += 2) {
      out[j / 2] = static_cast<uint8_t>(code(from[j]) | code(from[j + 1]) << 4);
    }
  }
  for (int64_t n = 0; n < p.n; ++n) {
    const int64_t row = rows(n);
    for (int64_t G = 0; G < groups; ++G) {
      std::memcpy(fc->scales.data() + (row * groups + G) * ssize, scales + (G * p.n + n) * ssize,
                  ssize);
      const uint32_t zero = field(p.qzeros, G, n / per, n % per, bits) + (g.v2 ? 0u : 1u);
      if (!fc->format.zero_points) {
        if (zero != mid) *exact = false;
      } else if (zero > top) {
        *exact = false;
      } else if (g.group_size > 0) {
        put_code(fc->zero_points.data() + row * zp_row_bytes, G, bits, zero);
      } else {
        put_code(fc->zero_points.data(), row, bits, zero);
      }
    }
  }
}

// GPTQ's dequantization of projection p, groups by g_idx where present, into rows `rows` of
// w [*, K] (fp32), column j from source column perm[j] (in order when perm is empty). Exact:
// |code - zero| <= 2^bits and the scale has at most 24 significant bits.
void dequantize(const ProjTensors& p, const GptqConfig& g, const Rows& rows,
                const std::vector<int64_t>& perm, float* w) {
  const int bits = g.bits;
  const int64_t per = 32 / bits;
  const int64_t group = group_size(g, p);
  const int32_t* gi = g_idx_of(p);
  std::vector<float> scales(static_cast<size_t>(p.scales.numel()));
  widen(p.scales, scales.data());
  for (int64_t n = 0; n < p.n; ++n) {
    float* out = w + rows(n) * p.k;
    for (int64_t j = 0; j < p.k; ++j) {
      const int64_t k = perm.empty() ? j : perm[static_cast<size_t>(j)];
      const int64_t G = gi ? gi[k] : k / group;
      const float zero =
          static_cast<float>(field(p.qzeros, G, n / per, n % per, bits) + (g.v2 ? 0 : 1));
      const float code = static_cast<float>(field(p.qweight, k / per, n, k % per, bits));
      out[j] = (code - zero) * scales[static_cast<size_t>(G * p.n + n)];
    }
  }
}

}  // namespace

Status resolve_gptq(const Checkpoint& c, const GptqConfig& g, DType* scale_dtype, ProjTensors* p,
                    int64_t* bytes) {
  const int64_t per = 32 / g.bits;
  const int64_t group = group_size(g, *p);
  if (p->k % per != 0 || p->n % per != 0 || p->k % group != 0) {
    return tensor_error(c, p->name + ".qweight",
                        "[N, K] = [" + std::to_string(p->n) + ", " + std::to_string(p->k) +
                            "] does not fit GPTQ " + std::to_string(g.bits) +
                            "-bit packing with group_size " + std::to_string(group) +
                            " (K and N multiples of " + std::to_string(per) + ", K of the group)");
  }
  const int64_t groups = p->k / group;
  QMOE_RETURN_IF_ERROR(
      c.expect(p->name + ".qweight", DType::kI32, {p->k / per, p->n}, &p->qweight));
  QMOE_RETURN_IF_ERROR(
      expect_scales(c, p->name + ".scales", scale_dtype, groups, p->n, &p->scales));
  QMOE_RETURN_IF_ERROR(
      c.expect(p->name + ".qzeros", DType::kI32, {groups, p->n / per}, &p->qzeros));
  *bytes += static_cast<int64_t>(p->qweight.bytes() + p->scales.bytes() + p->qzeros.bytes());
  const std::string name = p->name + ".g_idx";
  std::string file;
  if (!c.has(name)) {
    if (!g.desc_act) return Status::ok();
    QMOE_RETURN_IF_ERROR(c.tensor(p->name + ".qweight", &p->qweight, &file));
    return Status::unsupported(file + ": tensor '" + p->name +
                               "': quantization_config.desc_act is true and there is no g_idx: "
                               "the groups of the act-order columns are unknown");
  }
  QMOE_RETURN_IF_ERROR(c.tensor(name, &p->g_idx, &file));
  if (p->g_idx.dtype != DType::kI32 || p->g_idx.rank != 1 || p->g_idx.dims[0] != p->k) {
    return tensor_error(c, name,
                        "expected I32 [" + std::to_string(p->k) + "], got " +
                            safetensors_dtype_name(p->g_idx.dtype) + " " + p->g_idx.shape_string());
  }
  const int32_t* gi = g_idx_of(*p);
  for (int64_t k = 0; k < p->k; ++k) {
    if (gi[k] < 0 || gi[k] >= groups) {
      return tensor_error(c, name,
                          "g_idx[" + std::to_string(k) + "] = " + std::to_string(gi[k]) +
                              " is not a group of the " + std::to_string(groups) +
                              " that scales and qzeros hold");
    }
  }
  *bytes += static_cast<int64_t>(p->g_idx.bytes());
  return Status::ok();
}

Status convert_gptq(const ExpertTensors& t, const GptqConfig& g, ExpertScratch* s,
                    ExpertStats* stats) {
  const int64_t inter = t.gate.n, hidden = t.gate.k;
  std::vector<int64_t> perm, inverse;  // of the intermediate index; empty: in order
  bool exact2 = true;
  if (!contiguous_groups(t.down, group_size(g, t.down))) {
    exact2 = group_order(t.down, group_size(g, t.down), &perm, &inverse);
    stats->reordered = exact2;
    stats->act_order_requantized = !exact2;
  }
  bool exact1 = contiguous_groups(t.gate, group_size(g, t.gate)) &&
                contiguous_groups(t.up, group_size(g, t.up));
  if (!exact1) stats->act_order_requantized = true;
  const std::vector<int64_t> in_order;
  const Rows gate{0, 2, inverse}, up{1, 2, inverse}, down{0, 1, in_order};
  if (exact1) {
    transcode(t.gate, g, gate, in_order, &s->fc1, &exact1);
    transcode(t.up, g, up, in_order, &s->fc1, &exact1);
  }
  if (exact2) transcode(t.down, g, down, perm, &s->fc2, &exact2);
  double err = 0;
  if (!exact1) {
    s->w1.resize(static_cast<size_t>(2 * inter * hidden));
    dequantize(t.gate, g, gate, in_order, s->w1.data());
    dequantize(t.up, g, up, in_order, s->w1.data());
    QMOE_RETURN_IF_ERROR(requantize(s->w1, 2 * inter, hidden, &s->fc1, &err));
    stats->requant_error = std::max(stats->requant_error, err);
  }
  if (!exact2) {
    s->w2.resize(static_cast<size_t>(hidden * inter));
    dequantize(t.down, g, down, perm, s->w2.data());
    QMOE_RETURN_IF_ERROR(requantize(s->w2, hidden, inter, &s->fc2, &err));
    stats->requant_error = std::max(stats->requant_error, err);
  }
  stats->requantized = !exact1 || !exact2;
  return Status::ok();
}

}  // namespace qmoe::convert
