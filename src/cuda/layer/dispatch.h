// The CUDA backend's one dispatch table: for a prepared layer and a call's token count, which path
// runs (the decode kernel, the fused decode kernel or the generic path).
//
//   analytic default  decode/1 where the decode kernel takes both FCs and the call is inside its
//                     default window: up to kDecodeWindowTokens tokens, and past that while an
//                     expert averages at most kDecodeMaxMeanRoutes routes (tokens x slots /
//                     experts), or kDecodeMaxMeanRoutesNoDequant where the generic path reads the
//                     codes itself (the mixed-input GEMM takes every FC); for large experts only
//                     while the expected routes per touched expert stay within
//                     kDecodeMaxRoutesPerTouched (Grouped for grouped top-k routing); generic
//                     elsewhere;
//   tuned rows        from a tune file (qmoe/tuning.h), replacing the default up to their last
//                     row's max_tokens;
//   fused             one cooperative kernel for the whole call (fused_decode.h): routing, FC1,
//                     FC2 and the combine; a candidate up to the layer's fused_max_tokens;
//   forced            generic | decode/1 | fused: one choice for every call
//                     (A/B runs and the tuner): PrepareOptions::dispatch (or $QMOE_DISPATCH) at
//                     prepare, PreparedLayer::force_dispatch() later.
// A choice the call cannot take (decode past kDecodeMaxRoutes tokens or for a layer it does not
// support) falls back to the generic path, which takes every call.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "qmoe/status.h"
#include "qmoe/tuning.h"

