#include "cpu/thread_pool.h"

namespace qmoe::cpu {

ThreadPool::ThreadPool(int num_threads) {
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::drain(int worker) {
  for (;;) {
    const int64_t task = next_.fetch_add(1, std::memory_order_relaxed);
    if (task >= num_tasks_) return;
    (*fn_)(task, worker);
  }
}

void ThreadPool::worker_loop(int worker) {
  int64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    drain(worker);
    {
      std::lock_guard<std::mutex> lock(mu_);
      --active_;
    }
    done_.notify_one();
  }
}

void ThreadPool::parallel_for(int64_t num_tasks, const std::function<void(int64_t, int)>& fn) {
  if (num_tasks <= 0) return;
  bool idle = false;
  if (workers_.empty() || num_tasks == 1 ||
      !busy_.compare_exchange_strong(idle, true, std::memory_order_acquire)) {
    for (int64_t t = 0; t < num_tasks; ++t) fn(t, 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    num_tasks_ = num_tasks;
    next_.store(0, std::memory_order_relaxed);
    active_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  wake_.notify_all();
  drain(0);
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [&] { return active_ == 0; });
  fn_ = nullptr;
  busy_.store(false, std::memory_order_release);
}

}  // namespace qmoe::cpu
