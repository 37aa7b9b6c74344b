// demo_parallel.h: a host parallel-for for the demo's bulk host work (input generation on the
// host, state comparison). Plain C++, header-only; never touches a device itself.
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <thread>
#include <vector>

namespace kda::demo {

/// Calls fn(i) for every i in [0, n), round-robin over up to hardware_concurrency threads (on
/// the calling thread alone when one suffices). fn must be safe to run concurrently for
/// distinct i. If calls throw, the remaining indices of that thread are skipped and the
/// lowest thread's exception is rethrown after every thread has joined.
template <typename Fn>
void parallel_for(int64_t n, const Fn& fn) {
  const int threads = static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>(n, std::thread::hardware_concurrency())));
  if (threads == 1) {
    for (int64_t i = 0; i < n; ++i) {
      fn(i);
    }
    return;
  }
  std::vector<std::exception_ptr> errors(static_cast<size_t>(threads));
  std::vector<std::thread> pool;
  for (int w = 0; w < threads; ++w) {
    pool.emplace_back([&, w] {
      try {
        for (int64_t i = w; i < n; i += threads) {
          fn(i);
        }
      } catch (...) {
        errors[static_cast<size_t>(w)] = std::current_exception();
      }
    });
  }
  for (std::thread& th : pool) {
    th.join();
  }
  for (const std::exception_ptr& e : errors) {
    if (e) {
      std::rethrow_exception(e);
    }
  }
}

}  // namespace kda::demo
