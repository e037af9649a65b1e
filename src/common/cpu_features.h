// Run-time x86-64 CPU feature detection (CPUID + XGETBV) and the choice of the
// kernel instruction-set level (Isa) the dispatch point in kernels/matmul.cpp
// uses. serval is built for baseline x86-64; SIMD kernels live in functions
// compiled for their ISA and are called only when these flags say so.
//
// A feature is reported only when both the CPU has it and the OS saves the
// register state it needs (XCR0: YMM for AVX*, ZMM/opmask for AVX-512).
// Pure functions and immutable, lazily initialized globals: thread-safe.
#pragma once

#include <optional>
#include <string_view>

namespace serval {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512vbmi = false;
  bool avx512vnni = false;
  bool avxvnni = false;  // VEX-encoded VNNI (256-bit vpdpbusd without AVX-512)
  bool avx512bf16 = false;
};

// The host's features, detected once (first call) and cached.
const CpuFeatures& cpu_features();

// Detects the features now (no caching). All false on non-x86 builds.
CpuFeatures detect_cpu_features();

// Kernel levels, each a superset of the one before except avx2vnni, which
// avx512 does not need (a CPU may have either without the other):
//   ref         portable scalar reference kernels (kernels/ref)
//   avx2        AVX2 + FMA + F16C
//   avx2vnni    + AVX-VNNI (VEX vpdpbusd/vpdpwssd on ymm; Alder Lake and later)
//   avx512      AVX2 + FMA + F16C + AVX-512 F/BW/VL
//   avx512vnni  + AVX-512-VNNI (vpdpbusd/vpdpwssd)
enum class Isa { ref = 0, avx2 = 1, avx2vnni = 2, avx512 = 3, avx512vnni = 4 };

const char* isa_name(Isa isa);
// "ref", "avx2", "avx2vnni", "avx512", "avx512vnni" (case-sensitive); nullopt otherwise.
std::optional<Isa> isa_from_name(std::string_view name);

// True when the CPU (features f) can run kernels of level isa.
bool isa_supported(Isa isa, const CpuFeatures& f);
// The highest level f supports.
Isa best_isa(const CpuFeatures& f);

// The level to use given the value of SERVAL_ISA (env_value, nullptr = unset):
// unset or empty -> best_isa(f); a known name -> the highest level <= it
// that f supports; an unknown name -> best_isa(f) and *error is set to a message
// naming the bad value and the accepted ones (error may be nullptr). Pure.
Isa choose_isa(const CpuFeatures& f, const char* env_value, std::string_view* error = nullptr);

// choose_isa(cpu_features(), getenv("SERVAL_ISA")), evaluated once; an unknown
// value is reported on stderr once.
Isa selected_isa();

}  // namespace serval
