"""The draft vocabulary of a SpecForge 0.2 EAGLE-3 run, from tokenmill's token rows.

SpecForge's online (disaggregated) EAGLE-3 training needs `model.vocab_mapping_path` as a file:
producer and consumer cannot derive one shared mapping, and SpecForge 0.2 has no command that
makes one from pre-tokenized prompts (its offline capture script writes one for its features).
This script makes it from the same rows the trainer reads (`tokenmill export --format jsonl`):
the supervised tokens (loss_mask 1) of each row, cut at `data.max_length` as SpecForge cuts
them, counted, and turned into the `{"d2t", "t2d"}` tensors by SpecForge's own
`specforge.data.preprocessing.process_token_dict_to_mappings` (the most frequent
draft_vocab_size tokens). Rows with no supervised token left are skipped, as SpecForge skips
them.

    python specforge_vocab_mapping.py --rows rows.jsonl --target-model-path /models/Qwen3-8B \
        --draft-model-config qwen3-8b-eagle3.json --max-length 4096 --out vocab_mapping.pt

Prints one JSON line: rows read, rows counted, supervised tokens, distinct tokens, and the share
of supervised tokens the draft vocabulary covers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from pathlib import Path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", required=True, help="token rows: tokenmill export --format jsonl")
    parser.add_argument(
        "--target-model-path", required=True, help="target model folder (its config.json: vocab_size)"
    )
    parser.add_argument(
        "--draft-model-config", required=True, help="draft config JSON (draft_vocab_size)"
    )
    parser.add_argument("--max-length", type=int, required=True, help="data.max_length of the run")
    parser.add_argument("--out", required=True, help="file to write (model.vocab_mapping_path)")
    return parser.parse_args(argv)


def read_json(path: Path, what: str) -> dict:
    try:
        with path.open(encoding="utf-8") as f:
            value = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise SystemExit(f"{path}: cannot read the {what}: {e}") from e
    if not isinstance(value, dict):
        raise SystemExit(f"{path}: the {what} is not a JSON object")
    return value


def target_vocab_size(model_path: str) -> int:
    path = Path(model_path) / "config.json"
    config = read_json(path, "target model config")
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    size = text.get("vocab_size")
    if not isinstance(size, int) or size <= 0:
        raise SystemExit(f"{path}: no positive vocab_size")
    return size


def draft_vocab_size(config_path: str) -> int:
    path = Path(config_path)
    config = read_json(path, "draft model config")
    size = config.get("draft_vocab_size", config.get("vocab_size"))
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
        raise SystemExit(f"{path}: no positive draft_vocab_size (or vocab_size)")
    return size


def count_supervised(rows_path: str, max_length: int) -> tuple[Counter, dict[str, int]]:
    counts: Counter = Counter()
    stats = {"rows": 0, "counted": 0, "tokens": 0}
    with open(rows_path, encoding="utf-8") as f:
        for line_number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            row = json.loads(line)
            ids, mask = row.get("input_ids"), row.get("loss_mask")
            if not isinstance(ids, list) or not isinstance(mask, list) or len(ids) != len(mask):
                raise SystemExit(f"{rows_path}:{line_number}: expected input_ids and loss_mask of one length")
            stats["rows"] += 1
            supervised = [t for t, m in zip(ids[:max_length], mask[:max_length]) if m == 1]
            if not supervised:
                continue
            stats["counted"] += 1
            stats["tokens"] += len(supervised)
            counts.update(supervised)
    return counts, stats


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.max_length <= 0:
        raise SystemExit("--max-length must be positive")
    target = target_vocab_size(args.target_model_path)
    draft = draft_vocab_size(args.draft_model_config)
    if draft > target:
        raise SystemExit(f"draft_vocab_size {draft} exceeds the target's vocab_size {target}")
    counts, stats = count_supervised(args.rows, args.max_length)
    if stats["counted"] == 0:
        raise SystemExit(f"{args.rows}: no row has a supervised token within --max-length {args.max_length}")
    out_of_vocab = [t for t in counts if not 0 <= t < target]
    if out_of_vocab:
        raise SystemExit(f"{args.rows}: token ids outside the target's vocabulary ({target}): {sorted(out_of_vocab)[:10]}")
    distinct = len(counts)
    covered = sum(n for _, n in counts.most_common(draft))

    import torch
    from specforge.data.preprocessing import process_token_dict_to_mappings

    # SpecForge prints its own summary lines; this script's result goes to stdout last.
    stdout = sys.stdout
    sys.stdout = sys.stderr
    try:
        d2t, t2d = process_token_dict_to_mappings(counts, draft, target)
    finally:
        sys.stdout = stdout
    if tuple(d2t.shape) != (draft,) or tuple(t2d.shape) != (target,):
        raise SystemExit(f"unexpected mapping shapes d2t {tuple(d2t.shape)}, t2d {tuple(t2d.shape)}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    torch.save({"d2t": d2t, "t2d": t2d}, tmp)
    os.replace(tmp, out)
    print(
        json.dumps(
            {
                "out": str(out),
                "rows": stats["rows"],
                "rowsCounted": stats["counted"],
                "supervisedTokens": stats["tokens"],
                "distinctTokens": distinct,
                "draftVocabSize": draft,
                "targetVocabSize": target,
                "coverage": covered / stats["tokens"],
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
