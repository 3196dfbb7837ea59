"""Writes the sources `tokenmill prepare` reads, as the Python ecosystem writes them, and prints
what they hold.

Usage: make_prepare_sources.py OUT_DIR [--only-saved]

Writes under OUT_DIR:
  sharegpt_snappy.parquet  ShareGPT rows (conversations: list<struct<from, value>>, id int64,
                           a system column), snappy, row groups of 7 rows
  openai_zstd.parquet      OpenAI rows (messages: list<struct<role, content, name,
                           tool_calls: list<struct<id, type, function: struct<name, arguments>>>>>,
                           id string), zstd, row groups of 5 rows
  hub/                     a folder as `huggingface-cli download --local-dir` leaves it:
                           data/train-0000{0,1,2}-of-00003.parquet, data/test-00000-of-00001.parquet,
                           README.md, .gitattributes, .cache/huggingface/...
  shards/                  part-1, part-2, part-10 .parquet (natural order)
  variant_*.parquet        ShareGPT rows with gzip, brotli, lz4, no codec with data page v2 and
                           no dictionary, and large_string/large_list types
  saved/                   Dataset.save_to_disk of the OpenAI rows in 2 shards
  saved_dict/              DatasetDict(train, test).save_to_disk of ShareGPT rows
  exported_lines.json, exported_array.json, exported.parquet
                           Dataset.to_json (JSON Lines, and lines=False) and Dataset.to_parquet
(--only-saved writes what `datasets` writes only, for another `datasets` version.)

Prints JSON: {name: {"path", "rows": [the rows as Python has them], "messages": [the chat turns
each row must become]}} where "path" is relative to OUT_DIR.
"""

import json
import os
import random
import sys

import pyarrow as pa
import pyarrow.parquet as pq

SHAREGPT_ROLES = {"system": "system", "human": "user", "gpt": "assistant", "observation": "tool", "function_call": "assistant"}

TEXTS = [
    "Explain the difference between a process and a thread.",
    "Écris un poème sur la mer 🌊 — avec des rimes.",
    "写一个快速排序的 Python 实现。",
    "",
    "Line one\nline two\n\ttabbed \"quoted\" \\ backslash",
    "a" * 5000,
    "Ünïcödé mixed with 数字 123 and emoji 🤖🎉",
]

SHAREGPT_SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("system", pa.string()),
        ("conversations", pa.list_(pa.struct([("from", pa.string()), ("value", pa.string())]))),
    ]
)

TOOL_CALL = pa.struct([("id", pa.string()), ("type", pa.string()), ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())]))])
OPENAI_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        (
            "messages",
            pa.list_(pa.struct([("role", pa.string()), ("content", pa.string()), ("name", pa.string()), ("tool_calls", pa.list_(TOOL_CALL))])),
        ),
        ("score", pa.float64()),
        ("tags", pa.list_(pa.string())),
        ("ok", pa.bool_()),
    ]
)


def text(rng):
    return rng.choice(TEXTS) + f" #{rng.randrange(10**6)}"


def sharegpt_rows(n, seed, start_id=0):
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        conv = []
        if i % 4 == 0:
            conv.append({"from": "system", "value": "You are terse."})
        for t in range(1 + i % 3):
            conv.append({"from": "human", "value": text(rng)})
            if i % 5 == 1 and t == 0:
                conv.append({"from": "function_call", "value": json.dumps({"name": "search", "arguments": {"q": "x"}})})
                conv.append({"from": "observation", "value": json.dumps({"result": "ok"})})
            conv.append({"from": "gpt", "value": text(rng)})
        system = "Top-level system prompt." if i % 4 == 2 else None
        rows.append({"id": start_id + i, "system": system, "conversations": conv})
    return rows


