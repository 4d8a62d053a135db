// The decode kernel's launcher (see decode_gemv.h; the kernel is decode_kernel.cuh): argument
// checks, the launch geometry, and the turn from runtime widths into template arguments.
#include <algorithm>
#include <string>

#include "cuda/common/cuda_check.h"
#include "cuda/decode/decode_gemv.h"
#include "cuda/decode/decode_launch.h"

namespace qmoe::cuda {

using namespace decode_detail;

namespace {

// The geometry of an FC with one tile per block and one staged row (the launcher sets tpb and
// rows_cap afterwards).
DecodeGeometry geometry(const MmaPackShape& s) {
  DecodeGeometry g;
  const int chunk_k = 16 * s.steps_per_chunk;
  g.kpad = static_cast<int>(s.chunks) * chunk_k;
  // The staged rows' stride in halves is 16 modulo 32, 32 bytes modulo 64: the B fragment loads
  // (8 bytes per lane, row g at byte 8 t) then give the 4 rows of a half-warp, and the zero row
  // before them, 4 different 32-byte ranges of the banks. A stride of 16 bytes modulo 128 (kpad +
  // 8) made rows g and g + 1 meet in the banks: two-way conflicts on every mma step.
  g.ld = g.kpad % 32 == 0 ? g.kpad + 16 : g.kpad;
  g.nblk_pad = static_cast<int>(s.scale_blocks);
  g.shift = 30;
  if (s.block_size) {
    g.shift = 0;
    while ((1 << g.shift) < s.block_size) ++g.shift;
  }
  if (s.bits == 3) {
    g.spb = -1;
  } else if (s.block_size == 0 || s.block_size >= chunk_k) {
    g.spb = 0;
  } else {
    g.spb = s.block_size / 16;
  }
  if (g.spb == 0) {
    g.cpb = s.block_size ? s.block_size / chunk_k : static_cast<int>(s.chunks);
    g.cpb_last = static_cast<int>(s.chunks) - (g.nblk_pad - 1) * g.cpb;
  }
  g.mblk = s.codes == MmaCodes::kNvFp4 ? static_cast<int>(s.fp4_blocks) : 0;
  g.tpb = 1;
  g.rows_cap = 1;
  return g;
}

// Tiles per block when the caller leaves it open: one (the warps split K) while the call's
// (expert, tile) pairs are few enough that loads in flight, not instructions, bound it; beyond,
// several, so that a block's prologue and staged activations serve more weights. The switch
// points come from QMOE_DECODE_TPB sweeps on an H200 (bench/results/*-f6adf92.md): one tile wins
// at 1 token (768-800 pairs), 4 from 2 to 8 tokens, 8 from 16 tokens. With the count-down K loop
// (bench/results/2026-12-01-h200-decode-loop.md) 8 tiles from 4096 pairs won on qwen3-30b-a3b at
// 8 tokens (INT4 67.0 -> 65.2 us, INT2 b64 63.1 -> 60.6) but lost on INT2 b64 with H 2560, I 640,
// E 512, k 10 (FC1 6400 pairs: 78-81 -> 86.1), INT8 (108.7 -> 110.4): 8192 till K bounded. With one
// route per expert (one token) a block stages a single row, so several tiles save only the block's
// fixed costs, which count where tiles are small and many: one tile won for qwen3-30b-a3b's FC2
// (1024 pairs, 3-6 KB tiles; 0.5-1.0 us at one token) and Mixtral-8x7B's FC1 (3584 pairs, 32 KB
// tiles; 104.3 -> 101.6 us), and lost for INT2 on H 2560, E 512, k 10 (FC2: 1600 pairs of 2.5 KB
// tiles; 33.5 -> 36.5 us; bench/results/2026-12-01-h200-decode-c7ff17d.md).
// Two tiles per block, two warps splitting each tile's K: one route per expert where one tile per
// block would take more than a wave of blocks (6 on each of 132 SMs: 792) and two tiles fit one,
// if each warp's half of a tile is at least 4 chunks. qwen3-30b-a3b's FC2 at one token (1024
// pairs of 12 chunks): the layer 29.1 -> 27.4 us on an H100, qwen3.6-35b-a3b's 27.4 -> 25.6;
// INT2 on H 2560, E 512, k 10 (FC2: 1600 pairs of 5 chunks) lost 35.5 -> 39.9 against 4 tiles
// (bench/results/2026-12-06-h100-split-two.md). The bounds are constants, not the device's wave,
// so that the partial sums' order (hence the bits) never depends on the device.
// FC1 within one wave takes two tiles per block as well where its tiles are under 16 KB: one
// tile per block fills nearly every place, so FC2's clusters enter only as FC1's blocks leave
// (bench/results/2026-12-06-h100-routed-flag-and-stamps.md). On an H100 (bench/results/
// 2026-12-06-h100-fc1-two-direct-self-route.md) INT2 b64 on H 2560, E 512, k 10 (FC1: 800 pairs
// of 10 KB, 20 chunks) went 34.9-35.0 -> 32.1-32.3 us at one token, while the 16 KB tiles of
// qwen3-30b-a3b (768 pairs) and qwen3.6-35b-a3b (512) lost, 25.9-26.2 -> 26.8-26.9 and 25.0-25.1
// -> 26.5 (each warp's 16 chunks then take the shared-memory ring), so those keep one tile.
constexpr int64_t kDecodeOneWave = 800;

// Eight tiles per block from 4096 pairs where K <= 2048 (H200, bench/results/2026-12-07-h200-
// tpb-k-act-order-tables.md): qwen3-30b-a3b INT4 at 6 / 8 tokens 4.3 / 5.0% faster, INT8 7.9 /
// 7.7%, qwen3.6-35b-a3b INT4 at 8 tokens 3.4%, the INT2 E 512 layer's FC2 (K 640) at 5 tokens
// 3.6%. Longer tiles lost (H100, 2026-12-07-h100-no-pdl-tpb-chunks.md): gpt-oss-20b's FC1 (K 2880,
// 720 blocks of eight 23 KB MXFP4 tiles for 792 places) 14% at 4 tokens, the E 512 FC1 1.1%.
constexpr int64_t kDecodeEightTilesMaxK = 2048;

int auto_tiles_per_block(const DecodeFcArgs& a, int max_routes) {
  const int64_t items = static_cast<int64_t>(a.max_groups) * a.shape.tiles;
  const int64_t tile_bytes = 2 * a.shape.k * a.shape.bits;  // 16 rows of K codes
  if (max_routes == 1) {
    if (tile_bytes >= 16 * 1024) return 1;
    if (items > kDecodeOneWave && items <= 2 * kDecodeOneWave && a.shape.chunks >= 8) return 2;
    if (a.fc1 && items <= kDecodeOneWave && a.shape.chunks >= 8) return 2;
    if (items <= 1024) return 1;
  }
  if (items <= 1000) return 1;
  if (items > 8192) return 8;
  return items > 4096 && a.shape.k <= kDecodeEightTilesMaxK ? 8 : 4;
}

// Blocks of the kernel one sm_90 multiprocessor holds by shared memory (the reserved share of
// each block and the static reduction buffer of 2 KB included), at most its register bound.
int blocks_per_sm(const DecodeGeometry& g, bool zero_points) {
  const size_t per_block = decode_smem_bytes(g, zero_points) + kSm90SmemReservedPerBlock + 2048;
  return std::min(kDecodeMinBlocks, static_cast<int>(kSm90SmemPerSm / per_block));
}

// The weight ring goes to shared memory when a warp's stream of 16-byte chunks is long
// (at least kSmemRingMinChunks). Where only several tiles per block make it long, the ring's
// 16 KB must also leave 4 blocks per multiprocessor (or as many as without it).
// The register ring waits for all its loads each time round (decode_launch.h), a memory latency
// per ring, which dominates long streams; over a few rings the shared-memory ring's extra
// instructions and shared memory cost more than they save. QMOE_DECODE_RING sweeps on an H200
// (graph replays, cold L2, us; registers / shared memory; bench/results/2026-12-01-h200-ring.md):
//   Mixtral-8x7B INT4 (tiles of 64 and 224 chunks)  1 / 2 / 4 / 8 tokens: 101.0 / 221.2 / 382.2 /
//     559.8 against 94.5 / 183.7 / 329.1 / 436.8;
//   qwen3-30b-a3b INT4 (tiles of 32 and 12 chunks)  16 tokens (8 tiles per block, streams of 64,
//     4 rows: 6 -> 4 blocks per SM): 98.3 against 95.7; 64 tokens (8 rows: 4 -> 3 blocks per SM):
//     154.5 against 162.1; 1 token (one tile per block, streams of 8): 26.3 against 29.3;
//   Mixtral at 1 token, FC2 (one tile per block, 3 -> 2 blocks per SM): 100.6 against 91.3 for
//     the layer;
//   INT2 (16-chunk tiles) loses at every token count: 42.8 against 52.1 at 4 tokens.
// With one route per expert, streams of 16 chunks take it too (kSmemRingMinChunksOneRoute; H100,
// QMOE_DECODE_RING=2 against the rule at 48, bench/results/2026-12-06-h100-ring-one-route.md):
// DeepSeek-V3's FC2 at one token (K 2048 fp8, 4 warps on a tile: 16 chunks each), the layer
// 172.7 -> 163.8 us; Mixtral-8x7B's FC1 (K 4096 int4, 16 chunks each) 86.4 -> 84.4. The
// one-token streams of 8 chunks (qwen3-30b-a3b's FC1) keep the register ring (26.3 against 29.3).
// So: geo with the weight ring in shared memory where this rule or a.ring (2) asks for it, its
// rows per pass cut to fit; geo as it is otherwise.
DecodeGeometry choose_ring(const DecodeFcArgs& a, const DecodeGeometry& geo, bool zero_points,
                           int max_routes) {
  const int sh = decode_split_shift(geo.tpb);  // split K: a warp streams its part of one tile
  const int64_t stream = decode_split_k(geo.tpb) ? (a.shape.chunks + (1 << sh) - 1) >> sh
                                                 : (geo.tpb / kDecodeWarps) * a.shape.chunks;
  const int64_t min_stream = max_routes == 1 ? kSmemRingMinChunksOneRoute : kSmemRingMinChunks;
  if (a.ring == 1 || (a.ring == 0 && stream < min_stream)) return geo;
  DecodeGeometry with = geo;
  with.smem_ring = true;
  const size_t cap = static_cast<size_t>(kMaxDynamicSmem);
  while (with.rows_cap > 1 && decode_smem_bytes(with, zero_points) > cap) --with.rows_cap;
  if (decode_smem_bytes(with, zero_points) > cap) return geo;
  const bool keeps_blocks =
      a.shape.chunks >= kSmemRingMinChunks ||
      blocks_per_sm(with, zero_points) >= std::min(4, blocks_per_sm(geo, zero_points));
  return a.ring == 2 || keeps_blocks ? with : geo;
}

// The launch geometry for tpb tiles per block (the request; fewer where they do not fit) and
// passes of up to max_routes rows, then the ring and the prefetch.
DecodeGeometry plan_geometry(const DecodeFcArgs& a, int max_routes, int tpb) {
  DecodeGeometry geo = geometry(a.shape);
  const bool zp = a.zero_points != nullptr;
  // Several tiles per block: a warp's ring must not span two tile ends (decode_kernel.cuh), and
  // the tiles' scales must leave room for a pass of 8 rows; otherwise one tile.
  const int ring = decode_ring(a.shape.bits);
  tpb = static_cast<int>(std::min<int64_t>(tpb, (a.shape.tiles + 3) / 4 * 4));
  if (a.shape.chunks < ring && !decode_split_k(tpb)) tpb = 1;
  while (!decode_split_k(tpb)) {
    geo.tpb = tpb;
    geo.rows_cap = std::min(max_routes, 8);
    if (decode_smem_bytes(geo, zp) <= static_cast<size_t>(kMaxDynamicSmem)) break;
    tpb = tpb > 4 ? tpb / 2 / 4 * 4 : 1;
  }
  geo.tpb = tpb;
  geo.rows_cap = 1;
  const size_t fixed = decode_smem_bytes(geo, zp);
  const int fit = 1 + static_cast<int>((kMaxDynamicSmem - fixed) / (geo.ld * 2));
  geo.rows_cap = std::min({max_routes, 8, fit});
  if (a.max_rows > 0) geo.rows_cap = std::min(geo.rows_cap, a.max_rows);
  geo = choose_ring(a, geo, zp, max_routes);
  // The L2 prefetch where streams are long (several tiles per warp): a round ahead.
  geo.prefetch = a.prefetch >= 0 ? a.prefetch : (geo.tpb >= 8 && !geo.smem_ring ? 1 : 0);
  return geo;
}

// The launch of the kind of codes the FC has, on geometry geo.
Status launch_geometry(const DecodeFcArgs& a, const DecodeGeometry& geo, size_t smem,
                       cudaStream_t stream) {
  switch (a.shape.codes) {  // the runtime kind and width to the kernel's template arguments
    case MmaCodes::kFp8:
      return launch_decode_kind<8, kFp8Codes>(a, geo, smem, stream);
    case MmaCodes::kNvFp4:
      return launch_decode_kind<4, kNvFp4Codes>(a, geo, smem, stream);
    case MmaCodes::kMxFp4:
      return launch_decode_kind<4, kMxFp4Codes>(a, geo, smem, stream);
    default:
      break;
  }
  switch (a.shape.bits) {
    case 2:
      return launch_decode_kind<2, kIntCodes>(a, geo, smem, stream);
    case 3:
      return launch_decode_kind<3, kIntCodes>(a, geo, smem, stream);
    case 4:
      return launch_decode_kind<4, kIntCodes>(a, geo, smem, stream);
    case 8:
      return launch_decode_kind<8, kIntCodes>(a, geo, smem, stream);
    default:
      return Status::invalid("decode: bits must be 2, 3, 4 or 8, got " +
                             std::to_string(a.shape.bits));
  }
}

// FC2 with the combine: the geometry of one route per block (tpb tiles, the ring the rule
// chooses), the cluster's gathered sums with it; a tile per block where that leaves fewer than
// kCombineMinBlocks blocks per multiprocessor.
DecodeGeometry combine_geometry(const DecodeFcArgs& a, int tpb) {
  DecodeGeometry g = plan_geometry(a, 1, tpb);
  g.combine = a.terms.slots;  // before the count: the gathered sums take shared memory
  if (g.tpb > 1 && blocks_per_sm(g, a.zero_points != nullptr) < kCombineMinBlocks) {
    return combine_geometry(a, 1);
  }
  return g;
}

Status check_combine_args(const DecodeFcArgs& a) {
  const CombineTerms& m = a.terms;
  if (a.fc1 || m.slots < 1 || m.slots > kCombineMaxSlots || m.tokens < 1 ||
      m.tokens * m.slots > 65535) {
    return Status::invalid("decode combine: FC2 only, terms.slots 1.." +
                           std::to_string(kCombineMaxSlots) +
                           " and terms.tokens * slots 1..65535 (the grid's rows), got slots " +
                           std::to_string(m.slots) + ", tokens " + std::to_string(m.tokens));
  }
  if (m.route_position == nullptr || m.expert_ids == nullptr || m.weights == nullptr ||
      m.out == nullptr) {
    return Status::invalid("decode combine: null route position, expert, weight map or output");
  }
  if (m.out_dtype != DType::kF32 && m.out_dtype != DType::kBF16 && m.out_dtype != DType::kF16) {
    return Status::invalid(
        std::string("decode combine: terms.out_dtype must be f32, bf16 or f16, got ") +
        dtype_name(m.out_dtype));
  }
  if (m.hidden != a.shape.n) {
    return Status::invalid("decode combine: terms.hidden must be the FC's rows (H), " +
                           std::to_string(a.shape.n) + ", got " + std::to_string(m.hidden));
  }
  return Status::ok();
}

}  // namespace

// The bound alone (the token count) sizes a pass for an expert that takes every token, which
// top-k routing over many experts makes unlikely; the rows it stages take shared memory that
// then holds fewer blocks per multiprocessor. An expert with more routes than a pass holds takes
// another pass over its weights, mostly from L2. Measured on an H200 against passes of up to 8
// rows (bench/results/2026-12-01-h200-decode-c7ff17d.md): INT2 b64 on H 2560, I 640, E 512,
// k 10 ran 16% faster at 8 tokens with 2 rows and 8% at 64 tokens with 4; qwen3-30b-a3b INT2
// 6-8% at 8 and 16 tokens, INT8 2-4%, INT4 within 1%; at 64 tokens there (4 routes per expert
// on average) fewer than 8 rows lost 20-40%, so the rule keeps 8.
int decode_rows_per_pass(int64_t tokens, int top_k, int num_shared, int64_t experts) {
  if (num_shared > 0 || experts <= 0 || tokens <= 0) return 0;
  const double want = 4.0 * static_cast<double>(tokens) * top_k / static_cast<double>(experts);
  int rows = 2;
  while (rows < 16 && 1.5 * rows < want) rows *= 2;
  return rows;
}

Status check_decode_args(const DecodeFcArgs& a) {
  if (a.dtype != DType::kBF16 && a.dtype != DType::kF16) {
    return Status::invalid(std::string("decode dtype: expected bf16 or f16, got ") +
                           dtype_name(a.dtype));
  }
  // fp8 (one global scale per expert) may have no scale tensor.
  const bool needs_scales = !(a.shape.codes == MmaCodes::kFp8 && a.shape.block_size == 0);
  if (a.packed == nullptr || (needs_scales && a.scales == nullptr) || a.x == nullptr ||
      a.out == nullptr || a.touched == nullptr || a.n_touched == nullptr || a.offsets == nullptr ||
      (a.by_token && a.permuted_route == nullptr) ||
      (a.scale_input && (a.weights == nullptr || a.permuted_route == nullptr))) {
    return Status::invalid("decode: null weight, scale, activation, output or schedule pointer");
  }
  if (a.shape.k % 16 != 0 || a.ldx % 8 != 0 || reinterpret_cast<uintptr_t>(a.x) % 16 != 0) {
    return Status::invalid(
        "decode: K must be a multiple of 16 and activation rows 16-byte aligned");
  }
  if (a.ready_target < 0 || (a.ready_target > 0 && (a.fc1 || a.ready == nullptr))) {
    return Status::invalid(
        "decode: ready_target must be 0, or positive on FC2 with the ready counters, got " +
        std::to_string(a.ready_target));
  }
  if (a.prefetch < -1 || a.prefetch > 16) {
    return Status::invalid(
        "decode: prefetch must be -1 (the launcher's choice) or 0..16 rounds, got " +
        std::to_string(a.prefetch));
  }
  if (a.ring < 0 || a.ring > 2) {
    return Status::invalid(
        "decode: ring must be 0 (the launcher's choice), 1 (registers) or 2 (shared memory), "
        "got " +
        std::to_string(a.ring));
  }
  if (a.max_groups <= 0 || a.max_groups > 65535 || a.shape.tiles <= 0 ||
      a.shape.tiles > 0x7FFFFFFF || a.shape.k > (int64_t{1} << 24)) {
    return Status::invalid("decode: max_groups must be 1..65535, tiles positive, K <= 2^24");
  }
  if (a.shape.codes == MmaCodes::kFp8) {
    const int bs = a.shape.block_size;
    if (a.shape.bits != 8 || a.shape.steps_per_chunk != 2 ||
        a.shape.fp8_mag_bit != (a.dtype == DType::kBF16 ? 4 : 7) || a.zero_points != nullptr ||
        (bs == 0 && a.global == nullptr && a.scales == nullptr) ||
        (bs != 0 && (bs < 32 || (bs & (bs - 1)) != 0)) ||
        (bs != 0 && a.scale_dtype != DType::kF32 && a.scale_dtype != DType::kF16 &&
         a.scale_dtype != DType::kBF16)) {
      return Status::invalid(
          "decode: FP8 weights must be packed for the activation dtype (mma_pack_shape's act), "
          "without zero points, with a global scale or f32 scales per row (fp8) or f32/f16/bf16 "
          "scales in blocks of a power of two >= 32 (fp8_block)");
    }
    return Status::ok();
  }
  if (a.shape.codes != MmaCodes::kInt) {
    const int want_bit = a.dtype == DType::kBF16 ? 6 : 9;
    const bool nv = a.shape.codes == MmaCodes::kNvFp4;
    if (a.shape.bits != 4 || a.shape.steps_per_chunk != 4 || a.shape.fp4_mag_bit != want_bit ||
        a.zero_points != nullptr || a.global == nullptr ||
        a.scale_dtype != (nv ? DType::kF8E4M3 : DType::kF8E8M0) ||
        a.shape.block_size != (nv ? 0 : 32) || (nv && a.shape.fp4_blocks != a.shape.chunks * 4)) {
      return Status::invalid(
          "decode: FP4 weights must be packed for the activation dtype (mma_pack_shape's act), "
          "with their 8-bit scales (e4m3 NVFP4, e8m0 MXFP4), a global scale and no zero points");
    }
  }
  const int bs = a.shape.block_size;
  if (bs != 0 && (bs < 16 || (bs & (bs - 1)) != 0 || a.shape.k % bs != 0)) {
    return Status::invalid(
        "decode: block_size must be 0 (per channel) or a power of two >= 16 dividing K, got " +
        std::to_string(bs));
  }
  return Status::ok();
}

bool decode_fits(const MmaPackShape& s, bool zero_points) {
  return decode_smem_bytes(geometry(s), zero_points) <= static_cast<size_t>(kMaxDynamicSmem);
}

bool decode_combine_fits(const MmaPackShape& s, bool zero_points, int slots) {
  if (slots < 1 || slots > kCombineMaxSlots) return false;
  DecodeGeometry g = geometry(s);  // one tile, one row, the ring in shared memory
  g.combine = slots;
  g.smem_ring = true;
  return decode_smem_bytes(g, zero_points) <= static_cast<size_t>(kMaxDynamicSmem) &&
         blocks_per_sm(g, zero_points) >= kCombineMinBlocks;
}

Status prepare_decode_kernels() {
  QMOE_RETURN_IF_ERROR((prepare_decode_kind<2, kIntCodes>()));
  QMOE_RETURN_IF_ERROR((prepare_decode_kind<3, kIntCodes>()));
  QMOE_RETURN_IF_ERROR((prepare_decode_kind<4, kIntCodes>()));
  QMOE_RETURN_IF_ERROR((prepare_decode_kind<8, kIntCodes>()));
  QMOE_RETURN_IF_ERROR((prepare_decode_kind<4, kNvFp4Codes>()));
  QMOE_RETURN_IF_ERROR((prepare_decode_kind<4, kMxFp4Codes>()));
  return prepare_decode_kind<8, kFp8Codes>();
}

Status launch_decode_fc(const DecodeFcArgs& a, int max_routes, int tiles_per_block,
                        cudaStream_t stream, int* blocks_per_expert) {
  QMOE_RETURN_IF_ERROR(check_decode_args(a));
  if (max_routes < 1 || max_routes > kDecodeMaxRoutes) {
    return Status::invalid("decode: max_routes must be 1.." + std::to_string(kDecodeMaxRoutes) +
                           ", got " + std::to_string(max_routes));
  }
  if (tiles_per_block < 0 || (tiles_per_block > 2 && tiles_per_block % 4 != 0)) {
    return Status::invalid(
        "decode: tiles_per_block must be 0 (automatic), 1, 2 or a multiple of 4, got " +
        std::to_string(tiles_per_block));
  }
  const bool zp = a.zero_points != nullptr;
  if (!decode_fits(a.shape, zp)) {
    return Status::invalid("decode: K = " + std::to_string(a.shape.k) +
                           " too large to stage one activation row in shared memory");
  }
  if (a.combine) {
    QMOE_RETURN_IF_ERROR(check_combine_args(a));
    if (!decode_combine_fits(a.shape, zp, a.terms.slots)) {
      return Status::invalid("decode combine: K = " + std::to_string(a.shape.k) + " with " +
                             std::to_string(a.terms.slots) +
                             " route slots does not fit shared memory (decode_combine_fits)");
    }
    // The pairs of the launcher's rule: every route a block.
    DecodeFcArgs pairs = a;
    pairs.max_groups = static_cast<int>(a.terms.tokens * a.terms.slots);
    const DecodeGeometry cg =
        combine_geometry(a, tiles_per_block ? tiles_per_block : auto_tiles_per_block(pairs, 1));
    return launch_geometry(a, cg, decode_smem_bytes(cg, zp), stream);
  }
  const int tpb = tiles_per_block ? tiles_per_block : auto_tiles_per_block(a, max_routes);
  DecodeGeometry geo = plan_geometry(a, max_routes, tpb);
  // Shared memory may hold fewer blocks per multiprocessor than the kernel's registers allow
  // where K is long (a staged row per route) or the scales are many per tile (FP4: one per 16 or
  // 32 K): then fewer rows per pass (down to half the mean-based choice, a.max_rows) and, where
  // the launcher chose them, 4 tiles per block rather than 8, until a.min_blocks fit.
  // Where passes cannot shrink (the mean-based choice is at least twice the rows a pass holds:
  // many routes per expert), the geometry stays: there 8 tiles per block won at 2 blocks per SM
  // (gpt-oss-20b, 32 and 64 tokens: 326 and 456 us against 364 and 527 with 4 tiles).
  const int floor_rows = std::max(2, (a.max_rows > 0 ? a.max_rows : geo.rows_cap) / 2);
  if (a.min_blocks > 0 && floor_rows < geo.rows_cap && blocks_per_sm(geo, zp) < a.min_blocks) {
    int rows = geo.rows_cap;
    while (rows > floor_rows && blocks_per_sm(geo, zp) < a.min_blocks) {
      geo = plan_geometry(a, std::min(max_routes, --rows), geo.tpb);
    }
    if (blocks_per_sm(geo, zp) < a.min_blocks && tiles_per_block == 0 && geo.tpb > 4) {
      geo = plan_geometry(a, std::min(max_routes, rows), 4);
    }
  }
  if (blocks_per_expert != nullptr) {
    *blocks_per_expert = decode_blocks_per_expert(a, geo);
  }
  return launch_geometry(a, geo, decode_smem_bytes(geo, zp), stream);
}

}  // namespace qmoe::cuda
