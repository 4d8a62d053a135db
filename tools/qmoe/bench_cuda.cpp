// `qmoe bench` on the CUDA backend: graph replays (or eager calls) timed with one pair of events
// each, an optional L2 flush before each, and the device's read ceiling. Compiled only in builds
// with CUDA.
#ifdef QMOE_WITH_CUDA

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bench.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/device_buffer.h"
#include "device_call.h"
#if defined(QMOE_STAMPS)
#include <cstdio>

#include "cuda/common/stamps.h"
#endif

namespace qmoe::cli {

namespace {

using cuda::DeviceBuffer;

class Stream {
 public:
  Stream() = default;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream() {
    if (s_) cudaStreamDestroy(s_);
  }
  // Non-blocking: nothing on the legacy default stream serializes with the timed work, and the
  // stream can be captured.
  Status create() {
    QMOE_CUDA_TRY(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking));
    return Status::ok();
  }
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

// One (start, stop) pair per timed call, all recorded before the host reads any, so consecutive
// calls are not separated by host synchronizations.
class EventPairs {
 public:
  EventPairs() = default;
  EventPairs(const EventPairs&) = delete;
  EventPairs& operator=(const EventPairs&) = delete;
  ~EventPairs() {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }
  Status create(int pairs) {
    events_.reserve(2 * static_cast<size_t>(pairs));
    for (int i = 0; i < 2 * pairs; ++i) {
      cudaEvent_t e = nullptr;
      QMOE_CUDA_TRY(cudaEventCreate(&e));
      events_.push_back(e);
    }
    return Status::ok();
  }
  cudaEvent_t start(int i) const { return events_[2 * static_cast<size_t>(i)]; }
  cudaEvent_t stop(int i) const { return events_[2 * static_cast<size_t>(i) + 1]; }
  // Microseconds between each pair's events (after they have completed).
  Status elapsed_us(int pairs, std::vector<double>* us) const {
    us->clear();
    for (int i = 0; i < pairs; ++i) {
      float ms = 0;
      QMOE_CUDA_TRY(cudaEventElapsedTime(&ms, start(i), stop(i)));
      us->push_back(1000.0 * ms);
    }
    return Status::ok();
  }

