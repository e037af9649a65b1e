// A fixed pool of worker threads running one parallel_for at a time.
//
// parallel_for(n, fn) splits [0, n) into contiguous chunks, runs fn(begin, end)
// on the workers and on the calling thread, and returns when all are done.
// Call it from one thread at a time per job (the engine/run loop); fn must not call
// back into the pool. With n_threads == 1 everything runs on the caller.
// Several threads may share one pool (the engines of several models in one
// process): their parallel_fors then run one after another, each with all
// the workers (call_mu_ serializes them).
//
// Chunks are claimed, not assigned: up to kChunksPerThread per thread, and
// each thread (the caller too) takes the next unclaimed one until none is
// left. On a shared machine a worker's core can be taken away for
// milliseconds; with fixed shares the caller would wait for the absent
// worker's share, with claims it runs the chunks the worker never started
// and waits only for one in progress. (A chunk's result must not depend on
// which thread runs it; the callers' kernels promise that anyway.)
//
// Hand-off is spin-then-sleep: after a chunk a worker polls for the next
// parallel_for for about kSpinMicros (30 µs) before it blocks on a condition variable,
// and the caller polls for the workers' completion the same way. A decode step
// issues a few hundred parallel_fors a few microseconds apart, so the workers
// stay hot for the whole step (a hand-off costs a cache-line transfer, not a
// futex wake-up); an idle pool sleeps and costs nothing.
#pragma once

#include <atomic>
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

  // Runs fn over [0, n) in at most n_threads() * kChunksPerThread chunks of
  // at least `grain` items.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t grain = 1);

  // Number of physical cores (hardware threads / SMT siblings), at least 1.
  static int default_threads();

  // How long a thread polls before it sleeps.
  static constexpr int kSpinMicros = 30;
  // Chunks per thread, at most: the share of a stalled worker that the
  // others can still take over.
  static constexpr int kChunksPerThread = 4;

 private:
  void worker_loop();
  void run_claimed(uint64_t generation, int chunks);
  void wait_done();

  std::vector<std::thread> workers_;
  // The current job. fn_ and n_ are written before ticket_ is published and
  // read only by workers taking part (index < chunks), which all finish before
  // the caller can write them again.
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  uint64_t generation_ = 0;                     // caller only
  alignas(64) std::atomic<uint64_t> ticket_{0};  // generation << 16 | chunks
  alignas(64) std::atomic<uint64_t> next_{0};    // generation << 16 | next unclaimed chunk
  alignas(64) std::atomic<int> pending_{0};      // chunks not yet done
  std::atomic<int> sleepers_{0};                 // workers blocked on cv_work_
  std::atomic<bool> caller_waiting_{false};      // caller blocked on cv_done_
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_work_, cv_done_;
  std::mutex call_mu_;  // one parallel_for at a time when callers share the pool
};

}  // namespace serval
