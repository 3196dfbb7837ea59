#!/usr/bin/env bash
# Creates the Python environment the parity tests and data checks use: .venv at the repository
# root, with the pinned packages of scripts/requirements.txt (no torch: transformers loads
# tokenizers without it).
#
# Idempotent: does nothing when .venv was built from the current requirements.txt and its
# packages import. Concurrent runs (two test files at once) serialize on a lock file; the
# second one finds the environment ready and returns.
#
# Environment: PYTHON (default python3) is the interpreter the venv is created from.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="$VENV/bin/python"
REQ="$ROOT/scripts/requirements.txt"
STAMP="$VENV/.requirements.sha256"
WANT="$(sha256sum "$REQ" | cut -d' ' -f1)"
export TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
LOCK="${TMPDIR:-/tmp}/tokenmill-venv-$(printf %s "$ROOT" | sha256sum | cut -c1-16).lock"

ready() {
  [ -x "$PY" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] &&
    "$PY" -c 'import transformers, datasets' >/dev/null 2>&1
}

exec 9>"$LOCK"
flock 9

if ready; then
  exit 0
fi

echo "setup-python: creating $VENV from $REQ" >&2
rm -f "$STAMP"
"${PYTHON:-python3}" -m venv "$VENV"
"$PY" -m pip install --quiet --disable-pip-version-check --no-input -r "$REQ"
"$PY" -c 'import transformers, datasets, tokenizers, jinja2, pyarrow' >/dev/null
printf '%s\n' "$WANT" >"$STAMP"
echo "setup-python: ready ($("$PY" -c 'import transformers; print("transformers", transformers.__version__)' 2>/dev/null))" >&2
