// --tp N for run and serve: tensor parallelism across the ranks of an MPI job
// (mpirun -np N serval run|serve --tp N ...; parallel/mpi_link.h). Every rank
// parses the same command line and loads its shard of the model; rank 0 goes
// on with the command, the others run their shards on rank 0's steps until it
// finishes.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "common/thread_pool.h"
#include "engine/tensor_parallel_link.h"
#include "model/model.h"
#ifdef SERVAL_HAVE_MPI
#include "parallel/mpi_link.h"
#endif

namespace serval::cli {

struct TpFlag {
  int size = 1;
  double timeout_s = 60.0;

  void add_to(CLI::App& app) {
    app.add_option("--tp", size,
                   "tensor parallelism: split every layer's heads and FFN columns over N MPI ranks "
                   "(mpirun -np N serval ... --tp N)")
        ->check(CLI::Range(1, 64));
    app.add_option("--tp-timeout", timeout_s,
                   "seconds a rank waits for the others inside a step before it fails (a rank gone or stuck)")
        ->check(CLI::Range(1.0, 3600.0));
  }

  // Joins the MPI job when --tp > 1; an error is printed and its exit code returned.
  std::optional<int> join(const std::string& cmd) {
    if (size == 1) return std::nullopt;
#ifdef SERVAL_HAVE_MPI
    auto l = parallel::MpiLink::join(size, timeout_s);
    if (!l.ok()) {
      std::fprintf(stderr, "%s: %s\n", cmd.c_str(), l.status().message().c_str());
      return 2;
    }
    link = std::move(l.value());
    return std::nullopt;
#else
    std::fprintf(stderr, "%s: --tp needs MPI, and this serval was built without it (Debian: libopenmpi-dev)\n",
                 cmd.c_str());
    return 2;
#endif
  }

  TensorParallel shard() const {
#ifdef SERVAL_HAVE_MPI
    if (link) return link->shard();
#endif
    return {};
  }
  bool worker() const { return shard().rank != 0; }
  TensorParallelLink* engine_link() {
#ifdef SERVAL_HAVE_MPI
    return link.get();
#else
    return nullptr;
#endif
  }

  // Ranks 1..N-1: serve rank 0's steps with this shard; the exit code.
  int run_worker(const std::string& cmd, const Model& shard_model, int threads) {
#ifdef SERVAL_HAVE_MPI
    ThreadPool pool(threads > 0 ? threads : ThreadPool::default_threads());
    const Status st = link->serve_steps(shard_model, &pool);
    if (!st.ok()) {
      std::fprintf(stderr, "%s (rank %d): %s\n", cmd.c_str(), (int)link->rank(), st.message().c_str());
      return 1;
    }
    return 0;
#else
    (void)cmd, (void)shard_model, (void)threads;
    return 2;
#endif
  }

  // Rank 0: what this rank exchanged, on stderr.
  void report(const std::string& cmd, int64_t steps_tokens) const {
#ifdef SERVAL_HAVE_MPI
    if (!link) return;
    const double b = (double)link->bytes_broadcast(), r = (double)link->bytes_gathered();
    std::fprintf(stderr, "%s: tensor parallel %d ranks: %.0f bytes of steps sent, %.0f bytes all-gathered (%.0f per token)\n",
                 cmd.c_str(), (int)link->size(), b, r, steps_tokens > 0 ? (b + r) / (double)steps_tokens : 0.0);
#else
    (void)cmd, (void)steps_tokens;
#endif
  }

#ifdef SERVAL_HAVE_MPI
  std::unique_ptr<parallel::MpiLink> link;
#endif
};

}  // namespace serval::cli
