#!/usr/bin/env python3
"""tokenmill's reference trainer: a small causal transformer drafter trained on a tokenmill
training dataset (Hugging Face `datasets` folder with `input_ids` and `loss_mask`).

It stands in for the real trainer (e.g. SpecForge's train_eagle3.py under torchrun) so that the
train stage can be run end to end anywhere: on CUDA when a GPU is visible, on the CPU otherwise.

    python trainers/tiny_drafter.py --data DATASET --output CKPT_DIR [--steps N] [--batch-size B]
        [--lr LR] [--resume CHECKPOINT]
    python trainers/tiny_drafter.py --extract --data DATASET --output FEATURES_DIR
    python trainers/tiny_drafter.py --features FEATURES_DIR --data DATASET --output CKPT_DIR …

What it does:
- loads the dataset with `datasets.load_from_disk`; the drafter's vocabulary is the set of token
  ids the dataset uses (a compact draft vocabulary, as EAGLE-3's), mapped back in checkpoints;
- trains next-token prediction, the loss of each predicted token weighted by its `loss_mask`
  (only what the target model said is learned);
- prints `step N/M loss X` (tokenmill reads it for progress), saves `step-NNNNNN.pt` checkpoints
  (model, optimizer, step, vocabulary, arguments) every `--save-every` steps and at the end;
- `--resume CHECKPOINT` continues at the step after the checkpoint's, with the same batches it
  would have drawn (each step's batch is drawn from a generator seeded with the seed and step),
  so a resumed run reaches the same loss as an uninterrupted one.
- the offline, two-step form of EAGLE-3 training in miniature: `--extract` runs a small frozen
  "target" model over every sample and saves its hidden states (`features.pt` in `--output`);
  `--features DIR` then trains the drafter on them (each position sees its token and the
  target's hidden state there, and predicts the next token).
"""
import argparse
import json
import math
import os
import sys
import time


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="training dataset folder (datasets.save_to_disk layout)")
    p.add_argument("--output", required=True, help="folder for checkpoints (created if missing)")
    p.add_argument("--steps", type=int, default=200, help="total optimizer steps")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--resume", default="", help="checkpoint file to continue from (empty: from scratch)")
    p.add_argument("--seq-len", type=int, default=64, help="tokens per training window")
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--save-every", type=int, default=50, help="steps between checkpoints")
    p.add_argument("--log-every", type=int, default=1, help="steps between progress lines")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", help="auto (CUDA when available), cpu or cuda")
    p.add_argument("--extract", action="store_true", help="save a frozen target's hidden states to --output instead of training")
    p.add_argument("--features", default="", help="folder written by --extract: train on the target's hidden states")
    p.add_argument("--target-d-model", type=int, default=96, help="--extract: width of the frozen target")
    p.add_argument("--threads", type=int, default=0, help="CPU threads for torch (0: 1 on the CPU, where a model this small gains nothing from more)")
    return p.parse_args(argv)


