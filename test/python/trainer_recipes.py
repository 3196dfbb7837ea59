"""Checks tokenmill's trainer recipes (deploy/trainers/) with the trainers' own code.

Runs in the `trainers` environment (SpecForge 0.2.0, speculators 0.9.0). Reads
{"ops": [...]} as JSON on stdin, runs them in order, prints {"versions": {...}, "results": [...]}.
A failing op gives {"ok": false, "error": "..."} and the others still run.

  {"op": "specforge-config", "config", "overrides": [...]}
      specforge.config.load_config(config, overrides) (the YAML, then each `section.field=value`
      applied and re-validated, as `specforge train` does), the algorithm resolved
      (specforge.application.resolve_run), the values a recipe relies on, and whether its
      data.chat_template is one SpecForge registers.
  {"op": "specforge-plan", "argv": [...], "cwd"}
      specforge.cli.main(argv + ["--plan"]) in `cwd`: the real argument parser and launch
      planner, which print the resolved process plan (commands, their GPUs, the managed
      capture servers) without starting anything.
  {"op": "specforge-plan", "script", "argv": [...], "cwd"}
      The same through a wrapper script (deploy/trainers/specforge_gpu_split.py): its main(argv +
      ["--plan"]), which writes the run config on the GPU groups and calls specforge.cli.main.
  {"op": "specforge-prompts", "config", "overrides": [...]}
      The prompts SpecForge's online producer would stream: the run's own preparation
      (specforge.training.assembly._prepare_prompts, which calls
      specforge.data.prompt_builder.prepare_prompt_tasks with the run's data settings and the
      EAGLE-3 algorithm's minimum of supervised tokens and mask filter). No tokenizer is
      needed: pre-tokenized rows take its fast path.
  {"op": "vocab-mapping", "file"}
      A {"d2t", "t2d"} file as SpecForge's draft model loads it (torch.load): shapes, and the
      target ids the draft vocabulary keeps.
  {"op": "speculators-train", "argv": [...]}
      speculators.train.config.TrainConfig.resolve(argv): the argparse/pydantic resolution behind
      `speculators train` and `python -m speculators.train` (flags over the --config YAML over
      the defaults), with the warnings it gives (unknown YAML keys are warnings there), and
      whether the module `speculators.train` can be run (`-m`).
  {"op": "speculators-cli", "argv": [...]}
      The `speculators` typer app: its command names, and argv[1:] parsed by the click command
      argv[0] names (click's own parser: options, types, required ones), without running it.
"""

import contextlib
import importlib.util
import io
import json
import os
import sys
import traceback
import warnings
from importlib.metadata import version


def specforge_config(op):
    from specforge.application import resolve_run
    from specforge.config import load_config
    from specforge.data.template import TEMPLATE_REGISTRY

    cfg = load_config(op["config"], op.get("overrides") or [])
    resolved = resolve_run(cfg)
    dis = cfg.deployment.disaggregated
    managed = dis.managed_local if dis is not None else None
    return {
        "ok": True,
        "mode": cfg.mode,
        "algorithm": resolved.algorithm.name,
        "strategy": cfg.training.strategy,
        "target_model_path": cfg.model.target_model_path,
        "draft_model_config": cfg.model.draft_model_config,
        "vocab_mapping_path": cfg.model.vocab_mapping_path,
        "prompts_path": cfg.data.prompts_path,
        "train_data_path": cfg.data.train_data_path,
        "hidden_states_path": cfg.data.hidden_states_path,
        "max_length": cfg.data.max_length,
        "chat_template": cfg.data.chat_template,
        "chat_template_registered": cfg.data.chat_template in TEMPLATE_REGISTRY.get_all_template_names(),
        "cache_dir": cfg.data.cache_dir,
        "output_dir": cfg.output_dir,
        "num_anchors": cfg.training.num_anchors,
        "draft_block_size": cfg.model.draft_block_size,
        "draft_num_hidden_layers": cfg.model.draft_num_hidden_layers,
        "mask_token_id": cfg.model.mask_token_id,
        "deployment_mode": cfg.deployment.mode,
        "nproc_per_node": cfg.deployment.trainer.nproc_per_node,
        "control_dir": dis.control_dir if dis is not None else None,
        "backend": dis.backend if dis is not None else None,
        "managed_local": None
        if managed is None
        else {
            "trainer_devices": managed.trainer_cuda_visible_devices,
            "capture_devices": [s.cuda_visible_devices for s in managed.capture_servers],
        },
    }


