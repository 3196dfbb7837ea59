"""Reference ids from Python tiktoken for tokenmill's tiktoken encoder.

Reads one JSON object on stdin:
    {"rank_file": str,
     "cases": [{"name": str, "pat_str": str, "special_tokens": {text: id}, "texts": [str]}]}
and writes one JSON object on stdout:
    {"version": str, "n_ranks": int,
     "cases": [{"name": str, "ids": [[int]], "decoded": [str]}]}

Each text is encoded as Kimi's tokenizer does with tiktoken:
Encoding(name, pat_str, mergeable_ranks=load_tiktoken_bpe(rank_file), special_tokens)
.encode(text, allowed_special="all"); "decoded" is decode(ids).
"""
import json
import sys

import tiktoken
from tiktoken.load import load_tiktoken_bpe


def main() -> None:
    req = json.load(sys.stdin)
    ranks = load_tiktoken_bpe(req["rank_file"])
    out = {"version": tiktoken.__version__, "n_ranks": len(ranks), "cases": []}
    for case in req["cases"]:
        enc = tiktoken.Encoding(
            name=case["name"],
            pat_str=case["pat_str"],
            mergeable_ranks=ranks,
            special_tokens={k: int(v) for k, v in case["special_tokens"].items()},
        )
        ids = [enc.encode(t, allowed_special="all") for t in case["texts"]]
        out["cases"].append(
            {
                "name": case["name"],
                "ids": ids,
                "decoded": [enc.decode(i) for i in ids],
            }
        )
    json.dump(out, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