 private:
  std::vector<cudaEvent_t> events_;
};

class Graph {
 public:
  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  ~Graph() {
    if (exec_) cudaGraphExecDestroy(exec_);
    if (graph_) cudaGraphDestroy(graph_);
  }
  // Captures one call of the layer on `stream`. A failing call still ends the capture, so the
  // stream is usable (and destroyable) afterwards.
  Status capture(PreparedLayer& layer, const RunInputs& in, const MutableTensorView& out, void* ws,
                 size_t ws_bytes, cudaStream_t stream) {
    QMOE_CUDA_TRY(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    const Status run = layer.run(in, out, ws, ws_bytes, stream, nullptr);
    const cudaError_t end = cudaStreamEndCapture(stream, &graph_);
    QMOE_RETURN_IF_ERROR(run);
    QMOE_RETURN_IF_ERROR(cuda::cuda_status(end, "cudaStreamEndCapture"));
    QMOE_CUDA_TRY(cudaGraphInstantiate(&exec_, graph_, 0));
    QMOE_CUDA_TRY(cudaGraphUpload(exec_, stream));
    return Status::ok();
  }
  cudaGraphExec_t exec() const { return exec_; }

 private:
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

Status l2_bytes(int* bytes) {
  int device = 0;
  QMOE_CUDA_TRY(cudaGetDevice(&device));
  QMOE_CUDA_TRY(cudaDeviceGetAttribute(bytes, cudaDevAttrL2CacheSize, device));
  return Status::ok();
}

#if defined(QMOE_STAMPS)
// The decode chain's timeline (a measurement build, stamps.cuh), on stderr: per kernel, us from
// the routing kernel's first block past its wait to the kernel's first block entering, its first
// and last blocks past their waits, and its last block's end; medians over the calls since the
// last take (each kernel ran once per call, or its line is left out). The FC lines are the int4
// decode kernel's where it ran, else the FP8 one's.
using StampRows = std::vector<std::vector<unsigned long long>>;
bool take_stamps(StampRows* routing, StampRows* decode, StampRows* finalize) {
  StampRows fp8;
  if (!cuda::stamps_take_routing(routing) || !cuda::stamps_take_decode4(decode) ||
      !cuda::stamps_take_decode_fp8(&fp8) || !cuda::stamps_take_finalize(finalize)) {
    return false;
  }
  if (decode->empty() || (*decode)[0].empty()) *decode = std::move(fp8);
  return true;
}
void print_stamps() {
  StampRows routing, decode, finalize;
  if (!take_stamps(&routing, &decode, &finalize)) {
    std::fprintf(stderr, "stamps: CUDA error reading them\n");
    return;
  }
  constexpr int kF = cuda::stamps::kStampFields;
  const size_t calls = routing[0].size() / kF;
  if (calls == 0) return;
  auto median = [](const std::vector<double>& v) { return percentile(v, 0.5); };
  std::string line =
      "stamps (us from the routing's wait, median of " + std::to_string(calls) + " calls):";
  struct Row {
    const char* name;
    const std::vector<unsigned long long>* v;
  };
  for (const Row& r : {Row{"routing", &routing[0]}, Row{"fc1", &decode[0]}, Row{"fc2", &decode[1]},
                       Row{"finalize", &finalize[0]}}) {
    if (r.v->size() != calls * kF) continue;
    std::vector<double> f[kF];
    for (size_t c = 0; c < calls; ++c) {
      const double t0 = static_cast<double>(routing[0][c * kF + cuda::stamps::kWaitedFirst]);
      for (int i = 0; i < kF; ++i) {
        f[i].push_back(1e-3 * (static_cast<double>((*r.v)[c * kF + i]) - t0));
      }
    }
    char buf[160];
    std::snprintf(buf, sizeof(buf), " | %s entry %.2f waited %.2f-%.2f end %.2f", r.name,
                  median(f[0]), median(f[1]), median(f[2]), median(f[3]));
    line += buf;
  }
  std::fprintf(stderr, "%s\n", line.c_str());
}
#endif

}  // namespace

Status device_used_bytes(size_t* used) {
  size_t free_bytes = 0, total_bytes = 0;
  QMOE_CUDA_TRY(cudaMemGetInfo(&free_bytes, &total_bytes));
  *used = total_bytes - free_bytes;
  return Status::ok();
}

Status rotation_copies(double expert_bytes, int experts_per_token, double layer_bytes, int* copies,
                       bool* enough) {
  int l2 = 0;
  QMOE_RETURN_IF_ERROR(l2_bytes(&l2));
  size_t free_bytes = 0, total_bytes = 0;
  QMOE_CUDA_TRY(cudaMemGetInfo(&free_bytes, &total_bytes));
  const double per_use = std::max(1.0, expert_bytes * std::max(1, experts_per_token));
  const int want = 1 + static_cast<int>(std::ceil(2.0 * l2 / per_use));
  const int fit =
      static_cast<int>(0.4 * static_cast<double>(free_bytes) / std::max(1.0, layer_bytes));
  *copies = std::max(2, std::min(want, fit));
  *enough = *copies >= want;
  return Status::ok();
}

Status time_cuda_case(const std::vector<PreparedLayer*>& layers, const RunInputs& in,
                      const MutableTensorView& out, const BenchTiming& timing,
                      std::vector<double>* us) {
  if (layers.empty() || layers[0] == nullptr) return Status::invalid("layers: expected one");
  PreparedLayer& layer = *layers[0];
  int64_t tokens = 0;
  QMOE_RETURN_IF_ERROR(check_run(layer.spec(), in, out, &tokens));
  if (timing.repeat < 1 || timing.warmup < 0) {
    return Status::invalid("repeat, warmup: expected repeat >= 1 and warmup >= 0");
  }
  const bool rotate = timing.cold_l2 && timing.flush == BenchTiming::Flush::kRotate;
  const size_t copies = rotate ? layers.size() : 1;
  DeviceCall staged;
  QMOE_RETURN_IF_ERROR(staged.stage(layer, in, out));
  const RunInputs& din = staged.in;
  const MutableTensorView& dout = staged.out;
  DeviceBuffer& y = staged.y;
  DeviceBuffer& ws = staged.ws;
  const size_t ws_bytes = staged.ws_bytes;
  DeviceBuffer flush;
  int flush_blocks = 0;
  DeviceBuffer flush_partials;
  const bool read_flush = timing.cold_l2 && timing.flush == BenchTiming::Flush::kRead;
  const bool write_flush = timing.cold_l2 && timing.flush == BenchTiming::Flush::kWrite;
  if (read_flush || write_flush) {
    int l2 = 0;
    QMOE_RETURN_IF_ERROR(l2_bytes(&l2));
    // A pass over it evicts every line the previous call left in the L2.
    // At least 256 MiB (the usual convention), and twice the L2 on larger caches.
    QMOE_RETURN_IF_ERROR(flush.allocate(
        std::max<size_t>(size_t{256} << 20, 2 * static_cast<size_t>(l2 > 0 ? l2 : 1))));
  }
  if (read_flush) {
#ifdef QMOE_BENCH_READ_KERNEL
    QMOE_RETURN_IF_ERROR(read_sum_blocks(&flush_blocks));
    QMOE_RETURN_IF_ERROR(
        flush_partials.allocate(static_cast<size_t>(flush_blocks) * sizeof(uint32_t)));
    QMOE_CUDA_TRY(cudaMemset(flush.get(), 0x5A, flush.bytes()));
#else
    return Status::invalid("l2 flush: the read flush needs the bench's read kernel; use write");
#endif
  }

  Stream stream;
  QMOE_RETURN_IF_ERROR(stream.create());
  const cudaStream_t s = stream.get();
  for (size_t c = 0; c < copies; ++c) {
    QMOE_RETURN_IF_ERROR(layers[c]->run(din, dout, ws.get(), ws_bytes, s, nullptr));
    QMOE_CUDA_TRY(cudaStreamSynchronize(s));
    QMOE_RETURN_IF_ERROR(layers[c]->take_deferred_error());
  }
  // NaN bytes: the output the oracle checks afterwards must come from the timed calls.
  QMOE_CUDA_TRY(cudaMemsetAsync(y.get(), 0xFF, out.bytes(), s));

  std::vector<std::unique_ptr<Graph>> graphs;
  if (timing.graph) {
    for (size_t c = 0; c < copies; ++c) {
      graphs.push_back(std::make_unique<Graph>());
      QMOE_RETURN_IF_ERROR(graphs.back()->capture(*layers[c], din, dout, ws.get(), ws_bytes, s));
    }
  }
  size_t next = 0;  // the copy the next call runs: each is used again `copies` calls later
  auto call = [&]() -> Status {
    const size_t c = next;
    next = (next + 1) % copies;
    if (timing.graph) {
      QMOE_CUDA_TRY(cudaGraphLaunch(graphs[c]->exec(), s));
      return Status::ok();
    }
    return layers[c]->run(din, dout, ws.get(), ws_bytes, s, nullptr);
  };
  for (int r = 0; r < std::max<int>(timing.warmup, static_cast<int>(copies)); ++r) {
    QMOE_RETURN_IF_ERROR(call());
  }

  EventPairs events;
  QMOE_RETURN_IF_ERROR(events.create(timing.repeat));
#if defined(QMOE_STAMPS)
  {  // the warm-up calls' records go
    QMOE_CUDA_TRY(cudaStreamSynchronize(s));
    StampRows r, d, f;
    take_stamps(&r, &d, &f);
  }
#endif
  for (int r = 0; r < timing.repeat; ++r) {
    if (read_flush) {
#ifdef QMOE_BENCH_READ_KERNEL
      QMOE_RETURN_IF_ERROR(launch_read_sum(flush.get(), flush.bytes() / 16,
                                           flush_partials.as<uint32_t>(), flush_blocks, s));
#endif
    } else if (write_flush) {
      // A different byte each time, so no write can be skipped as redundant.
      QMOE_CUDA_TRY(cudaMemsetAsync(flush.get(), r & 0xFF, flush.bytes(), s));
    }
    QMOE_CUDA_TRY(cudaEventRecord(events.start(r), s));
    QMOE_RETURN_IF_ERROR(call());
    QMOE_CUDA_TRY(cudaEventRecord(events.stop(r), s));
  }
  QMOE_CUDA_TRY(cudaStreamSynchronize(s));
#if defined(QMOE_STAMPS)
  print_stamps();
#endif
  for (size_t c = 0; c < copies; ++c) QMOE_RETURN_IF_ERROR(layers[c]->take_deferred_error());
  QMOE_RETURN_IF_ERROR(events.elapsed_us(timing.repeat, us));
  QMOE_CUDA_TRY(cudaMemcpy(out.data, y.get(), out.bytes(), cudaMemcpyDeviceToHost));
  return Status::ok();
}

Status measure_read_ceiling(ReadCeiling* out) {
  constexpr int kWarmup = 3, kTimed = 20;
  Stream stream;
  QMOE_RETURN_IF_ERROR(stream.create());
  const cudaStream_t s = stream.get();
#ifdef QMOE_BENCH_READ_KERNEL
  // 2 GiB: over 30 times the L2 of any Hopper part, so the L2 holds a negligible share.
  const size_t bytes = size_t{2} << 30;
  int blocks = 0;
  QMOE_RETURN_IF_ERROR(read_sum_blocks(&blocks));
  DeviceBuffer src, partials;
  QMOE_RETURN_IF_ERROR(src.allocate(bytes));
  QMOE_RETURN_IF_ERROR(partials.allocate(static_cast<size_t>(blocks) * sizeof(uint32_t)));
  QMOE_CUDA_TRY(cudaMemsetAsync(src.get(), 0x5A, bytes, s));
  auto pass = [&]() {
    return launch_read_sum(src.get(), bytes / 16, partials.as<uint32_t>(), blocks, s);
  };
  out->method = "read kernel, 2 GiB, 16-byte loads";
#else
  // Without the read kernel: a device-to-device copy of 1 GiB, counting its reads only. The copy
  // also writes as many bytes, so this ceiling is lower than a pure read's (about half on HBM).
  const size_t bytes = size_t{1} << 30;
  DeviceBuffer src, dst;
  QMOE_RETURN_IF_ERROR(src.allocate(bytes));
  QMOE_RETURN_IF_ERROR(dst.allocate(bytes));
  QMOE_CUDA_TRY(cudaMemsetAsync(src.get(), 0x5A, bytes, s));
  auto pass = [&]() -> Status {
    QMOE_CUDA_TRY(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, s));
    return Status::ok();
  };
  out->method = "device-to-device copy, 1 GiB, read bytes only";
#endif
  for (int r = 0; r < kWarmup; ++r) QMOE_RETURN_IF_ERROR(pass());
  EventPairs events;
  QMOE_RETURN_IF_ERROR(events.create(kTimed));
  for (int r = 0; r < kTimed; ++r) {
    QMOE_CUDA_TRY(cudaEventRecord(events.start(r), s));
    QMOE_RETURN_IF_ERROR(pass());
    QMOE_CUDA_TRY(cudaEventRecord(events.stop(r), s));
  }
  QMOE_CUDA_TRY(cudaStreamSynchronize(s));
  std::vector<double> us;
  QMOE_RETURN_IF_ERROR(events.elapsed_us(kTimed, &us));
  const double med = percentile(us, 0.5);
  if (!(med > 0)) return Status::internal("read ceiling: the timed passes took no time");
  out->gbps = static_cast<double>(bytes) / (med * 1e-6) / 1e9;
  return Status::ok();
}

std::string cuda_device_name() {
  int device = 0;
  cudaDeviceProp prop;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    cudaGetLastError();  // clear the error: the name is only for the report
    return "cuda";
  }
  return prop.name;
}

}  // namespace qmoe::cli

#endif  // QMOE_WITH_CUDA
