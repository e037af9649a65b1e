// A fixed pool of worker threads running one parallel_for at a time.
//
// parallel_for(n, fn) splits [0, n) into contiguous chunks, runs fn(begin, end)
// on the workers and on the calling thread, and returns when all are done.
// Call it from one thread at a time (the engine/run loop); fn must not call
// back into the pool. With n_threads == 1 everything runs on the caller.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace serval {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int n_threads() const { return (int)workers_.size() + 1; }

  // Runs fn over [0, n) in at most n_threads() chunks of at least `grain` items.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t grain = 1);

  // Number of physical cores (hardware threads / SMT siblings), at least 1.
  static int default_threads();

 private:
  void worker_loop(int index);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_work_, cv_done_;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int n_chunks_ = 0;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

}  // namespace serval
