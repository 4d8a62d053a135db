// `qmoe bench`: the pieces shared by its driver (cmd_bench.cpp), its CUDA timing (bench_cuda.cpp)
// and the read-bandwidth kernel (bench_kernels.cu).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "qmoe/backend.h"
#include "qmoe/status.h"

namespace qmoe::cli {

struct BenchTiming {
  int warmup = 1;
  int repeat = 5;
  bool cold_l2 = true;  // CUDA: flush the L2 before each timed call, outside its events
  // How: kRead leaves the L2 holding clean lines of another buffer (a read pass over it), so the
  // timed call's reads evict them for free, as in the read ceiling's own pass; kWrite leaves it
  // holding dirty lines (a memset), whose write-back the timed call pays as it evicts them;
  // kRotate flushes nothing: each timed call runs the next of several copies of the layer's
  // weights (rotation_copies()), so its weights come from DRAM while the code, the routing inputs
  // and the workspace stay cached, as they do from one layer of a model to the next.
  enum class Flush { kRead, kWrite, kRotate };
  Flush flush = Flush::kRead;
  bool graph = true;  // CUDA: replay one captured call (false: eager run() calls)
};

// The q-quantile (0..1) of v, interpolated linearly between the two nearest ranks (q = 0.5 is the
// usual median); 0 for an empty v.
double percentile(std::vector<double> v, double q);

// Times one case on the CPU backend with the host clock: `warmup` untimed calls, then `repeat`
// timed ones. us receives each timed call's microseconds; out (host memory) the last output.
Status time_cpu_case(PreparedLayer& layer, const RunInputs& in, const MutableTensorView& out,
                     const BenchTiming& timing, std::vector<double>* us);

// The device read bandwidth the layer's achieved GB/s is compared with.
struct ReadCeiling {
  double gbps = 0;
  std::string method;  // what was timed, for the report and the CSV
};

#ifdef QMOE_WITH_CUDA
// Stages in (host memory) on device 0, allocates the exact workspace and times one case on a
// non-blocking stream: one eager call per layer copy (which also surfaces argument errors outside
// a capture), then either captured graphs replayed `warmup` + `repeat` times or as many eager
// calls. Each timed call has its own pair of events; with cold_l2 a pass over twice the L2 size
// (a read or a memset, BenchTiming::flush) precedes it, or with Flush::kRotate the calls cycle
// through `layers`, copies of one layer (only layers[0] is used otherwise).
// us receives each timed call's microseconds; out (host memory) the last call's output.
Status time_cuda_case(const std::vector<PreparedLayer*>& layers, const RunInputs& in,
                      const MutableTensorView& out, const BenchTiming& timing,
                      std::vector<double>* us);

// How many copies of a layer's weights Flush::kRotate cycles through: enough that the other
// copies' weights one token touches (experts_per_token experts of expert_bytes each) fill twice
// the L2 between two uses of a copy, at most what 40% of the free device memory holds for
// layer_bytes each (and at least 2). enough: whether the memory allowed that many.
Status rotation_copies(double expert_bytes, int experts_per_token, double layer_bytes, int* copies,
                       bool* enough);

// Measures the read ceiling of device 0 once: the median of 20 timed passes.
Status measure_read_ceiling(ReadCeiling* out);

// The name of device 0 ("NVIDIA H200"), for the report.
std::string cuda_device_name();

// Device memory in use on the current device (total less free): the difference across a
// prepare_layer call is what the prepared layer holds.
Status device_used_bytes(size_t* used);
#endif

#if defined(QMOE_WITH_CUDA) && defined(QMOE_BENCH_READ_KERNEL)
// The read kernel (bench_kernels.cu): every thread sums 16-byte words of src with a grid-stride
// loop, each block writes one partial sum to partials[blockIdx.x], so the only DRAM traffic that
// scales with the buffer is reads. read_sum_blocks() gives the grid that fills the device once
// (the most resident blocks per SM times the SMs); partials must hold that many uint32 values.
Status read_sum_blocks(int* blocks);
Status launch_read_sum(const void* src, size_t words16, uint32_t* partials, int blocks,
                       void* stream);
#endif

}  // namespace qmoe::cli
