"""Reference renderings of assistant tool calls by Python transformers, for the tool-call parity test.

Reads one JSON object on stdin:
    {"cases": [{"tokenizer_dir": str | null, "chat_template": str | null,
                "messages": [...], "tools": [...] | null}]}
and writes one JSON object on stdout:
    {"versions": {...}, "cases": [{"prompt": str, "full": str} | {"error": str}]}

"prompt" is apply_chat_template(messages[:-1], tools=tools, add_generation_prompt=True) and "full"
apply_chat_template(messages, tools=tools), both as text. A case with a tokenizer_dir loads the
tokenizer there (AutoTokenizer); a case without one (a folder transformers cannot load, such as a
tiktoken one without its tokenizer code) renders chat_template with transformers' own renderer.
"""

import json
import sys

import transformers
from transformers import AutoTokenizer
from transformers.utils.chat_template_utils import render_jinja_template


def render(case, messages, add_generation_prompt):
    tools = case.get("tools")
    if case.get("tokenizer_dir"):
        tok = AutoTokenizer.from_pretrained(case["tokenizer_dir"], local_files_only=True)
        return tok.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt
        )
    rendered, _ = render_jinja_template(
        conversations=[messages],
        tools=tools,
        chat_template=case["chat_template"],
        add_generation_prompt=add_generation_prompt,
    )
    return rendered[0]


def main() -> None:
    request = json.load(sys.stdin)
    out = []
    for case in request["cases"]:
        messages = case["messages"]
        try:
            out.append(
                {
                    "prompt": render(case, messages[:-1], True),
                    "full": render(case, messages, False),
                }
            )
        except Exception as e:  # reported per case, so one bad case does not hide the others
            out.append({"error": f"{type(e).__name__}: {e}"})
    json.dump(
        {"versions": {"transformers": transformers.__version__}, "cases": out},
        sys.stdout,
        ensure_ascii=False,
    )


if __name__ == "__main__":
    main()
