#!/usr/bin/env bash
# Prints the N (default 10) slowest tests of a CTest run, from its console
# output (a file, or standard input): where CI time goes.
# Usage: slowest-tests.sh LOG [N]
# (awk reads all of sort's output: `head` would close the pipe early, and
# under pipefail sort's SIGPIPE (exit 141) failed a CI run.)
set -euo pipefail
log=${1:--} n=${2:-10}
echo "-- slowest $n tests:"
sed -nE 's/.*Test +#[0-9]+: ([^ ]+) [. ]*(\*\*\*)?[A-Za-z ]+ +([0-9.]+) sec$/\3 \1/p' "$log" |
  sort -rn | awk -v n="$n" 'NR <= n { printf "   %8.2f s  %s\n", $1, $2 }'
