// Device helpers shared by the decode kernels: streaming loads and copies, the m16n8k16 tensor-core
// step, the code-to-fragment conversion and the packed row map (mma_pack.h).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "core/formats/code_windows.h"
#include "core/formats/mma_pack.h"
#include "core/numeric.h"
#include "cuda/common/device_numeric.cuh"
#include "cuda/decode/decode_gemv.h"
#include "cuda/decode/decode_launch.h"
#include "cuda/layer/activation.cuh"
#include "cuda/layer/combine.cuh"

namespace qmoe::cuda::decode_detail {

// The decode kernel's warps per block (decode_launch.h), by the short name its helpers use.
constexpr int kWarps = kDecodeWarps;

__device__ __forceinline__ uint4 load_stream(const uint32_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// A lane's 16 bytes of a step-major chunk (int4, int8; mma_pack.h), from p = the chunk plus the
// lane's first word (mma_chunk_word(kBits, lane, 0)): four words (int4) or two pairs (int8) a K
// step (128 or 256 bytes) apart, each load one contiguous 128 or 256 bytes of the warp.
template <int kBits>
__device__ __forceinline__ uint4 load_step_major(const uint32_t* p) {
  uint4 v;
  if constexpr (kBits == 4) {
    asm volatile(
        "ld.global.nc.L1::no_allocate.u32 %0, [%4];\n\t"
        "ld.global.nc.L1::no_allocate.u32 %1, [%4+128];\n\t"
        "ld.global.nc.L1::no_allocate.u32 %2, [%4+256];\n\t"
        "ld.global.nc.L1::no_allocate.u32 %3, [%4+384];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
  } else {
    static_assert(kBits == 8, "step-major codes are 4 or 8 bits");
    asm volatile(
        "ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%4];\n\t"
        "ld.global.nc.L1::no_allocate.v2.u32 {%2,%3}, [%4+256];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
  }
  return v;
}

// The same from a chunk in shared memory (addr: the chunk plus 4 or 8 bytes a lane).
template <int kBits>
__device__ __forceinline__ uint4 lds_step_major(uint32_t addr) {
  uint4 v;
  if constexpr (kBits == 4) {
    asm volatile(
        "ld.shared.u32 %0, [%4];\n\t"
        "ld.shared.u32 %1, [%4+128];\n\t"
        "ld.shared.u32 %2, [%4+256];\n\t"
        "ld.shared.u32 %3, [%4+384];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "r"(addr));
  } else {
    static_assert(kBits == 8, "step-major codes are 4 or 8 bits");
    asm volatile(
        "ld.shared.v2.u32 {%0,%1}, [%4];\n\t"
        "ld.shared.v2.u32 {%2,%3}, [%4+256];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "r"(addr));
  }
  return v;
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The weight ring's copies (decode_kernel.cuh): 16 bytes global -> shared, cached in L2 only
// (each chunk is read once), and the group waits. All are volatile, so they keep their order with
// lds128, the ring's only reader.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending));
}
__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr));
  return v;
}

// A hint to bring the 128-byte line at p into L2 (no register, no wait): the decode kernel's loads
// of it then see L2's latency, not HBM's.
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

template <bool kBf16>
__device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], uint32_t b0,
                                         uint32_t b1) {
  if constexpr (kBf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// (a & b) | c in one LOP3: written as two C operations with two constants, the compiler emits
// two instructions (a LOP3 takes one immediate), one per code pair per K step.
__device__ __forceinline__ uint32_t and_or(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// Pair jj (0 or 1) of a word of step-major int8 codes (bytes jj and jj + 2, each b = q ^ 128,
// mma_pack.h) as the exact (q - zp) bf16x2. 128 + q needs 9 significant bits, more than bf16
// has, but b's low seven bits and its top bit b7 fit apart: one LOP3 gives 128 + (b & 127) and
// one 128 + 128 b7 (bf16 bits 0x4300 with b7 as the exponent's low bit: 128 or 256), whose
// difference is (b & 127) - 128 b7 = q - 128 exactly; then sub = zp - 128 (window_base below)
// comes off, exact too (|q - zp| <= 255). Two LOP3 and two HSUB2 a pair, and a shift for the
// word's pair 1; the fp32 form it replaces took two PRMT, two FADD and an F2FP a pair and an
// XOR a word (bench/results/2026-12-05-h200-one-copy.md).
__device__ __forceinline__ uint32_t int8_pair_bf16(uint32_t w, int jj, uint32_t sub) {
  const uint32_t x = jj ? w >> 8 : w;
  const uint32_t low7 = and_or(x, 0x007F007Fu, 0x43004300u);
  const uint32_t top = and_or(x, 0x00800080u, 0x43004300u);
  const __nv_bfloat162 d = __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&low7),
                                   *reinterpret_cast<const __nv_bfloat162*>(&top));
  const __nv_bfloat162 r = __hsub2(d, *reinterpret_cast<const __nv_bfloat162*>(&sub));
  return *reinterpret_cast<const uint32_t*>(&r);
}

// Pair j of a word in the FP4 layout (mma_pack.h) as a bf16x2/f16x2, times mult: the magnitudes
// (the word rotated right by 3 j) and the signs (rotated by P - 3 + j) masked into place give the
// E2M1 values times 2^-126 (bf16) or 2^-14 (f16) exactly, subnormals included; the HMUL2 by mult
// (NVFP4: the block's multiplier, MXFP4: 2^126 or 2^14) is exact as well (nvfp4_multiplier). Two
// LOP3s and a multiply per pair, and the word's five distinct rotations.
template <bool kBf16>
__device__ __forceinline__ uint32_t fp4_pair(uint32_t w, int j, uint32_t mult) {
  constexpr int kP = kBf16 ? 6 : 9;
  const uint32_t mag = __funnelshift_r(w, w, 3 * j) & ((7u << kP) | (7u << (kP + 16)));
  const uint32_t v = and_or(__funnelshift_r(w, w, kP - 3 + j), 0x80008000u, mag);
  if constexpr (kBf16) {
    const __nv_bfloat162 r = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&v),
                                     *reinterpret_cast<const __nv_bfloat162*>(&mult));
    return *reinterpret_cast<const uint32_t*>(&r);
  } else {
    const __half2 r =
        __hmul2(*reinterpret_cast<const __half2*>(&v), *reinterpret_cast<const __half2*>(&mult));
    return *reinterpret_cast<const uint32_t*>(&r);
  }
}

