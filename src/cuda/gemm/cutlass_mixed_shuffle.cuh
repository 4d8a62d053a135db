// The shuffled order of int4 codes (MixedCodes::kInt4) that the mixed-input GEMM reads: each
// thread's eight codes of one wgmma A fragment lie in one 32-bit word, in the order the fast int4
// -> bf16/f16 conversion takes (CUTLASS's mixed-input utilities convert such a word with lop3 and
// one subtract per pair, where the plain K-contiguous order needs byte permutes first). Included
// by the kInt4 instances and by the shuffle kernel (cutlass_mixed_shuffle.cu), so both use one
// layout.
//
// The atom covers 16 rows (n) x 16 codes (k), 128 bytes. A warp's m64n16k16 A fragment gives
// lane t the codes of rows r = t / 4 and r + 8 at k = 2 (t % 4) + {0, 1, 8, 9}: values v0..v7 =
// (r, k0) (r, k0+1) (r+8, k0) (r+8, k0+1) (r, k0+8) (r, k0+9) (r+8, k0+8) (r+8, k0+9). Lane t's
// word is at offset 8 t (in codes), holding v0 v2 v4 v6 v1 v3 v5 v7 from the low nibble up:
//
//   offset   0   1   2   3   4   5   6   7 | 8 ...
//   code    v0  v2  v4  v6  v1  v3  v5  v7 | lane 1's v0 ...
//
// Atoms tile the [n, k] matrix column-major (down n first, then along k), each contiguous:
//   offset(m, k) = atom(m % 16, k % 16) + 256 ((m / 16) + (n / 16) (k / 16))
// so n must be a multiple of 16 and k of 16 (the kernel's K tile, 64, already is).
#pragma once

#include "cute/atom/mma_traits_sm90_gmma.hpp"
#include "cute/tensor.hpp"
#include "cutlass/numeric_types.h"

namespace qmoe::cuda::cutlass_detail {

// The atom as a CuTe layout (m, k) -> offset, derived from the wgmma's own A fragment layout
// rather than written out, so that it is the fragment order by construction.
template <typename Element>
constexpr auto shuffle_atom_for() {
  using namespace cute;
  using Mma = decltype(SM90::GMMA::rs_op_selector<Element, Element, float, Shape<_64, _16, _32>>());
  auto tv = typename MMA_Traits<Mma>::ALayout{};  // (thread of 128, value) -> m + 64 k
  constexpr int kValues = decltype(size<1>(tv))::value;
  // One warp's lanes cover 16 of the 64 rows: (lane, value) -> (m, k) over 16 x 16, inverted.
  auto warp_tv = make_layout_like(composition(tv, make_shape(Int<32>{}, Int<kValues>{})));
  auto warp_mk = right_inverse(warp_tv).with_shape(make_shape(Int<16>{}, Int<16>{}));
  // (lane, value) -> offset: the lane's values contiguous, in the order v0 v2 v4 v6 v1 v3 v5 v7.
  auto value_order = Layout<Shape<_2, _4>, Stride<_4, _1>>{};
  auto tv_offset = select<1, 0>(logical_product(value_order, make_layout(Int<32>{})));
  return composition(tv_offset, warp_mk);
}

// The same atom for bf16 and f16 (both 16-bit wgmma operands with one A fragment layout).
using ShuffleAtom = decltype(shuffle_atom_for<cutlass::bfloat16_t>());
static_assert(cute::is_same_v<ShuffleAtom, decltype(shuffle_atom_for<cutlass::half_t>())>,
              "one shuffled order for both activation dtypes");
constexpr int kShuffleRows = decltype(cute::size<0>(ShuffleAtom{}))::value;
constexpr int kShuffleCols = decltype(cute::size<1>(ShuffleAtom{}))::value;
constexpr int kShuffleSize = kShuffleRows * kShuffleCols;
static_assert(kShuffleRows == 16 && kShuffleCols == 16, "the atom drawn above");
static_assert(decltype(cute::cosize(ShuffleAtom{}))::value == kShuffleSize, "a compact atom");

// The layout of one expert's [n, k] codes (with the unit batch mode the kernel's stride type
// carries), as the kernel's A "stride" and as the shuffle kernel's destination.
template <typename StrideA>
using ShuffledLayoutA = decltype(cute::tile_to_shape(
    ShuffleAtom{}, cute::Layout<cute::Shape<int, int, cute::Int<1>>, StrideA>{}));

CUTE_HOST_DEVICE auto shuffled_layout(int n, int k) {
  return cute::tile_to_shape(ShuffleAtom{}, cute::make_shape(n, k, cute::Int<1>{}));
}

}  // namespace qmoe::cuda::cutlass_detail
