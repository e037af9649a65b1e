#include "common/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <set>
#include <string>

namespace serval {
namespace {

constexpr int kMaxThreads = 1 << 15;  // also the most chunks: they must fit the ticket's 16 bits

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

// Polls done() for about ThreadPool::kSpinMicros; true as soon as it holds.
// Pure polling (no sched_yield): on a machine with more runnable threads than
// cores a yield hands the rest of our time slice (milliseconds) to another
// process, which is far worse than a short spin followed by a proper sleep.
template <typename Done>
bool spin_until(Done done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(ThreadPool::kSpinMicros);
  for (;;) {
    for (int i = 0; i < 32; ++i) {
      if (done()) return true;
      cpu_relax();
    }
    if (std::chrono::steady_clock::now() >= deadline) return done();
  }
}

void run_chunk(const std::function<void(int64_t, int64_t)>& fn, int64_t n, int chunks, int index) {
  const int64_t begin = n * index / chunks, end = n * (index + 1) / chunks;
  if (begin < end) fn(begin, end);
}

}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  n_threads = std::clamp(n_threads, 1, kMaxThreads);
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  {
    std::lock_guard<std::mutex> lk(mu_);
  }
  cv_work_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t grain) {
  if (n <= 0) return;
  const int64_t max_chunks = std::max<int64_t>(1, n / std::max<int64_t>(1, grain));
  const int64_t most = std::min<int64_t>((int64_t)n_threads() * kChunksPerThread, kMaxThreads);
  const int chunks = n_threads() == 1 ? 1 : (int)std::min<int64_t>(most, max_chunks);
  if (chunks == 1) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> call(call_mu_);
  fn_ = &fn;
  n_ = n;
  pending_.store(chunks, std::memory_order_relaxed);
  ++generation_;
  next_.store(generation_ << 16, std::memory_order_relaxed);
  // seq_cst store, then seq_cst load of sleepers_: a worker going to sleep
  // increments sleepers_ and then re-reads ticket_, so either it sees this
  // ticket or we see it asleep and wake it.
  ticket_.store(generation_ << 16 | (uint64_t)chunks);
  if (sleepers_.load() > 0) {
    { std::lock_guard<std::mutex> lk(mu_); }
    cv_work_.notify_all();
  }
  run_claimed(generation_, chunks);
  wait_done();
  fn_ = nullptr;
}

// Claims and runs chunks of job `generation` until none is left. A claim is a
// compare-exchange on next_ that also checks the generation, so a thread that
// read an old ticket can never take (and lose) a chunk of a newer job.
void ThreadPool::run_claimed(uint64_t generation, int chunks) {
  uint64_t c = next_.load(std::memory_order_relaxed);
  for (;;) {
    if ((c >> 16) != generation || (int)(c & 0xffff) >= chunks) return;
    if (!next_.compare_exchange_weak(c, c + 1, std::memory_order_relaxed)) continue;
    run_chunk(*fn_, n_, chunks, (int)(c & 0xffff));
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1 && caller_waiting_.load()) {
      { std::lock_guard<std::mutex> lk(mu_); }
      cv_done_.notify_one();
    }
    c = next_.load(std::memory_order_relaxed);
  }
}

void ThreadPool::wait_done() {
  if (spin_until([&] { return pending_.load(std::memory_order_acquire) == 0; })) return;
  caller_waiting_.store(true);  // seq_cst: pairs with the workers' fetch_sub + load
  {
    std::unique_lock<std::mutex> lk(mu_);
    cv_done_.wait(lk, [&] { return pending_.load() == 0; });
  }
  caller_waiting_.store(false, std::memory_order_relaxed);
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;  // generation of the last job this worker looked at
  for (;;) {
    uint64_t t = 0;
    auto fresh = [&] {
      t = ticket_.load();
      return (t >> 16) != seen || stop_.load(std::memory_order_relaxed);
    };
    if (!spin_until(fresh)) {
      std::unique_lock<std::mutex> lk(mu_);
      sleepers_.fetch_add(1);  // seq_cst: see parallel_for
      cv_work_.wait(lk, fresh);
      sleepers_.fetch_sub(1);
    }
    if (stop_.load()) return;
    seen = t >> 16;
    run_claimed(seen, (int)(t & 0xffff));
  }
}

int ThreadPool::default_threads() {
  // Count distinct (physical id, core id) pairs; fall back to hardware_concurrency.
  std::ifstream in("/proc/cpuinfo");
  std::set<std::pair<std::string, std::string>> cores;
  std::string line, phys = "0";
  while (std::getline(in, line)) {
    auto val = [&] { auto p = line.find(':'); return p == std::string::npos ? std::string() : line.substr(p + 2); };
    if (line.rfind("physical id", 0) == 0) phys = val();
    else if (line.rfind("core id", 0) == 0) cores.insert({phys, val()});
  }
  int n = (int)cores.size();
  if (n <= 0) n = (int)std::thread::hardware_concurrency();
  return std::max(1, n);
}

}  // namespace serval