namespace qmoe::cuda {

enum class CallPath : uint8_t { kDecode, kGeneric, kFused };

// The analytic default's decode window. The decode kernel takes calls up to kDecodeMaxRoutes
// tokens (decode_gemv.h), and the tuner and a forced choice may take it anywhere there; the
// default takes it where it won on an H200 (bench/results/2026-12-01-h200-window.md): against
// the generic path (dequantize the touched experts, grouped GEMM), qwen3-30b-a3b INT4 at 128 /
// 256 / 512 tokens (8 / 16 / 32 routes per expert) 230 / 395 / 651 us against 1028 / 1045 /
// 1075, a tie at 64 routes (1024 tokens); INT8 a tie at 32; Mixtral-8x7B INT4 1650 against 2560
// us at 16 routes per expert (64 tokens) and 3093 against 2584 at 32. So: every call of up to
// 64 tokens (as before), and larger ones while an expert averages at most 16 routes.
// Where the generic path runs the mixed-input GEMM on every FC it skips its dequantize pass, and it
// wins sooner (bench/results/2026-12-01-h200-final.md, qwen3-30b-a3b INT4, generic against
// decode/1: 375 against 228 us at 128 tokens, 8 routes per expert; 388 against 393 at 256, 16
// routes; 405 against 645 at 512): there larger calls take the decode kernel up to 8 routes per
// expert.
// Large experts (at least kDecodeLargeExpertBytes of weights each) lose the decode kernel's
// advantage as soon as a touched expert holds more than one route or so: the generic path reads
// them at 60% of the HBM ceiling and its fixed cost is small beside their bytes
// (bench/results/2026-12-02-h200-fp8-act.md, generic against decode/1): deepseek-v3 (44 MB
// experts, 8 of 256) 721 / 597 us at 8 tokens, 946 / 990 at 16, 1321 / 2156 at 64; Mixtral-8x7B
// INT4 (94 MB, 2 of 8) 164 / 89 at 1 token, 367 / 382 at 8, 414 / 1662 at 64. There the window
// ends where the expected routes per touched expert, T k / (E (1 - (1 - k / E)^T)) for uniform
// routing, pass a bound. Remeasured since the generic path's narrow tiles
// (bench/results/2026-12-04-h200-knobs-fp8-cluster.md, runs 11-12, decode/1 / generic, us):
// mixtral-8x7b INT4 246.5 / 276.4 at 4 tokens (1.46), 250.6 / 277.3 at 5 (1.64), 284.8 / 275.9
// at 6 (1.82), 370.1 / 276.5 at 7: kDecodeMaxRoutesPerTouched; deepseek-v3 602.3 / 630.1 at 8
// tokens (1.116), 680.8 / 652.5 at 9 (1.132), 848.0 / 794.6 at 12. The synthetic DeepSeek-V3
// router touches fewer experts than the uniform estimate (39-45 against 57 at 8 tokens; plain
// top-8 over the same 256 experts 57-60) and crosses at a lower estimate:
// kDecodeMaxRoutesPerTouchedGrouped. Not the groups' doing (with independent tokens grouped
// top-k gives each expert the marginal k / E, as plain top-k does): its router bias, 0.1 N(0, 1)
// on sigmoid scores, makes a few experts every token's pick. A trained load-balancing bias
// routes closer to uniform; a tune file measures such a layer.
// Smaller experts (qwen3-30b-a3b's 2.5 MB) keep the window above.
// Where every FC has the mixed-input GEMM's narrow tile (256 x 32 rows since
// 2026-12-02-h200-mid-tile.md) the generic path wins sooner still, and the 64-token floor goes:
// qwen3-30b-a3b, decode/1 against generic, INT4 145.0 / 183.1 us at 64 tokens (4 routes per
// expert), 161.5 / 184.1 at 80 (5), 192.6 / 185.5 at 96 (6), 220.5 / 186.6 at 128; INT8 175.8 /
// 177.1 at 24 (1.5), 193.1 / 192.8 at 32 (2), 239.7 / 207.9 at 48 (3), 235.3 / 212.5 at 64. With
// FC1's activation in the narrow tile's epilogue (bench/results/2026-12-04-h200-act-epilogue.md,
// run 5) INT8 takes 147.2 / 148.9 us at 16 tokens (1), 175.8 / 173.1 at 24, 193.3 / 187.2 at 32;
// INT4 157.9 / 178.9 at 80 (5), 187.9 / 180.5 at 96. So the decode kernel keeps such layers up
// to kDecodeMaxMeanRoutesNarrow4 routes per expert for codes of up to 4 bits,
// kDecodeMaxMeanRoutesNarrow8 for 8-bit codes. Measured again on an H100 after the generic
// path's chain of kernels changed (bench/results/2026-12-07-h100-pdl-and-window.md, section 2,
// decode/1 / generic): INT4 160.2 / 167.2 at 80 tokens (5), 183.1 / 167.9 at 88 (5.5), so 5
// stays (qwen3.6-35b-a3b, E 256: 214.8 / 217.5 at 4, 225.8 / 219.9 at 5, 2.8% lost there);
// INT8 197.4 / 210.5 at 24 (1.5), 209.7 / 224.2 at 32 (2): 2 (past 32 tokens not measured there).
// The zero-point kinds have the narrow tile too (bench/results/2026-12-05-h200-zero-tiles.md,
// run 2, decode/1 / generic, us): qwen3-30b-a3b INT4 with zero points 149.3 / 230.8 at 48 tokens
// (3 routes per expert), 162.2 / 231.7 at 64, 178.4 / 229.4 at 80, 208.6 / 229.2 at 96, 244.8 /
// 230.7 at 128 (8), 275.9 / 234.7 at 160; INT8 with zero points 91.5 / 128.1 at 8 tokens, 128.6 /
// 169.3 at 16, 182.2 / 209.5 at 24, 177.4 / 217.9 at 32, 221.0 / 230.0 at 48, 211.7 / 233.8 at
// 64 (4), and 322.4 us at 128 where the generic path takes about 243 at 256 (run 1). Their
// decode kernels cost more per route than the symmetric kinds' and their GEMMs convert in f32,
// so the crossings lie later: about 7 routes per expert (INT4, interpolated 7.1) and 5 (INT8,
// 4.9), kDecodeMaxMeanRoutesZero4 and kDecodeMaxMeanRoutesZero8. On an H100 after the chain's
// change (the same file as above, section 2) INT4 with zero points 207.8 / 230.7 at 112 (7),
// 221.0 / 230.5 at 128 (8), 238.6 / 230.3 at 144 (9): 8.
// MXFP4 layers whose every FC runs the narrow tile on its exact e4m3 copy (the copy holds twice
// the decode path's bytes, but the MXFP4 decode kernel is bound by its conversion) cross over by
// expert size (bench/results/2026-12-04-h200-mxfp4-e4m3.md, runs 1, 2 and 6, decode/1 against
// generic, bf16): gpt-oss-20b (E 32, top 4, 13.2 MB experts) 259.2 / 281.2 us at 24 tokens (3
// routes per expert), 317.9 / 280.8 at 28 (3.5), 324.5 / 281.6 at 32, 454.9 / 287.0 at 64;
// qwen3.6-35b-a3b in MXFP4 (E 256, top 8, 1.7 MB experts) 216.2 / 281.7 at 64 tokens (2), 305.4 /
// 311.9 at 192 (6), 359.4 / 315.9 at 256 (8); f16 crosses at the same counts (259.4 / 284.2 and
// 317.6 / 284.3 at 24 / 28 tokens; 304.5 / 313.3 and 360.8 / 315.1 at 192 / 256). So the decode
// kernel keeps them up to
// kDecodeMaxMeanRoutesE4m3Copy routes per expert, kDecodeMaxMeanRoutesE4m3CopyLarge for experts
// of at least kE4m3CopyLargeExpertBytes, with no token floor.
// With FP8 activations (act_quant) the same layers' generic path runs the FP8 GEMM on a 128-wide
// e4m3 copy, faster than the bf16 one, and the small experts' window ends sooner
// (bench/results/2026-12-04-h200-mxfp4-fp8.md, run 4, decode/1 against generic): qwen3.6 MXFP4
// 259.7 / 271.6 us at 128 tokens (4 routes per expert), 303.4 / 280.5 at 192 (6); gpt-oss-20b
// 245.4 / 248.4 at 20 tokens (2.5), 257.9 / 248.4 at 24 (3), 317.4 / 255.8 at 28. So
// kDecodeMaxMeanRoutesE4m3Fp8 routes per expert for small experts, the large ones' bound as
// above (its 4% at 24 tokens of gpt-oss-20b is within the window edge's spread).
constexpr int64_t kDecodeWindowTokens = 64;
constexpr int64_t kDecodeMaxMeanRoutes = 16;
constexpr int64_t kDecodeMaxMeanRoutesNoDequant = 8;
constexpr int64_t kDecodeMaxMeanRoutesNarrow4 = 5;
constexpr int64_t kDecodeMaxMeanRoutesNarrow8 = 2;
constexpr int64_t kDecodeMaxMeanRoutesZero4 = 8;
constexpr int64_t kDecodeMaxMeanRoutesZero8 = 4;
constexpr int64_t kDecodeMaxMeanRoutesE4m3Copy = 6;
constexpr int64_t kDecodeMaxMeanRoutesE4m3CopyLarge = 3;
constexpr int64_t kDecodeMaxMeanRoutesE4m3Fp8 = 4;
constexpr int64_t kE4m3CopyLargeExpertBytes = int64_t{8} << 20;
constexpr int64_t kDecodeLargeExpertBytes = int64_t{16} << 20;
constexpr double kDecodeMaxRoutesPerTouched = 1.7;
constexpr double kDecodeMaxRoutesPerTouchedGrouped = 1.12;

// The mixed-input GEMM's automatic tile choice (PrepareOptions::mixed_tile = 0, cutlass_mixed.h's
// tiles, named by their N) takes the narrow tile while a call averages at most kMixedNarrowRoutes
// routes per expert, the middle one up to kMixedMidRoutes, the 128-row one (256 x 128 where the
// kind has it) past that. Measured on qwen3-30b-a3b INT4 (E 128, top 8), generic path, tiles
// forced (bench/results/2026-12-02-h200-mid-tile.md), 32 / 64 / 128 rows: 190.6 / - / - us at 12
// routes per expert, 194.8 / - / 339.6 at 16, 221.5 / 232.7 / 342.9 at 24, 276.2 / 242.8 / 347.4
// at 32, - / 261.7 / 352.0 at 48, - / 353.4 / 367.9 at 64. A 128 x 256 tile (each weight tile
// converted once for 256 rows) lost to the 256 x 128 one from 128 routes per expert on
// (bench/results/2026-12-03-h200-fused-ring.md, 256 / 128 rows): 601.9 / 500.0 us at 128 routes,
// 658.1 / 672.1 at 192, 922.5 / 857.5 at 256, 1693.0 / 1565.5 at 512; mixtral-8x7b INT4 1676.5 /
// 1396.5 us at 256 routes, 4984 / 4983 at 1024. It was deleted.
// kE4m3 has the middle tile too (bench/results/2026-12-04-h200-mxfp4-e4m3.md, run 4, middle /
// 128 rows): on MXFP4's e4m3 copy it wins to 48 routes per expert and loses at 64 (gpt-oss-20b
// 338.1 / 409.8 us at 32 routes, 356.0 / 422.8 at 48, 499.6 / 434.4 at 64, 644.3 / 471.9 at 96;
// qwen3.6-35b-a3b 412.4 / 486.9 at 32, 588.4 / 542.4 at 64). On fp8
// (deepseek-v3 fp8_block, whose grouped routing puts about twice the mean on each touched
// expert) it lost at 32 and 64 (3265.5 / 3023.7, 5401.2 / 4783.1): fp8 FCs never take it
// (mid_routes 0).
// Since the 128-row tile's epilogue and activation changes, qwen3-30b-a3b INT4 leaves the middle
// tile at 48 routes per expert too (bench/results/2026-12-04-h200-knobs-fp8-cluster.md, run 8,
// the tuner's times, 32 / 64 / 128 rows): 353.9 / 260.7 / 312.1 us at 48 routes, 441.3 / 353.9 /
// 333.4 at 64; mixtral-8x7b INT4 (E 8, top 2; run 6) 612.3 / 400.3 / 500.0 at 48, 731.2 / 537.7
// / 501.7 at 56; gpt-oss-20b 418.0 / 429.1 (64 / 128 rows) at 56, 502.7 / 435.3 at 64. So every
// kind that has the middle tile takes it to kMixedMidRoutes = 48.
// Layers of fewer than kMixedFewExperts experts (a few large ones) leave the narrow tile sooner:
// mixtral-8x7b (run 6) 323.0 / 380.9 / 503.6 at 20 routes per expert, 437.1 / 382.4 / 505.4 at
// 22, 438.5 / 384.2 / 500.6 at 24 (qwen3-30b-a3b's narrow tile still wins at 24, 218.4 / 229.7 /
// 284.6, run 8): kMixedNarrowRoutesFew.
constexpr int64_t kMixedNarrowRoutes = 24;
constexpr int64_t kMixedMidRoutes = 48;
constexpr int64_t kMixedFewExperts = 32;
constexpr int64_t kMixedNarrowRoutesFew = 20;

// The wide tile (144 rows, cutlass_mixed_wide.cuh) against the 128-row one where the bounds
// above give 128: a group of r rows runs ceil(r / N) tiles of N rows, so the call's wgmma and
// conversions cover about N E[ceil(r / N)] rows per expert. mixed_padded_rows estimates that with
// r normal at the multinomial's mean and variance (routes / E, routes (1 / E)(1 - 1 / E)), and the
// wide tile is taken where it runs at least kMixedWideMinGain fewer rows: from about 120 routes
// per expert up to 144 (the 128-row tile spills a tail into a second tile) and around 256
// (qwen3-30b-a3b at 4096 tokens: 256 +- 16 rows, 318 against 291). Measured on an H100
// (bench/results/2026-12-07-h100-wide-tile.md): 4-10% faster at 128 and 256 rows per expert;
// at 384 (3.1% fewer rows) INT4 lost 1.4% and INT4 with zero points won 1.4%, hence the margin.
double mixed_padded_rows(int64_t routes, int64_t experts, int tile);
constexpr double kMixedWideMinGain = 0.05;

// The tile rows that choice names for a call of `routes` routes over a layer of `experts` experts
// (all E: a shard's held experts share the whole layer's average), the middle tile up to
// mid_routes routes per expert (the FC's: kMixedMidRoutes, or 0 for none), then 128 or 144 rows
// (above); the caller falls back to 128 rows where the kind lacks the tile named.
int mixed_tile_for(int64_t routes, int64_t experts, int64_t mid_routes = kMixedMidRoutes);

// decode/1 names the decode kernel (one mma column group of 8 routes per pass); its two-group form,
// decode/2 (16 routes per pass), lost to it at every count measured on an H200 (16 to 64 routes
// per expert, 26-37%; docs/cuda-backend.md) and was deleted, as was the CUDA-core form decode/cc.
// A generic choice may name the mixed-input GEMM's tile (its N, kMixedTiles), which its mixed-input
// FCs then take (an FC whose kind lacks it takes its 128-row tile); 0 leaves it to the layer
// (PrepareOptions::mixed_tile, else mixed_tile_for). The tile bounds above come from a few
// models; `qmoe bench --tune` times the tiles per layer and token count, and a tune file's rows
// name them ("generic/64").
struct DispatchChoice {
  CallPath path = CallPath::kGeneric;
  int tile = 0;  // generic only: 0 (the layer's choice) or one of kMixedTiles

