// The shuffled orders of int4 and int8 codes (MixedCodes::kInt4, kInt8 and their zero-point
// kinds) that the mixed-input GEMM reads: each thread's eight codes of one wgmma A fragment lie in
// 32-bit words in the order the fast int4 / int8 -> bf16/f16 conversions take (CUTLASS's
// mixed-input utilities convert such a word with lop3 and one subtract per pair, where the plain
// K-contiguous order needs byte permutes first; the zero-point kinds convert to f32 instead and
// take the order for their one copy, below). Included by the shuffled kinds' instances and by the
// shuffle kernel (cutlass_mixed_shuffle.cu), so both use one layout.
//
// The atom covers 16 rows (n) x 16 codes (k). A warp's m64n16k16 A fragment gives lane t the
// codes of rows r = t / 4 and r + 8 at k = 2 (t % 4) + {0, 1, 8, 9}: values v0..v7 = (r, k0)
// (r, k0+1) (r+8, k0) (r+8, k0+1) (r, k0+8) (r, k0+9) (r+8, k0+8) (r+8, k0+9). Lane t's codes
// start at offset 8 t (in codes), in this order:
//
//   int4 (one word)   offset   0   1   2   3   4   5   6   7      from the low nibble up
//                     code    v0  v2  v4  v6  v1  v3  v5  v7
//   int8 (two words)  offset   0   1   2   3 | 4   5   6   7      from the low byte up
//                     code    v0  v2  v1  v3 | v4  v6  v5  v7
//
// Atoms tile the [n, k] matrix along k first (a 16-row band's atoms in a row), each contiguous:
//   offset(m, k) = atom(m % 16, k % 16) + 256 ((k / 16) + (k_total / 16) (m / 16))
// so n must be a multiple of 16 and k of 16 (the kernel's K tile, 64, already is). Along k first
// because the decode kernels read the same codes (mma_pack.h: int4 and int8 are this layout):
// a decode chunk is four (int4) or two (int8) consecutive atoms of one band, 512 contiguous
// bytes, and the layer keeps one copy of the codes for both paths. A K tile of the GEMM is then
// 16 runs of 512 (int4) or 1024 (int8) bytes, one per band, which its TMA box takes as well.
#pragma once

#include "cute/atom/mma_traits_sm90_gmma.hpp"
#include "cute/tensor.hpp"
#include "cutlass/numeric_types.h"

namespace qmoe::cuda::cutlass_detail {

// A lane's value order (value -> offset among its eight codes): int4's 0 2 4 6 1 3 5 7 in one
// word; int8's 0 2 1 3 in each of two words.
template <int kBits>
constexpr auto shuffle_value_order() {
  using namespace cute;
  if constexpr (kBits == 4) {
    return Layout<Shape<_2, _4>, Stride<_4, _1>>{};
  } else {
    static_assert(kBits == 8, "int4 or int8 codes");
    return logical_product(Layout<Shape<_2, _2>, Stride<_2, _1>>{}, Layout<_2>{});
  }
}

// The atom as a CuTe layout (m, k) -> offset, derived from the wgmma's own A fragment layout
// rather than written out, so that it is the fragment order by construction.
template <typename Element, int kBits>
constexpr auto shuffle_atom_for() {
  using namespace cute;
  using Mma = decltype(SM90::GMMA::rs_op_selector<Element, Element, float, Shape<_64, _16, _32>>());
  auto tv = typename MMA_Traits<Mma>::ALayout{};  // (thread of 128, value) -> m + 64 k
  constexpr int kValues = decltype(size<1>(tv))::value;
  // One warp's lanes cover 16 of the 64 rows: (lane, value) -> (m, k) over 16 x 16, inverted.
  auto warp_tv = make_layout_like(composition(tv, make_shape(Int<32>{}, Int<kValues>{})));
  auto warp_mk = right_inverse(warp_tv).with_shape(make_shape(Int<16>{}, Int<16>{}));
  // (lane, value) -> offset: the lane's values contiguous, in the drawn order.
  auto value_order = shuffle_value_order<kBits>();
  static_assert(decltype(size(value_order))::value == kValues, "eight codes per lane");
  auto tv_offset = select<1, 0>(logical_product(value_order, make_layout(Int<32>{})));
  return composition(tv_offset, warp_mk);
}

// The same atom for bf16 and f16 (both 16-bit wgmma operands with one A fragment layout).
template <int kBits>
using ShuffleAtom = decltype(shuffle_atom_for<cutlass::bfloat16_t, kBits>());
static_assert(cute::is_same_v<ShuffleAtom<4>, decltype(shuffle_atom_for<cutlass::half_t, 4>())> &&
                  cute::is_same_v<ShuffleAtom<8>, decltype(shuffle_atom_for<cutlass::half_t, 8>())>,
              "one shuffled order for both activation dtypes");
constexpr int kShuffleRows = decltype(cute::size<0>(ShuffleAtom<4>{}))::value;
constexpr int kShuffleCols = decltype(cute::size<1>(ShuffleAtom<4>{}))::value;
constexpr int kShuffleSize = kShuffleRows * kShuffleCols;
static_assert(kShuffleRows == 16 && kShuffleCols == 16, "the atom drawn above");
static_assert(decltype(cute::size<0>(ShuffleAtom<8>{}))::value == kShuffleRows &&
                  decltype(cute::size<1>(ShuffleAtom<8>{}))::value == kShuffleCols,
              "one atom shape for both code widths");
static_assert(decltype(cute::cosize(ShuffleAtom<4>{}))::value == kShuffleSize &&
                  decltype(cute::cosize(ShuffleAtom<8>{}))::value == kShuffleSize,
              "compact atoms");

// The layout of one expert's [n, k] codes (with the unit batch mode the kernel's stride type
// carries), as the kernel's A "stride" and as the shuffle kernel's destination.
using ShuffleOrder = cute::Step<cute::_2, cute::_1, cute::_3>;  // atoms along k first
template <typename StrideA, int kBits>
using ShuffledLayoutA = decltype(cute::tile_to_shape(
    ShuffleAtom<kBits>{}, cute::Layout<cute::Shape<int, int, cute::Int<1>>, StrideA>{},
    ShuffleOrder{}));

template <int kBits>
CUTE_HOST_DEVICE auto shuffled_layout(int n, int k) {
  return cute::tile_to_shape(ShuffleAtom<kBits>{}, cute::make_shape(n, k, cute::Int<1>{}),
                             ShuffleOrder{});
}

}  // namespace qmoe::cuda::cutlass_detail
