// Test helpers shared by the kernel tests: the ISA levels this machine runs,
// a guard that restores the active level, and the two environments that run
// a test's code paths once rather than at every size (the sanitizers, the
// emulated CPUs of tests/dispatch/isa_emulated.sh).
#pragma once

#include <cstdlib>
#include <vector>

#include "common/cpu_features.h"
#include "kernels/matmul.h"

namespace serval::test {

// Every level the machine can run, lowest (ref) first; each is forced in turn
// to find out, and the active level is restored.
inline std::vector<Isa> available_isa_levels() {
  std::vector<Isa> out;
  const Isa keep = kernels::active_isa();
  for (Isa i : {Isa::ref, Isa::avx2, Isa::avx2vnni, Isa::avx512, Isa::avx512vnni})
    if (kernels::set_isa(i) == i) out.push_back(i);
  kernels::set_isa(keep);
  return out;
}

// scripts/test-sanitize.sh sets SERVAL_SANITIZED: there the memory-safety
// check needs each code path once, and the release stage runs the rest.
inline bool sanitized() { return std::getenv("SERVAL_SANITIZED") != nullptr; }

// tests/dispatch/isa_emulated.sh sets SERVAL_TEST_EMULATED when it runs the
// kernel tests under qemu-user (about 100x slower): there the point is that
// every kernel of the emulated CPU's level runs without an instruction the CPU
// lacks and gives the bits it gives natively (where every size runs), so the
// tests that loop over shapes take one shape of each kind.
inline bool emulated() { return std::getenv("SERVAL_TEST_EMULATED") != nullptr; }

// The levels an end-to-end forward test runs: every level, or under the
// sanitizers the best one only (every level's kernels run under ASan in
// tests/kernels; the scalar level of a whole forward takes minutes there).
inline std::vector<Isa> forward_levels() {
  std::vector<Isa> levels = available_isa_levels();
  if (sanitized() && levels.size() > 1) levels = {levels.back()};
  return levels;
}

// Restores the active ISA level when the scope ends.
class IsaGuard {
 public:
  IsaGuard() : saved_(kernels::active_isa()) {}
  ~IsaGuard() { kernels::set_isa(saved_); }
  IsaGuard(const IsaGuard&) = delete;
  IsaGuard& operator=(const IsaGuard&) = delete;

 private:
  Isa saved_;
};

}  // namespace serval::test