// Pair jj of a word in the FP8 layout (mma_pack.h) as an exact bf16x2/f16x2: rotations back and
// masks (mma_fp8_pair_bits: f16 one LOP3 for pair 0, two SHF and two LOP3 for pair 1; bf16 three
// SHF and four LOP3 per word) give e4m3 * 2^-8 (f16) or e4m3 * 2^-120 (bf16), subnormals included;
// bf16 then takes an HMUL2 by 2^120, exact for every code (the MXFP4 path's HMUL2 of bf16
// subnormals likewise). The f16 sums take 2^kFp8F16Shift when scaled (decode_kernel.cuh's flush).
template <bool kBf16>
__device__ __forceinline__ uint32_t fp8_pair(uint32_t w, int jj) {
  constexpr int kMagBit = kBf16 ? 4 : 7;
  const uint32_t v = mma_fp8_pair_bits(w, kMagBit, jj);
  if constexpr (kBf16) {
    constexpr uint32_t kTwo120 = 0x7B807B80u;  // 2^120 in both halves (exponent 247)
    const __nv_bfloat162 r = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&v),
                                     *reinterpret_cast<const __nv_bfloat162*>(&kTwo120));
    return *reinterpret_cast<const uint32_t*>(&r);
  } else {
    return v;
  }
}

// Half h of a word of two 16-bit values, in both halves of the result (an HMUL2 operand).
template <bool kBf16>
__device__ __forceinline__ uint32_t dup_half(uint32_t w, int h) {
  if constexpr (kBf16) {
    const __nv_bfloat162 x = *reinterpret_cast<const __nv_bfloat162*>(&w);
    const __nv_bfloat162 r = h ? __high2bfloat162(x) : __low2bfloat162(x);
    return *reinterpret_cast<const uint32_t*>(&r);
  } else {
    const __half2 x = *reinterpret_cast<const __half2*>(&w);
    const __half2 r = h ? __high2half2(x) : __low2half2(x);
    return *reinterpret_cast<const uint32_t*>(&r);
  }
}

