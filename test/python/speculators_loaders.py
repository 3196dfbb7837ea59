"""Reads tokenmill's exports back with vLLM speculators' own code (speculators 0.9.0).

Reads one JSON object on stdin, {"mode": ..., ...}, and prints one JSON object:

  {"mode": "train-loader", "export_dir", "target_dir", "work_dir", "hidden_size",
   "target_vocab_size", "draft_vocab_size"}
      speculators.train.data.ArrowDataset over `export --format speculators` (on_missing="raise"),
      with hidden states cached the way hs_connectors' FileTransfer reads them
      (<export_dir>/hidden_states/hs_<i>.safetensors: random `hidden_states` [seq, 4, hidden],
      `token_ids` = the row's ids); every item taken through ds[i] and CollateFn and compared with
      the training dataset's rows (load_from_disk of <target_dir>, rows with a supervised token),
      also counted per dataset (by_dataset: {name: {rows, equal}});
      save_token_frequency_distribution on the loaded dataset against the export's token_freq.pt
      (torch.load weights_only), and the d2t/t2d that build_vocab_mappings_from_distribution makes
      of each.
  {"mode": "prepare-data", "jsonl", "tokenizer", "target_dir", "export_dir", "work_dir", "seq_length"}
      load_and_preprocess_dataset (prepare-data's code) on `export --format jsonl`: pre-tokenized
      rows pass through; the multiset of (input_ids, loss_mask) and its token frequencies compared
      with the training dataset's rows and the export's token_freq.pt; its save_to_disk output
      compared with the export (state.json format, column types, features).
  {"mode": "target-as-data", "target_dir", "work_dir"}
      prepare-data's load_raw_dataset on the training dataset folder itself: the error it raises.
  {"mode": "torch-load", "file", "n"}
      torch.load(file, weights_only=True) of the dict {(i * 7919) % 1000003: i * 31 + (i % 7) * 2**33
      for i in range(n)}: equal, in order, and its data.pkl byte for byte pickle.dumps(protocol=2).
"""
import json
import os
import sys
from collections import Counter


def _setup(work_dir):
    # datasets' caches in the test's folder, never the user's.
    os.environ["HF_DATASETS_CACHE"] = os.path.join(work_dir, "hf-cache")
    os.environ["HF_HOME"] = os.path.join(work_dir, "hf-home")


def _training_rows(target_dir):
    """The training dataset's rows that carry a supervised token, in order."""
    import datasets

    ds = datasets.load_from_disk(target_dir)
    rows = []
    for r in ds:
        if sum(r["loss_mask"]) == 0:
            continue
        rows.append(
            {
                "id": r.get("id"),
                "dataset": r.get("dataset"),
                "input_ids": list(r["input_ids"]),
                "loss_mask": list(r["loss_mask"]),
                "num_tokens": r.get("num_tokens", len(r["input_ids"])),
            }
        )
    return rows, len(ds)


def _freq_of(rows):
    c = Counter()
    for r in rows:
        for t, m in zip(r["input_ids"], r["loss_mask"]):
            if m == 1:
                c[t] += 1
    return dict(c)


def _shard_types(folder):
    import pyarrow as pa

    state = json.load(open(os.path.join(folder, "state.json")))
    first = os.path.join(folder, state["_data_files"][0]["filename"])
    with pa.memory_map(first) as f:
        schema = pa.ipc.open_stream(f).schema
    return {f.name: str(f.type) for f in schema}, state


