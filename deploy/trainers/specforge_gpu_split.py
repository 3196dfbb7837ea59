"""`specforge train` on the GPU groups tokenmill assigned to a split step.

SpecForge 0.2's `managed_local` stack starts its SGLang capture servers and its trainer ranks with
CUDA_VISIBLE_DEVICES set to the device ordinals its run config names
(`deployment.disaggregated.managed_local`), which replace the train worker's own
CUDA_VISIBLE_DEVICES. A tokenmill step with `gpus: { target: N, drafter: M }` gets its groups only
when it starts (the GPUs with enough free memory), so this script writes the run config again with
them and then runs `specforge train` on it:

    python specforge_gpu_split.py --target-gpus {target_gpus} --drafter-gpus {drafter_gpus} \
        --write {output}/specforge-run.yaml -c specforge-dflash-online.yaml [section.field=value ...] [--plan]

- one capture server per `tp_size` GPUs of the target group, each like the config's first
  `capture_servers` entry (its tp_size, memory fraction, …), on consecutive ports from its port;
- `trainer_cuda_visible_devices` = the drafter group, `deployment.trainer.nproc_per_node` = its size.

Everything after the groups is `specforge train`'s own command line, with `-c` pointing at the
written config; the overrides still apply on top of it (SpecForge validates the result with its
own schema). Runs in SpecForge's Python environment (the train image's /opt/venv).
"""

import argparse
import sys


def gpu_list(text):
    out = [g.strip() for g in text.split(",") if g.strip() != ""]
    if not out or not all(g.isdigit() for g in out):
        raise argparse.ArgumentTypeError(f"expected GPU indices separated by commas, got {text!r}")
    return out


def split_config(raw, target, drafter):
    """The run config `raw` (a dict) with its managed_local stack on these groups."""
    try:
        managed = raw["deployment"]["disaggregated"]["managed_local"]
    except (KeyError, TypeError):
        raise SystemExit("the run config has no deployment.disaggregated.managed_local to place on the GPU groups")
    servers = managed.get("capture_servers") or [{"port": 30000, "tp_size": 1}]
    template = dict(servers[0])
    tp = int(template.get("tp_size", 1))
    if len(target) % tp != 0:
        raise SystemExit(f"the target group has {len(target)} GPU(s), not a multiple of the capture servers' tp_size {tp}")
    port = int(template["port"])
    managed["capture_servers"] = [
        {**template, "port": port + i, "cuda_visible_devices": target[i * tp : (i + 1) * tp]}
        for i in range(len(target) // tp)
    ]
    managed["trainer_cuda_visible_devices"] = list(drafter)
    raw.setdefault("deployment", {}).setdefault("trainer", {})["nproc_per_node"] = len(drafter)
    return raw


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target-gpus", type=gpu_list, required=True)
    parser.add_argument("--drafter-gpus", type=gpu_list, required=True)
    parser.add_argument("--write", required=True, help="where the run config on these groups is written")
    parser.add_argument("-c", "--config", required=True, help="the run config to place on the groups")
    args, rest = parser.parse_known_args(argv)
    overlap = set(args.target_gpus) & set(args.drafter_gpus)
    if overlap:
        parser.error(f"the target and drafter groups share GPU(s) {sorted(overlap)}")

    import yaml

    with open(args.config) as f:
        raw = yaml.safe_load(f)
    raw = split_config(raw, args.target_gpus, args.drafter_gpus)
    with open(args.write, "w") as f:
        yaml.safe_dump(raw, f, sort_keys=False)

    from specforge.cli import main as specforge

    return specforge(["train", "-c", args.write, *rest])


if __name__ == "__main__":
    sys.exit(main())
