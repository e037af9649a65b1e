#!/usr/bin/env bash
# Installs dependencies (Debian 12 packages) and builds serval in build/ (Release).
# SERVAL_WERROR=ON makes compiler warnings errors (scripts/test.sh sets it).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
cmake --preset release -DSERVAL_WERROR="${SERVAL_WERROR:-OFF}" >/dev/null
cmake --build --preset release -j"$(nproc)"
