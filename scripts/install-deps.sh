#!/usr/bin/env bash
# Installs every build and test dependency of serval from Debian 12 packages.
# Idempotent: packages already present are skipped by apt-get; safe to re-run.
set -euo pipefail

PKGS=(
  cmake ninja-build g++ pkg-config
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libcli11-dev
  python3 python3-jinja2 python3-jsonschema
  libpcre2-dev
  libsqlite3-dev                                 # batch jobs' state (src/server/batch_store)
  libtomlplusplus-dev libssl-dev                 # serval gateway: TOML config, SHA-256 of API keys (src/gateway)
  libopenmpi-dev openmpi-bin                     # --tp: tensor parallelism across processes (src/parallel)
  libboost-dev curl nodejs
  prometheus
  qemu-user                                      # tests/dispatch: the binary on CPUs without AVX-512 / AVX2
  clang-14 libclang-rt-14-dev libfuzzer-14-dev   # scripts/fuzz.sh (libFuzzer + ASan/UBSan runtimes)
)
# The test suite also drives the web UI in a real browser (tests/webui):
# scripts/test.sh sets SERVAL_TEST_DEPS=1. npm comes with Node.js (a separate
# Debian package only where Node.js is Debian's own).
if [ "${SERVAL_TEST_DEPS:-0}" = 1 ]; then
  PKGS+=(chromium)
fi
command -v npm >/dev/null 2>&1 || PKGS+=(npm)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all packages present"
  exit 0
fi

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
