// qmoe: a small fixed pool of worker threads for the CPU backend. parallel_for hands out task
// indices dynamically (an atomic counter) but every task's result depends only on its index, so
// outputs are the same for any thread count or schedule.
//
// One parallel_for at a time has the workers. parallel_for may be called from several threads at
// once (one prepared layer run from several threads): a call that finds the workers busy runs its
// tasks on its own thread, as worker 0, rather than wait; so does a task that calls parallel_for.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace qmoe::cpu {

class ThreadPool {
 public:
  // num_threads counts the calling thread: 1 runs everything inline.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(task, worker) for task in [0, num_tasks); worker in [0, size()). Blocks until done.
  // Thread-safe (see above); a worker index is unique among the tasks running at once for this
  // call, not among other threads' calls.
  void parallel_for(int64_t num_tasks, const std::function<void(int64_t, int)>& fn);

 private:
  void worker_loop(int worker);
  void drain(int worker);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(int64_t, int)>* fn_ = nullptr;
  int64_t num_tasks_ = 0;
  std::atomic<int64_t> next_{0};
  std::atomic<bool> busy_{false};  // a parallel_for has the workers
  int64_t generation_ = 0;
  int active_ = 0;
  bool stop_ = false;
};

}  // namespace qmoe::cpu
