#!/usr/bin/env bash
# tokenmill eval on a GPU machine, with a real EAGLE-3 drafter: starts two SGLang servers (the
# target with the drafter, and the target alone), waits until both answer /health_generate,
# runs `tokenmill eval --checkpoint <draft> --json` on a held-out prompt file, stops both servers
# (their whole process groups) whatever happened, and writes the report. At most about 10 minutes;
# nothing is downloaded: the models, SGLang and this checkout must be on the machine.
#
#   bash bench/gpu/eagle3-eval.sh TARGET_MODEL DRAFT_MODEL [PROMPTS] [OUT_DIR]
#
#   TARGET_MODEL  the target's folder (config.json, weights, tokenizer.json), e.g. /models/Qwen3-8B
#   DRAFT_MODEL   an EAGLE-3 drafter for it, e.g. /models/Qwen3-8B-EAGLE3 (a public one, or one
#                 tokenmill's train step made)
#   PROMPTS       held-out prompts (tokenmill's prompt JSONL, e.g. <run>/<dataset>/eval-prompts.jsonl);
#                 default: data/demo/B2_magicoder.jsonl of this checkout
#   OUT_DIR       default: bench/results/gpu-eagle3-eval-<UTC time>
#
# Environment (all optional):
#   PYTHON=python3          the interpreter with sglang installed
#   TOKENMILL="node bin/tokenmill.js"   how to run tokenmill (default: this checkout's source with tsx, else bin/)
#   DRAFTER_PORT=30100 BASELINE_PORT=30101
#   DRAFTER_GPU=0 BASELINE_GPU=1   with one GPU both servers share GPU 0 (MEM_FRACTION each)
#   MEM_FRACTION=0.40       --mem-fraction-static of each server when they share a GPU (0.80 alone)
#   NUM_STEPS=3 TOPK=1 DRAFT_TOKENS=4   the speculative settings of an EAGLE-3 drafter server
#   ALGORITHM=EAGLE3        or DFLASH (bench/gpu/dflash-eval.sh sets it): the drafter server then
#                           runs --speculative-algorithm DFLASH, its block size and mask token
#                           read from the draft's own config
#   PROMPT_COUNT=64 MAX_NEW_TOKENS=256 CONCURRENCY=16
#   HEALTH_TIMEOUT_S=360 EVAL_TIMEOUT_S=180
#
# It measures, per prompt set: the drafter's acceptance length (Σ completion tokens / Σ
# spec_verify_ct, as SGLang counts it), acceptance rate, the histogram of drafts accepted per
# verify step, output tok/s with the drafter and without it at CONCURRENCY in flight, and the
# speed-up: the figures of docs/eval.md, on real hardware instead of the simulator.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TARGET_MODEL="${1:?usage: eagle3-eval.sh TARGET_MODEL DRAFT_MODEL [PROMPTS] [OUT_DIR]}"
DRAFT_MODEL="${2:?usage: eagle3-eval.sh TARGET_MODEL DRAFT_MODEL [PROMPTS] [OUT_DIR]}"
PROMPTS="${3:-$ROOT/data/demo/B2_magicoder.jsonl}"
OUT_DIR="${4:-$ROOT/bench/results/gpu-eagle3-eval-$(date -u +%Y%m%dT%H%M%SZ)}"
PYTHON="${PYTHON:-python3}"
DRAFTER_PORT="${DRAFTER_PORT:-30100}"
BASELINE_PORT="${BASELINE_PORT:-30101}"
NUM_STEPS="${NUM_STEPS:-3}"
TOPK="${TOPK:-1}"
DRAFT_TOKENS="${DRAFT_TOKENS:-4}"
ALGORITHM="${ALGORITHM:-EAGLE3}"
case "$ALGORITHM" in
  EAGLE3) SPEC_ARGS=(--speculative-algorithm EAGLE3 --speculative-draft-model-path "$DRAFT_MODEL"
    --speculative-num-steps "$NUM_STEPS" --speculative-eagle-topk "$TOPK" --speculative-num-draft-tokens "$DRAFT_TOKENS") ;;
  DFLASH) SPEC_ARGS=(--speculative-algorithm DFLASH --speculative-draft-model-path "$DRAFT_MODEL") ;;
  *) echo "eagle3-eval: ALGORITHM must be EAGLE3 or DFLASH, got $ALGORITHM" >&2; exit 2 ;;
esac
PROMPT_COUNT="${PROMPT_COUNT:-64}"
MAX_NEW_TOKENS="${MAX_NEW_TOKENS:-256}"
CONCURRENCY="${CONCURRENCY:-16}"
HEALTH_TIMEOUT_S="${HEALTH_TIMEOUT_S:-360}"
EVAL_TIMEOUT_S="${EVAL_TIMEOUT_S:-180}"

for p in "$TARGET_MODEL/config.json" "$DRAFT_MODEL/config.json" "$PROMPTS"; do
  [[ -e "$p" ]] || { echo "eagle3-eval: $p does not exist" >&2; exit 2; }
done
command -v nvidia-smi >/dev/null || { echo 'eagle3-eval: no nvidia-smi: this script needs a GPU machine' >&2; exit 2; }
"$PYTHON" -c 'import sglang' 2>/dev/null || { echo "eagle3-eval: $PYTHON cannot import sglang (set PYTHON)" >&2; exit 2; }
if [[ -n "${TOKENMILL:-}" ]]; then
  read -r -a TM <<<"$TOKENMILL"
elif [[ -d "$ROOT/node_modules/tsx" ]]; then
  # This checkout's source, as it is (dist/ may be older).
  TM=(node --import "$(cd "$ROOT" && node --input-type=module -e "process.stdout.write(import.meta.resolve('tsx'))")" "$ROOT/src/cli/main.ts")