// MXFP4's constant multiplier: 2^126 (bf16) or 2^14 (f16) in both halves.
template <bool kBf16>
constexpr uint32_t kFp4Unit = kBf16 ? 0x7E807E80u : 0x74007400u;

// Ablation builds (src/CMakeLists.txt, QMOE_DECODE_ABLATION) remove one technique each, so that
// scripts/gpu-ablations.sh can measure what it buys; a normal build defines none of these.
//   NO_WINDOWS     one position per window: a shift for every code pair (code_windows.h)
//   NO_KPAIR       the scale multiplies the sums after every K step, not once per scale block
//   RING2, RING4   two or four weight chunks in flight per lane at every width (decode_ring())
//   SCALAR_SCALES  scales and zero points copied one entry per load instead of 16 bytes
#if defined(QMOE_DECODE_ABLATE_NO_WINDOWS)
constexpr int kWindowPositions = 1;
#else
constexpr int kWindowPositions = 3;
#endif

template <int kBits, bool kBf16>
using Windows = formats::CodeWindows<kBits, kBf16, kWindowPositions>;

// Whether a width reads its codes through code windows (code_windows.h): all but int8 with bf16,
// whose 128 + q needs 9 significant bits and takes its top bit apart (int8_pair_bf16).
template <int kBits, bool kBf16>
constexpr bool kUsesWindows = !(kBits == 8 && kBf16);

// The window's positions (its (base + zp) constants per row), 1 without windows.
template <int kBits, bool kBf16>
__host__ __device__ constexpr int window_positions() {
  if constexpr (kUsesWindows<kBits, kBf16>) {
    return Windows<kBits, kBf16>::kPositions;
  } else {
    return 1;
  }
}

// The base of position index i; int8 with bf16 (no windows): -128, so that base + zp is the
// zp - 128 int8_pair_bf16 subtracts.
template <int kBits, bool kBf16>
__device__ __forceinline__ float window_base(int i) {
  if constexpr (kUsesWindows<kBits, kBf16>) {
    return Windows<kBits, kBf16>::base(i);
  } else {
    return -128.0f;
  }
}

// (a & b) | (c & ~b) with the bits of a where b and c are both set inverted, in one LOP3: with b a
// window's mask and c its base plus the codes' top bits, a step-major word's flipped codes
// (mma_pack.h) become q again at no cost.
__device__ __forceinline__ uint32_t and_or_flip(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0x6A;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// The top bit of each code at window position i, in both halves.
template <int kBits>
__host__ __device__ constexpr uint32_t window_top_bits(int i) {
  const uint32_t top = 1u << (kBits * i + kBits - 1);
  return top | (top << 16);
}

// Pair jj of word w as the exact (q - zp) bf16x2/f16x2: the window's shift (shared by the pairs of
// one window, so the compiler computes it once per word), one LOP3 for mask and base (kFlip: and
// the codes' top bits flipped back), and one subtraction of sub, the (base + zp) of the pair's
// position.
template <int kBits, bool kBf16, bool kFlip = false>
__device__ __forceinline__ uint32_t window_pair(uint32_t w, int jj, uint32_t sub) {
  using W = Windows<kBits, kBf16>;
  const int i = W::position_index(jj);
  const uint32_t q = kFlip ? and_or_flip(w >> W::shift(jj), W::mask(i),
                                         W::base_bits(i) | window_top_bits<kBits>(i))
                           : and_or(w >> W::shift(jj), W::mask(i), W::base_bits(i));
  if constexpr (kBf16) {
    const __nv_bfloat162 r = __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&q),
                                     *reinterpret_cast<const __nv_bfloat162*>(&sub));
    return *reinterpret_cast<const uint32_t*>(&r);
  } else {
    const __half2 r =
        __hsub2(*reinterpret_cast<const __half2*>(&q), *reinterpret_cast<const __half2*>(&sub));
    return *reinterpret_cast<const uint32_t*>(&r);
  }
}

