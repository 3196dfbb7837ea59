#!/usr/bin/env python3
"""tokenmill's reference trainer: a small causal transformer drafter trained on a tokenmill
training dataset (Hugging Face `datasets` folder with `input_ids` and `loss_mask`).

It stands in for the real trainer (e.g. SpecForge's train_eagle3.py under torchrun) so that the
train stage can be run end to end anywhere: on CUDA when a GPU is visible, on the CPU otherwise.

    python trainers/tiny_drafter.py --data DATASET --output CKPT_DIR [--steps N] [--batch-size B]
        [--lr LR] [--resume CHECKPOINT]
    python trainers/tiny_drafter.py --extract --data DATASET --output FEATURES_DIR
    python trainers/tiny_drafter.py --features FEATURES_DIR --data DATASET --output CKPT_DIR …
    python trainers/tiny_drafter.py --mode dflash --mask-token-id ID --data DATASET --output CKPT_DIR
        [--block-size K] [--anchors-per-sample N] [--loss-decay-gamma G] …

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
- `--mode dflash`: a DFlash-style block drafter in miniature. Anchors are drawn per sample (so
  short conversations get their share) from the positions followed by at least 2 adjacent
  supervised tokens; at each anchor a small frozen "target" reads the tokens up to it, and the
  drafter sees a block of K slots — the anchor's token, then the reserved mask token
  (`--mask-token-id`, which the data must never hold) — plus the target's hidden state at the
  anchor, attends across the whole block at once, and predicts the K tokens after the anchor in
  one pass (slot j the token at anchor + 1 + j, its loss weighted by the loss mask and by
  exp(-j / gamma), as DFlash's decaying loss). The target sees only tokens up to the anchor, so no
  block reads a future target state.
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
    p.add_argument("--mode", choices=("ar", "dflash"), default="ar", help="ar: next-token drafter (EAGLE-3 style); dflash: block drafter")
    p.add_argument("--block-size", type=int, default=8, help="dflash: slots per block (tokens predicted per anchor)")
    p.add_argument("--anchors-per-sample", type=int, default=4, help="dflash: anchors drawn in each sample of a batch")
    p.add_argument("--loss-decay-gamma", type=float, default=4.0, help="dflash: slot j's loss weighted by exp(-j / gamma)")
    p.add_argument("--mask-token-id", type=int, default=-1, help="dflash: the reserved token the block's slots are filled with (required)")
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


def build_dflash(torch, vocab, d_model, layers, heads, block_size, d_target):
    """The block drafter: K slots (anchor token, then mask tokens) + the target's state at the anchor."""
    nn = torch.nn

    class BlockDrafter(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, d_model)
            self.pos = nn.Embedding(block_size, d_model)
            self.feat = nn.Linear(d_target, d_model)
            layer = nn.TransformerEncoderLayer(
                d_model, heads, dim_feedforward=4 * d_model, dropout=0.0, batch_first=True, norm_first=True
            )
            self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(d_model)
            self.head = nn.Linear(d_model, vocab)

        def forward(self, x, target_state):
            pos = torch.arange(x.shape[1], device=x.device)
            h = self.embed(x) + self.pos(pos)[None] + self.feat(target_state)[:, None, :]
            # No causal mask: every slot of the block sees every other (one drafting pass).
            return self.head(self.norm(self.blocks(h)))

    return BlockDrafter()


def dflash_anchors(mask):
    """Positions a with loss_mask[a + 1] and loss_mask[a + 2] set: at least 2 adjacent supervised tokens after a."""
    return [a for a in range(len(mask) - 2) if mask[a + 1] and mask[a + 2]]


def make_dflash_batch(torch, samples, anchors, to_local, mask_local, step, cfg, batch_size, per_sample, gamma):
    """The blocks of `step`: samples, then anchors within each, drawn with a generator seeded by (seed, step)."""
    g = torch.Generator().manual_seed(cfg["seed"] * 1_000_003 + step)
    k, ctx = cfg["block_size"], cfg["seq_len"]
    xs, ys, ws, cs = [], [], [], []
    for _ in range(batch_size):
        i = int(torch.randint(len(samples), (1,), generator=g))
        ids, mask = samples[i]
        eligible = anchors[i]
        picks = torch.randperm(len(eligible), generator=g)[: min(per_sample, len(eligible))].tolist()
        for p in picks:
            a = eligible[p]
            context = [to_local[t] for t in ids[max(0, a + 1 - ctx) : a + 1]]
            cs.append([0] * (ctx - len(context)) + context)
            xs.append([to_local[ids[a]]] + [mask_local] * (k - 1))
            y, w = [], []
            for j in range(k):
                q = a + 1 + j
                y.append(to_local[ids[q]] if q < len(ids) else 0)
                w.append(float(mask[q]) * math.exp(-j / gamma) if q < len(ids) else 0.0)
            ys.append(y)
            ws.append(w)
    return torch.tensor(xs), torch.tensor(ys), torch.tensor(ws), torch.tensor(cs)


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

    if args.mode == "dflash":
        if features is not None:
            fail("--mode dflash computes the target's states itself; leave out --features")
        train_dflash(torch, args, samples, device)
        return

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


