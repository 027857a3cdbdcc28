"""Train a small byte-level Llama on local text, then measure what W8A8 costs it.

Deterministic (seeded data order and initialisation, a fixed number of steps). The text
is every ``*.py`` file under ``--text`` (a folder, read in sorted order; or one file),
split by file: every 20th file is held out. The model is an mlx-lm Llama (vocabulary:
the 256 byte values; grouped-query attention so the v -> o smoothing pair is the tied
kind) and is saved as an mlx-lm folder (``config.json``, ``model.safetensors``, a byte
tokenizer where the ``tokenizers`` package is installed) in bfloat16.

Then the accuracy matrix on the held-out text, every model built from the saved folder:
held-out perplexity for bf16, W8A16 (mlx-lm 8-bit linear layers), W8A8, W8A8 +
SmoothQuant for an alpha sweep, and W8A8 with the mixed policy (``lm_head`` and the
layers below an SQNR floor on W8A16); plus the per-channel activation maxima that show
the outlier channels, and the sensitivity report. JSON lines go to ``--results``, a
table to stdout.

    python bench/train_small_llama.py --text /usr/lib/python3.12 --out /tmp/acc
    python bench/train_small_llama.py --text /usr/lib/python3.11 --out /tmp/acc --tiny
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from functools import partial
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten

SIZES = {
    # ~25M parameters: 8 blocks of width 512, GQA 8 query / 4 KV heads.
    "small": dict(hidden_size=512, num_hidden_layers=8, intermediate_size=1536,
                  num_attention_heads=8, num_key_value_heads=4, seq_len=512, batch=32,
                  steps=1500, lr=1e-3, max_bytes=48 << 20, eval_windows=128,
                  calib_windows=32),
    # Seconds on a CPU: a smoke test of the whole pipeline, not a result.
    "tiny": dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                 num_attention_heads=4, num_key_value_heads=2, seq_len=64, batch=8,
                 steps=40, lr=3e-3, max_bytes=2 << 20, eval_windows=8, calib_windows=4),
}
ALPHAS = (0.5, 0.6, 0.7, 0.75, 0.8, 0.85)


def read_corpus(root: Path, max_bytes: int) -> tuple[bytes, bytes, int]:
    """(train, held-out, files): every 20th file (sorted paths) is held out."""
    files = sorted(root.rglob("*.py")) if root.is_dir() else [root]
    if not files:
        raise SystemExit(f"no *.py files under {root}")
    train, held, total = [], [], 0
    for i, f in enumerate(files):
        try:
            data = f.read_bytes()
        except OSError:
            continue
        (held if i % 20 == 0 else train).append(data)
        total += len(data)
        if total >= max_bytes:
            break
    if root.is_file():  # one file: its last 5% is held out
        cut = int(len(train[0]) * 0.95) if train else 0
        data = (train or held)[0]
        return data[:cut], data[cut:], 1
    return b"\n".join(train), b"\n".join(held), len(files)


def windows(data: bytes, seq_len: int, limit: int | None = None, offset: int = 0) -> mx.array:
    arr = np.frombuffer(data, dtype=np.uint8)[offset:]
    rows = len(arr) // seq_len
    if limit is not None:
        rows = min(rows, limit)
    return mx.array(arr[: rows * seq_len].reshape(rows, seq_len).astype(np.int32))


def build(cfg: dict, seed: int):
    from mlx_lm.models import llama

    mx.random.seed(seed)
    args = llama.ModelArgs(
        model_type="llama", hidden_size=cfg["hidden_size"],
        num_hidden_layers=cfg["num_hidden_layers"], intermediate_size=cfg["intermediate_size"],
        num_attention_heads=cfg["num_attention_heads"],
        num_key_value_heads=cfg["num_key_value_heads"], rms_norm_eps=1e-5, vocab_size=256,
        tie_word_embeddings=False, max_position_embeddings=cfg["seq_len"], rope_theta=10000.0,
    )
    model = llama.Model(args)
    mx.eval(model.parameters())
    config = {k: v for k, v in dataclasses.asdict(args).items() if v is not None}
    return model, config


def train(model, data: bytes, cfg: dict, seed: int, log, max_seconds: float | None = None) -> list[float]:
    seq, batch, steps = cfg["seq_len"], cfg["batch"], cfg["steps"]
    arr = np.frombuffer(data, dtype=np.uint8)
    rng = np.random.default_rng(seed)
    warmup = max(1, steps // 20)
    schedule = optim.join_schedules(
        [optim.linear_schedule(1e-6, cfg["lr"], warmup),
         optim.cosine_decay(cfg["lr"], steps - warmup, cfg["lr"] / 10)], [warmup])
    opt = optim.AdamW(learning_rate=schedule, weight_decay=0.1)

    def loss_fn(m, x, y):
        return nn.losses.cross_entropy(m(x), y, reduction="mean")

    grad = nn.value_and_grad(model, loss_fn)
    state = [model.state, opt.state]

    def step(x, y):
        loss, g = grad(model, x, y)
        g, _ = optim.clip_grad_norm(g, 1.0)
        opt.update(model, g)
        return loss

    if mx.default_device() == mx.gpu:  # on a CPU, compiling the fused kernels costs more than it saves
        step = partial(mx.compile, inputs=state, outputs=state)(step)

    losses, t0 = [], time.perf_counter()
    for i in range(steps):
        starts = rng.integers(0, len(arr) - seq - 1, size=batch)
        chunk = np.stack([arr[s : s + seq + 1] for s in starts]).astype(np.int32)
        loss = step(mx.array(chunk[:, :-1]), mx.array(chunk[:, 1:]))
        mx.eval(state, loss)
        losses.append(loss.item())
        elapsed = time.perf_counter() - t0
        if i % max(1, steps // 10) == 0 or i == steps - 1:
            log(f"step {i:5d}  loss {losses[-1]:.4f}  {elapsed:6.1f} s")
        if max_seconds is not None and elapsed > max_seconds and i < steps - 1:
            log(f"step {i:5d}  loss {losses[-1]:.4f}  {elapsed:6.1f} s: time cap reached, "
                f"stopping after {i + 1} of {steps} steps (this run is not step-reproducible)")
            break
    return losses


def save(model, config: dict, folder: Path) -> None:
    from mlx_lm.utils import save_config, save_model

    model.set_dtype(mx.bfloat16)
    save_model(folder, model)
    save_config(dict(config), folder / "config.json")
    try:
        from mlx_w8a8.tokens import write_byte_tokenizer

        write_byte_tokenizer(folder)
    except ImportError:  # no tokenizers package: the folder stays byte-level only
        pass


def outlier_table(stats: dict, top: int = 4) -> list[dict]:
    """Per observed layer input: the largest channel maxima against the median one."""
    rows = []
    for path, st in stats.items():
        a = np.array(st.absmax)
        order = np.argsort(-a)
        med = float(np.median(a))
        rows.append({
            "layer": path, "median_absmax": med, "max_absmax": float(a[order[0]]),
            "max_over_median": float(a[order[0]] / med) if med > 0 else math.inf,
            "top_channels": [int(c) for c in order[:top]],
            "top_absmax": [float(a[c]) for c in order[:top]],
        })
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--text", required=True, help="folder of *.py files (or one text file)")
    p.add_argument("--out", required=True, help="output folder (model/ and results)")
    p.add_argument("--tiny", action="store_true", help="a seconds-long CPU smoke run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, help="training steps (default: per size)")
    p.add_argument("--max-train-seconds", type=float, default=None,
                   help="stop training early past this many seconds (recorded; default: "
                   "no cap, the run is reproducible)")
    p.add_argument("--eval-windows", type=int, help="held-out windows (default: per size)")
    p.add_argument("--calib-windows", type=int, help="calibration windows (default: per size)")
    p.add_argument("--alphas", default=",".join(map(str, ALPHAS)))
    p.add_argument("--mixed-alpha", type=float, default=None,
                   help="alpha of the mixed-policy model (default: the sweep's best)")
    p.add_argument("--sqnr-floor", type=float, default=None,
                   help="mixed policy floor in dB (default: the 10th percentile of the "
                   "smoothed model's per-layer W8A8 SQNR)")
    p.add_argument("--kernel", default=None, help="W8A8 candidate (default: exact)")
    p.add_argument("--results", help="JSON lines file (default: OUT/results.jsonl)")
    args = p.parse_args(argv)

    from mlx_lm.utils import load_model

    import mlx_w8a8 as w8
    from mlx_w8a8.calibrate import calibrate
    from mlx_w8a8.evaluation import perplexity
    from mlx_w8a8.sensitivity import EXACT, policy, sensitivity
    from mlx_w8a8.smooth import smooth

    kernel = args.kernel or EXACT
    cfg = dict(SIZES["tiny" if args.tiny else "small"])
    for key in ("steps", "eval_windows", "calib_windows"):
        if getattr(args, key):
            cfg[key] = getattr(args, key)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results_path = Path(args.results) if args.results else out / "results.jsonl"
    results_path.write_text("")
    t_start = time.perf_counter()

    def log(msg):
        print(msg, flush=True)

    def record(entry):
        entry = {"elapsed_s": round(time.perf_counter() - t_start, 1), **entry}
        with results_path.open("a") as f:
            f.write(json.dumps(entry) + "\n")

    train_bytes, held_bytes, n_files = read_corpus(Path(args.text), cfg["max_bytes"])
    log(f"corpus: {len(train_bytes)} train bytes, {len(held_bytes)} held-out bytes "
        f"({n_files} files found); device {mx.default_device()}")
    model, config = build(cfg, args.seed)
    n_params = sum(v.size for _, v in tree_flatten(model.parameters()))
    log(f"model: {n_params / 1e6:.1f}M parameters, {cfg}")
    losses = train(model, train_bytes, cfg, args.seed, log, args.max_train_seconds)
    folder = out / "model"
    save(model, config, folder)
    record({"kind": "train", "params": n_params, "steps": len(losses), "final_loss": losses[-1],
            "train_bytes": len(train_bytes), "held_out_bytes": len(held_bytes), "config": cfg,
            "seed": args.seed})
    log(f"saved {folder} ({time.perf_counter() - t_start:.0f} s)")

    test = windows(held_bytes, cfg["seq_len"], cfg["eval_windows"])
    test_batches = [test[i : i + 8] for i in range(0, test.shape[0], 8)]
    # Calibration windows from the training text (offset: not the first bytes).
    calib = windows(train_bytes, cfg["seq_len"], cfg["calib_windows"], offset=len(train_bytes) // 3)
    calib_batches = [calib[i : i + 8] for i in range(0, calib.shape[0], 8)]

    def fresh():
        m = load_model(folder)[0]
        m.set_dtype(mx.bfloat16)
        return m

    table = []

    def run(name, model, **extra):
        ppl, count = perplexity(model, test_batches)
        table.append((name, ppl, extra))
        record({"kind": "perplexity", "variant": name, "perplexity": ppl, "tokens": count,
                "kernel": kernel if "w8a8" in name else None, **extra})
        log(f"{name:<28} perplexity {ppl:9.4f}  ({time.perf_counter() - t_start:.0f} s)")
        return ppl

    base = fresh()
    run("bf16", base)
    stats = calibrate(base, calib_batches)
    outliers = outlier_table(stats)
    for row in outliers:
        record({"kind": "activation_absmax", **row})
    log("\nper-channel activation absmax of layer inputs (calibration data), top channels:")
    log(f"{'layer':<36} {'median':>8} {'max':>9} {'max/med':>8}  top channels")
    for row in outliers:
        if row["layer"].endswith(("q_proj", "gate_proj", "down_proj", "o_proj", "lm_head")):
            log(f"{row['layer']:<36} {row['median_absmax']:8.3f} {row['max_absmax']:9.3f} "
                f"{row['max_over_median']:8.1f}  {row['top_channels']}")
    log("")

    m = fresh()
    nn.quantize(m, group_size=64, bits=8,
                class_predicate=lambda p_, l: isinstance(l, nn.Linear) and l.weight.shape[-1] % 64 == 0)
    run("w8a16 (mlx-lm 8-bit)", m)
    run("w8a8", w8.quantize(fresh(), kernel=kernel))
    run("w8a8 skip lm_head", w8.quantize(fresh(), kernel=kernel, skip=["lm_head"]))

    sweep = {}
    for alpha in [float(a) for a in args.alphas.split(",")]:
        m = fresh()
        smooth(m, calibrate(m, calib_batches), alpha)
        sweep[alpha] = run(f"w8a8 + smoothquant a={alpha}", w8.quantize(m, kernel=kernel),
                           alpha=alpha)
    best = args.mixed_alpha if args.mixed_alpha is not None else min(sweep, key=sweep.get)

    m = fresh()
    smooth(m, calibrate(m, calib_batches), best)
    report = sensitivity(m, calib_batches, kernel=kernel)
    report.save(out / f"sensitivity_alpha{best}.json")
    floor = args.sqnr_floor
    if floor is None:
        floor = float(np.percentile([e["w8a8_db"] for e in report.layers.values()], 10))
    below = policy(report, floor, "w8a16")
    skip = {"lm_head": "w8a16", **below}
    log(f"\nsensitivity of the alpha={best} smoothed model (worst 12 of {len(report.layers)}):")
    log(report.table(worst=12))
    record({"kind": "sensitivity", "alpha": best, **report.to_json()})
    run(f"w8a8 + sq a={best} mixed", w8.quantize(m, kernel=kernel, skip=skip),
              alpha=best, sqnr_floor_db=floor, w8a16_layers=sorted(skip))
    log(f"mixed policy: floor {floor:.2f} dB, on W8A16: {sorted(skip)}")

    ref = table[0][1]
    log(f"\n{'variant':<28} {'perplexity':>11} {'vs bf16':>9}")
    for name, p_, _ in table:
        log(f"{name:<28} {p_:>11.4f} {100 * (p_ / ref - 1):>+8.2f}%")
    log(f"\ntotal {time.perf_counter() - t_start:.0f} s; results in {results_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
