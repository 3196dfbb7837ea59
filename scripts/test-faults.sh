#!/usr/bin/env bash
# The fault suite (test/faults, vitest.faults.config.ts): its files run one at a time, so that their
# timing-sensitive assertions never compete with each other for the CPU. One file is the exception:
# redis-gone.test.ts spends most of its 80 s waiting on a Redis that is gone (the outage line, the
# 30 s reminder, the stop's grace), so it runs beside the others; its output follows theirs.
#
#   bash scripts/test-faults.sh                 the whole suite
#   bash scripts/test-faults.sh <vitest args>   those files or tests only, one at a time
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ "$#" -gt 0 ]; then exec npx vitest run -c vitest.faults.config.ts "$@"; fi

BESIDE=test/faults/redis-gone.test.ts
out="$(mktemp "${TMPDIR:-/tmp}/tokenmill-faults-XXXXXX.log")"
trap 'rm -f "$out"' EXIT

npx vitest run -c vitest.faults.config.ts "$BESIDE" >"$out" 2>&1 &
beside=$!
npx vitest run -c vitest.faults.config.ts --exclude "$BESIDE"
rest=$?
wait "$beside"
gone=$?
echo "--- $BESIDE (run beside the others) ---"
cat "$out"
if [ "$rest" -ne 0 ]; then exit "$rest"; fi
exit "$gone"
