// Compiling a region of a file for an ISA, the same way with GCC and clang:
// functions declared between SERVAL_TARGET_BEGIN("avx2,fma,f16c") and
// SERVAL_TARGET_END get that target (GCC: `#pragma GCC target`; clang, which
// ignores it: `#pragma clang attribute` with the target attribute). The file
// itself needs no -m flags, so a new kernel file needs no build-system entry;
// the kernel table picks an ISA at run time (kernels/dispatch).
#pragma once

#define SERVAL_PRAGMA(x) _Pragma(#x)

#if defined(__clang__)
#define SERVAL_TARGET_BEGIN(t) SERVAL_PRAGMA(clang attribute push(__attribute__((target(t))), apply_to = function))
#define SERVAL_TARGET_END SERVAL_PRAGMA(clang attribute pop)
#else
#define SERVAL_TARGET_BEGIN(t) SERVAL_PRAGMA(GCC push_options) SERVAL_PRAGMA(GCC target(t))
#define SERVAL_TARGET_END SERVAL_PRAGMA(GCC pop_options)
#endif

// GCC 12's AVX-512 headers build _mm512_undefined_*() from self-initialized
// locals, which -Wuninitialized reports at every inlined use.
#if defined(__clang__)
#define SERVAL_AVX512_DIAGNOSTICS_BEGIN
#define SERVAL_AVX512_DIAGNOSTICS_END
#else
#define SERVAL_AVX512_DIAGNOSTICS_BEGIN                      \
  SERVAL_PRAGMA(GCC diagnostic push)                         \
  SERVAL_PRAGMA(GCC diagnostic ignored "-Wuninitialized")    \
  SERVAL_PRAGMA(GCC diagnostic ignored "-Wmaybe-uninitialized")
#define SERVAL_AVX512_DIAGNOSTICS_END SERVAL_PRAGMA(GCC diagnostic pop)
#endif
