#!/usr/bin/env bash
# Builds serval, its tests and the fuzz harnesses with clang-14 AddressSanitizer
# + UndefinedBehaviorSanitizer (preset `fuzz`, build-fuzz/: one sanitized build
# serves this script and scripts/fuzz.sh) and runs the whole CTest suite under
# them: the unit tests, and the server tests against the sanitized
# `serval serve`. A sanitizer report aborts the process it happens in, which
# fails its test. Extra arguments go to ctest (e.g. -L server).
# The x86 SIMD kernel files are built without UBSan (ASan and coverage stay):
# it tripled their compile time (fuzz/CMakeLists.txt).
# (The gcc `asan` preset, build-asan/, is the same check with gcc.)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -d ../shared/models ]; then
  echo "test-sanitize.sh: ../shared (test data) is missing beside the checkout" >&2
  exit 2
fi
./scripts/install-deps.sh
cmake --preset fuzz -DSERVAL_WERROR="${SERVAL_WERROR:-OFF}" >/dev/null
cmake --build --preset fuzz -j"$(nproc)"
export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:strict_string_checks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export SERVAL_SANITIZED=1              # server tests: no RSS-plateau checks (ASan quarantine)
export SERVAL_TIME_SCALE="${SERVAL_TIME_SCALE:-4}"  # latency bounds x4 for the slower binaries
# The soak's growth checks are the release stage's; here it only has to run
# clean under the sanitizers, so a shorter one does.
export SERVAL_SOAK_SECONDS="${SERVAL_SOAK_SECONDS:-15}"
# Left to the release stage: the Node SDK suite (label network; nothing native
# to check), the teacher-forced comparison of every mini quant format (75 s
# in Release, over 5 min under ASan; the same forward code runs here through
# the stories260K golden, batch-forward and kernel tests) and the chi-square
# test of speculative sampling (4000 requests: 78 s under ASan; a statistical
# check, while the same accept/reject code runs here in the other SpecEngine
# and speculative sampler tests), and the mini IQ/TQ quantizer comparison
# against ik_llama.cpp's files (20 s per type under ASan: a quality check; the
# same quantizer code runs here through tests/kernels/quant_iq_test.cpp's
# round-trip and hostile-row tests).
ctest --preset fuzz -j"$(nproc)" -LE 'network|mpi' \
  -E 'MiniFormatsTeacherForcedMatchLlamaCpp|MiniIqFormatsTeacherForcedMatchLlamaCpp|IqFormatsTeacherForcedMatchLlamaCppAtEveryLevel|SpecEngine.SampledDistributionMatchesTarget|IqQuantize.ServalIsAtLeastAsCloseAsTheReferenceQuantizer' "$@" |
  tee build-fuzz/ctest-sanitize.log
./scripts/slowest-tests.sh build-fuzz/ctest-sanitize.log
