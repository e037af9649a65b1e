#!/usr/bin/env bash
# Installs dependencies, builds, and runs the whole test suite (CTest, in parallel).
# Needs ../shared beside the checkout (models, goldens, tokenizer vectors).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -d ../shared/models ]; then
  echo "test.sh: ../shared (test data) is missing beside the checkout" >&2
  exit 2
fi
./scripts/build.sh
ctest --preset release -j"$(nproc)" "$@"
