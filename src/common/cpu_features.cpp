#include "common/cpu_features.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define SERVAL_X86 1
#endif

namespace serval {

#if SERVAL_X86
namespace {

struct Regs {
  uint32_t a = 0, b = 0, c = 0, d = 0;
};

Regs cpuid(uint32_t leaf, uint32_t subleaf) {
  Regs r;
  __cpuid_count(leaf, subleaf, r.a, r.b, r.c, r.d);
  return r;
}

uint64_t xgetbv0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return ((uint64_t)hi << 32) | lo;
}

bool bit(uint32_t v, int i) { return (v >> i) & 1u; }

}  // namespace
#endif

CpuFeatures detect_cpu_features() {
  CpuFeatures f;
#if SERVAL_X86
  const uint32_t max_leaf = cpuid(0, 0).a;
  if (max_leaf < 1) return f;
  const Regs l1 = cpuid(1, 0);
  const bool osxsave = bit(l1.c, 27), avx = bit(l1.c, 28);
  if (!osxsave || !avx) return f;
  const uint64_t xcr0 = xgetbv0();
  const bool ymm_state = (xcr0 & 0x6) == 0x6;             // SSE + AVX state
  const bool zmm_state = ymm_state && (xcr0 & 0xe0) == 0xe0;  // opmask, ZMM_Hi256, Hi16_ZMM
  if (!ymm_state) return f;
  f.fma = bit(l1.c, 12);
  f.f16c = bit(l1.c, 29);
  if (max_leaf < 7) return f;
  const Regs l7 = cpuid(7, 0);
  f.avx2 = bit(l7.b, 5);
  if (zmm_state) {
    f.avx512f = bit(l7.b, 16);
    f.avx512bw = f.avx512f && bit(l7.b, 30);
    f.avx512vl = f.avx512f && bit(l7.b, 31);
    f.avx512vbmi = f.avx512f && bit(l7.c, 1);
    f.avx512vnni = f.avx512f && bit(l7.c, 11);
  }
  if (l7.a >= 1) {
    const Regs l71 = cpuid(7, 1);
    f.avxvnni = bit(l71.a, 4);
    f.avx512bf16 = zmm_state && f.avx512f && bit(l71.a, 5);
  }
#endif
  return f;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect_cpu_features();
  return f;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::ref: return "ref";
    case Isa::avx2: return "avx2";
    case Isa::avx2vnni: return "avx2vnni";
    case Isa::avx512: return "avx512";
    case Isa::avx512vnni: return "avx512vnni";
  }
  return "?";
}

std::optional<Isa> isa_from_name(std::string_view name) {
  for (Isa i : {Isa::ref, Isa::avx2, Isa::avx2vnni, Isa::avx512, Isa::avx512vnni})
    if (name == isa_name(i)) return i;
  return std::nullopt;
}

bool isa_supported(Isa isa, const CpuFeatures& f) {
  const bool avx2 = f.avx2 && f.fma && f.f16c;
  const bool avx512 = avx2 && f.avx512f && f.avx512bw && f.avx512vl;
  switch (isa) {
    case Isa::ref: return true;
    case Isa::avx2: return avx2;
    case Isa::avx2vnni: return avx2 && f.avxvnni;
    case Isa::avx512: return avx512;
    case Isa::avx512vnni: return avx512 && f.avx512vnni;
  }
  return false;
}

Isa best_isa(const CpuFeatures& f) {
  for (Isa i : {Isa::avx512vnni, Isa::avx512, Isa::avx2vnni, Isa::avx2})
    if (isa_supported(i, f)) return i;
  return Isa::ref;
}

Isa choose_isa(const CpuFeatures& f, const char* env_value, std::string_view* error) {
  const Isa best = best_isa(f);
  if (env_value == nullptr || env_value[0] == '\0') return best;
  const auto want = isa_from_name(env_value);
  if (!want) {
    if (error) *error = "unknown value (expected ref, avx2, avx2vnni, avx512 or avx512vnni)";
    return best;
  }
  for (int i = (int)*want; i > 0; --i)
    if (isa_supported((Isa)i, f)) return (Isa)i;
  return Isa::ref;
}

Isa selected_isa() {
  static const Isa isa = [] {
    const char* env = std::getenv("SERVAL_ISA");
    std::string_view err;
    const Isa i = choose_isa(cpu_features(), env, &err);
    if (!err.empty())
      std::fprintf(stderr, "serval: SERVAL_ISA='%s': %.*s; using %s\n", env, (int)err.size(), err.data(), isa_name(i));
    return i;
  }();
  return isa;
}

}  // namespace serval
