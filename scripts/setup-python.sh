#!/usr/bin/env bash
# Creates the Python environments the parity tests and data checks use, at the repository root:
#   main       .venv            scripts/requirements.txt            transformers + the current
#                                                                   `datasets` (no torch:
#                                                                   transformers loads tokenizers
#                                                                   without it)
#   datasets3  .venv-datasets3  scripts/requirements-datasets3.txt  `datasets` 3.6, the last
#                                                                   before 4.0, for the
#                                                                   compatibility tests
#   trainer    .venv            scripts/requirements-trainer.txt    main + torch (pinned), for
#                                                                   the reference trainer
#                                                                   (`npm run setup:trainer`)
#   trainers   .venv-trainers   scripts/requirements-trainers.txt   SpecForge 0.2.0 and
#                                                                   speculators 0.9.0 (their
#                                                                   data code, CPU torch), for
#                                                                   the trainer loader tests
#
#   bash scripts/setup-python.sh [main|datasets3|trainer]...   (no argument: main and datasets3)
#
# Idempotent: an environment built from its current requirements file whose packages import is
# left as it is. Concurrent runs (two test files at once) serialize on a lock file; the second
# one finds the environments ready and returns.
#
# Environment: PYTHON (default python3) is the interpreter the venvs are created from.
#
# Kept between checkouts: in a checkout without the venv folder (a fresh clone, e.g. CI's), the
# venv is built once per machine in ${XDG_CACHE_HOME:-$HOME/.cache}/tokenmill/venvs/, keyed by
# the interpreter and every requirements file, and the checkout's folder is a link to it; a later
# fresh clone links to the same one in well under a second. A venv folder the checkout already has
# is used where it is. TOKENMILL_VENV_CACHE=off builds every venv inside the checkout.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
LOCK="${TMPDIR:-/tmp}/tokenmill-venv-$(printf %s "$ROOT" | sha256sum | cut -c1-16).lock"
VENV_CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/tokenmill/venvs"
# What a cached venv is built from: the interpreter and every requirements file.
VENV_KEY="$(
  {
    "${PYTHON:-python3}" -c 'import sys; print(sys.executable, sys.version)'
    cat "$ROOT"/scripts/requirements*.txt
  } | sha256sum | cut -c1-16
)"

# name -> "venv folder|requirements file|modules that must import"
declare -A ENVS=(
  [main]=".venv|scripts/requirements.txt|transformers datasets tokenizers jinja2 pyarrow"
  [datasets3]=".venv-datasets3|scripts/requirements-datasets3.txt|datasets pyarrow"
  [trainer]=".venv|scripts/requirements-trainer.txt|torch datasets pyarrow"
  [trainers]=".venv-trainers|scripts/requirements-trainers.txt|torch datasets specforge.data.prompt_builder speculators.train.data"
)

# Builds one environment unless it is ready.
setup() {
  local spec="${ENVS[$1]:-}"
  if [ -z "$spec" ]; then
    echo "setup-python: unknown environment '$1' (expected one of: ${!ENVS[*]})" >&2
    exit 2
  fi
  local venv req modules
  IFS='|' read -r venv req modules <<<"$spec"
  local link=""
  if [ "${TOKENMILL_VENV_CACHE:-on}" != off ] && { [ -L "$ROOT/$venv" ] || [ ! -e "$ROOT/$venv" ]; }; then
    # Built (or found) in the machine's cache; the checkout's folder links to it.
    link="$ROOT/$venv"
    venv="$VENV_CACHE/${venv#.}-$VENV_KEY"
    mkdir -p "$VENV_CACHE"
  else
    venv="$ROOT/$venv"
  fi
  req="$ROOT/$req"
  # `trainer` shares .venv with `main`: each keeps its own stamp, so neither rebuilds the other.
  # Its requirements file includes main's (`-r requirements.txt`), so its stamp covers both.
  local py="$venv/bin/python" stamp="$venv/.requirements.sha256"
  local want imports
  if [ "$1" = trainer ]; then
    stamp="$venv/.requirements-trainer.sha256"
    want="$(cat "$req" "$(dirname "$req")/requirements.txt" | sha256sum | cut -d' ' -f1)"
  else
    want="$(sha256sum "$req" | cut -d' ' -f1)"
  fi
  # A `<name>.nodeps.txt` beside the requirements file is installed after it with --no-deps; the
  # stamp covers both.
  if [ -f "${req%.txt}.nodeps.txt" ]; then
    want="$(cat "$req" "${req%.txt}.nodeps.txt" | sha256sum | cut -d' ' -f1)"
  fi
  imports="import ${modules// /, }"
  if [ -x "$py" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$py" -c "$imports" >/dev/null 2>&1; then
    if [ -n "$link" ]; then ln -sfn "$venv" "$link"; fi
    return 0
  fi
  local started=$SECONDS
  echo "setup-python: creating $venv from $req" >&2
  rm -f "$stamp"
  "${PYTHON:-python3}" -m venv "$venv"
  "$py" -m pip install --quiet --disable-pip-version-check --no-input -r "$req"
  if [ -f "${req%.txt}.nodeps.txt" ]; then
    "$py" -m pip install --quiet --disable-pip-version-check --no-input --no-deps -r "${req%.txt}.nodeps.txt"
  fi
  "$py" -c "$imports" >/dev/null
  printf '%s\n' "$want" >"$stamp"
  if [ -n "$link" ]; then ln -sfn "$venv" "$link"; fi
  echo "setup-python: $venv ready in $((SECONDS - started)) s ($("$py" -c 'import datasets; print("datasets", datasets.__version__)' 2>/dev/null))" >&2
}

exec 9>"$LOCK"
flock 9
# Checkouts share the cached venvs: one builds, the others wait and find them ready.
mkdir -p "$VENV_CACHE"
exec 8>"$VENV_CACHE/.lock"
flock 8

if [ "$#" -eq 0 ]; then set -- main datasets3; fi
for name in "$@"; do setup "$name"; done
