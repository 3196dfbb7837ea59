"""Re-derives training rows from tokenmill's SpecForge export with Python transformers.

Reads one JSON object on stdin:
    {"tokenizer_dir": str, "specforge": <export file>, "rows": <jsonl export file>,
     "target": <training dataset folder>}
and writes one JSON object on stdout:
    {"versions": {...}, "target_rows": int, "jsonl_equal": int, "jsonl_rows": int,
     "results": [{"id", "dataset", "prompt_tokens", "input_ids_equal", "mask_equal_after_prompt",
                  "prompt_has_assistant", "kind", "detail", "text_is_row", "text_reencodes"}]}

For each exported line, the conversation is rendered and tokenized by transformers
(apply_chat_template(conversations, tokenize=True)), and its loss mask computed with SpecForge's
GeneralParser rule, implemented here on its own: supervised spans are
re.escape(header) + "([\\s\\S]*?(?:" + re.escape(turn_end) + "|$))" over the rendered text, less
an ignorable prefix at their start; a token is supervised when its offsets overlap a span.
The result is compared with the row tokenmill made from the same generation (read with
datasets.load_from_disk). A difference is classified:
  "empty-think": the rendering holds Qwen3's empty <think>\\n\\n</think>\\n\\n block after the
                 last assistant header, the row does not, and removing it gives the row;
  "stop-without-end-of-turn": the row ends with another end token than the template's, and the
                 rendering ends with the template's turn end instead;
  "non-canonical": the row's ids are not the encoding of their own text (a token split the server
                 produced), and the rendering is that encoding;
  "unexplained": anything else (detail: where and what).
"""

import json
import re
import sys

import datasets
import transformers
from transformers import AutoTokenizer

HEADER = "<|im_start|>assistant\n"
TURN_END = "<|im_end|>\n"
EMPTY_THINK = "<think>\n\n</think>\n\n"


def ids_of(result):
    if isinstance(result, list):
        return result
    return list(result["input_ids"])


def spans(text):
    out = []
    pattern = re.escape(HEADER) + r"([\s\S]*?(?:" + re.escape(TURN_END) + r"|$))"
    for m in re.finditer(pattern, text):
        start, end = m.start(1), m.end(1)
        if text.startswith(EMPTY_THINK, start) and start + len(EMPTY_THINK) <= end:
            start += len(EMPTY_THINK)
        if start < end:
            out.append((start, end))
    return out


def mask_of(tok, text):
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    sp = spans(text)
    mask = [1 if any(s < e_span and e > s_span for (s_span, e_span) in sp) else 0 for (s, e) in enc["offset_mapping"]]
    return list(enc["input_ids"]), mask


def classify(tok, conv, row_ids, py_text):
    row_text = tok.decode(row_ids, skip_special_tokens=False)
    reencoded = tok(row_text, add_special_tokens=False)["input_ids"]
    if reencoded != row_ids and row_text == py_text:
        return "non-canonical", ""
    last_header = py_text.rfind(HEADER)
    if last_header >= 0 and py_text.startswith(EMPTY_THINK, last_header + len(HEADER)):
        cut = last_header + len(HEADER)
        without = py_text[:cut] + py_text[cut + len(EMPTY_THINK):]
        if without == row_text:
            return "empty-think", ""
    if py_text.endswith(TURN_END) and not row_text.endswith(TURN_END):
        last = tok.convert_ids_to_tokens(row_ids[-1])
        if last in tok.all_special_tokens and py_text[: -len(TURN_END)] == row_text[: -len(last)]:
            return "stop-without-end-of-turn", last
    i = 0
    while i < len(row_text) and i < len(py_text) and row_text[i] == py_text[i]:
        i += 1
    return "unexplained", f"text differs at char {i}: row {row_text[max(0, i - 40):i + 40]!r} python {py_text[max(0, i - 40):i + 40]!r}"


def main():
    req = json.load(sys.stdin)
    tok = AutoTokenizer.from_pretrained(req["tokenizer_dir"], local_files_only=True)
    ds = datasets.load_from_disk(req["target"])
    table = ds.data
    cols = {name: table.column(name).to_pylist() for name in ds.column_names}
    rows = {}
    for i in range(ds.num_rows):
        rows[(cols["dataset"][i], cols["id"][i])] = {name: cols[name][i] for name in cols}

    jsonl_rows = 0
    jsonl_equal = 0
    with open(req["rows"], encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            jsonl_rows += 1
            if rows.get((r.get("dataset"), r.get("id"))) == r:
                jsonl_equal += 1

    results = []
    with open(req["specforge"], encoding="utf-8") as f:
        for line in f:
            ex = json.loads(line)
            conv = ex["conversations"]
            row = rows.get((ex["dataset"], ex["id"]))
            out = {"id": ex["id"], "dataset": ex["dataset"]}
            if row is not None:
                out["text_is_row"] = ex.get("text") == tok.decode(row["input_ids"], skip_special_tokens=False)
                out["text_reencodes"] = tok(ex.get("text", ""), add_special_tokens=False)["input_ids"] == row["input_ids"]
            if row is None:
                out.update(kind="no-row", detail="the training dataset has no row of this sample")
                results.append(out)
                continue
            ids = ids_of(tok.apply_chat_template(conv, tokenize=True, add_generation_prompt=False))
            text = tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=False)
            enc_ids, mask = mask_of(tok, text)
            assert enc_ids == ids, "tokenize=True and encoding the rendered text disagree"
            prompt = ids_of(tok.apply_chat_template(conv[:-1], tokenize=True, add_generation_prompt=True))
            n = len(prompt)
            out["prompt_tokens"] = n
            out["prompt_has_assistant"] = any(m["role"] == "assistant" for m in conv[:-1])
            out["input_ids_equal"] = ids == row["input_ids"]
            if out["input_ids_equal"]:
                out["kind"] = "identical"
                out["mask_equal_after_prompt"] = mask[n:] == row["loss_mask"][n:] and not any(row["loss_mask"][:n])
                out["detail"] = ""
            else:
                out["kind"], out["detail"] = classify(tok, conv, row["input_ids"], text)
            results.append(out)

    json.dump(
        {
            "versions": {"transformers": transformers.__version__, "datasets": datasets.__version__},
            "target_rows": ds.num_rows,
            "jsonl_rows": jsonl_rows,
            "jsonl_equal": jsonl_equal,
            "results": results,
        },
        sys.stdout,
    )


if __name__ == "__main__":
    datasets.disable_progress_bars()
    main()
