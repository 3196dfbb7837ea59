"""Reference rows for the tokenize step, computed with Python transformers and SpecForge's rule.

Reads one JSON object on stdin, a job or {"jobs": [job, ...], "conversations": [...]} (one job
per tokenizer, answered as {"jobs": [result, ...]}; the top-level conversations are every job's
that has none of its own); a job is
    {"tokenizer_dir": str, "kwargs": {...} | null (for every case without its own),
     "specforge": {"header", "turn_end", "eot_token", "ignore": [str]} | null,
     "conversations": [{"messages": [...], "tools": [...] | null, "kwargs": {...} | null}],
     "generations":   [{"messages": [...], "kwargs": {...} | null, "output_ids": [int, ...]}],
     "records":       [{"messages": [...], "tools": [...] | null, "kwargs": {...} | null}
                       | {"conversation": <index into conversations>}]}
and its result, written as one JSON object on stdout, is
    {"versions": {...},
     "formats": {<kwargs as compact sorted JSON>: {"header", "ignorable", "turn_end", "eot_id", "suffix_ids"}},
     "conversations": [{"text", "input_ids", "loss_mask"} | {"error": str}],
     "generations": [{"prompt_ids", "content", "input_ids", "loss_mask"} | {"error": str}],
     "records": [{"prompt_ids", "output_ids", "after_output", ["text", "input_ids", "loss_mask"]} | {"error": str}]}
(a record given as a conversation's index has no row of its own: it is that conversation's).

Everything here is implemented on its own, from the descriptions below, not from the TypeScript
code.

The assistant-turn format is SpecForge's registered template when "specforge" is given
(specforge/data/template.py: assistant_header, end_of_turn_token, ignore_token); otherwise it is
found by rendering probe conversations: header = longest common prefix of (generation prompt,
text before the answer in a last assistant turn, text before the answer in an earlier assistant
turn); ignorable = what those two hold past the header; turn end = the text after the answer in
the last turn, which must start with a special added token (the end-of-turn token). The suffix
ids are always the ids after the last end-of-turn token in the encoding of [user, assistant].

A conversation is rendered with apply_chat_template(tokenize=False, add_generation_prompt=False)
and encoded with tokenizer(text, add_special_tokens=False). The loss mask is SpecForge's
GeneralParser.parse rule (specforge/data/parse.py):
1. spans: every match of re.escape(header) + r"([\\s\\S]*?(?:" + re.escape(turn_end) + r"|$))"
   (re.DOTALL) over the text; note that `$` also matches before a final newline;
2. for each span, the tokens from len(encode(text[:span_start])) to len(encode(text[:span_end]))
   (encodings of the text's prefixes, add_special_tokens=False) are set to 1;
3. then, for every occurrence of each ignore string anywhere in the text, the tokens from
   len(encode(text[:start])) to len(encode(text[:end])) are set back to 0.

For a generation case, the prompt is apply_chat_template(messages, tokenize=True,
add_generation_prompt=True), the content is tokenizer.decode(output_ids[:-1]) (the output
without its end-of-turn token), and the row is the rule above applied to messages + [assistant
content].

For a record case (a conversation that ends with an assistant turn), the pipeline's record is
simulated: the prompt is the conversation without its last turn, rendered with
add_generation_prompt=True and encoded (tokenize=True); the rest of the full rendering must
start where the prompt ends, and the model's output is that rest up to and including its last
end-of-turn token, encoded; the reference row is the full rendering with the mask above.
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


def encode(tok, text):
    return list(tok(text, add_special_tokens=False)["input_ids"])


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
    ids = encode(tok, f1)
    last_eot = len(ids) - 1 - ids[::-1].index(eot_id)
    return {
        "header": header,
        "ignorable": ignorable,
        "turn_end": after,
        "eot_id": eot_id,
        "eot_token": eot.content,
        "suffix_ids": ids[last_eot + 1:],
    }


def specforge_mask(tok, text, fmt, n):
    """SpecForge's GeneralParser mask over the n ids of text (see the module comment)."""
    pattern = re.escape(fmt["header"]) + r"([\s\S]*?(?:" + re.escape(fmt["turn_end"]) + r"|$))"
    spans = [(m.start(1), m.end(1)) for m in re.finditer(pattern, text, re.DOTALL)]
    ignored = []
    for ignore in fmt["ignorable"]:
        start = 0
        while True:
            at = text.find(ignore, start)
            if at < 0:
                break
            ignored.append((at, at + len(ignore)))
            start = at + len(ignore)
    # len(encode(text[:c])) for every boundary, encoded in one batch.
    cuts = sorted({c for span in spans + ignored for c in span})
    lengths = [len(ids) for ids in tok([text[:c] for c in cuts], add_special_tokens=False)["input_ids"]] if cuts else []
    count = dict(zip(cuts, lengths))
    mask = [0] * n
    for (a, b), value in [(span, 1) for span in spans] + [(span, 0) for span in ignored]:
        for i in range(min(count[a], n), min(count[b], n)):
            mask[i] = value
    return mask


