// Float experts (--from bf16 | fp16 | fp32): each projection is widened to fp32 where it lies in
// the checkpoint and quantized with qmoe's quantizers. A projection W [N, K] (y = x W^T) is read
// through ProjTensors::at, element (n, k) at offset + n * row + k * col of its tensor:
//
//   plain Linear weight [N, K]                     offset 0,        row K,  col 1
//   fused y = x W, gate_up [H, 2I] of one expert:
//     Llama-4 (gate columns, then up columns)      gate: offset 0,  row 1,  col 2I
//                                                  up:   offset I,  row 1,  col 2I
//     gpt-oss (gate and up columns alternate)      gate: offset 0,  row 2,  col 2I
//                                                  up:   offset 1,  row 2,  col 2I
//   fused down [I, H] of one expert (both)         offset 0,        row 1,  col H
//   shared-expert slice c of down [H, S]           offset c * I,    row S,  col 1
//
// FC1 [2I, H] then interleaves gate and up rows (row 2i gate row i, row 2i + 1 up row i) and FC2
// [H, I] is down, whatever the source layout.
#include <algorithm>
#include <cstring>
#include <string>

#include "convert/experts.h"
#include "core/numeric.h"

namespace qmoe::convert {

namespace {

// Widens a run of `count` elements of v starting at element `at` into out; one loop per dtype so
// that each vectorizes (bf16 is a shift).
void widen_run(const TensorView& v, int64_t at, int64_t count, float* out) {
  if (v.dtype == DType::kF32) {
    std::memcpy(out, static_cast<const float*>(v.data) + at, static_cast<size_t>(count) * 4);
  } else if (v.dtype == DType::kBF16) {
    const uint16_t* in = static_cast<const uint16_t*>(v.data) + at;
    for (int64_t i = 0; i < count; ++i) {
      const uint32_t bits = static_cast<uint32_t>(in[i]) << 16;
      std::memcpy(out + i, &bits, 4);
    }
  } else {
    const uint16_t* in = static_cast<const uint16_t*>(v.data) + at;
    for (int64_t i = 0; i < count; ++i) out[i] = num::f16_to_f32(in[i]);
  }
}

// Copies element (n, k) of p's weight (ProjTensors::at) to w[(row0 + n * stride) * K + k] for a
// weight stored transposed, in tiles so that both sides stay in cache; `load` widens one element.
template <typename T, typename Load>
void load_strided(const ProjTensors& p, int64_t row, int64_t row0, int64_t stride, Load load,
                  float* w) {
  const T* in = static_cast<const T*>(p.weight.data) + p.at.offset;
  constexpr int64_t kTile = 32;
  for (int64_t k0 = 0; k0 < p.k; k0 += kTile) {
    for (int64_t n0 = 0; n0 < p.n; n0 += kTile) {
      const int64_t k1 = std::min(p.k, k0 + kTile);
      for (int64_t n = n0; n < std::min(p.n, n0 + kTile); ++n) {
        float* out = w + (row0 + n * stride) * p.k;
        const T* src = in + n * row;
        for (int64_t k = k0; k < k1; ++k) out[k] = load(src[k * p.at.col]);
      }
    }
  }
}

// Widens projection p into rows row0, row0 + stride, ... of w [*, K].
void load_proj(const ProjTensors& p, int64_t row0, int64_t stride, float* w) {
  const int64_t row = p.at.row > 0 ? p.at.row : p.k;
  if (p.at.col == 1) {  // rows are contiguous runs
    for (int64_t n = 0; n < p.n; ++n) {
      widen_run(p.weight, p.at.offset + n * row, p.k, w + (row0 + n * stride) * p.k);
    }
  } else if (p.weight.dtype == DType::kF32) {
    load_strided<float>(
        p, row, row0, stride, [](float v) { return v; }, w);
  } else if (p.weight.dtype == DType::kBF16) {
    load_strided<uint16_t>(
        p, row, row0, stride, [](uint16_t v) { return num::bf16_to_f32(v); }, w);
  } else {
    load_strided<uint16_t>(
        p, row, row0, stride, [](uint16_t v) { return num::f16_to_f32(v); }, w);
  }
}

// The tensor a projection names in messages: its Linear's weight, or a slice the name spells
// out (e.g. experts.gate_up_proj[3]).
std::string label(const ProjTensors& p) {
  return !p.name.empty() && p.name.back() == ']' ? p.name : p.name + ".weight";
}

}  // namespace

bool is_float_source(SourceFormat from) {
  return from == SourceFormat::kBf16 || from == SourceFormat::kFp16 || from == SourceFormat::kFp32;
}

ProjTensors proj_of(std::string name, int64_t n, int64_t k, const TensorView& weight,
                    ProjTensors::Layout at) {
  ProjTensors p;
  p.name = std::move(name);
  p.n = n;
  p.k = k;
  p.weight = weight;
  p.at = at;
  return p;
}

TensorView expert_slice(const TensorView& v, int64_t e, std::initializer_list<int64_t> dims) {
  const size_t bytes = v.bytes() / static_cast<size_t>(v.dims[0]);
  return TensorView(static_cast<const uint8_t*>(v.data) + static_cast<size_t>(e) * bytes, v.dtype,
                    dims);
}

Status convert_float_expert(const ExpertTensors& t, ExpertScratch* s) {
  const int64_t inter = t.gate.n, hidden = t.gate.k;
  s->w1.resize(static_cast<size_t>(2 * inter * hidden));
  s->w2.resize(static_cast<size_t>(hidden * inter));
  load_proj(t.gate, 0, 2, s->w1.data());
  load_proj(t.up, 1, 2, s->w1.data());
  load_proj(t.down, 0, 1, s->w2.data());
  Status st = quantize_expert(s->w1.data(), 0, &s->fc1);
  if (!st.is_ok()) {
    return Status(st.code(), label(t.gate) + " / " + label(t.up) +
                                 " (FC1 rows interleave them): " + st.message());
  }
  st = quantize_expert(s->w2.data(), 0, &s->fc2);
  if (!st.is_ok()) return Status(st.code(), label(t.down) + ": " + st.message());
  if (t.gate.bias.present()) {
    s->b1.resize(static_cast<size_t>(t.gate.bias.numel()));
    widen(t.gate.bias, s->b1.data());
    s->b2.resize(static_cast<size_t>(t.down.bias.numel()));
    widen(t.down.bias, s->b2.data());
  }
  return Status::ok();
}

}  // namespace qmoe::convert