template <bool kBf16>
__device__ __forceinline__ uint32_t pair_of(float base_plus_zp) {
  if constexpr (kBf16) {
    const __nv_bfloat162 r = __float2bfloat162_rn(base_plus_zp);
    return *reinterpret_cast<const uint32_t*>(&r);
  } else {
    const __half2 r = __float2half2_rn(base_plus_zp);
    return *reinterpret_cast<const uint32_t*>(&r);
  }
}

// One lane's results of a tile: v[0..1] are row g (logical lr0) for routes r0 and r0 + 1 of the
// expert, v[2..3] row g + 8 (lr1). FC1: bias, activation (gated units pair the two rows), store in
// the dtype; FC2: store fp32.
__device__ __forceinline__ void epilogue(const DecodeFcArgs& a, int64_t e, int m, int g,
                                         int64_t lr0, int64_t lr1, int off, int cnt, int r0,
                                         const float v[4], bool bf16) {
  const MmaPackShape& s = a.shape;
  const DType act_dtype = bf16 ? DType::kBF16 : DType::kF16;  // a constant in each kernel
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int r = r0 + rr;
    if (r >= cnt) continue;
    const int p = off + r;
    if (!a.fc1) {
      float* y = static_cast<float*>(a.out) + static_cast<int64_t>(p) * a.ldo;
      if (lr0 >= 0) y[lr0] = v[rr];
      if (lr1 >= 0) y[lr1] = v[2 + rr];
      continue;
    }
    const float scale = a.scale_input ? a.weights[a.permuted_route[p]] : 1.0f;
    const int64_t fc1_rows = s.map == MmaRowMap::kIdentity ? s.n : 2 * s.units;
    auto fc1_value = [&](float dot, int64_t lr) {
      const float b = a.bias ? load_scalar(a.bias, a.bias_dtype, e * fc1_rows + lr) : 0.0f;
      return scale * dot + b;
    };
    const int64_t o = static_cast<int64_t>(p) * a.ldo;
    if (s.map != MmaRowMap::kIdentity) {
      if (lr0 < 0) continue;
      const float gate = fc1_value(v[rr], lr0), lin = fc1_value(v[2 + rr], lr1);
      store_float(a.out, act_dtype, o + static_cast<int64_t>(m) * 8 + g,
                  gated_act(a.act, gate, lin));
    } else {
      if (lr0 >= 0) {
        store_float(a.out, act_dtype, o + lr0, scalar_act(a.act.kind, fc1_value(v[rr], lr0)));
      }
      if (lr1 >= 0) {
        store_float(a.out, act_dtype, o + lr1, scalar_act(a.act.kind, fc1_value(v[2 + rr], lr1)));
      }
    }
  }
}

// FC2 with the combine (DecodeFcArgs::combine): block blockIdx.y's route (token t, slot j =
// blockIdx.y % slots), its expert as a local index (0 where another shard's: then not held) and
// its position. Slot 0's block also keeps every slot's expert (-1 where another shard's) and
// weight in cs_e / cs_w for combine_store.
struct CombineRoute {
  int64_t e = 0;
  int off = 0;
  bool held = false;
};
__device__ __forceinline__ CombineRoute combine_route(const DecodeFcArgs& a, int32_t* cs_e,
                                                      float* cs_w, int tid) {
  const CombineTerms& m = a.terms;
  const int64_t r = blockIdx.y;
  const int ge = m.expert_ids[r];
  CombineRoute out;
  out.held = ge >= m.expert_begin && ge < m.expert_end;
  out.e = out.held ? ge - m.expert_begin : 0;
  out.off = m.route_position[r];
  if (r % m.slots == 0 && tid < m.slots) {
    const int gk = m.expert_ids[r + tid];
    cs_e[tid] = gk >= m.expert_begin && gk < m.expert_end ? gk - m.expert_begin : -1;
    cs_w[tid] = m.weights[r + tid];
  }
  return out;
}

