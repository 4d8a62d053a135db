// One prepared layer run from several threads at once, each call with its own inputs, workspace
// and output, gives every call the bytes a serial run gives (include/qmoe/backend.h states the
// contract). scripts/test.sh also runs these tests under ThreadSanitizer (QMOE_TSAN), which
// reports any data race they provoke.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "cpu/thread_pool.h"
#include "layer_factory.h"

namespace qmoe::test {
namespace {

constexpr int kThreads = 4;

// 64-byte aligned host memory of `bytes` bytes, filled with `fill`.
struct AlignedBytes {
  std::vector<uint8_t> storage;
  uint8_t* p = nullptr;
  explicit AlignedBytes(size_t bytes, uint8_t fill = 0xFF) : storage(bytes + 64, fill) {
    p = storage.data() + (64 - reinterpret_cast<uintptr_t>(storage.data()) % 64) % 64;
  }
};

// One thread's call: its own inputs (own seed and token count), workspace and output.
struct Call {
  TestInputs in;
  int64_t tokens = 0;
  std::vector<uint8_t> serial;  // the output of a run with no other call in flight
};

Status run_once(PreparedLayer& layer, const Call& c, std::vector<uint8_t>* out) {
  const LayerSpec& s = layer.spec();
  AlignedBytes ws(layer.workspace_size(c.tokens));
  out->assign(static_cast<size_t>(c.tokens * s.hidden) * dtype_size(s.act_dtype), 0xFF);
  MutableTensorView ov(out->data(), s.act_dtype, {c.tokens, s.hidden});
  return layer.run(c.in.in, ov, ws.p, ws.storage.size() - 64, nullptr);
}

// Runs calls[i] on thread i, `rounds` times each, all threads released together; counts outputs
// that differ from the serial ones.
void run_concurrently(PreparedLayer& layer, std::vector<Call>& calls, int rounds) {
  std::atomic<int> ready{0}, mismatches{0}, errors{0};
  std::vector<std::thread> threads;
  for (size_t i = 0; i < calls.size(); ++i) {
    threads.emplace_back([&, i] {
      ready.fetch_add(1);
      while (ready.load() < static_cast<int>(calls.size())) std::this_thread::yield();
      std::vector<uint8_t> out;
      for (int r = 0; r < rounds; ++r) {
        if (!run_once(layer, calls[i], &out).is_ok()) {
          errors.fetch_add(1);
        } else if (out != calls[i].serial) {
          mismatches.fetch_add(1);
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(mismatches.load(), 0) << "outputs differ from the serial run's bytes";
}

void check_layer_concurrently(const LayerSpec& spec, int pool_threads,
                              const std::vector<int64_t>& tokens, bool router_weights) {
  const uint64_t seed = fresh_seed();
  TestLayer tl;
  make_layer(spec, seed, &tl);
  std::unique_ptr<PreparedLayer> layer;
  PrepareOptions opt;
  opt.num_threads = pool_threads;
  ASSERT_TRUE(prepare_layer(BackendKind::kCpu, tl.spec, tl.weights, opt, &layer).is_ok());
  std::vector<Call> calls(tokens.size());
  for (size_t i = 0; i < calls.size(); ++i) {
    calls[i].tokens = tokens[i];
    make_inputs(tl.spec, tokens[i], seed + 100 * (i + 1), router_weights, &calls[i].in);
    const Status st = run_once(*layer, calls[i], &calls[i].serial);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
  }
  // Distinct inputs give distinct outputs, so a call that received another's result would show.
  for (size_t i = 1; i < calls.size(); ++i) {
    if (calls[i].tokens > 0) ASSERT_NE(calls[i].serial, calls[0].serial);
  }
  run_concurrently(*layer, calls, 6);
}

TEST(Concurrency, CpuLayerFromFourThreadsEqualsSerial) {
  for (int pool : {1, 3}) {
    SCOPED_TRACE("pool threads " + std::to_string(pool));
    check_layer_concurrently(small_spec(WeightFormat::kInt4), pool, {3, 17, 1, 40}, false);
  }
}

TEST(Concurrency, CpuLayerWithRouterWeightsAndZeroTokens) {
  LayerSpec s = small_spec(WeightFormat::kInt8, 256, 128, 16, 4);
  s.act_dtype = DType::kBF16;
  s.has_fc2_bias = true;
  check_layer_concurrently(s, 2, {9, 0, 24, 2}, true);
}

// The pool itself: parallel_for from several threads at once runs each call's every task exactly
// once, on that call's own results.
TEST(Concurrency, ThreadPoolServesConcurrentCallers) {
  cpu::ThreadPool pool(3);
  constexpr int64_t kTasks = 500;
  std::atomic<int> ready{0}, bad{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      ready.fetch_add(1);
      while (ready.load() < kThreads) std::this_thread::yield();
      for (int round = 0; round < 20; ++round) {
        std::vector<std::atomic<int>> hits(kTasks);
        for (auto& h : hits) h.store(0);
        pool.parallel_for(kTasks, [&](int64_t task, int worker) {
          if (worker < 0 || worker >= pool.size()) bad.fetch_add(1);
          hits[task].fetch_add(1 + i);
        });
        for (auto& h : hits) {
          if (h.load() != 1 + i) bad.fetch_add(1);
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
}

// A task that calls parallel_for (the pool already busy) runs the inner tasks inline.
TEST(Concurrency, ThreadPoolNestedCallRunsInline) {
  cpu::ThreadPool pool(3);
  std::vector<std::atomic<int>> hits(64 * 8);
  for (auto& h : hits) h.store(0);
  pool.parallel_for(64, [&](int64_t outer, int) {
    pool.parallel_for(8, [&](int64_t inner, int) { hits[outer * 8 + inner].fetch_add(1); });
  });
  for (size_t i = 0; i < hits.size(); ++i) EXPECT_EQ(hits[i].load(), 1) << "task " << i;
}

}  // namespace
}  // namespace qmoe::test