else
  TM=(node "$ROOT/bin/tokenmill.js")
fi

GPUS=$(nvidia-smi --query-gpu=index,name,memory.total,memory.free,driver_version --format=csv | tail -n +2 | grep -c .)
DRAFTER_GPU="${DRAFTER_GPU:-0}"
if [[ -z "${BASELINE_GPU:-}" ]]; then BASELINE_GPU=$([[ "$GPUS" -ge 2 ]] && echo 1 || echo 0); fi
if [[ "$DRAFTER_GPU" == "$BASELINE_GPU" ]]; then MEM="${MEM_FRACTION:-0.40}"; else MEM="${MEM_FRACTION:-0.80}"; fi

mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
{
  echo "started $(date -u +%FT%TZ)"
  echo "target $TARGET_MODEL"
  echo "draft $DRAFT_MODEL"
  echo "prompts $PROMPTS (first $PROMPT_COUNT)"
  echo "drafter GPU $DRAFTER_GPU, baseline GPU $BASELINE_GPU, mem-fraction-static $MEM"
  nvidia-smi --query-gpu=index,name,memory.total,memory.free,driver_version --format=csv
  "$PYTHON" -c 'import sglang, torch; print("sglang", sglang.__version__, "torch", torch.__version__, "cuda", torch.version.cuda)'
} >"$OUT_DIR/machine.txt" 2>&1

PGIDS=()
stop_servers() {
  local pg
  for pg in "${PGIDS[@]}"; do kill -TERM -- "-$pg" 2>/dev/null || true; done
  for _ in $(seq 1 30); do
    local left=0
    for pg in "${PGIDS[@]}"; do kill -0 -- "-$pg" 2>/dev/null && left=1; done
    [[ "$left" == 0 ]] && return 0
    sleep 1
  done
  for pg in "${PGIDS[@]}"; do kill -KILL -- "-$pg" 2>/dev/null || true; done
}
trap stop_servers EXIT INT TERM

start_server() { # name gpu port args...
  local name="$1" gpu="$2" port="$3"
  shift 3
  CUDA_VISIBLE_DEVICES="$gpu" setsid "$PYTHON" -m sglang.launch_server --model-path "$TARGET_MODEL" \
    --host 127.0.0.1 --port "$port" --mem-fraction-static "$MEM" "$@" >"$OUT_DIR/$name.log" 2>&1 &
  PGIDS+=("$!")
}

start_server drafter "$DRAFTER_GPU" "$DRAFTER_PORT" "${SPEC_ARGS[@]}"
start_server baseline "$BASELINE_GPU" "$BASELINE_PORT"

deadline=$((SECONDS + HEALTH_TIMEOUT_S))
for port in "$DRAFTER_PORT" "$BASELINE_PORT"; do
  until curl -sf -o /dev/null "http://127.0.0.1:$port/health_generate"; do
    for pg in "${PGIDS[@]}"; do
      kill -0 "$pg" 2>/dev/null || { echo "eagle3-eval: a server exited while starting; see $OUT_DIR/*.log" >&2; tail -n 20 "$OUT_DIR"/*.log >&2; exit 1; }
    done
    [[ $SECONDS -lt $deadline ]] || { echo "eagle3-eval: port $port not healthy within $HEALTH_TIMEOUT_S s; see $OUT_DIR/*.log" >&2; exit 1; }
    sleep 2
  done
done
echo "servers healthy after ${SECONDS} s" >>"$OUT_DIR/machine.txt"

cat >"$OUT_DIR/tokenmill.yaml" <<YAML
# Written by bench/gpu/eagle3-eval.sh: tokenmill eval against the two servers it started.
run: gpu-eagle3-eval
tokenizer: { path: $TARGET_MODEL }
datasets:
  - { name: heldout, prompts: $PROMPTS, tokenBudget: 1 }
output: { dir: $OUT_DIR/out }
eval:
  endpoints: [http://127.0.0.1:$DRAFTER_PORT]
  baseline: [http://127.0.0.1:$BASELINE_PORT]
  prompts: $PROMPTS
  maxPromptsPerDataset: $PROMPT_COUNT
  maxNewTokens: $MAX_NEW_TOKENS
  concurrency: $CONCURRENCY
YAML

status=0
timeout "$EVAL_TIMEOUT_S" "${TM[@]}" eval -c "$OUT_DIR/tokenmill.yaml" --checkpoint "$DRAFT_MODEL" --json \
  --out "$OUT_DIR/eval.json" >"$OUT_DIR/eval-stdout.json" 2>"$OUT_DIR/eval-stderr.txt" || status=$?
stop_servers
trap - EXIT INT TERM
echo "finished $(date -u +%FT%TZ), tokenmill eval exit code $status" >>"$OUT_DIR/machine.txt"
if [[ -s "$OUT_DIR/eval.json" ]]; then
  node -e '
    const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
    const o = r.overall;
    console.log(`accept length ${o.drafter.acceptLength?.toFixed(3)}, accept rate ${o.drafter.acceptRate?.toFixed(3)}, ` +
      `drafter ${o.drafter.tokensPerSec?.toFixed(1)} tok/s, baseline ${o.baseline?.tokensPerSec?.toFixed(1)} tok/s, speed-up ${o.speedup?.toFixed(3)}x`);
    console.log(`histogram ${(o.drafter.histogram ?? []).join(" ")}`);
    for (const w of r.warnings) console.log(`WARNING: ${w}`);
  ' "$OUT_DIR/eval.json" | tee "$OUT_DIR/summary.txt"
else
  echo "eagle3-eval: no report; tokenmill eval exited $status:" >&2
  tail -n 20 "$OUT_DIR/eval-stderr.txt" >&2
fi
echo "eagle3-eval: results in $OUT_DIR"
exit "$status"