  bool operator==(const DispatchChoice& o) const { return path == o.path && tile == o.tile; }
};

constexpr int kMixedTiles[] = {32, 64, 128, 144};

// "generic", "decode/1", "fused", "generic/32", "generic/64", "generic/128", "generic/144".
std::string choice_name(const DispatchChoice& c);
bool parse_choice(const std::string& name, DispatchChoice* out);

// Every choice worth timing for a call of `tokens` tokens (the tuner's candidates).
// fused_max_tokens: the most tokens the fused kernel takes on this layer (0: none).
// tiles: the mixed-input tiles the layer's generic path can choose between (layer_tiles());
// empty: one generic choice, "generic"; else one per tile in its place.
std::vector<DispatchChoice> dispatch_candidates(bool decode_supported, int64_t tokens,
                                                int64_t fused_max_tokens = 0,
                                                const std::vector<int>& tiles = {});
// Every choice some token count's candidates hold: what a layer may be forced onto ("generic"
// among them).
std::vector<DispatchChoice> layer_choices(bool decode_supported, int64_t fused_max_tokens = 0,
                                          const std::vector<int>& tiles = {});

// How the generic path runs a layer's FCs: it sets where the analytic default's window ends.
enum class GenericKind : uint8_t {
  kDequantize,  // a dequantize pass, then the GEMMs: kDecodeWindowTokens, kDecodeMaxMeanRoutes
  kReadsCodes,  // no dequantize pass (the mixed-input GEMM on every FC, or FP8 activations):
                // kDecodeWindowTokens, kDecodeMaxMeanRoutesNoDequant
  kNarrow4,     // the mixed-input GEMM with its narrow tile on every FC, kInt4 codes:
                // kDecodeMaxMeanRoutesNarrow4, no token floor
  kNarrow8,     // the same with kInt8 codes: kDecodeMaxMeanRoutesNarrow8
  kZero4,       // the narrow tile on every FC, some with zero points (kInt4Zero, kInt8Zero), codes
  kZero8,       // of up to 4 or of 8 bits: kDecodeMaxMeanRoutesZero4 / Zero8, no token floor
  kE4m3Copy,    // the narrow tile on every FC through MXFP4's e4m3 copy:
                // kDecodeMaxMeanRoutesE4m3Copy(Large), no token floor
  kE4m3Fp8,     // MXFP4 with FP8 activations (the FP8 GEMM on its 128-wide e4m3 copy):
                // kDecodeMaxMeanRoutesE4m3Fp8 (E4m3CopyLarge for large experts), no floor
};

class DispatchTable {
 public:
  DispatchTable() = default;
  // generic: how the generic path runs the layer (GenericKind).
  // expert_bytes: one expert's weights (expert_bytes(spec)), for the large-expert window;
  // grouped: the layer routes by grouped top-k (its bound there).
  DispatchTable(bool decode_supported, int slots, int64_t experts,
                GenericKind generic = GenericKind::kDequantize, int64_t fused_max_tokens = 0,
                int64_t expert_bytes = 0, bool grouped = false)
      : decode_supported_(decode_supported),
        slots_(slots),
        experts_(experts),
        generic_(generic),
        fused_max_tokens_(fused_max_tokens),
        expert_bytes_(expert_bytes),
        grouped_(grouped) {}

