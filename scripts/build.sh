#!/usr/bin/env bash
# Installs dependencies (Debian 12 packages) and builds serval in build/ (Release).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
cmake --preset release >/dev/null
cmake --build --preset release -j"$(nproc)"
