"""Reference rows for the tokenize step, computed with Python transformers.

Reads one JSON object on stdin:
    {"tokenizer_dir": str,
     "conversations": [{"messages": [...], "tools": [...] | null, "kwargs": {...} | null}],
     "generations":   [{"messages": [...], "kwargs": {...} | null, "output_ids": [int, ...]}]}
and writes one JSON object on stdout:
    {"versions": {...},
     "formats": {<kwargs as compact sorted JSON>: {"header", "ignorable", "turn_end", "eot_id", "suffix_ids"}},
     "conversations": [{"text", "input_ids", "loss_mask"} | {"error": str}],
     "generations": [{"prompt_ids", "content", "input_ids", "loss_mask"} | {"error": str}]}

The masking rule is implemented here on its own, from its description, not from the
TypeScript code:

1. The template's assistant-turn format is found by rendering probe conversations:
   header = longest common prefix of (generation prompt, text before the answer in a last
   assistant turn, text before the answer in an earlier assistant turn); ignorable prefixes =
   what those two hold past the header; turn end = the text after the answer in the last turn,
   which must start with a special added token (the end-of-turn token); suffix ids = the ids
   after the last end-of-turn token in the encoding of [user, assistant].
2. A conversation is rendered with apply_chat_template(tokenize=False,
   add_generation_prompt=False) and encoded with tokenizer(text, add_special_tokens=False,
   return_offsets_mapping=True).
3. Supervised character spans: SpecForge's GeneralParser regex
   re.escape(header) + r"([\\s\\S]*?(?:" + re.escape(turn_end) + r"|\\Z))"
   over the rendered text, each span's leading ignorable prefix removed.
4. A token is supervised when its offset range overlaps a span: start < span_end and
   end > span_start.

For a generation case, the prompt is apply_chat_template(messages, tokenize=True,
add_generation_prompt=True), the content is tokenizer.decode(output_ids[:-1]) (the output
without its end-of-turn token), and the row is the rule above applied to messages + [assistant
content].
"""

import json
import os
import re
import sys

import tokenizers
import transformers
from transformers import AutoTokenizer

PROBE_USER = "tokenmill probe question"
PROBE_USER_2 = "tokenmill probe follow-up"
PROBE_ANSWER = "tokenmill probe answer"
PROBE_ANSWER_2 = "tokenmill probe second answer"


def ids_of(result):
    if isinstance(result, list):
        return result
    return list(result["input_ids"])


def render(tok, messages, generation_prompt, kwargs, tools=None):
    return tok.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=generation_prompt, **kwargs
    )


def derive_format(tok, kwargs):
    user = {"role": "user", "content": PROBE_USER}
    answer = {"role": "assistant", "content": PROBE_ANSWER}
    p0 = render(tok, [user], False, kwargs)
    p1 = render(tok, [user], True, kwargs)
    f1 = render(tok, [user, answer], False, kwargs)
    f2 = render(
        tok,
        [user, answer, {"role": "user", "content": PROBE_USER_2}, {"role": "assistant", "content": PROBE_ANSWER_2}],
        False,
        kwargs,
    )
    for text in (p1, f1, f2):
        assert text.startswith(p0), "template is not prefix-stable"
    generation_prompt = p1[len(p0):]
    last = f1[len(p0):]
    before, _, after = last.partition(PROBE_ANSWER)
    earlier = f2[len(p0):]
    before_earlier = earlier.partition(PROBE_ANSWER)[0]
    header = os.path.commonprefix([generation_prompt, before, before_earlier])
    assert header, "no assistant header"
    ignorable = sorted({before[len(header):], before_earlier[len(header):]} - {""}, key=len, reverse=True)

    specials = [t for t in tok.added_tokens_decoder.values() if t.special]
    candidates = [t for t in specials if after.startswith(t.content)]
    assert candidates, f"turn end {after!r} starts with no special token"
    eot = max(candidates, key=lambda t: len(t.content))
    eot_id = tok.convert_tokens_to_ids(eot.content)
    ids = tok(f1, add_special_tokens=False)["input_ids"]
    last_eot = len(ids) - 1 - ids[::-1].index(eot_id)
    return {
        "header": header,
        "ignorable": ignorable,
        "turn_end": after,
        "eot_id": eot_id,
        "suffix_ids": ids[last_eot + 1:],
    }


def supervised_spans(text, fmt):
    pattern = re.compile(re.escape(fmt["header"]) + r"([\s\S]*?(?:" + re.escape(fmt["turn_end"]) + r"|\Z))")
    spans = []
    for match in pattern.finditer(text):
        start, end = match.start(1), match.end(1)
        for prefix in fmt["ignorable"]:
            if text.startswith(prefix, start) and start + len(prefix) <= end:
                start += len(prefix)
                break
        if start < end:
            spans.append((start, end))
    return spans


def masked_row(tok, text, fmt):
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    spans = supervised_spans(text, fmt)
    mask = []
    for token_start, token_end in enc["offset_mapping"]:
        hit = any(token_start < span_end and token_end > span_start for span_start, span_end in spans)
        mask.append(1 if hit else 0)
    return list(enc["input_ids"]), mask


def main() -> None:
    request = json.load(sys.stdin)
    tok = AutoTokenizer.from_pretrained(request["tokenizer_dir"], local_files_only=True)
    formats = {}

    def format_for(kwargs):
        key = json.dumps(kwargs, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        if key not in formats:
            formats[key] = derive_format(tok, kwargs)
        return formats[key]

    format_for({})
    conversations = []
    for case in request.get("conversations", []):
        kwargs = case.get("kwargs") or {}
        try:
            fmt = format_for(kwargs)
            text = render(tok, case["messages"], False, kwargs, tools=case.get("tools"))
            input_ids, mask = masked_row(tok, text, fmt)
            conversations.append({"text": text, "input_ids": input_ids, "loss_mask": mask})
        except Exception as e:  # reported per case
            conversations.append({"error": f"{type(e).__name__}: {e}"})

    generations = []
    for case in request.get("generations", []):
        kwargs = case.get("kwargs") or {}
        try:
            fmt = format_for(kwargs)
            prompt_ids = ids_of(
                tok.apply_chat_template(case["messages"], tokenize=True, add_generation_prompt=True, **kwargs)
            )
            content = tok.decode(case["output_ids"][:-1])
            finished = case["messages"] + [{"role": "assistant", "content": content}]
            input_ids, mask = masked_row(tok, render(tok, finished, False, kwargs), fmt)
            generations.append({"prompt_ids": prompt_ids, "content": content, "input_ids": input_ids, "loss_mask": mask})
        except Exception as e:  # reported per case
            generations.append({"error": f"{type(e).__name__}: {e}"})

    json.dump(
        {
            "versions": {"transformers": transformers.__version__, "tokenizers": tokenizers.__version__},
            "formats": formats,
            "conversations": conversations,
            "generations": generations,
        },
        sys.stdout,
        ensure_ascii=False,
    )


if __name__ == "__main__":
    main()
