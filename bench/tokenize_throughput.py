"""Python side of bench/tokenize-throughput.ts: a conversation dataset tokenized with transformers.

    tokenize_throughput.py TOKENIZER_DIR FILE PASSES

Reads the JSONL file (SpecForge's {"id", "conversations": [...], "tools"}; ShareGPT's
{"from", "value"} messages mapped to roles) PASSES times. Each line: json.loads, the chat
template (apply_chat_template, tokenize=False, add_generation_prompt=False), one encode with
offsets (tokenizer(text, add_special_tokens=False, return_offsets_mapping=True), which is what
apply_chat_template(tokenize=True) runs, plus the offsets), and the loss mask: 1 on every token
whose offsets overlap an assistant span (SpecForge's GeneralParser pattern: the header, then
through the turn end, the empty think block after the header left out). The turn format is
derived from the template with probe conversations. Prints one JSON line per pass:
{"pass", "seconds", "rows", "tokens", "supervised"}; conversations with nothing supervised are
not counted, as tokenmill drops them.
"""

import json
import os
import re
import sys
import time

from transformers import AutoTokenizer

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system", "tool": "tool"}


def messages_of(record):
    out = []
    for m in record.get("conversations") or record.get("messages") or []:
        if "from" in m:
            out.append({"role": ROLES[m["from"]], "content": m.get("value") or ""})
        else:
            m = dict(m)
            if m.get("content") is None:
                m["content"] = ""
            out.append(m)
    return out


def derive_format(tok):
    def render(messages, prompt):
        return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)

    user = {"role": "user", "content": "probe question"}
    answer = {"role": "assistant", "content": "probe answer"}
    p0 = render([user], False)
    p1 = render([user], True)[len(p0):]
    last = render([user, answer], False)[len(p0):]
    earlier = render([user, answer, {"role": "user", "content": "probe again"}, {"role": "assistant", "content": "probe answer 2"}], False)[len(p0):]
    before, _, after = last.partition("probe answer")
    before_earlier = earlier.partition("probe answer")[0]
    header = os.path.commonprefix([p1, before, before_earlier])
    ignorable = sorted({before[len(header):], before_earlier[len(header):]} - {""}, key=len, reverse=True)
    return header, after, ignorable


def main():
    tokenizer_dir, path, passes = sys.argv[1], sys.argv[2], int(sys.argv[3])
    tok = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    header, turn_end, ignorable = derive_format(tok)
    pattern = re.compile(re.escape(header) + r"([\s\S]*?(?:" + re.escape(turn_end) + r"|\Z))")
    for n in range(passes):
        started = time.perf_counter()
        rows = tokens = supervised = 0
        with open(path, encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    continue
                record = json.loads(line)
                text = tok.apply_chat_template(
                    messages_of(record), tools=record.get("tools"), tokenize=False, add_generation_prompt=False
                )
                enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
                spans = []
                for match in pattern.finditer(text):
                    start, end = match.start(1), match.end(1)
                    for prefix in ignorable:
                        if text.startswith(prefix, start) and start + len(prefix) <= end:
                            start += len(prefix)
                            break
                    if start < end:
                        spans.append((start, end))
                mask = []
                k = 0
                for a, b in enc["offset_mapping"]:
                    while k < len(spans) and spans[k][1] <= a:
                        k += 1
                    mask.append(1 if k < len(spans) and spans[k][0] < b else 0)
                s = sum(mask)
                if s == 0:
                    continue
                rows += 1
                tokens += len(enc["input_ids"])
                supervised += s
        seconds = time.perf_counter() - started
        print(json.dumps({"pass": n, "seconds": seconds, "rows": rows, "tokens": tokens, "supervised": supervised}), flush=True)


if __name__ == "__main__":
    main()
