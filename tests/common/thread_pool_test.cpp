// ThreadPool: every index runs exactly once, through each hand-off path —
// workers still spinning, workers asleep (gaps longer than kSpinMicros), the
// caller asleep (a worker chunk longer than kSpinMicros) — a stalled worker
// holds up only the chunk it took, and pools are destroyed cleanly in every
// state.
#include "common/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace serval {
namespace {

// Runs parallel_for(n) and checks each index was visited exactly once.
void expect_each_once(ThreadPool& pool, int64_t n, int64_t grain) {
  std::vector<std::atomic<int>> hits((size_t)n);
  std::atomic<int> calls{0};
  pool.parallel_for(
      n,
      [&](int64_t b, int64_t e) {
        ASSERT_LE(0, b);
        ASSERT_LT(b, e);
        ASSERT_LE(e, n);
        calls.fetch_add(1);
        for (int64_t i = b; i < e; ++i) hits[(size_t)i].fetch_add(1);
      },
      grain);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[(size_t)i].load(), 1) << "index " << i << " of " << n;
  const int64_t max_chunks = std::max<int64_t>(1, n / std::max<int64_t>(1, grain));
  const int64_t most = pool.n_threads() == 1 ? 1 : (int64_t)pool.n_threads() * ThreadPool::kChunksPerThread;
  EXPECT_LE(calls.load(), std::min<int64_t>(most, max_chunks));
}

TEST(ThreadPool, EveryIndexOnceForManySizes) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.n_threads(), threads);
    for (int64_t n : {0, 1, 2, 3, 7, 16, 100, 1001})
      for (int64_t grain : {1, 4, 64}) expect_each_once(pool, n, grain);
  }
}

TEST(ThreadPool, BackToBackDispatchesWhileWorkersSpin) {
  ThreadPool pool(3);
  for (int rep = 0; rep < 4000; ++rep) expect_each_once(pool, 1 + rep % 9, 1);
}

TEST(ThreadPool, WakesSleepingWorkers) {
  ThreadPool pool(3);
  for (int rep = 0; rep < 30; ++rep) {
    // Longer than the spin: every worker has gone to sleep by the next call.
    std::this_thread::sleep_for(std::chrono::microseconds(ThreadPool::kSpinMicros * 3));
    expect_each_once(pool, 64, 1);
  }
}

TEST(ThreadPool, CallerSleepsUntilASlowWorkerFinishes) {
  ThreadPool pool(2);
  const std::thread::id caller = std::this_thread::get_id();
  for (int rep = 0; rep < 10; ++rep) {
    std::atomic<int> done{0};
    pool.parallel_for(2, [&](int64_t, int64_t) {
      // A worker's chunk outlasts the caller's spin.
      if (std::this_thread::get_id() != caller)
        std::this_thread::sleep_for(std::chrono::microseconds(ThreadPool::kSpinMicros * 5));
      done.fetch_add(1);
    });
    ASSERT_EQ(done.load(), 2);
  }
}

// A worker that stalls in its first chunk (as one whose core the machine took
// away) holds up that chunk only: the caller runs all the others meanwhile.
TEST(ThreadPool, AStalledWorkerHoldsUpOnlyItsChunk) {
  ThreadPool pool(2);
  const std::thread::id caller = std::this_thread::get_id();
  const int chunks = 2 * ThreadPool::kChunksPerThread;
  for (int rep = 0; rep < 5; ++rep) {
    std::atomic<int> by_caller{0}, by_worker{0};
    std::atomic<bool> stalled{false};
    pool.parallel_for(chunks, [&](int64_t b, int64_t e) {
      EXPECT_EQ(e, b + 1);
      if (std::this_thread::get_id() == caller) {
        // The caller's first chunk waits for the worker to stall in one.
        if (by_caller.fetch_add(1) == 0)
          for (int i = 0; i < 2000 && !stalled.load(); ++i) std::this_thread::sleep_for(std::chrono::microseconds(500));
      } else {
        by_worker.fetch_add(1);
        if (!stalled.exchange(true)) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    });
    EXPECT_EQ(by_caller.load() + by_worker.load(), chunks);
    // The worker took its stalled chunk and none after: by the time it woke,
    // the caller had run the rest.
    EXPECT_TRUE(stalled.load());
    EXPECT_EQ(by_worker.load(), 1) << "rep " << rep;
  }
}

TEST(ThreadPool, DestroysCleanlySpinningIdleOrAsleep) {
  for (int rep = 0; rep < 50; ++rep) {
    ThreadPool pool(4);
    if (rep % 3 == 1) expect_each_once(pool, 10, 1);  // destroyed while workers spin
    if (rep % 3 == 2) {
      expect_each_once(pool, 10, 1);
      std::this_thread::sleep_for(std::chrono::microseconds(ThreadPool::kSpinMicros * 3));  // asleep
    }
  }
}

TEST(ThreadPool, DefaultThreadsIsPositive) { EXPECT_GE(ThreadPool::default_threads(), 1); }

}  // namespace
}  // namespace serval
