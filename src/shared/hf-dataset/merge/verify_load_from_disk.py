"""Loads a `datasets` folder the way a trainer does, for tokenmill's `postprocess.verifyWithPython`.

Usage: python verify_load_from_disk.py [DIR]
Without DIR, only imports `datasets`. Prints one JSON object on stdout:
  {"python": <version>, "datasets": <version>, "num_rows": int, "columns": "name: type, ..."}
where a column's type is spelled as tokenmill spells it (`string`, `int32`, `list<int32>`,
`large_list<int64>`). Exits 1 with the error on stderr when `datasets` cannot be imported or
the folder cannot be loaded.
"""
import json
import sys


def spelled(feature):
    name = type(feature).__name__
    if name == "Value":
        return feature.dtype
    if name in ("Sequence", "List", "LargeList"):
        inner = spelled(feature.feature)
        return ("large_list" if name == "LargeList" else "list") + "<" + inner + ">"
    return name


def main():
    import datasets

    out = {"python": sys.version.split()[0], "datasets": datasets.__version__}
    if len(sys.argv) > 1:
        datasets.disable_progress_bars()
        ds = datasets.load_from_disk(sys.argv[1])
        out["num_rows"] = ds.num_rows
        out["columns"] = ", ".join(f"{k}: {spelled(v)}" for k, v in ds.features.items())
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # the caller reports it, naming the interpreter
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
