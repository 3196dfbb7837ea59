"""Reference prompts for multi-turn regeneration (test/integration/multi-turn-parity.test.ts).

Reads a JSON job on stdin:

    {"tokenizer_dir": "...", "cases": [{"messages": [...], "kwargs": {...} | null}, ...],
     "decode": [[id, ...], ...]}

or {"jobs": [job, ...]} for several tokenizers in one process. Each folder is loaded once,
whichever jobs name it; the folders named as arguments after `--preload` are loaded before stdin
is read, while the caller still builds the jobs. For each case (the regenerated history of one
turn: the source's system, user and tool messages and, in place of each earlier assistant
message, the message built from the answer regenerated for it, `reasoning_content` included), it
prints what transformers gives for turn k's prompt:

- text: tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
- ids: tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True), which
  must equal tokenizer(text, add_special_tokens=False) (the tokenize=True path of transformers);
  a case where they differ is reported as an error, as is a template error.

For each entry of `decode` (a regenerated answer's output ids without its end-of-turn token), it
prints tokenizer.decode(ids, skip_special_tokens=True): the text the history carries.

A case may also carry `answer`, the message the history carries for the answer regenerated for
that turn; then `rows` (one entry per case, null for a case without one) holds the training row
SpecForge makes of the regenerated conversation messages + [answer] with `train_only_last_turn`:
- text: apply_chat_template(messages + [answer], add_generation_prompt=False, tokenize=False);
- input_ids: tokenizer(text, add_special_tokens=False);
- loss_mask: SpecForge's GeneralParser rule as test/python/tokenize_parity.py implements it
  (`masked_row`, imported, not re-implemented), restricted to the last match of its assistant
  pattern, as GeneralParser.parse does with train_only_last_turn (`matches = [matches[-1]]`,
  then the ignore strings are zeroed over the whole text).
The job may also carry `whole`: [{"messages": [...], "kwargs": {...} | null}], each a whole
regenerated conversation (the last turn's history + its answer); then `whole_rows` (one entry
each) holds SpecForge's row of it with every assistant turn trained (GeneralParser.parse without
train_only_last_turn): the same text and input_ids, and `masked_row`'s mask as it is (every match
of the assistant pattern set to 1, the ignore strings zeroed).

The assistant-turn format is the job's `specforge` (SpecForge's registered template: header,
turn_end, eot_token, ignore), or else derived from the template as tokenize_parity.py derives
it; a template it cannot derive one from gives every row that error.
"""

import json
import sys

import tokenizers
import transformers
from transformers import AutoTokenizer

from tokenize_parity import derive_format, masked_row


def ids_of(result):
    if isinstance(result, list):
        return list(result)
    return list(result["input_ids"])


def encode(tok, text):
    return list(tok(text, add_special_tokens=False)["input_ids"])


def specforge_format(tok, given, kwargs):
    """The format tokenize_parity.py's rule takes: SpecForge's registered template, else derived."""
    if given is None:
        return derive_format(tok, kwargs)
    return {
        "header": given["header"],
        "turn_end": given["turn_end"],
        "ignorable": given["ignore"],
        "eot_token": given["eot_token"],
    }


def last_turn_row(tok, messages, fmt, kwargs):
    """SpecForge's row of `messages` with train_only_last_turn (see the module comment)."""
    header = fmt["header"]
    for m in messages:
        # The last match of SpecForge's pattern starts at the last occurrence of the header, unless
        # the header's text occurs inside an assistant turn (then an earlier match could swallow it).
        if m["role"] == "assistant" and header in (m.get("content") or "") + (m.get("reasoning_content") or ""):
            raise ValueError("HeaderInAnswer: an assistant message holds the assistant header's text")
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=False, **kwargs)
    # Every assistant turn supervised, ignore strings zeroed: SpecForge's rule.
    input_ids, mask = masked_row(tok, text, fmt)
    # train_only_last_turn: only the last match is set to 1; every token before its content start
    # (len(encode(text[:match.start(1)])), the same prefix length the rule uses) goes back to 0.
    at = text.rfind(header)
    start = len(input_ids) if at < 0 else len(encode(tok, text[: at + len(header)]))
    return {"text": text, "input_ids": input_ids, "loss_mask": [0] * start + mask[start:]}


def whole_row(tok, messages, fmt, kwargs):
    """SpecForge's row of `messages` with every assistant turn trained (see the module comment)."""
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=False, **kwargs)
    input_ids, mask = masked_row(tok, text, fmt)
    return {"text": text, "input_ids": input_ids, "loss_mask": mask}


TOKENIZERS = {}


def tokenizer(folder):
    """The tokenizer of `folder`, loaded once."""
    if folder not in TOKENIZERS:
        TOKENIZERS[folder] = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    return TOKENIZERS[folder]


def run_job(request):
    tok = tokenizer(request["tokenizer_dir"])
    prompts = []
    rows = []
    formats = {}
    for case in request.get("cases", []):
        if case.get("answer") is None:
            rows.append(None)
            continue
        kwargs = case.get("kwargs") or {}
        try:
            key = json.dumps(kwargs, sort_keys=True)
            if key not in formats:
                formats[key] = specforge_format(tok, request.get("specforge"), kwargs)
            fmt = formats[key]
            rows.append(last_turn_row(tok, case["messages"] + [case["answer"]], fmt, kwargs))
        except Exception as e:  # reported per case
            rows.append({"error": f"{type(e).__name__}: {e}"})
    whole_rows = []
    for case in request.get("whole", []):
        kwargs = case.get("kwargs") or {}
        try:
            key = json.dumps(kwargs, sort_keys=True)
            if key not in formats:
                formats[key] = specforge_format(tok, request.get("specforge"), kwargs)
            whole_rows.append(whole_row(tok, case["messages"], formats[key], kwargs))
        except Exception as e:  # reported per case
            whole_rows.append({"error": f"{type(e).__name__}: {e}"})
    for case in request.get("cases", []):
        kwargs = case.get("kwargs") or {}
        messages = case["messages"]
        try:
            text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
            ids = ids_of(tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, **kwargs))
            encoded = encode(tok, text)
            if ids != encoded:
                raise ValueError(f"tokenize=True gave {len(ids)} ids, encoding the text {len(encoded)}")
            prompts.append({"text": text, "ids": ids})
        except Exception as e:  # reported per case
            prompts.append({"error": f"{type(e).__name__}: {e}"})
    decoded = [tok.decode(ids, skip_special_tokens=True) for ids in request.get("decode", [])]
    return {
        "versions": {"transformers": transformers.__version__, "tokenizers": tokenizers.__version__},
        "prompts": prompts,
        "rows": rows,
        "whole_rows": whole_rows,
        "decoded": decoded,
    }


def main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["--preload"]:
        for folder in args[1:]:
            tokenizer(folder)
    request = json.load(sys.stdin)
    if "jobs" in request:
        result = {"jobs": [run_job(job) for job in request["jobs"]]}
    else:
        result = run_job(request)
    sys.stdout.write(json.dumps(result, ensure_ascii=False, separators=(",", ":")))


if __name__ == "__main__":
    main()
