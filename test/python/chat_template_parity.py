"""Reference output of Python transformers for the tokenizer parity test.

Reads one JSON object on stdin:
    {"tokenizer_dir": str,
     "cases": [{"messages": [...], "tools": [...] | null, "kwargs": {...} | null}],
     "texts": [str, ...]}
and writes one JSON object on stdout:
    {"versions": {...}, "info": {...},
     "cases": [{"rendered", "input_ids", "decoded", "decoded_skip"} | {"error": str}],
     "texts": [{"ids": [...], "decoded": str}]}

Each case is rendered and tokenized the way a user of transformers would prepare a prompt:
apply_chat_template(messages, tokenize=True, add_generation_prompt=True). Recent transformers
return a BatchEncoding there, older ones a list: both are handled.
"""

import json
import sys

import tokenizers
import transformers
from transformers import AutoTokenizer


def input_ids_of(result):
    if isinstance(result, list):
        return result
    return list(result["input_ids"])


def main() -> None:
    request = json.load(sys.stdin)
    tok = AutoTokenizer.from_pretrained(request["tokenizer_dir"], local_files_only=True)
    out_cases = []
    for case in request["cases"]:
        kwargs = case.get("kwargs") or {}
        tools = case.get("tools")
        try:
            rendered = tok.apply_chat_template(
                case["messages"], tools=tools, tokenize=False, add_generation_prompt=True, **kwargs
            )
            ids = input_ids_of(
                tok.apply_chat_template(
                    case["messages"], tools=tools, tokenize=True, add_generation_prompt=True, **kwargs
                )
            )
            out_cases.append(
                {
                    "rendered": rendered,
                    "input_ids": ids,
                    "decoded": tok.decode(ids),
                    "decoded_skip": tok.decode(ids, skip_special_tokens=True),
                }
            )
        except Exception as e:  # reported per case, so one bad case does not hide the others
            out_cases.append({"error": f"{type(e).__name__}: {e}"})
    out_texts = []
    for text in request.get("texts", []):
        ids = tok.encode(text, add_special_tokens=False)
        out_texts.append({"ids": ids, "decoded": tok.decode(ids)})
    json.dump(
        {
            "versions": {"transformers": transformers.__version__, "tokenizers": tokenizers.__version__},
            "info": {
                "len": len(tok),
                "eos_token_id": tok.eos_token_id,
                "bos_token_id": tok.bos_token_id,
                "special_tokens_map": tok.special_tokens_map,
            },
            "cases": out_cases,
            "texts": out_texts,
        },
        sys.stdout,
        ensure_ascii=False,
    )


if __name__ == "__main__":
    main()
