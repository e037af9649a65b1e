// Test helpers shared by the kernel tests: the ISA levels this machine runs
// and a guard that restores the active level.
#pragma once

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
