// qmoe: backends. prepare_layer() validates a layer once and prepacks its weights for a backend;
// PreparedLayer::run() then runs calls on a caller-provided workspace of workspace_size() bytes.
// The CPU backend is exact (fp32 arithmetic on exactly dequantized weights) and multi-threaded;
// reference_forward() is the fp64 oracle that every test compares against.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "qmoe/layer.h"
#include "qmoe/status.h"

namespace qmoe {

enum class BackendKind : uint8_t { kCpu, kCuda };
const char* backend_name(BackendKind b);
bool backend_available(BackendKind b);  // kCuda: built with CUDA and a device is present

// CUDA: the decode kernel's settings, for A/B runs. Every value gives the same bits (but see
// combine); the defaults are the measured choices (docs/cuda-backend.md). Each field's environment
// variable, when set, applies where the field holds its default (resolve_prepare_options).
struct DecodeOptions {
  // Activation rows one pass stages: -1 decode_rows_per_pass() (about four times the mean routes
  // per expert, 2 to 16), 0 as many as the call's tokens and shared memory allow, n > 0 at most n.
  // QMOE_DECODE_ROWS.
  int rows = -1;
  // 16-row tiles per block: 0 the launcher chooses, 1 or 2 (the block's warps split each tile's
  // K), or a multiple of 4 (a warp per tile; a request the launcher cannot honour falls back to
  // fewer). QMOE_DECODE_TPB.
  int tiles_per_block = 0;
  // Where the weight ring lives: 0 the launcher chooses, 1 registers, 2 shared memory.
  // QMOE_DECODE_RING.
  int ring = 0;
  // Rounds of the register ring prefetched into L2 ahead of the loads: -1 the launcher chooses,
  // 0 none, 1..16. QMOE_DECODE_PREFETCH.
  int prefetch = -1;
  // Blocks per multiprocessor the launcher keeps room for in shared memory (trading rows per pass
  // and its own choice of tiles per block): 0 no such trade, 1..32. QMOE_DECODE_MIN_BLOCKS.
  int min_blocks = 4;
  // Decode calls of up to this many tokens run FC2 and the combine in one kernel (FC2's blocks of
  // a token's routes in a thread-block cluster whose first block adds them; no finalize kernel):
  // -1 the measured default (two tokens), 0 never, 1..64. The same bits as FC2 with the same
  // tiles per block and the finalize kernel; the launcher's own tile choice may differ past one
  // token (FC2 then counts an expert's routes). QMOE_DECODE_COMBINE.
  int combine = -1;
};

struct PrepareOptions {
  int num_threads = 0;  // CPU: worker threads, 0 = hardware concurrency
  int device = 0;       // CUDA: device ordinal
  // CUDA: the most bytes of dequantized weights the generic path holds at once (its experts run
  // in waves beyond that); 0 = 1 GiB. Part of workspace_size(), see docs/cuda-backend.md.
  size_t max_dequant_bytes = 0;
  // A tune file (qmoe/tuning.h) whose rows for this layer and device replace the backend's
  // default dispatch; empty: $QMOE_TUNE_FILE when set, else the default.
  std::string tune_file;
  // CUDA: the generic path's grouped GEMM for bf16/f16 layers: "cutlass" (INT4, INT8 (with or
  // without zero points), fp8 and fp8_block FCs with blocks of 64, 128, 256... or per channel, and
  // MXFP4 FCs through an exact e4m3 copy (a second copy of their codes, 1 byte a weight), on
  // CUTLASS's SM90 mixed-input kernel, which reads the codes directly; the rest dequantized, then
  // CUTLASS's SM90 TMA + wgmma kernel where the shapes allow it, else the mma.sync kernel), "cutlass-dequant" (every FC dequantized, then as
  // "cutlass") or "mma" (dequantized, then the mma.sync kernel always). The last two are for A/B
  // runs. Empty: $QMOE_GEMM when set, else "cutlass". Read at prepare; another value is an error
  // naming it.
  std::string gemm;
  // CUDA: one path for every call instead of the dispatch table (A/B runs): "generic",
  // "decode/1", "fused", or "generic/32|64|128" (the generic path with that mixed-input tile,
  // qmoe/tuning.h); a call that path cannot take
  // (decode on a layer without it or past its largest call, fused past its window) runs the next
  // path that can (fused -> decode/1 -> generic). Empty:
  // $QMOE_DISPATCH when set (or the older QMOE_CUDA_PATH=generic), else the table.
  // PreparedLayer::force_dispatch() changes it later.
  std::string dispatch;
  // CUDA: launch kernels with programmatic dependent launch (each one's prologue overlaps the
  // previous one's tail), except on generic calls whose routing writes the GEMMs' group arrays
  // (they measured faster without it; docs/cuda-backend.md). false is for A/B runs; QMOE_PDL=0
  // sets it where it is true.
  bool pdl = true;
  // CUDA: bf16 INT4 / INT8 layers with a gated activation of FC1's own rows and no FC1 bias
  // apply the activation in the mixed-input GEMM's FC1 epilogue on calls that take its narrow
  // tile (FC1's fp32 rows and the activation kernel go; the same bits). false keeps the
  // activation kernel at every call (A/B runs); QMOE_EPILOGUE_ACT=0 sets it where it is true.
  bool epilogue_act = true;
  DecodeOptions decode;  // CUDA: the decode kernel's A/B settings
  // CUDA: the fused kernel runs on at most this many CTAs (tests of its grid independence); 0 as
  // many as the device holds. QMOE_FUSED_GRID.
  int fused_grid_ctas = 0;
  // CUDA: the mixed-input GEMM's tile rows: 0 chooses per call by the call's average routes per
  // expert (the dispatch table's thresholds: 32, 64, then 128 or 144 rows, where the kind has
  // them), 32, 64, 128 or 144 take that tile wherever it exists (A/B runs; the FP8 GEMM of
  // act_quant "fp8_e4m3" has 64 and 128). QMOE_MIXED_TILE.
  int mixed_tile = 0;
  // CUDA: the activations of the grouped GEMM path. "none" keeps ORT's numerics (bf16/f16
  // activations times the dequantized weights); "fp8_e4m3" quantizes each route's FC1 and FC2
  // input rows to e4m3 with a scale per 128 columns and runs both FCs on FP8 tensor cores
  // (fp8 and fp8_block weights with 128 x 128 blocks and K a multiple of 128; MXFP4 weights
  // through an exact e4m3 copy, any K the format takes). An explicit
  // opt-in with its own error budget (docs/cuda-backend.md); the decode and fused paths keep
  // bf16/f16 activations. Empty: $QMOE_ACT_QUANT when set, else "none". The CPU backend takes
  // "none" only.
  std::string act_quant;
};

// The error budget of act_quant = "fp8_e4m3" on the calls it applies to: the relative norm error
// against the fp64 oracle (two e4m3 roundings of at most 2^-4 each, docs/cuda-backend.md).
constexpr double kFp8ActErrorBudget = 6e-2;

// The one place the environment enters the options: `options` with each QMOE_* variable that is
// set (and not empty) applied where its field holds the default (a caller's choice wins), then
// every field checked. An invalid value is an error naming the variable or field and what it
// expects. The CUDA backend's prepare_layer() calls it once; no setting is read on the run path.
//   QMOE_TUNE_FILE -> tune_file         QMOE_DECODE_ROWS       -> decode.rows
//   QMOE_GEMM      -> gemm              QMOE_DECODE_TPB        -> decode.tiles_per_block
//   QMOE_DISPATCH  -> dispatch          QMOE_DECODE_RING       -> decode.ring
//   (QMOE_CUDA_PATH=generic, older)     QMOE_DECODE_PREFETCH   -> decode.prefetch
//   QMOE_PDL       -> pdl (0 or 1)      QMOE_DECODE_MIN_BLOCKS -> decode.min_blocks
//                                       QMOE_DECODE_COMBINE    -> decode.combine
//   QMOE_FUSED_GRID -> fused_grid_ctas  QMOE_MIXED_TILE        -> mixed_tile
//   QMOE_ACT_QUANT -> act_quant         QMOE_EPILOGUE_ACT      -> epilogue_act (0 or 1)
Status resolve_prepare_options(const PrepareOptions& options, PrepareOptions* out);

// Wall-clock time of each stage of the last run, in microseconds (host clock on the CPU backend).
// Where one kernel runs the whole call (the CUDA backend's "fused" dispatch choice), the stages
// come from its in-kernel stamps and combine_us is its grid barrier's wait and combine.
struct RunProfile {
  double route_us = 0, fc1_us = 0, fc2_us = 0, combine_us = 0;
  // The fused kernel, or FC2 with the combine, did the combine (no finalize kernel ran).
  bool combine_fused = false;
  double total_us() const { return route_us + fc1_us + fc2_us + combine_us; }
};

// Threads. A prepared layer is immutable after prepare_layer() except where marked below, so
//   - run(), workspace_size(), spec(), backend(), dispatch_choice() and dispatch_candidates() may
//     be called from several threads at once on one layer, each run() with its own workspace and
//     output (and, on the CUDA backend, typically its own stream). Every call then gives the bytes
//     it gives alone. Calls that share a workspace must be ordered by the caller (on the GPU: one
//     stream, or events between the streams), as must calls whose outputs overlap.
//   - run() with a RunProfile: allowed concurrently too; the CUDA backend's profile events belong
//     to the layer, so such calls take turns (a mutex) and each waits for its own run.
//   - take_deferred_error() may be called from any thread, concurrently with run() and with
//     itself; the error record is the layer's, shared by every call on every stream, so a take
//     reports what any call recorded since the previous take and cannot say which call it was.
//     No error is lost or reported twice (errors recorded between two takes come as one report).
//     See take_deferred_error() for what it waits on.
//   - apply_tune_file() and force_dispatch() change the dispatch: the caller must not run them
//     concurrently with any other call on the same layer (serialize them, e.g. do them before
//     sharing the layer).
//   - destruction: after every call has returned and, on the GPU, its work has completed.
// The CPU backend's worker pool serves one call at a time; a call that finds it busy runs on its
// own thread alone (same bytes, less parallelism). Settings are read once, at prepare
// (resolve_prepare_options); the environment is not read on the run path.
class PreparedLayer {
 public:
  virtual ~PreparedLayer() = default;
  virtual BackendKind backend() const = 0;
  virtual const LayerSpec& spec() const = 0;
  // Exact bytes run() needs for calls of up to max_tokens tokens (a documented formula per
  // backend), monotone in max_tokens; 0 for max_tokens <= 0.
  virtual size_t workspace_size(int64_t max_tokens) const = 0;
  // Runs one call. `workspace` holds at least workspace_size(T) bytes, 64-byte aligned (256 on the
  // CUDA backend); its contents on entry do not matter. Never allocates; `profile`, when given,
  // receives per-stage times.
  // Zero tokens (input [0, H], [B, 0, H] or [0, S, H], router_probs [0, E], output of the
  // input's shape) is a valid call: it returns ok, reads and writes nothing and launches nothing
  // (a captured graph gets no node). Its empty tensors may have null data pointers, its workspace
  // may be null (workspace_size(0) = 0), and its pointers are not checked for being device memory;
  // a profile receives zeros.
  // CUDA backend: `in`, `out` and `workspace` are device memory and `stream` is a cudaStream_t
  // (nullptr = the legacy default stream). The call only enqueues work on that stream: it never
  // synchronizes with the host (except with a profile, which waits for its events) and may be
  // captured in a CUDA graph. The CPU backend ignores `stream`.
  virtual Status run(const RunInputs& in, const MutableTensorView& out, void* workspace,
                     size_t workspace_bytes, void* stream, RunProfile* profile = nullptr) = 0;
  // Errors an asynchronous backend found in inputs after run() had returned: non-finite router
  // logits, router weights or activations (the affected tokens' outputs are NaN). Returns and
  // clears them. Always ok on the CPU, which rejects such inputs in run() itself.
  // CUDA: waits for the whole device (cudaDeviceSynchronize: calls on every stream, the layer's
  // and others' work), so it must not be called while any thread captures a graph in
  // cudaStreamCaptureModeGlobal (the default), nor from a capturing thread. The record is taken
  // with atomic exchanges, so an error that a call on another stream records meanwhile is
  // reported by this take or the next one, never lost; its "first at token" is then a hint.
  virtual Status take_deferred_error() { return Status::ok(); }
  // The kernel path a call of `tokens` tokens takes now (qmoe/tuning.h), and every path it could
  // take (what a tuner times). Empty on backends with one path (the CPU).
  virtual std::string dispatch_choice(int64_t tokens) const { return ""; }
  // Replaces the dispatch table with the default plus the rows of `tune_file` for this layer and
  // device (as PrepareOptions::tune_file does at prepare; empty path or no rows: the default).
  // On error the table is unchanged. A no-op on backends with one path.
  virtual Status apply_tune_file(const std::string& tune_file) { return Status::ok(); }
  virtual std::vector<std::string> dispatch_candidates(int64_t tokens) const { return {}; }
  // Forces every later call onto `choice`, one of the names dispatch_candidates() gives for some
  // token count on this layer (what a tuner times), as PrepareOptions::dispatch does at prepare;
  // "" returns to the dispatch table. A call the choice cannot take (decode past its largest
  // call) runs the generic path. Another name is an error naming it and the layer's choices; the
  // dispatch is then unchanged. Backends with one path accept "" only.
  virtual Status force_dispatch(const std::string& choice);
};

// Validates (check_layer) and prepares. The weights' memory must outlive the layer.
Status prepare_layer(BackendKind backend, const LayerSpec& spec, const LayerWeights& weights,
                     const PrepareOptions& options, std::unique_ptr<PreparedLayer>* out);

// Convenience for callers without their own workspace: allocates it and runs.
Status run_layer(PreparedLayer& layer, const RunInputs& in, const MutableTensorView& out,
                 RunProfile* profile = nullptr);

// The fp64 oracle: routing as route() does it (the exact, shared fp32 routing), everything after it
// in double on weights dequantized in double. out receives [T, H] doubles.
Status reference_forward(const LayerSpec& spec, const LayerWeights& weights, const RunInputs& in,
                         std::vector<double>* out);

// ||a - b|| / ||b|| over n values (0 when both are zero; +inf when a holds NaN).
double relative_norm_error(const double* a, const double* b, size_t n);

}  // namespace qmoe