  // Tuned rows replace the analytic default up to their last max_tokens; an unknown choice name
  // is an error naming it.
  Status apply_tuned(const std::vector<TunedRow>& rows);

  // One choice for every call (nullptr: the table again). Kept by apply_tuned.
  void force(const DispatchChoice* c) {
    forced_ = c != nullptr;
    if (c) forced_choice_ = *c;
  }
  const DispatchChoice* forced() const { return forced_ ? &forced_choice_ : nullptr; }

  // The table's choice, then the one a call takes (the forced choice where there is one, or
  // the generic path where the call cannot take it).
  DispatchChoice table_choice(int64_t tokens) const;
  DispatchChoice choose(int64_t tokens) const;

  bool decode_supported() const { return decode_supported_; }

 private:
  DispatchChoice analytic(int64_t tokens) const;
  // What a call of `tokens` can run: decode only inside its window.
  DispatchChoice feasible(DispatchChoice c, int64_t tokens) const;

  bool decode_supported_ = false;
  int slots_ = 1;
  int64_t experts_ = 1;
  GenericKind generic_ = GenericKind::kDequantize;
  int64_t fused_max_tokens_ = 0;
  int64_t expert_bytes_ = 0;
  bool grouped_ = false;
  std::vector<std::pair<int64_t, DispatchChoice>> tuned_;  // (max_tokens, choice), increasing
  bool forced_ = false;
  DispatchChoice forced_choice_;
};

}  // namespace qmoe::cuda
