#!/usr/bin/env bash
# Installs the real SGLang server the test:sglang suite runs against (test/sglang), into a cache
# folder kept between runs on the same machine.
#
#   bash scripts/setup-sglang.sh [--require]
#
# The setup script: $TOKENMILL_REAL_SGLANG_SETUP, else ../shared/real-sglang/setup.sh beside the
# repository, else the one the install folder was last set up with (recorded there, so that a clone
# elsewhere on the same machine finds it). The install folder: $TOKENMILL_REAL_SGLANG_DIR, else
# ${XDG_CACHE_HOME:-$HOME/.cache}/tokenmill/real-sglang. Once installed, a stamp (the setup
# script's checksum) makes a rerun take well under a second; a changed setup script reruns it
# (setup.sh is itself idempotent). Without a setup script it says so and exits 0 (the tests then
# skip), or 1 with --require.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
REQUIRE=0
for a in "$@"; do
  case "$a" in
    --require) REQUIRE=1 ;;
    *) echo "setup-sglang: unknown argument $a (usage: setup-sglang.sh [--require])" >&2; exit 2 ;;
  esac
done

if [ -n "${TOKENMILL_REAL_SGLANG_SETUP:-}" ] && [ ! -f "$TOKENMILL_REAL_SGLANG_SETUP" ]; then
  echo "setup-sglang: TOKENMILL_REAL_SGLANG_SETUP=$TOKENMILL_REAL_SGLANG_SETUP is not a file" >&2
  exit 1
fi
DIR=${TOKENMILL_REAL_SGLANG_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tokenmill/real-sglang}
FROM="$DIR/.tokenmill-setup-from"
RECORDED=""
if [ -f "$FROM" ]; then RECORDED=$(cat "$FROM"); fi
SETUP=""
for c in "${TOKENMILL_REAL_SGLANG_SETUP:-}" "$ROOT/../shared/real-sglang/setup.sh" "$RECORDED"; do
  if [ -n "$c" ] && [ -f "$c" ]; then SETUP=$(cd "$(dirname "$c")" && pwd)/$(basename "$c"); break; fi
done
if [ -z "$SETUP" ]; then
  msg="setup-sglang: no real-SGLang setup script (looked at \$TOKENMILL_REAL_SGLANG_SETUP, $ROOT/../shared/real-sglang/setup.sh${RECORDED:+, $RECORDED}); npm run test:sglang will skip"
  if [ "$REQUIRE" = 1 ]; then echo "$msg" >&2; exit 1; fi
  echo "$msg"
  exit 0
fi

mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
FROM="$DIR/.tokenmill-setup-from"
echo "$SETUP" >"$FROM"
STAMP="$DIR/.tokenmill-setup-ok"
SUM=$(sha256sum "$SETUP" | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$SUM" ] && [ -x "$DIR/serve.sh" ] && [ -x "$DIR/venv/bin/python" ] && [ -f "$DIR/tiny-qwen3/model.safetensors" ]; then
  echo "setup-sglang: real SGLang installed in $DIR (serve with $DIR/serve.sh PORT [WAIT_S])"
  exit 0
fi
echo "setup-sglang: installing real SGLang with $SETUP into $DIR (a few minutes on a new machine)"
rm -f "$STAMP"
if ! bash "$SETUP" "$DIR"; then
  echo "setup-sglang: $SETUP failed for $DIR" >&2
  exit 1
fi
echo "$SUM" >"$STAMP"
echo "setup-sglang: real SGLang installed in $DIR (serve with $DIR/serve.sh PORT [WAIT_S])"
