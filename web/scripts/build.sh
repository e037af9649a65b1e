#!/usr/bin/env bash
# Builds the web UI into OUT/dist and writes OUT/webui_assets.cpp, the source
# that embeds it in serval (run by CMake when a file under web/ changed).
# `npm ci` runs only when node_modules is missing or older than the lock file.
set -euo pipefail
out="$1"
cd "$(dirname "$0")/.."
if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  npm ci --no-audit --no-fund --loglevel=error
fi
npx --no-install vite build --outDir "$out/dist" --emptyOutDir --logLevel warn
node scripts/embed.mjs "$out/dist" "$out/webui_assets.cpp.tmp"
mv "$out/webui_assets.cpp.tmp" "$out/webui_assets.cpp"
