#!/usr/bin/env bash
# Installs dependencies, builds, and runs the whole test suite (CTest, in
# parallel), then the hardening stages:
#   release  build/ (Release) and every CTest test (extra arguments go to ctest)
#   sanitize scripts/test-sanitize.sh: the same suite under clang ASan + UBSan
#            (build-fuzz/, which also holds the fuzz harnesses)
#   fuzz     scripts/fuzz.sh: each libFuzzer harness for SERVAL_FUZZ_SECONDS (30)
# SERVAL_TEST_STAGES picks stages (default "release": the sanitized build
# alone takes about 12 minutes on 2 cores, which would put CI past its 30;
# run "release sanitize fuzz" for the whole hardening pass).
# Needs ../shared beside the checkout (models, goldens, tokenizer vectors).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -d ../shared/models ]; then
  echo "test.sh: ../shared (test data) is missing beside the checkout" >&2
  exit 2
fi
for stage in ${SERVAL_TEST_STAGES:-release}; do
  echo "== test.sh: $stage ($(date -u +%H:%M:%S))"
  case "$stage" in
    release) ./scripts/build.sh && ctest --preset release -j"$(nproc)" "$@" ;;
    sanitize) ./scripts/test-sanitize.sh ;;
    fuzz) ./scripts/fuzz.sh --seconds "${SERVAL_FUZZ_SECONDS:-30}" ;;
    *) echo "test.sh: unknown stage '$stage' (release, sanitize, fuzz)" >&2; exit 2 ;;
  esac
done
