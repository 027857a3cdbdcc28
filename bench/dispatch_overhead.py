"""Graph-build time of one ``mlx_w8a8.Linear`` call vs an 8-bit ``nn.QuantizedLinear``.

What a layer costs in Python before any kernel runs: the time to build the lazy graph
of ``layer(x)`` (no ``mx.eval``), on the same shape, for

- ``qlinear8``: ``nn.QuantizedLinear`` (8 bits, group 64), MLX's own layer;
- ``w8a8_mlx_qmm``: ``mlx_w8a8.Linear`` with a tuning-table hit whose choice is
  ``mlx_qmm``, so both layers build the same op (``mx.quantized_matmul``, 8 bits,
  group 64) and the difference is the dispatch;
- ``w8a8_<kernel>``: the same layer with a table hit on a W8A8 kernel (the first
  device W8A8 kernel that runs the shape here, else ``exact``), reported separately;
- ``bf16_linear``: ``nn.Linear`` in bfloat16, for scale.

The table is a temporary file written with ``mlx_w8a8.tuning.table.write_entries`` and
named with ``mlx_w8a8.set_tuning_table``; the hit is checked with
``mlx_w8a8.tuning.lookup`` before timing. Each arm is warmed up (its first call makes
the layer's decision; nothing is evaluated, so large M costs no compute), then timed in blocks of ``--calls`` calls, arms alternating
block by block (A B C, C B A, ...); per-call time = block time / calls. Reported:
median and p25..p75 per arm, and the per-block ratios to ``qlinear8``.

Usage: ``python bench/dispatch_overhead.py [--m 1,512] [--k 4096] [--n 4096]
[--blocks 200] [--calls 50] [--out FILE.jsonl]``; prints a table and one JSON line per M.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402

import mlx_w8a8  # noqa: E402
from mlx_w8a8.kernels import registry  # noqa: E402
from mlx_w8a8.kernels.registry import Problem  # noqa: E402
from mlx_w8a8.tuning import lookup, render, shapes, table  # noqa: E402

GROUP_SIZE = 64
EXACT = registry.EXACT


def w8a8_choice(problem: Problem) -> str:
    """A W8A8 kernel for ``problem`` here: a device one if any, else the exact one."""
    found = [c for c in registry.candidates(problem)
             if c.name != "mlx_qmm" and getattr(c, "w8a8", True)]
    device = [c.name for c in found if c.backend != "any"]
    return device[0] if device else EXACT


def entry(problem: Problem, choice: str) -> dict:
    """A table entry for ``problem`` choosing ``choice``, fresh for the kernels here."""
    cands = {c.name: {"digest": c.digest, "status": "ok", "backend": c.backend}
             for c in registry.candidates(problem) if c.name in (choice, "mlx_qmm")}
    return {"op": "linear", "m_bucket": shapes.bucket(problem.m), "n": problem.n, "k": problem.k,
            "dtype": problem.dtype, "weight_format": problem.weight_format,
            "group_size": problem.group_size, "has_bias": problem.has_bias, "choice": choice,
            "reference": "mlx_qmm", "m": problem.m, "speedup": 1.0, "candidates": cands,
            "measured_at": "forced by bench/dispatch_overhead.py"}


def force(path: str, problem: Problem, choice: str) -> dict:
    """Write a table at ``path`` whose entry for ``problem`` chooses ``choice``, name it,
    and check that the lookup finds it."""
    if os.path.exists(path):
        os.unlink(path)
    table.write_entries(path, table.device_key(), [entry(problem, choice)])
    mlx_w8a8.set_tuning_table(path)
    hit = lookup(problem)
    if hit is None or hit.choice != choice:
        raise SystemExit(f"[dispatch_overhead] the forced table entry ({choice}) is not used: "
                         f"lookup gave {hit}")
    return {"choice": hit.choice, "layer": hit.layer}


def time_blocks(arms: dict, x: mx.array, blocks: int, calls: int) -> dict[str, list[float]]:
    """Per-call graph-build seconds per block, arms alternating block by block."""
    names = list(arms)
    out = {n: [] for n in names}
    for b in range(blocks):
        order = names if b % 2 == 0 else names[::-1]
        for n in order:
            layer = arms[n]
            start = time.perf_counter()
            for _ in range(calls):
                layer(x)
            out[n].append((time.perf_counter() - start) / calls)
    return out


def git_state() -> dict:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "mlx_w8a8"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return {"commit": rev or None, "package_modified": bool(dirty)}
    except Exception:
        return {"commit": None, "package_modified": None}


def run(args) -> list[dict]:
    records = []
    tmp = tempfile.mkdtemp(prefix="dispatch-")
    dense = nn.Linear(args.k, args.n, bias=False)
    dense.set_dtype(mx.bfloat16)
    qlinear = nn.QuantizedLinear.from_linear(dense, group_size=GROUP_SIZE, bits=8)
    w8 = mlx_w8a8.Linear.from_linear(dense, group_size=GROUP_SIZE)
    mx.eval(dense.parameters(), qlinear.parameters(), w8.parameters())
    for m in args.m:
        x = mx.random.normal((m, args.k)).astype(mx.bfloat16)
        mx.eval(x)
        problem = Problem("linear", m, args.n, args.k, "bfloat16", "per_channel", GROUP_SIZE, False)
        kernel = w8a8_choice(problem)
        runs, hits, reprs = {}, {}, {}
        # one table per forced choice; the w8a8 layer is timed under each in turn, each
        # time paired with MLX's layers
        for label, choice in (("w8a8_mlx_qmm", "mlx_qmm"), (f"w8a8_{kernel}", kernel)):
            hits[label] = force(os.path.join(tmp, f"{choice}-{m}.json"), problem, choice)
            arms = {"qlinear8": qlinear, label: w8, "bf16_linear": dense}
            for layer in arms.values():  # warm-up: the layer's decision is made on first use
                for _ in range(3):
                    layer(x)
            reprs[label] = repr(w8)
            runs[label] = time_blocks(arms, x, args.blocks, args.calls)
        mlx_w8a8.set_tuning_table(None)
        times = {label: got[label] for label, got in runs.items()}
        for n in ("qlinear8", "bf16_linear"):
            times[n] = [t for got in runs.values() for t in got[n]]
        stats = {n: dict(zip(("median_us", "p25_us", "p75_us"),
                             (round(v * 1e6, 3) for v in render.spread(ts)))) for n, ts in times.items()}
        ratios = {}
        for label, got in runs.items():
            med, lo, hi = render.spread([a / b for a, b in zip(got[label], got["qlinear8"])])
            ratios[f"{label}/qlinear8"] = {"median": round(med, 3), "p25": round(lo, 3), "p75": round(hi, 3)}
        records.append({
            "bench": "dispatch_overhead", "m": m, "n": args.n, "k": args.k, "dtype": "bfloat16",
            "group_size": GROUP_SIZE, "device": table.device_key(), "git": git_state(),
            "blocks": args.blocks, "calls_per_block": args.calls, "graph_build": stats,
            "ratio": ratios, "table_hit": hits, "layer_repr": reprs,
        })
    return records


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--m", default="1,512", help="token counts, comma-separated (default: %(default)s)")
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--k", type=int, default=4096)
    p.add_argument("--blocks", type=int, default=200, help="timed blocks per arm")
    p.add_argument("--calls", type=int, default=50, help="calls per timed block")
    p.add_argument("--out", help="append the JSON lines to this file")
    args = p.parse_args(argv)
    args.m = shapes.parse_m_list(args.m)
    records = run(args)
    head = ["M", "arm", "graph build (median)", "p25..p75", "ratio to qlinear8 (p25..p75)"]
    body = []
    for r in records:
        for arm, s in r["graph_build"].items():
            ratio = r["ratio"].get(f"{arm}/qlinear8")
            body.append([str(r["m"]), arm, f"{s['median_us']:.2f} us", f"{s['p25_us']:.2f}..{s['p75_us']:.2f}",
                         "-" if ratio is None else f"{ratio['median']:.2f}x ({ratio['p25']:.2f}..{ratio['p75']:.2f})"])
    print(render.columns(head, body))
    print("target: w8a8_mlx_qmm / qlinear8 <= 1.3x at M = 1 and M = 512")
    for r in records:
        line = json.dumps(r, allow_nan=False)
        print(line)
        if args.out:
            with open(args.out, "a", encoding="utf-8") as f:
                f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