def fail(message):
    print(f"tiny_drafter: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


def load_samples(path):
    """(list of (ids, mask) lists) from a tokenmill dataset; refuses what it cannot train on."""
    try:
        import datasets
    except ImportError:
        fail("the Python package `datasets` is missing (npm run setup:trainer installs it)")
    try:
        ds = datasets.load_from_disk(path)
    except Exception as e:  # noqa: BLE001 - reported as is
        fail(f"cannot load the dataset at {path}: {e}")
    for col in ("input_ids", "loss_mask"):
        if col not in ds.column_names:
            fail(f"{path}: column `{col}` is missing (columns: {', '.join(ds.column_names)})")
    samples = []
    for i, (ids, mask) in enumerate(zip(ds["input_ids"], ds["loss_mask"])):
        if len(ids) != len(mask):
            fail(f"{path}: row {i}: input_ids has {len(ids)} tokens, loss_mask {len(mask)}")
        if len(ids) >= 2:
            samples.append((list(ids), list(mask)))
    if not samples:
        fail(f"{path}: no row with at least 2 tokens to train on")
    return samples


def build_model(torch, vocab, d_model, layers, heads, seq_len, d_features=0):
    nn = torch.nn

    class Drafter(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, d_model)
            self.pos = nn.Embedding(seq_len, d_model)
            layer = nn.TransformerEncoderLayer(
                d_model, heads, dim_feedforward=4 * d_model, dropout=0.0, batch_first=True, norm_first=True
            )
            self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(d_model)
            self.head = nn.Linear(d_model, vocab)
            self.feat = nn.Linear(d_features, d_model) if d_features else None

        def hidden(self, x, features=None):
            t = x.shape[1]
            pos = torch.arange(t, device=x.device)
            h = self.embed(x) + self.pos(pos)[None]
            if self.feat is not None:
                h = h + self.feat(features)
            causal = nn.Transformer.generate_square_subsequent_mask(t, device=x.device)
            return self.norm(self.blocks(h, mask=causal, is_causal=True))

        def forward(self, x, features=None):
            return self.head(self.hidden(x, features))

    return Drafter()


def make_batch(torch, samples, to_local, step, seed, batch_size, seq_len, features=None):
    """The batch of `step`: windows drawn with a generator seeded by (seed, step)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    xs, ys, ws, fs = [], [], [], []
    for _ in range(batch_size):
        k = int(torch.randint(len(samples), (1,), generator=g))
        ids, mask = samples[k]
        n = len(ids)
        start = int(torch.randint(max(1, n - seq_len), (1,), generator=g)) if n > seq_len + 1 else 0
        window = ids[start : start + seq_len + 1]
        wmask = mask[start : start + seq_len + 1]
        x = [to_local[t] for t in window[:-1]]
        y = [to_local[t] for t in window[1:]]
        w = [float(m) for m in wmask[1:]]
        pad = seq_len - len(x)
        xs.append(x + [0] * pad)
        ys.append(y + [0] * pad)
        ws.append(w + [0.0] * pad)
        if features is not None:
            f = features[k][start : start + len(x)]
            fs.append(torch.cat([f, f.new_zeros(pad, f.shape[1])]) if pad else f)
    batch = (torch.tensor(xs), torch.tensor(ys), torch.tensor(ws))
    return batch + ((torch.stack(fs),) if features is not None else (None,))


def extract(torch, args, samples):
    """--extract: a frozen target's last hidden state at every position of every sample."""
    vocab_ids = sorted({t for ids, _ in samples for t in ids})
    to_local = {t: i for i, t in enumerate(vocab_ids)}
    max_len = max(len(ids) for ids, _ in samples)
    torch.manual_seed(1234)  # the "target" is the same model every time
    target = build_model(torch, len(vocab_ids), args.target_d_model, 2, 4, max_len)
    target.eval()
    hidden = []
    os.makedirs(args.output, exist_ok=True)
    with torch.no_grad():
        for i, (ids, _) in enumerate(samples, 1):
            x = torch.tensor([[to_local[t] for t in ids]])
            hidden.append(target.hidden(x)[0].clone())
            if i % max(1, len(samples) // 10) == 0 or i == len(samples):
                print(f"step {i}/{len(samples)}", flush=True)
    path = os.path.join(args.output, "features.pt")
    torch.save({"vocab": vocab_ids, "hidden": hidden, "d_target": args.target_d_model}, path + ".tmp")
    os.replace(path + ".tmp", path)
    print(f"features {path}: {len(hidden)} samples, {sum(h.shape[0] for h in hidden)} positions, width {args.target_d_model}", flush=True)


def main(argv):
    args = parse_args(argv)
    try:
        import torch
    except ImportError:
        fail("PyTorch is missing: run `npm run setup:trainer` (installs torch==2.13.0 into .venv)")
    if args.device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    else:
        device = args.device
    if args.threads > 0 or device == "cpu":
        torch.set_num_threads(args.threads if args.threads > 0 else 1)
    samples = load_samples(args.data)
    if args.extract:
        extract(torch, args, samples)
        return
    features = None
    if args.features:
        fpath = os.path.join(args.features, "features.pt")
        if not os.path.exists(fpath):
            fail(f"--features: {fpath} does not exist (run --extract first)")
        feats = torch.load(fpath, map_location="cpu", weights_only=False)
        if len(feats["hidden"]) != len(samples):
            fail(f"--features: {fpath} has {len(feats['hidden'])} samples, the dataset {len(samples)}; extract again")
        features = feats["hidden"]

    ckpt = None
    if args.resume:
        if not os.path.exists(args.resume):
            fail(f"--resume: checkpoint {args.resume} does not exist")
        ckpt = torch.load(args.resume, map_location="cpu", weights_only=False)
        vocab_ids = ckpt["vocab"]
        cfg = ckpt["config"]
    else:
        vocab_ids = sorted({t for ids, _ in samples for t in ids})
        cfg = {"d_model": args.d_model, "layers": args.layers, "heads": args.heads, "seq_len": args.seq_len, "seed": args.seed,
               "d_features": 0 if features is None else int(features[0].shape[1])}
    if (features is None) != (cfg.get("d_features", 0) == 0):
        fail("--features must be given exactly when the checkpoint was trained with features")
    to_local = {t: i for i, t in enumerate(vocab_ids)}
    unknown = sum(1 for ids, _ in samples for t in ids if t not in to_local)
    if unknown:
        fail(f"{unknown} token(s) of the dataset are not in the checkpoint's vocabulary; resume on the dataset it was trained on")

    torch.manual_seed(cfg["seed"])
    model = build_model(torch, len(vocab_ids), cfg["d_model"], cfg["layers"], cfg["heads"], cfg["seq_len"], cfg.get("d_features", 0)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    start_step = 0
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        start_step = int(ckpt["step"])
        print(f"resumed from {args.resume} at step {start_step}", flush=True)
    if start_step >= args.steps:
        fail(f"the checkpoint is at step {start_step}, not before --steps {args.steps}; raise --steps")

    os.makedirs(args.output, exist_ok=True)
    params = sum(p.numel() for p in model.parameters())
    gpu = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    print(
        f"tiny_drafter: {len(samples)} samples, draft vocabulary {len(vocab_ids)}, {params:,} parameters, device {device} ({gpu})",
        flush=True,
    )

    def save(step):
        path = os.path.join(args.output, f"step-{step:06d}.pt")
        tmp = path + ".tmp"
        torch.save(
            {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step, "vocab": vocab_ids, "config": cfg, "args": vars(args)},
            tmp,
        )
        os.replace(tmp, path)  # a killed run never leaves a half-written checkpoint under its name
        print(f"checkpoint {path}", flush=True)

    started = time.time()
    model.train()
    for step in range(start_step + 1, args.steps + 1):
        x, y, w, f = make_batch(torch, samples, to_local, step, cfg["seed"], args.batch_size, cfg["seq_len"], features)
        x, y, w = x.to(device), y.to(device), w.to(device)
        logits = model(x, None if f is None else f.to(device))
        per_token = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="none")
        weight = w.reshape(-1)
        loss = (per_token * weight).sum() / weight.sum().clamp(min=1.0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        value = float(loss.detach())
        if not math.isfinite(value):
            fail(f"step {step}: the loss is {value}")
        if step % args.log_every == 0 or step == args.steps:
            print(f"step {step}/{args.steps} loss {value:.6f}", flush=True)
        if step % args.save_every == 0 or step == args.steps:
            save(step)
    elapsed = time.time() - started
    done = args.steps - start_step
    summary = {"steps": done, "seconds": round(elapsed, 3), "steps_per_sec": round(done / elapsed, 3) if elapsed > 0 else None, "device": device, "gpu": gpu}
    if device == "cuda":
        summary["max_memory_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    print(f"done {json.dumps(summary)}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