def _script_main(file):
    spec = importlib.util.spec_from_file_location("recipe_script", file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def specforge_plan(op):
    if op.get("script"):
        main = _script_main(op["script"])
    else:
        from specforge.cli import main

    out = io.StringIO()
    cwd = os.getcwd()
    os.chdir(op["cwd"])
    try:
        with contextlib.redirect_stdout(out):
            try:
                code = main([*op["argv"], "--plan"])
            except SystemExit as e:  # argparse refused the arguments
                code = e.code
    finally:
        os.chdir(cwd)
    if code not in (0, None):
        return {"ok": False, "error": f"specforge exited {code}: {out.getvalue()[-2000:]}"}
    plan = json.loads(out.getvalue())

    def command(c):
        return {"label": c["label"], "argv": c["argv"], "cuda": c["env"].get("CUDA_VISIBLE_DEVICES")}

    services = []
    for s in plan.get("services", []):
        argv = s["command"]["argv"]
        services.append(
            {
                "label": s["command"]["label"],
                "cuda": s["command"]["env"].get("CUDA_VISIBLE_DEVICES"),
                "context_length": int(argv[argv.index("--context-length") + 1])
                if "--context-length" in argv
                else None,
                "model_path": argv[argv.index("--model-path") + 1] if "--model-path" in argv else None,
            }
        )
    return {
        "ok": True,
        "kind": plan["kind"],
        "role": plan.get("role"),
        "managed_root": plan.get("managed_root"),
        "commands": [command(c) for c in plan.get("commands", [])],
        "services": services,
    }


def specforge_prompts(op):
    from specforge.application import resolve_run
    from specforge.config import load_config
    from specforge.training.assembly import _prepare_prompts

    cfg = load_config(op["config"], op.get("overrides") or [])
    resolved = resolve_run(cfg)
    prompts = _prepare_prompts(cfg, None, algorithm=resolved.algorithm, draft_config=None)
    return {
        "ok": True,
        "min_loss_tokens": resolved.algorithm.providers.model.minimum_loss_tokens(cfg, None),
        "prompts": [
            {"input_ids": p["payload"]["input_ids"], "loss_mask": p["payload"]["loss_mask"]} for p in prompts
        ],
    }


def vocab_mapping(op):
    import torch

    mapping = torch.load(op["file"], map_location="cpu")
    d2t, t2d = mapping["d2t"], mapping["t2d"]
    kept = (d2t + torch.arange(d2t.shape[0])).tolist()
    return {
        "ok": True,
        "keys": sorted(mapping.keys()),
        "d2t_shape": list(d2t.shape),
        "t2d_shape": list(t2d.shape),
        "t2d_dtype": str(t2d.dtype),
        "kept": kept,
        "t2d_true": torch.nonzero(t2d).flatten().tolist(),
    }


def speculators_train(op):
    from speculators.train.config import TrainConfig

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                cfg = TrainConfig.resolve(op["argv"])
        except SystemExit as e:
            return {"ok": False, "error": f"exit {e.code}: {err.getvalue()[-2000:]}"}
    flat = cfg.flatten()
    keys = [
        "speculator_type",
        "verifier_name_or_path",
        "data_path",
        "total_seq_len",
        "on_missing",
        "vllm_endpoint",
        "save_path",
        "log_dir",
        "draft_vocab_size",
        "token_freq_path",
        "lr",
        "epochs",
        "hidden_states_backend",
        "hidden_states_path",
        "block_size",
        "max_anchors",
        "mask_token_id",
        "num_layers",
    ]
    return {
        "ok": True,
        "module_runnable": importlib.util.find_spec("speculators.train.__main__") is not None,
        "values": {k: flat.get(k) for k in keys},
        "provenance": {k: cfg.provenance.get(k) for k in keys if k in cfg.provenance},
        "warnings": [str(w.message) for w in caught],
    }


def speculators_cli(op):
    import click
    import typer

    from speculators.cli import app

    group = typer.main.get_command(app)
    names = sorted(group.commands)
    name, *args = op["argv"]
    if name not in group.commands:
        return {"ok": False, "error": f"no command {name!r} (commands: {names})", "commands": names}
    command = group.commands[name]
    try:
        ctx = command.make_context(name, list(args), resilient_parsing=False)
    except click.exceptions.ClickException as e:
        return {"ok": False, "error": e.format_message(), "commands": names}
    return {"ok": True, "commands": names, "params": {k: v for k, v in ctx.params.items()}}


OPS = {
    "specforge-config": specforge_config,
    "specforge-plan": specforge_plan,
    "specforge-prompts": specforge_prompts,
    "vocab-mapping": vocab_mapping,
    "speculators-train": speculators_train,
    "speculators-cli": speculators_cli,
}


def run(op):
    try:
        return OPS[op["op"]](op)
    except Exception as e:  # the test reports what failed, with where
        return {"ok": False, "error": f"{type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}"}


def main():
    request = json.load(sys.stdin)
    # The trainers print progress of their own; only this script's JSON goes to stdout.
    results = []
    for op in request["ops"]:
        with contextlib.redirect_stdout(sys.stderr):
            results.append(run(op))
    versions = {name: version(name) for name in ("specforge", "speculators", "torch", "datasets", "transformers")}
    sys.stdout.write(json.dumps({"versions": versions, "results": results}))
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
