#!/usr/bin/env bash
# Installs dependencies, builds, and runs the whole test suite (CTest, in
# parallel), then the hardening stages:
#   release  build/ (Release) and every CTest test (extra arguments go to ctest)
#   sanitize scripts/test-sanitize.sh: the same suite under clang ASan + UBSan
#            (build-fuzz/, which also holds the fuzz harnesses)
#   fuzz     scripts/fuzz.sh: each libFuzzer harness for SERVAL_FUZZ_SECONDS (30)
# SERVAL_TEST_STAGES picks stages (default: all three, what CI runs; on a
# clean 2-core machine release ~9 min, sanitize ~14, fuzz ~2).
# SERVAL_FUZZ_SECONDS sets each harness's time (default 20 here; the long mode
# is scripts/fuzz.sh --seconds N).
# Needs ../shared beside the checkout (models, goldens, tokenizer vectors).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -d ../shared/models ]; then
  echo "test.sh: ../shared (test data) is missing beside the checkout" >&2
  exit 2
fi
export SERVAL_WERROR="${SERVAL_WERROR:-ON}"  # a warning fails the build (build.sh, test-sanitize.sh)
export SERVAL_TEST_DEPS=1                     # install-deps.sh adds what only the tests need (Chromium)
start=$SECONDS
for stage in ${SERVAL_TEST_STAGES:-release sanitize fuzz}; do
  echo "== test.sh: $stage ($(date -u +%H:%M:%S))"
  stage_start=$SECONDS
  case "$stage" in
    release)
      ./scripts/build.sh
      ctest --preset release -j"$(nproc)" "$@" | tee build/ctest-release.log
      ./scripts/slowest-tests.sh build/ctest-release.log ;;
    sanitize) ./scripts/test-sanitize.sh ;;
    fuzz) ./scripts/fuzz.sh --seconds "${SERVAL_FUZZ_SECONDS:-20}" ;;
    *) echo "test.sh: unknown stage '$stage' (release, sanitize, fuzz)" >&2; exit 2 ;;
  esac
  echo "== test.sh: $stage took $((SECONDS - stage_start)) s"
done
echo "== test.sh: all stages passed in $((SECONDS - start)) s"