def masked_row(tok, text, fmt):
    ids = encode(tok, text)
    return ids, specforge_mask(tok, text, fmt, len(ids))


def record_row(tok, case, fmt, full=None, default_kwargs=None):
    """The record case's reference; `full` is the conversation's own result when already computed."""
    messages = case["messages"]
    kwargs = case.get("kwargs") or default_kwargs or {}
    tools = case.get("tools")
    if not messages or messages[-1]["role"] != "assistant":
        raise ValueError("the conversation does not end with an assistant turn")
    if full is not None and "error" in full:
        raise ValueError(full["error"])
    prompt_text = render(tok, messages[:-1], True, kwargs, tools=tools)
    prompt_ids = ids_of(
        tok.apply_chat_template(messages[:-1], tools=tools, tokenize=True, add_generation_prompt=True, **kwargs)
    )
    text = full["text"] if full is not None else render(tok, messages, False, kwargs, tools=tools)
    if not text.startswith(prompt_text):
        raise ValueError("NotAPrefix: the full rendering does not start with the generation prompt")
    rest = text[len(prompt_text):]
    at = rest.rfind(fmt["eot_token"])
    if at < 0:
        raise ValueError("NoEndOfTurn: the last turn has no end-of-turn token")
    output_text = rest[: at + len(fmt["eot_token"])]
    result = {
        "prompt_ids": prompt_ids,
        "output_ids": encode(tok, output_text),
        "after_output": rest[at + len(fmt["eot_token"]):],
    }
    if full is None:  # else the row is the conversation's, already in the answer
        result["input_ids"], result["loss_mask"] = masked_row(tok, text, fmt)
        result["text"] = text
    return result


def run_job(request):
    tok = AutoTokenizer.from_pretrained(request["tokenizer_dir"], local_files_only=True)
    given = request.get("specforge")
    formats = {}

    def format_for(kwargs):
        key = json.dumps(kwargs, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        if key not in formats:
            formats[key] = derive_format(tok, kwargs)
        derived = formats[key]
        if given is None:
            return derived
        return {
            "header": given["header"],
            "turn_end": given["turn_end"],
            "ignorable": given["ignore"],
            "eot_token": given["eot_token"],
            "eot_id": tok.convert_tokens_to_ids(given["eot_token"]),
        }

    job_kwargs = request.get("kwargs") or {}  # template kwargs of every case that has none of its own
    format_for({})
    conversations = []
    for case in request.get("conversations", []):
        kwargs = case.get("kwargs") or job_kwargs
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

    records = []
    for case in request.get("records", []):
        try:
            full = None
            if "conversation" in case:  # the same conversation as conversations[i]: reuse its row
                full = conversations[case["conversation"]]
                case = request["conversations"][case["conversation"]]
            records.append(record_row(tok, case, format_for(case.get("kwargs") or job_kwargs), full, job_kwargs))
        except Exception as e:  # reported per case
            records.append({"error": f"{type(e).__name__}: {e}"})

    return {
        "versions": {"transformers": transformers.__version__, "tokenizers": tokenizers.__version__},
        "formats": formats,
        "conversations": conversations,
        "generations": generations,
        "records": records,
    }


def main() -> None:
    request = json.load(sys.stdin)
    if "jobs" in request:
        shared = request.get("conversations")
        jobs = [job if "conversations" in job or shared is None else {**job, "conversations": shared} for job in request["jobs"]]
        result = {"jobs": [run_job(job) for job in jobs]}
    else:
        result = run_job(request)
    # json.dumps uses the C encoder; json.dump to a stream does not.
    sys.stdout.write(json.dumps(result, ensure_ascii=False, separators=(",", ":")))


if __name__ == "__main__":
    main()