def sharegpt_messages(row):
    # A function_call turn is an assistant turn with its call as `tool_calls` (id `call_<turn index>`),
    # and an observation a tool turn answering the call before it, as tokenmill reads them.
    turns = []
    last_call = None
    for k, t in enumerate(row["conversations"]):
        if t["from"] == "function_call":
            call = json.loads(t["value"])
            last_call = f"call_{k}"
            turns.append({"role": "assistant", "content": "", "tool_calls": [
                {"id": last_call, "type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}]})
        elif t["from"] == "observation":
            turns.append({"role": "tool", "content": t["value"], "tool_call_id": last_call})
        else:
            turns.append({"role": SHAREGPT_ROLES[t["from"]], "content": t["value"]})
    if row.get("system") and not (turns and turns[0]["role"] == "system"):
        turns.insert(0, {"role": "system", "content": row["system"]})
    return turns


def openai_rows(n, seed):
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        msgs = []
        if i % 3 == 0:
            msgs.append({"role": "system", "content": "Answer in French.", "name": None, "tool_calls": None})
        msgs.append({"role": "user", "content": text(rng), "name": "alice" if i % 2 else None, "tool_calls": None})
        if i % 4 == 1:
            call = {"id": f"call_{i}", "type": "function", "function": {"name": "lookup", "arguments": json.dumps({"k": i})}}
            msgs.append({"role": "assistant", "content": None, "name": None, "tool_calls": [call]})
            msgs.append({"role": "tool", "content": "42", "name": "lookup", "tool_calls": None})
        msgs.append({"role": "assistant", "content": text(rng), "name": None, "tool_calls": None})
        rows.append({"id": f"oa-{i}", "messages": msgs, "score": None if i % 7 == 3 else i / 4, "tags": ["math", "code", "chat"][: i % 4], "ok": i % 2 == 0})
    return rows


def openai_messages(row):
    out = []
    for m in row["messages"]:
        turn = {"role": m["role"], "content": m["content"] if m["content"] is not None else ""}
        for k in ("name", "tool_calls"):
            if m.get(k) is not None:
                turn[k] = m[k]
        out.append(turn)
    return out


def write_parquet(path, rows, schema, compression, row_group_size):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    table = pa.Table.from_pylist(rows, schema=schema)
    pq.write_table(table, path, compression=compression, row_group_size=row_group_size)
    # What a reader must give back: the file as pyarrow reads it.
    return pq.read_table(path).to_pylist()


def entry(path, rows, to_messages):
    return {"path": path, "rows": rows, "messages": [to_messages(r) for r in rows]}


def write_saved(out, result):
    from datasets import Dataset, DatasetDict, Features, disable_progress_bars

    disable_progress_bars()
    rows = openai_rows(23, seed=5)
    ds = Dataset.from_list(rows, features=Features.from_arrow_schema(OPENAI_SCHEMA))
    ds.save_to_disk(os.path.join(out, "saved"), num_shards=2)
    result["saved"] = entry("saved", ds.to_list(), openai_messages)

    # The files `datasets` exports: JSON Lines saved as .json (its default), a JSON array, parquet.
    exported = Dataset.from_list(sharegpt_rows(12, seed=9), features=Features.from_arrow_schema(SHAREGPT_SCHEMA))
    exported.to_json(os.path.join(out, "exported_lines.json"))
    exported.to_json(os.path.join(out, "exported_array.json"), lines=False, orient="records")
    exported.to_parquet(os.path.join(out, "exported.parquet"))
    for name in ("exported_lines.json", "exported_array.json", "exported.parquet"):
        result[name.replace(".", "_")] = entry(name, exported.to_list(), sharegpt_messages)

    train = Dataset.from_list(sharegpt_rows(17, seed=6), features=Features.from_arrow_schema(SHAREGPT_SCHEMA))
    test = Dataset.from_list(sharegpt_rows(4, seed=7, start_id=1000), features=Features.from_arrow_schema(SHAREGPT_SCHEMA))
    DatasetDict({"train": train, "test": test}).save_to_disk(os.path.join(out, "saved_dict"))
    result["saved_dict"] = entry("saved_dict", train.to_list(), sharegpt_messages)


def main():
    out = sys.argv[1]
    only_saved = "--only-saved" in sys.argv[2:]
    os.makedirs(out, exist_ok=True)
    result = {}
    if not only_saved:
        rows = write_parquet(os.path.join(out, "sharegpt_snappy.parquet"), sharegpt_rows(30, seed=1), SHAREGPT_SCHEMA, "snappy", 7)
        result["sharegpt_snappy"] = entry("sharegpt_snappy.parquet", rows, sharegpt_messages)

        rows = write_parquet(os.path.join(out, "openai_zstd.parquet"), openai_rows(26, seed=2), OPENAI_SCHEMA, "zstd", 5)
        result["openai_zstd"] = entry("openai_zstd.parquet", rows, openai_messages)

        hub = os.path.join(out, "hub")
        all_train = sharegpt_rows(31, seed=3)
        parts = [all_train[0:11], all_train[11:20], all_train[20:]]
        train = []
        for k, part in enumerate(parts):
            train += write_parquet(os.path.join(hub, "data", f"train-{k:05d}-of-00003.parquet"), part, SHAREGPT_SCHEMA, "snappy", 4)
        write_parquet(os.path.join(hub, "data", "test-00000-of-00001.parquet"), sharegpt_rows(5, seed=4, start_id=500), SHAREGPT_SCHEMA, "snappy", 4)
        with open(os.path.join(hub, "README.md"), "w") as f:
            f.write("---\nlicense: mit\n---\n# A dataset\n")
        with open(os.path.join(hub, ".gitattributes"), "w") as f:
            f.write("*.parquet filter=lfs diff=lfs merge=lfs -text\n")
        os.makedirs(os.path.join(hub, ".cache", "huggingface", "download", "data"), exist_ok=True)
        with open(os.path.join(hub, ".cache", "huggingface", "download", "data", "train-00000-of-00003.parquet.metadata"), "w") as f:
            f.write("0123abcd\n")
        result["hub"] = entry("hub", train, sharegpt_messages)

        # Other codecs, data page v2 without dictionaries, and the large Arrow types (64-bit offsets).
        large = pa.schema(
            [
                ("id", pa.int64()),
                ("system", pa.large_string()),
                ("conversations", pa.large_list(pa.struct([("from", pa.large_string()), ("value", pa.large_string())]))),
            ]
        )
        variants = [
            ("gzip", dict(compression="gzip"), SHAREGPT_SCHEMA),
            ("brotli", dict(compression="brotli"), SHAREGPT_SCHEMA),
            ("lz4", dict(compression="lz4"), SHAREGPT_SCHEMA),
            ("none_v2", dict(compression="none", data_page_version="2.0", use_dictionary=False), SHAREGPT_SCHEMA),
            ("large_types", dict(compression="zstd"), large),
        ]
        for name, opts, schema in variants:
            path = os.path.join(out, f"variant_{name}.parquet")
            table = pa.Table.from_pylist(sharegpt_rows(15, seed=10), schema=schema)
            pq.write_table(table, path, row_group_size=6, **opts)
            result[f"variant_{name}"] = entry(f"variant_{name}.parquet", pq.read_table(path).to_pylist(), sharegpt_messages)

        shards = []
        base = openai_rows(30, seed=8)
        for k, (a, b) in zip((1, 2, 10), ((0, 10), (10, 20), (20, 30))):
            shards += write_parquet(os.path.join(out, "shards", f"part-{k}.parquet"), base[a:b], OPENAI_SCHEMA, "zstd", 10)
        result["shards"] = entry("shards", shards, openai_messages)

    write_saved(out, result)
    json.dump(result, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
