// One prepared CUDA layer run from several host threads at once, each thread with its own stream,
// workspace and output: every call's bytes equal a serial run's (decode and generic paths, fused
// and general routing, profiled calls among them). Deferred errors recorded while other threads
// run and take are each reported exactly once. Run it under compute-sanitizer --tool racecheck
// too (scripts/gpu-check.sh style): the kernels of concurrent calls share only the error record.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gpu_layer_harness.h"

namespace qmoe::test {
namespace {

// One thread's call: its inputs on the device and the output of a serial run.
struct Call {
  TestInputs ti;
  DeviceInputs d;
  int64_t tokens = 0;
  std::vector<uint8_t> serial;
};

// Failures seen on worker threads, reported by the main thread.
struct Failures {
  std::mutex mu;
  std::vector<std::string> what;
  void add(const std::string& w) {
    std::lock_guard<std::mutex> lock(mu);
    if (what.size() < 8) what.push_back(w);
  }
};

// One thread's device buffers for its call, allocated once (cudaFree would synchronize the
// device between calls and hide the overlap this suite is about).
struct Buffers {
  GpuBuffer ws, y;
  Status allocate(const PreparedLayer& layer, const Call& c) {
    const LayerSpec& s = layer.spec();
    const size_t out_bytes = static_cast<size_t>(c.tokens * s.hidden) * dtype_size(s.act_dtype);
    if (!ws.allocate(layer.workspace_size(c.tokens)) || !y.allocate(out_bytes)) {
      return Status::internal("cannot allocate the call's buffers");
    }
    return Status::ok();
  }
};

// Runs c on `stream` with its workspace and output poisoned first; the output's bytes into *out.
Status run_on_stream(PreparedLayer& layer, const Call& c, Buffers& b, cudaStream_t stream,
                     RunProfile* prof, std::vector<uint8_t>* out) {
  const LayerSpec& s = layer.spec();
  auto cuda = [](cudaError_t e) {
    return e == cudaSuccess ? Status::ok() : Status::internal(cudaGetErrorString(e));
  };
  QMOE_RETURN_IF_ERROR(cuda(cudaMemsetAsync(b.ws.get(), 0xFF, b.ws.bytes(), stream)));
  QMOE_RETURN_IF_ERROR(cuda(cudaMemsetAsync(b.y.get(), 0xFF, b.y.bytes(), stream)));
  const MutableTensorView ov(c.tokens > 0 ? b.y.get() : nullptr, s.act_dtype, {c.tokens, s.hidden});
  QMOE_RETURN_IF_ERROR(layer.run(c.d.in, ov, b.ws.get(), b.ws.bytes(), stream, prof));
  out->assign(b.y.bytes(), 0);
  QMOE_RETURN_IF_ERROR(
      cuda(cudaMemcpyAsync(out->data(), b.y.get(), b.y.bytes(), cudaMemcpyDeviceToHost, stream)));
  return cuda(cudaStreamSynchronize(stream));
}

void check_concurrent(const LayerSpec& spec, const std::vector<int64_t>& tokens, int rounds) {
  const uint64_t seed = fresh_seed();
  TestLayer tl;
  make_layer(spec, seed, &tl);
  std::unique_ptr<PreparedLayer> layer;
  Status st = prepare_layer(BackendKind::kCuda, tl.spec, tl.weights, {}, &layer);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  std::vector<Call> calls(tokens.size());
  cudaStream_t serial_stream;
  CUDA_ASSERT(cudaStreamCreateWithFlags(&serial_stream, cudaStreamNonBlocking));
  for (size_t i = 0; i < calls.size(); ++i) {
    Call& c = calls[i];
    c.tokens = tokens[i];
    make_inputs(tl.spec, c.tokens, seed + 1000 * (i + 1), i % 2 == 1, &c.ti);
    ASSERT_TRUE(stage_inputs(c.ti, &c.d));
    Buffers buffers;
    ASSERT_TRUE(buffers.allocate(*layer, c).is_ok());
    st = run_on_stream(*layer, c, buffers, serial_stream, nullptr, &c.serial);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
  }
  cudaStreamDestroy(serial_stream);

  Failures failures;
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (size_t i = 0; i < calls.size(); ++i) {
    threads.emplace_back([&, i] {
      cudaStream_t stream;
      Buffers buffers;
      if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess ||
          !buffers.allocate(*layer, calls[i]).is_ok()) {
        failures.add("thread " + std::to_string(i) + ": no stream or buffers");
        ready.fetch_add(1);
        return;
      }
      ready.fetch_add(1);
      while (ready.load() < static_cast<int>(calls.size())) std::this_thread::yield();
      std::vector<uint8_t> out;
      for (int r = 0; r < rounds; ++r) {
        RunProfile prof;  // odd threads profile every other round: those calls take turns
        const bool profiled = i % 2 == 1 && r % 2 == 0;
        const Status s =
            run_on_stream(*layer, calls[i], buffers, stream, profiled ? &prof : nullptr, &out);
        const std::string where = "thread " + std::to_string(i) + " (" +
                                  std::to_string(calls[i].tokens) + " tokens) round " +
                                  std::to_string(r);
        if (!s.is_ok()) {
          failures.add(where + ": " + s.to_string());
        } else if (out != calls[i].serial) {
          failures.add(where + ": output differs from the serial run");
        } else if (profiled && calls[i].tokens > 0 && !(prof.total_us() > 0.0)) {
          failures.add(where + ": empty profile");
        }
      }
      cudaStreamDestroy(stream);
    });
  }
  for (std::thread& t : threads) t.join();
  for (const std::string& w : failures.what) ADD_FAILURE() << w;
  st = layer->take_deferred_error();
  EXPECT_TRUE(st.is_ok()) << st.to_string();
}

TEST(GpuConcurrency, DecodeLayerFromSeveralThreadsEqualsSerial) {
  QMOE_REQUIRE_GPU();
  LayerSpec s = small_spec(WeightFormat::kInt4, 512, 256, 32, 4);
  s.act_dtype = DType::kBF16;
  // Decode and generic calls, fused (T <= 64) and general routing, an empty call.
  check_concurrent(s, {1, 6, 40, 300, 0, 3}, 10);
}

TEST(GpuConcurrency, GenericLayerFromSeveralThreadsEqualsSerial) {
  QMOE_REQUIRE_GPU();
  LayerSpec s = small_spec(WeightFormat::kInt8, 256, 128, 16, 2);
  s.activation.glu = GluLayout::kSeparateFc3;
  s.has_fc1_bias = true;
  check_concurrent(s, {2, 90, 17, 1}, 8);
}

// A bad call (a NaN logit) on one thread while others run clean calls and take errors: every bad
// call's error is reported exactly once, by whichever thread takes it, and names router_probs.
TEST(GpuConcurrency, DeferredErrorsAreReportedOnceUnderConcurrentTakes) {
  QMOE_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  TestLayer tl;
  make_layer(small_spec(WeightFormat::kInt4, 256, 128, 16, 4), seed, &tl);
  std::unique_ptr<PreparedLayer> layer;
  Status st = prepare_layer(BackendKind::kCuda, tl.spec, tl.weights, {}, &layer);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  constexpr int kTakers = 3, kBadCalls = 6;
  std::vector<Call> calls(kTakers + 1);
  for (size_t i = 0; i < calls.size(); ++i) {
    Call& c = calls[i];
    c.tokens = 5 + 7 * static_cast<int64_t>(i);
    make_inputs(tl.spec, c.tokens, seed + 77 * (i + 1), false, &c.ti);
    if (i == 0) {
      reinterpret_cast<float*>(c.ti.logits.data())[2 * tl.spec.num_experts + 1] =
          std::numeric_limits<float>::quiet_NaN();
    }
    ASSERT_TRUE(stage_inputs(c.ti, &c.d));
  }
  ASSERT_TRUE(layer->take_deferred_error().is_ok());

  std::atomic<int> reported{0}, bad_done{0};
  std::atomic<bool> stop{false};
  Failures failures;
  auto take = [&](const char* who) {
    const Status s = layer->take_deferred_error();
    if (s.is_ok()) return;
    reported.fetch_add(1);
    if (s.message().find("router_probs") == std::string::npos) {
      failures.add(std::string(who) + ": unexpected error " + s.to_string());
    }
  };
  std::vector<std::thread> threads;
  threads.emplace_back([&] {  // the bad caller: one bad call at a time, each taken before the next
    cudaStream_t stream;
    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    Buffers buffers;
    if (!buffers.allocate(*layer, calls[0]).is_ok()) failures.add("bad caller: no buffers");
    std::vector<uint8_t> out;
    for (int b = 0; b < kBadCalls; ++b) {
      const Status s = run_on_stream(*layer, calls[0], buffers, stream, nullptr, &out);
      if (!s.is_ok()) failures.add("bad call: " + s.to_string());
      bad_done.fetch_add(1);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (reported.load() < b + 1 && std::chrono::steady_clock::now() < deadline) {
        take("bad caller");
      }
    }
    stop.store(true);
    cudaStreamDestroy(stream);
  });
  for (int i = 1; i <= kTakers; ++i) {
    threads.emplace_back([&, i] {
      cudaStream_t stream;
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
      Buffers buffers;
      if (!buffers.allocate(*layer, calls[i]).is_ok()) failures.add("taker: no buffers");
      std::vector<uint8_t> out;
      while (!stop.load()) {
        const Status s = run_on_stream(*layer, calls[i], buffers, stream, nullptr, &out);
        if (!s.is_ok()) failures.add("clean call: " + s.to_string());
        take("taker");
      }
      cudaStreamDestroy(stream);
    });
  }
  for (std::thread& t : threads) t.join();
  for (const std::string& w : failures.what) ADD_FAILURE() << w;
  EXPECT_EQ(bad_done.load(), kBadCalls);
  EXPECT_EQ(reported.load(), kBadCalls) << "each bad call's error must be reported exactly once";
  st = layer->take_deferred_error();
  EXPECT_TRUE(st.is_ok()) << "nothing left to take: " << st.to_string();
}

}  // namespace
}  // namespace qmoe::test
