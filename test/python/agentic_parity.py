"""Reference prompts of agentic conversations, for test/integration/agentic-parity.test.ts.

Reads one JSON object on stdin:
    {"jobs": [{"tokenizer_dir": str,
               "kimi": {"pat_str": str, "special_tokens": {text: id}} | null,
               "cases": [{"messages": [...], "tools": [...] | null, "kwargs": {...} | null}]}]}
and writes one JSON object on stdout:
    {"versions": {...}, "jobs": [{"cases": [{"rendered": str, "input_ids": [int]} | {"error": str}]}]}

Each case is turn k's history (system, user and tool messages, assistant messages with their
structured `tool_calls`); its reference prompt is transformers'
apply_chat_template(messages, tools=tools, add_generation_prompt=True, **kwargs), as text and
as ids (tokenize=True). A Kimi K2 folder (`kimi` given) is rendered and encoded as
tools_parity.py does it (the tools' keys sorted, transformers' template renderer, tiktoken).
All tokenizers in one process: transformers is imported once.
"""

import json
import sys

import tiktoken
import transformers
from transformers import AutoTokenizer

from tools_parity import input_ids_of, kimi_cases


def hf_cases(job):
    tok = AutoTokenizer.from_pretrained(job["tokenizer_dir"], local_files_only=True)
    out = []
    for case in job["cases"]:
        kwargs = case.get("kwargs") or {}
        try:
            args = dict(tools=case.get("tools"), add_generation_prompt=True, **kwargs)
            rendered = tok.apply_chat_template(case["messages"], tokenize=False, **args)
            ids = input_ids_of(tok.apply_chat_template(case["messages"], tokenize=True, **args))
            out.append({"rendered": rendered, "input_ids": ids})
        except Exception as e:  # reported per case
            out.append({"error": f"{type(e).__name__}: {e}"})
    return out


def main() -> None:
    request = json.load(sys.stdin)
    jobs = []
    for job in request["jobs"]:
        if job.get("kimi"):
            cases = [{**c, "add_generation_prompt": True} for c in job["cases"]]
            jobs.append({"cases": kimi_cases({**job, "cases": cases})})
        else:
            jobs.append({"cases": hf_cases(job)})
    json.dump(
        {
            "versions": {"transformers": transformers.__version__, "tiktoken": tiktoken.__version__},
            "jobs": jobs,
        },
        sys.stdout,
        ensure_ascii=False,
    )


if __name__ == "__main__":
    main()
