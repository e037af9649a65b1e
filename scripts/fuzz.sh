#!/usr/bin/env bash
# Builds the libFuzzer harnesses (preset `fuzz`: clang-14, ASan + UBSan, in
# build-fuzz/; only the fuzz_all target) and runs each for a bounded time.
#
#   scripts/fuzz.sh                     CI mode: every harness 30 s, 2 at a time
#   scripts/fuzz.sh --seconds 1800      long mode (docs/RELIABILITY.md figures)
#   scripts/fuzz.sh --jobs 1 gguf http_request
#   scripts/fuzz.sh --no-build ...      run what build-fuzz/ already holds
#
# Seeds: fuzz/corpus/<harness>/ (read-only, in the repo) plus, for the chat
# templates and the tokenizer, ../shared's real templates and test vectors.
# The growing corpus lives in build-fuzz/corpus/<harness>/; findings (crashes,
# sanitizer reports, timeouts, out-of-memory, single allocations past
# --malloc-limit-mb) in build-fuzz/artifacts/. Exit status 1 if any harness
# found something; each harness's log is printed on failure.
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_EACH=30
JOBS=2
RSS_MB=2048      # a process past this is a finding (libFuzzer -rss_limit_mb)
MALLOC_MB=512    # one allocation past this is a finding (-malloc_limit_mb)
TIMEOUT_S=10     # one input running longer is a finding
ALL=(gguf tokenizer chat_template openai_request http_request grammar batch_input output_parser api_translation embeddings_api gateway)
HARNESSES=()
BUILD=1
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) SECONDS_EACH="$2"; shift 2 ;;
    --jobs) JOBS="$2"; shift 2 ;;
    --rss-limit-mb) RSS_MB="$2"; shift 2 ;;
    --malloc-limit-mb) MALLOC_MB="$2"; shift 2 ;;
    --no-build) BUILD=0; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) HARNESSES+=("$1"); shift ;;
  esac
done
[ ${#HARNESSES[@]} -gt 0 ] || HARNESSES=("${ALL[@]}")
if [ ! -d ../shared/models ]; then
  echo "fuzz.sh: ../shared (test data) is missing beside the checkout" >&2
  exit 2
fi

if [ "$BUILD" = 1 ]; then
  cmake --preset fuzz >/dev/null
  cmake --build --preset fuzz --target fuzz_all -j"${FUZZ_BUILD_JOBS:-$(nproc)}"
fi

OUT=build-fuzz
mkdir -p "$OUT/artifacts" "$OUT/logs"

run_one() {
  local h="$1" max_len extra=()
  case "$h" in
    gguf) max_len=65536 ;;
    chat_template) max_len=16384; extra=(../shared/chat-templates) ;;
    tokenizer) max_len=4096 ;;
    *) max_len=16384 ;;
  esac
  mkdir -p "$OUT/corpus/$h"
  local log="$OUT/logs/$h.log"
  if "$OUT/fuzz/fuzz_$h" "$OUT/corpus/$h" "fuzz/corpus/$h" "${extra[@]}" \
      -max_total_time="$SECONDS_EACH" -rss_limit_mb="$RSS_MB" -malloc_limit_mb="$MALLOC_MB" \
      -timeout="$TIMEOUT_S" -max_len="$max_len" -print_final_stats=1 \
      -artifact_prefix="$OUT/artifacts/$h-" >"$log" 2>&1; then
    local execs
    execs=$(grep -m1 'stat::number_of_executed_units' "$log" | awk '{print $2}')
    echo "fuzz $h: OK, ${execs:-?} executions in ${SECONDS_EACH} s, corpus $(ls "$OUT/corpus/$h" | wc -l) inputs"
  else
    echo "fuzz $h: FINDING (log $log)"
    grep -E -A30 '^==[0-9]+==ERROR|runtime error|invariant violated|fuzz setup|ALARM|out-of-memory|malloc\(' "$log" | head -60
    return 1
  fi
}
export -f run_one
export OUT SECONDS_EACH RSS_MB MALLOC_MB TIMEOUT_S

printf '%s\n' "${HARNESSES[@]}" | xargs -P "$JOBS" -I{} bash -c 'run_one {}' && exit 0
echo "fuzz.sh: findings in $OUT/artifacts (reproduce: $OUT/fuzz/fuzz_<harness> <artifact>)" >&2
exit 1
