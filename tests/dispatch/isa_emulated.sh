#!/usr/bin/env bash
# The binaries on CPUs older than this machine, under qemu-user: Haswell
# (AVX2, FMA, F16C; no AVX-512) and Nehalem (SSE4.2; no AVX). On each, run-time
# dispatch must pick the best level the CPU has (and never an instruction it
# lacks: that would be SIGILL), the kernels at that level must match the
# scalar reference, and greedy generation must reproduce llama.cpp's golden.
# The kernel tests run on Haswell only: on Nehalem the only level is ref, the
# same scalar code the native run checks, and the golden runs it end to end.
# Under qemu (its AVX2 is over 1000x slower than native: stories260K decodes
# about 20 tokens a second) the tests take one shape of each kind and the
# golden its first case per KV type (SERVAL_TEST_EMULATED,
# tests/kernels/isa_levels.h): what this adds to the native run of every shape
# and case is the emulated CPU's instruction set.
# Usage: isa_emulated.sh SERVAL TEST_KERNELS TEST_ENGINE SHARED_DIR
# Exits 77 (CTest: skipped) without qemu-x86_64 (package qemu-user).
set -euo pipefail
serval=$1 test_kernels=$2 test_engine=$3 shared=$4
if ! command -v qemu-x86_64 >/dev/null; then
  echo "isa_emulated: qemu-x86_64 not installed (apt-get install qemu-user): skipped"
  exit 77
fi
model="$shared/models/stories260K.gguf"
export SERVAL_TEST_EMULATED=1
fail=0
for pair in Haswell:avx2 Nehalem:ref; do
  cpu=${pair%%:*} want=${pair##*:}
  q=(qemu-x86_64 -cpu "$cpu")
  echo "== $cpu (expect the $want kernels)"
  isa=$("${q[@]}" "$serval" bench model -m "$model" -p 8 -n 4 -r 1 -t 1 -o json 2>/dev/null |
        sed -n 's/.*"cpu_isa": *"\([^"]*\)".*/\1/p' | head -1)
  if [ "$isa" != "$want" ]; then
    echo "FAIL: on $cpu serval picked '$isa', expected '$want'"
    fail=1
  fi
  if [ "$want" != ref ] &&
     ! "${q[@]}" "$test_kernels" --gtest_brief=1 \
       --gtest_filter='KernelLevels.*:AttentionTile.*:LoraRow.*' 2>/dev/null; then
    echo "FAIL: kernel tests on $cpu"
    fail=1
  fi
  if ! "${q[@]}" "$test_engine" --gtest_brief=1 --gtest_filter='Engine.GreedyMatchesGolden' 2>/dev/null; then
    echo "FAIL: the stories260K golden on $cpu"
    fail=1
  fi
done
exit $fail
