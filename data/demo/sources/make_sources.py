"""Writes the demo's source files from the demo's prompt files, in the shapes datasets are
downloaded in, for `tokenmill prepare` to read:

  B5_sharegpt.parquet   B5's conversations as ShareGPT rows: id (string), conversations
                        (list<struct<from, value>>, roles system/human/gpt), snappy, row groups
                        of 16 rows, as `datasets` and pandas write them
  B6_writing.alpaca.jsonl  B6's prompts as Alpaca rows: id, instruction, input (""), output ("")

Run from the repository root: .venv/bin/python data/demo/sources/make_sources.py
The files are committed; the demo reads them without Python.
"""

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq

HERE = os.path.dirname(os.path.abspath(__file__))
DEMO = os.path.dirname(HERE)
SHAREGPT_ROLES = {"system": "system", "user": "human", "assistant": "gpt"}


def read_jsonl(name):
    with open(os.path.join(DEMO, name), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def write_sharegpt_parquet():
    rows = read_jsonl("B5_sharegpt.jsonl")
    turn = pa.struct([("from", pa.string()), ("value", pa.string())])
    table = pa.table(
        {
            "id": pa.array([r["id"] for r in rows], pa.string()),
            "conversations": pa.array(
                [[{"from": SHAREGPT_ROLES[t["role"]], "value": t["content"]} for t in r["conversations"]] for r in rows],
                pa.list_(turn),
            ),
        }
    )
    pq.write_table(table, os.path.join(HERE, "B5_sharegpt.parquet"), compression="snappy", row_group_size=16)
    return len(rows)


def write_alpaca_jsonl():
    rows = read_jsonl("B6_writing.jsonl")
    with open(os.path.join(HERE, "B6_writing.alpaca.jsonl"), "w", encoding="utf-8", newline="\n") as f:
        for r in rows:
            f.write(json.dumps({"id": r["id"], "instruction": r["prompt"], "input": "", "output": ""}, ensure_ascii=False) + "\n")
    return len(rows)


if __name__ == "__main__":
    print(json.dumps({"B5_sharegpt.parquet": write_sharegpt_parquet(), "B6_writing.alpaca.jsonl": write_alpaca_jsonl()}))
