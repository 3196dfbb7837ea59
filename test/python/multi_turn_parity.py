"""Reference prompts for multi-turn regeneration (test/integration/multi-turn-parity.test.ts).

Reads a JSON job on stdin:

    {"tokenizer_dir": "...", "cases": [{"messages": [...], "kwargs": {...} | null}, ...],
     "decode": [[id, ...], ...]}

or {"jobs": [job, ...]} for several tokenizers in one process. For each case (the regenerated
history of one turn: the source's system, user and tool messages and, in place of each earlier
assistant message, the message built from the answer regenerated for it, `reasoning_content`
included), it prints what transformers gives for turn k's prompt:

- text: tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
- ids: tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True), which
  must equal tokenizer(text, add_special_tokens=False) (the tokenize=True path of transformers);
  a case where they differ is reported as an error, as is a template error.

For each entry of `decode` (a regenerated answer's output ids without its end-of-turn token), it
prints tokenizer.decode(ids, skip_special_tokens=True): the text the history carries.
"""

import json
import sys

import tokenizers
import transformers
from transformers import AutoTokenizer


def ids_of(result):
    if isinstance(result, list):
        return list(result)
    return list(result["input_ids"])


def encode(tok, text):
    return list(tok(text, add_special_tokens=False)["input_ids"])


def run_job(request):
    tok = AutoTokenizer.from_pretrained(request["tokenizer_dir"], local_files_only=True)
    prompts = []
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
        "decoded": decoded,
    }


def main() -> None:
    request = json.load(sys.stdin)
    if "jobs" in request:
        result = {"jobs": [run_job(job) for job in request["jobs"]]}
    else:
        result = run_job(request)
    sys.stdout.write(json.dumps(result, ensure_ascii=False, separators=(",", ":")))


if __name__ == "__main__":
    main()