def train_loader(req):
    _setup(req["work_dir"])
    import torch
    from safetensors.torch import save_file

    from speculators.train.data import ArrowDataset, CollateFn
    from speculators.train.recovery import SampleUnavailable
    from speculators.train.vocab_mapping import (
        build_vocab_mappings_from_distribution,
        save_token_frequency_distribution,
    )

    export_dir = req["export_dir"]
    hidden = req["hidden_size"]
    rows, target_rows = _training_rows(req["target_dir"])
    max_len = max(r["num_tokens"] for r in rows)

    # Hidden states where FileTransfer(<data-path>/hidden_states).get_cached(i) looks.
    hs_dir = os.path.join(export_dir, "hidden_states")
    os.makedirs(hs_dir, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    for i, r in enumerate(rows):
        n = len(r["input_ids"])
        save_file(
            {
                "hidden_states": torch.randn(n, 4, hidden, generator=gen).to(torch.bfloat16),
                "token_ids": torch.tensor(r["input_ids"], dtype=torch.long),
            },
            os.path.join(hs_dir, f"hs_{i}.safetensors"),
        )

    ds = ArrowDataset(max_len=max_len, datapath=export_dir, on_missing="raise", train_ratio=1.0)
    collate = CollateFn(max_len=max_len, hidden_size=hidden, num_target_layers=3)
    differences = []
    equal = 0
    by_dataset = {}
    dtypes = set()
    for i, r in enumerate(rows):
        tally = by_dataset.setdefault(r["dataset"], {"rows": 0, "equal": 0})
        tally["rows"] += 1
        item = ds[i]
        if isinstance(item, SampleUnavailable):
            differences.append({"index": i, "id": r["id"], "kind": "unavailable", "detail": str(item.reason)})
            continue
        dtypes.add((str(item["input_ids"].dtype), str(item["loss_mask"].dtype)))
        batch = collate([item])
        n = len(r["input_ids"])
        got_ids = batch["input_ids"][0, :n].tolist()
        got_mask = batch["loss_mask"][0, :n].tolist()
        padding_zero = bool((batch["input_ids"][0, n:] == 0).all()) and bool((batch["loss_mask"][0, n:] == 0).all())
        doc_ids = batch["document_ids"][0]
        one_document = bool((doc_ids[:n] == 0).all()) and bool((doc_ids[n:] == -1).all())
        if got_ids == r["input_ids"] and got_mask == r["loss_mask"] and padding_zero and one_document:
            equal += 1
            tally["equal"] += 1
        else:
            differences.append(
                {
                    "index": i,
                    "id": r["id"],
                    "kind": "ids" if got_ids != r["input_ids"] else "mask" if got_mask != r["loss_mask"] else "packing",
                    "detail": f"{n} tokens",
                }
            )

    theirs_path = os.path.join(req["work_dir"], "speculators_token_freq.pt")
    if os.path.exists(theirs_path):
        os.remove(theirs_path)
    save_token_frequency_distribution(dataset=ds.data, output_path=theirs_path)
    theirs = torch.load(theirs_path, weights_only=True)
    ours = torch.load(os.path.join(export_dir, "token_freq.pt"), weights_only=True)
    d2t_a, t2d_a = build_vocab_mappings_from_distribution(ours, req["draft_vocab_size"], req["target_vocab_size"])
    d2t_b, t2d_b = build_vocab_mappings_from_distribution(theirs, req["draft_vocab_size"], req["target_vocab_size"])
    types, state = _shard_types(export_dir)
    return {
        "target_rows": target_rows,
        "rows": len(rows),
        "dataset_rows": len(ds),
        "approx_lengths_equal": list(ds.approx_lengths) == [r["num_tokens"] for r in rows],
        "equal": equal,
        "by_dataset": by_dataset,
        "differences": differences,
        "item_dtypes": sorted(list(d) for d in dtypes),
        "format": ds.data.format["type"],
        "format_columns": ds.data.format["columns"],
        "shard_types": types,
        "state": {k: state[k] for k in ("_format_type", "_format_columns", "_format_kwargs", "_output_all_columns", "_split")},
        "freq_equal": ours == theirs,
        "freq_order_equal": list(ours.items()) == list(theirs.items()),
        "freq_types": sorted({f"{type(k).__name__}:{type(v).__name__}" for k, v in ours.items()}),
        "freq_equal_rows": ours == _freq_of(rows),
        "distinct": len(ours),
        "supervised": sum(ours.values()),
        "d2t_equal": bool(torch.equal(d2t_a, d2t_b)),
        "t2d_equal": bool(torch.equal(t2d_a, t2d_b)),
        "t2d_selected": int(t2d_a.sum()),
    }


def prepare_data(req):
    _setup(req["work_dir"])
    import datasets
    import torch

    from speculators.data_generation.preprocessing import load_and_preprocess_dataset

    freq_path = os.path.join(req["work_dir"], "prepare_token_freq.pt")
    if os.path.exists(freq_path):
        os.remove(freq_path)
    out, _ = load_and_preprocess_dataset(
        target_model_path=req["tokenizer"],
        train_data_paths=[req["jsonl"]],
        seq_length=req["seq_length"],
        build_dataset_num_proc=1,
        skip_token_freq=False,
        token_freq_path=freq_path,
    )
    rows, _ = _training_rows(req["target_dir"])
    want = Counter((tuple(r["input_ids"]), tuple(r["loss_mask"])) for r in rows)
    got = Counter()
    for item in out:
        got[(tuple(item["input_ids"].tolist()), tuple(item["loss_mask"].tolist()))] += 1
    theirs = torch.load(freq_path, weights_only=True)
    ours = torch.load(os.path.join(req["export_dir"], "token_freq.pt"), weights_only=True)

    # What prepare-data itself saves (prepare_data's last step), beside the export.
    saved = os.path.join(req["work_dir"], "prepare-data-out")
    out.save_to_disk(saved)
    their_types, their_state = _shard_types(saved)
    our_types, our_state = _shard_types(req["export_dir"])
    keys = ("_format_type", "_format_columns", "_format_kwargs", "_output_all_columns", "_split")
    a = datasets.load_from_disk(saved)
    b = datasets.load_from_disk(req["export_dir"])
    return {
        "rows": sum(got.values()),
        "want_rows": sum(want.values()),
        "multiset_equal": got == want,
        "missing": sum((want - got).values()),
        "extra": sum((got - want).values()),
        "freq_equal": ours == theirs,
        "shard_types_equal": their_types == our_types,
        "shard_types": their_types,
        "state_equal": {k: their_state[k] for k in keys} == {k: our_state[k] for k in keys},
        "features_equal": a.features == b.features,
        "format_equal": a.format == b.format,
        "format": a.format["type"],
    }


def target_as_data(req):
    _setup(req["work_dir"])
    from speculators.data_generation.preprocessing import load_raw_dataset

    try:
        ds, _ = load_raw_dataset(req["target_dir"])
    except Exception as e:  # the test asserts which error
        cause = e.__cause__ or e.__context__
        return {
            "ok": False,
            "error": type(e).__name__,
            "message": str(e)[:500],
            "cause": type(cause).__name__ if cause is not None else None,
            "cause_message": str(cause)[:300] if cause is not None else None,
        }
    return {"ok": True, "rows": len(ds), "columns": ds.column_names}


def torch_load(req):
    import pickle
    import zipfile

    import torch

    n = req["n"]
    want = {(i * 7919) % 1000003: i * 31 + (i % 7) * 2**33 for i in range(n)}
    got = torch.load(req["file"], weights_only=True)
    with zipfile.ZipFile(req["file"]) as z:
        names = z.namelist()
        pkl = z.read(next(x for x in names if x.endswith("/data.pkl")))
        bad = z.testzip()
    return {
        "entries": len(got),
        "equal": got == want,
        "order_equal": list(got.items()) == list(want.items()),
        "pickle_identical": pkl == pickle.dumps(want, protocol=2),
        "names": names,
        "crc_ok": bad is None,
        "torch": torch.__version__,
    }


def main():
    req = json.load(sys.stdin)
    mode = req["mode"]
    fn = {
        "train-loader": train_loader,
        "prepare-data": prepare_data,
        "target-as-data": target_as_data,
        "torch-load": torch_load,
    }[mode]
    # Whatever the libraries print goes to stderr: stdout carries the JSON alone.
    out = sys.stdout
    sys.stdout = sys.stderr
    try:
        result = fn(req)
    finally:
        sys.stdout = out
    out.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
