"""Reads tokenmill's exports with SpecForge 0.2.0's own data code, as a SpecForge run reads them.

Reads one JSON object on stdin:
    {"tokenizer_dir": str, "target": <training dataset folder>, "rows": <export --format jsonl file>,
     "cache_dir": <scratch folder for Hugging Face datasets' cache>,
     "files": [{"file": <export --format specforge file>,
                "data": {"chat_template", "is_preformatted", "train_only_last_turn", "max_length"}}],
     "control": {"file": <specforge file>, "chat_template": str, "train_only_last_turn": bool}}
and writes one JSON object on stdout:
    {"versions": {...}, "templates": {name: {assistant_header, end_of_turn_token, ignore_token,
                                              parser_type, assistant_pattern_type}},
     "target_rows": int, "jsonl_rows": int, "jsonl_equal": int,
     "pretokenized": {"tasks": int, "ids_equal": int, "mask_equal": int, "first_differences": [...]},
     "files": [{"file", "lines", "tasks", "order": "shuffle(seed=42)", "results": [...]}],
     "control": {"tasks", "identical", "system_prompt_rows", "supervised_empty_think_rows"}}

- pre-tokenized route: specforge.data.prompt_builder.prepare_prompt_tasks on the jsonl export
  (its fast path for records with input_ids + loss_mask); task i is compared with line i.
- preformatted route: prepare_prompt_tasks on each specforge file with the settings of its
  sidecar: the raw path, load_dataset("json") then build_eagle3_dataset, which shuffles with
  seed 42 and drops the ids. The shuffle is replayed on the loaded file (the same call on the same
  dataset) to know which line each task is; each task's input_ids are checked to be those of its
  line's text encoded by the tokenizer, so a wrong pairing cannot pass as a difference.
  Per row: ids_equal / mask_equal with tokenmill's row, reencodes (tokenizer(text) gives the
  row's ids: what SpecForge can reproduce at best), system_prompt (SpecForge's ids hold the
  template's default system prompt where the row does not), supervised_empty_think (an empty
  <think>\\n\\n</think>\\n\\n block at mask 1).
- control: the conversation route SpecForge users take without the sidecar (is_preformatted
  false, re-rendering `conversations`), counted with the same checks: it must show the failure
  modes the preformatted route avoids.
"""

import contextlib
import importlib.metadata
import json
import os
import sys