def train_dflash(torch, args, samples, device):
    """--mode dflash: the block drafter, trained on blocks at anchors; checkpoints as the ar mode's."""
    if args.block_size < 2:
        fail(f"--block-size must be at least 2, got {args.block_size}")
    ckpt = None
    if args.resume:
        if not os.path.exists(args.resume):
            fail(f"--resume: checkpoint {args.resume} does not exist")
        ckpt = torch.load(args.resume, map_location="cpu", weights_only=False)
        if ckpt["config"].get("mode") != "dflash":
            fail(f"--resume: {args.resume} is not a dflash checkpoint")
        vocab_ids, cfg = ckpt["vocab"], ckpt["config"]
    else:
        if args.mask_token_id < 0:
            fail("--mode dflash needs --mask-token-id: a reserved token the data never holds (not pad, not eos)")
        vocab_ids = sorted({t for ids, _ in samples for t in ids})
        cfg = {"mode": "dflash", "d_model": args.d_model, "layers": args.layers, "heads": args.heads, "seq_len": args.seq_len,
               "seed": args.seed, "block_size": args.block_size, "mask_token": args.mask_token_id, "d_target": args.target_d_model}
    mask_token = cfg["mask_token"]
    holding = sum(1 for ids, _ in samples if mask_token in ids)
    if holding:
        fail(f"the mask token {mask_token} is in {holding} row(s) of the dataset: it must be reserved (never in the data)")
    to_local = {t: i for i, t in enumerate(vocab_ids)}
    if any(t not in to_local for ids, _ in samples for t in ids):
        fail("token(s) of the dataset are not in the checkpoint's vocabulary; resume on the dataset it was trained on")
    mask_local = len(vocab_ids)
    anchors = [dflash_anchors(mask) for _, mask in samples]
    usable = [i for i, a in enumerate(anchors) if a]
    if not usable:
        fail("no sample has 2 adjacent supervised tokens: DFlash has no anchor to draw")
    skipped = len(samples) - len(usable)
    samples = [samples[i] for i in usable]
    anchors = [anchors[i] for i in usable]

    torch.manual_seed(1234)  # the frozen "target", the same model every time
    target = build_model(torch, len(vocab_ids) + 1, cfg["d_target"], 2, 4, cfg["seq_len"]).to(device)
    target.eval()
    for p in target.parameters():
        p.requires_grad_(False)
    torch.manual_seed(cfg["seed"])
    model = build_dflash(torch, len(vocab_ids) + 1, cfg["d_model"], cfg["layers"], cfg["heads"], cfg["block_size"], cfg["d_target"]).to(device)
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
        f"tiny_drafter: dflash, {len(samples)} samples with anchors ({skipped} without), block {cfg['block_size']}, "
        f"mask token {mask_token}, draft vocabulary {len(vocab_ids)}, {params:,} parameters, device {device} ({gpu})",
        flush=True,
    )

    def save(step):
        path = os.path.join(args.output, f"step-{step:06d}.pt")
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step, "vocab": vocab_ids, "config": cfg, "args": vars(args)}, path + ".tmp")
        os.replace(path + ".tmp", path)
        print(f"checkpoint {path}", flush=True)

    started = time.time()
    model.train()
    for step in range(start_step + 1, args.steps + 1):
        x, y, w, c = make_dflash_batch(torch, samples, anchors, to_local, mask_local, step, cfg, args.batch_size, args.anchors_per_sample, args.loss_decay_gamma)
        x, y, w, c = x.to(device), y.to(device), w.to(device), c.to(device)
        with torch.no_grad():
            state = target.hidden(c)[:, -1, :]
        logits = model(x, state)
        per_token = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="none")
        weight = w.reshape(-1)
        loss = (per_token * weight).sum() / weight.sum().clamp(min=1e-6)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        value = float(loss.detach())
        if not math.isfinite(value):
            fail(f"step {step}: the loss is {value}")
        if step % args.log_every == 0 or step == args.steps:
            # Slot 1's top-1 agreement on this batch: a first hint, not acceptance (measure that with tokenmill eval).
            hit = (logits.argmax(-1) == y).float()[:, 0].mean()
            print(f"step {step}/{args.steps} loss {value:.6f} slot1_acc {float(hit):.3f}", flush=True)
        if step % args.save_every == 0 or step == args.steps:
            save(step)
    elapsed = time.time() - started
    done = args.steps - start_step
    summary = {"mode": "dflash", "steps": done, "seconds": round(elapsed, 3), "steps_per_sec": round(done / elapsed, 3) if elapsed > 0 else None, "device": device, "gpu": gpu}
    print(f"done {json.dumps(summary)}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
