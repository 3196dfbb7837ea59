"""Reference renderings of conversations with tool schemas, for the tools-everywhere test.

Reads one JSON object on stdin:
    {"tokenizer_dir": str,
     "kimi": {"pat_str": str, "special_tokens": {text: id}} | null,
     "cases": [{"messages": [...], "tools": [...] | null, "add_generation_prompt": bool}]}
and writes one JSON object on stdout:
    {"versions": {...}, "cases": [{"rendered": str, "input_ids": [int]} | {"error": str}]}

A Hugging Face tokenizer folder is rendered and encoded by transformers'
apply_chat_template(messages, tools=tools, add_generation_prompt=...). A Kimi K2 folder (`kimi`
given: no tokenizer.json, a tiktoken rank file) is rendered as Kimi's own tokenizer does: the
tools' keys sorted recursively (its deep_sort_dict), then transformers' chat template renderer
with the folder's template; the text is encoded by tiktoken with the folder's rank file
(`tiktoken.model`), Kimi's split pattern and special tokens, allowed_special="all".
"""

import json
import os
import sys

import tiktoken
import transformers
from tiktoken.load import load_tiktoken_bpe
from transformers.utils.chat_template_utils import render_jinja_template

NAMED_TOKENS = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"]


def deep_sort(value):
    if isinstance(value, dict):
        return {k: deep_sort(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [deep_sort(v) for v in value]
    return value


def input_ids_of(result):
    if isinstance(result, list):
        return result
    return list(result["input_ids"])


def token_text(value):
    if isinstance(value, dict):
        return value.get("content")
    return value


def hf_cases(request):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(request["tokenizer_dir"], local_files_only=True)
    out = []
    for case in request["cases"]:
        gen = case["add_generation_prompt"]
        try:
            rendered = tok.apply_chat_template(
                case["messages"], tools=case.get("tools"), tokenize=False, add_generation_prompt=gen
            )
            ids = input_ids_of(
                tok.apply_chat_template(
                    case["messages"], tools=case.get("tools"), tokenize=True, add_generation_prompt=gen
                )
            )
            out.append({"rendered": rendered, "input_ids": ids})
        except Exception as e:  # reported per case
            out.append({"error": f"{type(e).__name__}: {e}"})
    return out


def kimi_cases(request):
    folder = request["tokenizer_dir"]
    with open(os.path.join(folder, "tokenizer_config.json"), encoding="utf-8") as f:
        config = json.load(f)
    template = config["chat_template"]
    named = {k: token_text(config[k]) for k in NAMED_TOKENS if token_text(config.get(k)) is not None}
    kimi = request["kimi"]
    enc = tiktoken.Encoding(
        name="kimi",
        pat_str=kimi["pat_str"],
        mergeable_ranks=load_tiktoken_bpe(os.path.join(folder, "tiktoken.model")),
        special_tokens={k: int(v) for k, v in kimi["special_tokens"].items()},
    )
    out = []
    for case in request["cases"]:
        tools = case.get("tools")
        try:
            rendered, _ = render_jinja_template(
                conversations=[case["messages"]],
                tools=None if tools is None else deep_sort(tools),
                chat_template=template,
                add_generation_prompt=case["add_generation_prompt"],
                **named,
            )
            text = rendered[0]
            out.append({"rendered": text, "input_ids": enc.encode(text, allowed_special="all")})
        except Exception as e:  # reported per case
            out.append({"error": f"{type(e).__name__}: {e}"})
    return out


def main() -> None:
    request = json.load(sys.stdin)
    cases = kimi_cases(request) if request.get("kimi") else hf_cases(request)
    json.dump(
        {
            "versions": {"transformers": transformers.__version__, "tiktoken": tiktoken.__version__},
            "cases": cases,
        },
        sys.stdout,
        ensure_ascii=False,
    )


if __name__ == "__main__":
    main()
