#!/usr/bin/env bash
# Prints the N (default 10) slowest tests of a CTest run, from its console
# output (a file, or standard input): where CI time goes.
# Usage: slowest-tests.sh LOG [N]
set -euo pipefail
log=${1:--} n=${2:-10}
echo "-- slowest $n tests:"
sed -nE 's/.*Test +#[0-9]+: ([^ ]+) [. ]*(\*\*\*)?[A-Za-z ]+ +([0-9.]+) sec$/\3 \1/p' "$log" |
  sort -rn | head -n "$n" | awk '{ printf "   %8.2f s  %s\n", $1, $2 }'