// FC2 with the combine (DecodeFcArgs::combine): a finished tile's sums v (the m16n8 fragment of
// lane (g, t)) into the cluster's first block, at [slot][tile][16 rows]. The block has one route,
// whose row every mma column read, so column 0 (lanes t 0: rows g and g + 8) holds it.
__device__ __forceinline__ void hand_to_first(float* gathered, int tile, int g, int t,
                                              const float v[4], int tpb) {
  if (t != 0) return;
  uint32_t rank, dst;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  const uint32_t mine = smem_u32(gathered + (rank * tpb + tile) * 16 + g);
  asm volatile("mapa.shared::cluster.u32 %0, %1, 0;" : "=r"(dst) : "r"(mine));
  asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(dst), "f"(v[0]) : "memory");
  asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(dst + 32), "f"(v[2]) : "memory");
}

// Every thread of the cluster, once as the kernel starts (arrive) and once before the first
// store into another block's shared memory (wait): every block of the cluster has started, so the
// memory hand_to_first writes exists (a block's shared memory is its own only once it runs).
// Relaxed: it orders nothing; cluster_sync below orders the stores.
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
}

// FC1 -> FC2 counters in the workspace, one per expert: the decode kernels' (DecodeFcArgs::ready)
// and the fused kernel's (fused_decode.h). An FC1 block (or item) counts itself done after a
// block barrier that follows every store of its rows: one thread adds one by a releasing add
// (release_add), which makes those stores visible at GPU scope before the count (cumulatively:
// the barrier ordered the other threads' stores before it). One thread of an FC2 block (or item)
// waits until its expert's count reaches `target` (wait_count, acquiring loads), then a block
// barrier orders the block's reads of FC1's rows after it. The decode kernels first released by
// a fence and an atomic add (MEMBAR.SC, CCTL.IVALL, ATOM where this is MEMBAR.ALL, RED): level
// within 0.6% (bench/results/2026-12-06-h100-finalize-counters-and-tests-race.md).
__device__ __forceinline__ void release_add(int32_t* p, int32_t v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ int32_t acquire_load(const int32_t* p) {
  int32_t v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void wait_count(const int32_t* count, int target) {
  while (acquire_load(count) < target) __nanosleep(32);
}

// Every thread of the cluster: its shared-memory stores (hand_to_first's) before, every other
// block's visible after.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::
                   : "memory");
}

// In the cluster's first block after the cluster's barrier: output row 16 (m0 + i / 16) + i % 16
// of the token, the finalize kernel's sum (combine.cuh's combine_slots: its terms and order) on
// the rows FC2 would have stored, y_j the slot's gathered sums, so its bits. No held slot: +0,
// as there.
__device__ __forceinline__ void combine_store(const DecodeFcArgs& a, int m0, int i,
                                              const float* gathered, const int32_t* cs_e,
                                              const float* cs_w, int tpb) {
  const int tl = i >> 4, r = i & 15;
  const int64_t lr = a.shape.logical_row(16 * (m0 + tl) + r);
  if (lr < 0) return;
  struct Rows {
    const DecodeFcArgs& a;
    const float* gathered;
    const int32_t* cs_e;
    const float* cs_w;
    int tpb, tl, r;
    int64_t lr;
    __device__ int local(int j) const { return cs_e[j]; }
    __device__ void load(int j, float (&v)[1]) const { v[0] = gathered[(j * tpb + tl) * 16 + r]; }
    __device__ float bias(int e, int) const {
      return load_scalar(a.terms.bias, a.terms.bias_dtype,
                         static_cast<int64_t>(e) * a.terms.hidden + lr);
    }
    __device__ float weight(int j) const { return cs_w[j]; }
  };
  const CombineTerms& m = a.terms;
  float acc[1];
  combine_slots<1, 1>(m.slots, m.scale_input, m.bias != nullptr,
                      Rows{a, gathered, cs_e, cs_w, tpb, tl, r, lr}, acc);
  store_float(m.out, m.out_dtype, static_cast<int64_t>(blockIdx.y / m.slots) * m.hidden + lr,
              acc[0]);
}

}  // namespace qmoe::cuda::decode_detail
