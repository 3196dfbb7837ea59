"""Creates and loads Hugging Face `datasets` folders for tokenmill's dataset storage tests.

Reads {"ops": [...]} as JSON on stdin and runs the operations in order, in one process:
  {"op": "save", "dir", "columns": {name: [values]}, "features": {name: <features JSON>},
   "num_shards": int}            -> Dataset.from_dict(...).save_to_disk(dir, num_shards=...)
  {"op": "load", "dir", "data": bool}
                                  -> datasets.load_from_disk(dir): row count, features, the
                                     Arrow type of each column, and (with "data") every column
Prints {"versions": {...}, "results": [...]}; a load that fails gives {"ok": false, "error"}.
"""
import json
import sys

import datasets
import pyarrow as pa
from datasets import Dataset, Features


def save(op):
    features = Features.from_dict(op["features"]) if op.get("features") else None
    ds = Dataset.from_dict(op["columns"], features=features)
    ds.save_to_disk(op["dir"], num_shards=op.get("num_shards", 1))
    return {"ok": True}


def load(op):
    try:
        ds = datasets.load_from_disk(op["dir"])
    except Exception as e:  # the test reports what failed
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}
    out = {
        "ok": True,
        "num_rows": ds.num_rows,
        "features": {k: repr(v) for k, v in ds.features.items()},
        "arrow_types": {f.name: str(f.type) for f in ds.data.schema},
        "files": [f["filename"] for f in ds.cache_files],
    }
    if op.get("data"):
        out["data"] = {name: ds.data.column(name).to_pylist() for name in ds.column_names}
    return out


def main():
    req = json.load(sys.stdin)
    results = []
    for op in req["ops"]:
        results.append(save(op) if op["op"] == "save" else load(op))
    versions = {"datasets": datasets.__version__, "pyarrow": pa.__version__}
    json.dump({"versions": versions, "results": results}, sys.stdout)


if __name__ == "__main__":
    datasets.disable_progress_bars()
    main()
