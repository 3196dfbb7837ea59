#!/usr/bin/env bash
# tokenmill eval on a GPU machine, with a real DFlash drafter: the same check as eagle3-eval.sh
# (two SGLang servers — the target with the drafter, the target alone — `tokenmill eval
# --checkpoint <draft> --json` on held-out prompts, both servers stopped whatever happened),
# the drafter server run with `--speculative-algorithm DFLASH` (its block size and mask token
# read from the draft's config). At most about 10 minutes; nothing is downloaded.
#
#   bash bench/gpu/dflash-eval.sh TARGET_MODEL DRAFT_MODEL [PROMPTS] [OUT_DIR]
#
#   DRAFT_MODEL   a DFlash draft for the target, e.g. z-lab's Qwen3-8B-DFlash, or one the train
#                 step made (deploy/tokenmill.specforge-dflash.yaml, tokenmill.speculators-dflash.yaml)
# Environment: as eagle3-eval.sh (PYTHON, TOKENMILL, ports, GPUs, MEM_FRACTION, PROMPT_COUNT, …).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT_DIR="${4:-$ROOT/bench/results/gpu-dflash-eval-$(date -u +%Y%m%dT%H%M%SZ)}"
ALGORITHM=DFLASH exec bash "$ROOT/bench/gpu/eagle3-eval.sh" "${1:?usage: dflash-eval.sh TARGET_MODEL DRAFT_MODEL [PROMPTS] [OUT_DIR]}" \
  "${2:?usage: dflash-eval.sh TARGET_MODEL DRAFT_MODEL [PROMPTS] [OUT_DIR]}" "${3:-$ROOT/data/demo/B2_magicoder.jsonl}" "$OUT_DIR"
