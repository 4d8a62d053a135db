// The host's one fork-join helper: independent parts on their own threads.
#pragma once

#include <cstdint>
#include <thread>
#include <vector>

namespace qmoe {

// Runs part(i) for i in [0, parts), part 0 on this thread and each other on a thread of its own,
// and returns when all are done. A thread that cannot be started (resource limits) runs its part
// here instead, so the work is always done. The parts must not share writes.
template <typename F>
void run_parts(int64_t parts, F&& part) {
  std::vector<std::thread> pool;
  for (int64_t i = 1; i < parts; ++i) {
    try {
      pool.emplace_back(part, i);
    } catch (...) {
      part(i);
    }
  }
  if (parts > 0) part(int64_t{0});
  for (std::thread& t : pool) t.join();
}

}  // namespace qmoe