def main():
    req = json.load(sys.stdin)
    os.environ["HF_DATASETS_CACHE"] = req["cache_dir"]
    import datasets
    import torch
    import transformers
    from datasets import load_dataset
    from specforge.data.prompt_builder import prepare_prompt_tasks
    from specforge.data.template import TEMPLATE_REGISTRY
    from transformers import AutoTokenizer

    datasets.disable_progress_bars()
    tok = AutoTokenizer.from_pretrained(req["tokenizer_dir"], local_files_only=True)
    empty_think = tok("<think>\n\n</think>\n\n", add_special_tokens=False)["input_ids"]

    templates = {}
    for name in TEMPLATE_REGISTRY.get_all_template_names():
        t = TEMPLATE_REGISTRY.get(name)
        templates[name] = {
            "assistant_header": t.assistant_header,
            "end_of_turn_token": t.end_of_turn_token,
            "ignore_token": t.ignore_token,
            "parser_type": t.parser_type,
            "assistant_pattern_type": t.assistant_pattern_type,
            "system_prompt": t.system_prompt,
        }

    ds = datasets.load_from_disk(req["target"])
    cols = {name: ds.data.column(name).to_pylist() for name in ds.column_names}
    rows = {(cols["dataset"][i], cols["id"][i]): {n: cols[n][i] for n in cols} for i in range(ds.num_rows)}

    def ids_list(x):
        if hasattr(x, "tolist"):
            x = x.tolist()
        while len(x) == 1 and isinstance(x[0], list):
            x = x[0]
        return [int(v) for v in x]

    def has_run(ids, mask, seq, supervised):
        n = len(seq)
        for i in range(len(ids) - n + 1):
            if ids[i : i + n] == seq and (not supervised or any(mask[i : i + n])):
                return True
        return False

    # SpecForge prints progress to stdout; this process's stdout is the JSON answer.
    with contextlib.redirect_stdout(sys.stderr):
        jsonl = [json.loads(line) for line in open(req["rows"], encoding="utf-8") if line.strip()]
        jsonl_equal = sum(1 for r in jsonl if rows.get((r.get("dataset"), r.get("id"))) == r)
        longest = max(len(r["input_ids"]) for r in jsonl)
        tasks = prepare_prompt_tasks(
            req["rows"],
            tok,
            chat_template="qwen3-instruct",
            max_length=longest,
            is_preformatted=False,
            train_only_last_turn=False,
            cache_dir=None,
            cache_key=None,
            num_proc=1,
        )
        pre = {"tasks": len(tasks), "ids_equal": 0, "mask_equal": 0, "first_differences": []}
        for i, (task, r) in enumerate(zip(tasks, jsonl)):
            p = task["payload"]
            ids_eq = p["input_ids"] == r["input_ids"]
            mask_eq = p["loss_mask"] == r["loss_mask"]
            pre["ids_equal"] += ids_eq
            pre["mask_equal"] += mask_eq
            if not (ids_eq and mask_eq) and len(pre["first_differences"]) < 5:
                pre["first_differences"].append({"line": i + 1, "id": r["id"], "ids": ids_eq, "mask": mask_eq})

        def run_route(file, chat_template, preformatted, last_turn, max_length):
            template = TEMPLATE_REGISTRY.get(chat_template)
            system = template.system_prompt or ""
            processed = prepare_prompt_tasks(
                file,
                tok,
                chat_template=chat_template,
                max_length=max_length,
                is_preformatted=preformatted,
                train_only_last_turn=last_turn,
                cache_dir=None,
                cache_key=None,
                num_proc=1,
            )
            # The order build_eagle3_dataset gives: the same load and the same shuffle.
            order = load_dataset("json", data_files=file, split="train").shuffle(seed=42)
            lines = order.select_columns(["id", "dataset", "text"]).to_list()
            out = {"file": file, "lines": len(lines), "tasks": len(processed), "order": "shuffle(seed=42)", "results": []}
            if len(processed) != len(lines):
                out["error"] = f"{len(lines)} lines but {len(processed)} tasks: SpecForge dropped rows"
                return out
            for line, task in zip(lines, processed):
                p = task["payload"]
                got_ids, got_mask = ids_list(p["input_ids"]), ids_list(p["loss_mask"])
                row = rows.get((line["dataset"], line["id"]))
                enc = tok(line["text"], add_special_tokens=False)["input_ids"]
                res = {"id": line["id"], "dataset": line["dataset"]}
                if row is None:
                    res["kind"] = "no-row"
                    out["results"].append(res)
                    continue
                res["paired"] = (not preformatted) or got_ids == enc[:max_length]
                res["reencodes"] = enc == row["input_ids"]
                res["ids_equal"] = got_ids == row["input_ids"]
                res["mask_equal"] = res["ids_equal"] and got_mask == row["loss_mask"]
                res["system_prompt"] = bool(system) and (
                    system in tok.decode(got_ids) and system not in tok.decode(row["input_ids"])
                )
                res["supervised_empty_think"] = has_run(got_ids, got_mask, empty_think, True)
                res["row_has_empty_think"] = has_run(row["input_ids"], row["loss_mask"], empty_think, False)
                if res["ids_equal"] and not res["mask_equal"]:
                    diff = [i for i, (a, b) in enumerate(zip(got_mask, row["loss_mask"])) if a != b]
                    res["mask_detail"] = f"{len(diff)} positions differ, first {diff[:5]}"
                res["kind"] = "identical" if res["mask_equal"] else "different"
                out["results"].append(res)
            return out

        files = []
        for f in req["files"]:
            d = f["data"]
            assert d["is_preformatted"] is True
            files.append(run_route(f["file"], d["chat_template"], True, d["train_only_last_turn"], d["max_length"]))

        control = None
        if req.get("control"):
            c = req["control"]
            r = run_route(c["file"], c["chat_template"], False, c["train_only_last_turn"], c.get("max_length", 65536))
            res = r["results"]
            control = {
                "chat_template": c["chat_template"],
                "tasks": r["tasks"],
                "error": r.get("error"),
                "identical": sum(1 for x in res if x.get("kind") == "identical"),
                "system_prompt_rows": sum(1 for x in res if x.get("system_prompt")),
                "supervised_empty_think_rows": sum(1 for x in res if x.get("supervised_empty_think")),
            }

    json.dump(
        {
            "versions": {
                "specforge": importlib.metadata.version("specforge"),
                "transformers": transformers.__version__,
                "datasets": datasets.__version__,
                "torch": torch.__version__,
            },
            "templates": templates,
            "target_rows": ds.num_rows,
            "jsonl_rows": len(jsonl),
            "jsonl_equal": jsonl_equal,
            "pretokenized": pre,
            "files": files,
            "control": control,
        },
        sys.stdout,
    )


if __name__ == "__main__":
    main()
