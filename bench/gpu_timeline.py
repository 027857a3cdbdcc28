"""Where a model's GPU time goes: every kernel of a prefill or of a decode run, recorded
with CUPTI (through ``torch.profiler``, which records the kernels of every library in
the process, MLX's CUDA graphs included), per variant of the model benchmark.

For each variant (bf16, mlx-lm 8-bit, mlx_w8a8: ``mlx_w8a8.modelbench.make_variants``)
and each ``--tokens`` T, ``--rounds`` prefills into a fresh cache are recorded one by
one; with ``--decode N``, ``--rounds`` runs of N decode steps after a ``--prompt``
token prompt (only the steps after the first token are recorded). Per recorded run it
reports:

- ``wall``: the run's wall time under the profiler (recording costs a little per
  launch, so it is not the benchmark's figure: ``python -m mlx_w8a8.bench`` is);
- ``span``: first kernel start to last kernel end; ``busy``: the union of the kernel
  intervals (what the GPU spent running something); ``idle`` = span - busy;
- ``kernels``: the kernel count; per category (our GEMM, quantize and GEMV kernels,
  cuBLAS, MLX's quantized matmul, attention, the rest) the summed kernel time and count.

Decode runs also print every round's tok/s and its per-token GEMV time, so a bimodal
decode shows whether the slow rounds run slower kernels or wait longer between them.

Usage: ``python bench/gpu_timeline.py [--model llama-3-8b] [--layers 4] [--tokens 128]
[--decode 32] [--prompt 128] [--rounds 4] [--variants bf16,mlx_w8a8] [--table PATH]
[--out FILE.jsonl] [--top 12]``. Needs a CUDA build of MLX and torch with CUPTI.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mlx.core as mx  # noqa: E402

from mlx_w8a8 import modelbench  # noqa: E402

# First matching substring of a kernel's name -> category (order matters: our kernels'
# names contain "gemm" too).
CATEGORIES = (
    ("w8a8_quantize", "w8a8 quantize"),
    ("w8a8_gemv", "w8a8 gemv"),
    ("w8a8_gemm", "w8a8 gemm"),
    ("gemv", "mlx gemv"),
    ("qmm", "mlx qmm"),
    ("qmv", "mlx qmm"),
    ("affine", "mlx qmm"),
    ("sdpa", "attention"),
    ("attention", "attention"),
    ("flash", "attention"),
    ("nvjet", "cublas"),
    ("cutlass", "cublas"),
    ("sm90_xmma", "cublas"),
    ("gemm", "cublas"),
)


def category(name: str) -> str:
    low = name.lower()
    for key, cat in CATEGORIES:
        if key in low:
            return cat
    return "other"


def kernels_of(prof) -> list[tuple[str, float, float]]:
    """``[(name, start_us, duration_us)]`` of the GPU kernels a profiler recorded."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    finally:
        os.unlink(path)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    out = [(e["name"], float(e["ts"]), float(e.get("dur", 0.0)))
           for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"]
    out.sort(key=lambda k: k[1])
    return out


def summarize(kernels, wall_s: float) -> dict:
    """Span, busy (union of intervals), idle and per-category sums of one recorded run."""
    if not kernels:
        return {"wall_us": wall_s * 1e6, "kernels": 0}
    busy, cur_s, cur_e = 0.0, None, None
    for _, s, d in kernels:
        e = s + d
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    span = max(s + d for _, s, d in kernels) - kernels[0][1]
    cats: dict[str, list[float]] = {}
    names: dict[str, list[float]] = {}
    for name, _, d in kernels:
        cats.setdefault(category(name), []).append(d)
        names.setdefault(name, []).append(d)
    return {
        "wall_us": wall_s * 1e6, "span_us": span, "busy_us": busy, "idle_us": span - busy,
        "kernels": len(kernels),
        "categories": {c: {"us": sum(v), "n": len(v)} for c, v in sorted(cats.items())},
        "names": {n: {"us": sum(v), "n": len(v), "mean_us": sum(v) / len(v)}
                  for n, v in names.items()},
    }


def record(fn):
    """Run ``fn()`` under the profiler: ``(wall seconds, kernels)``."""
    from torch.profiler import ProfilerActivity, profile

    mx.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        fn()
        mx.synchronize()
        wall = time.perf_counter() - t0
    return wall, kernels_of(prof)


def record_decode(model, prompt, steps: int, loop):
    """Decode ``steps`` tokens after ``prompt``; only the steps after the first token
    (the prompt's prefill excluded) are recorded. ``(wall seconds, kernels)``."""
    from torch.profiler import ProfilerActivity, profile

    gen = loop(prompt, model, max_tokens=steps + 1)
    prof = profile(activities=[ProfilerActivity.CUDA])
    try:
        next(gen)
        mx.synchronize()
        prof.start()
        t0 = time.perf_counter()
        for i, _ in enumerate(gen, start=1):
            if i == steps:
                break
        mx.synchronize()
        wall = time.perf_counter() - t0
        prof.stop()
    finally:
        gen.close()
        mx.synchronize()
    return wall, kernels_of(prof)


def med(rows, key):
    vals = [r.get(key, 0.0) for r in rows]
    return statistics.median(vals) if vals else 0.0


def report(label: str, rows: list[dict], per: int, top: int) -> None:
    """Print the medians over the recorded runs, per ``per`` tokens (1 for prefill)."""
    print(f"--- {label}: {len(rows)} recorded runs, medians" + (f", per token of {per}" if per > 1 else ""))
    for key in ("wall_us", "span_us", "busy_us", "idle_us", "kernels"):
        print(f"  {key:10s} {med(rows, key) / per:10.1f}")
    cats = sorted({c for r in rows for c in r.get("categories", {})})
    for c in cats:
        us = statistics.median(r["categories"].get(c, {"us": 0})["us"] for r in rows) / per
        n = statistics.median(r["categories"].get(c, {"n": 0})["n"] for r in rows) / per
        print(f"  {c:16s} {us:10.1f} us  {n:6.1f} kernels")
    totals: dict[str, list[float]] = {}
    for r in rows:
        for n, v in r.get("names", {}).items():
            totals.setdefault(n, []).append(v["us"])
    ranked = sorted(totals.items(), key=lambda kv: -sum(kv[1]))[:top]
    for n, v in ranked:
        print(f"    {sum(v) / len(rows) / per:9.1f} us  {n[:110]}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="llama-3-8b")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--tokens", default="128", help="prefill lengths, comma-separated ('' for none)")
    p.add_argument("--decode", type=int, default=0, help="decode steps per run (0: none)")
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--variants", default="bf16,mlx_w8a8")
    p.add_argument("--table", default=None, help="tuning table (default: the shipped ones)")
    p.add_argument("--out", default=None, help="JSON lines of every recorded run")
    p.add_argument("--top", type=int, default=12, help="kernels listed per run kind")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.layers < 1 or args.decode < 0:
        p.error("--rounds and --layers must be >= 1 and --decode >= 0")
    try:
        tokens_list = [int(t) for t in args.tokens.split(",") if t.strip()]
    except ValueError:
        p.error(f"--tokens must be comma-separated integers, got {args.tokens!r}")
    if args.table:
        from mlx_w8a8.tuning import set_tuning_table

        set_tuning_table(args.table)
    variants, config, label = modelbench.make_variants(args.model, args.layers)
    names = [n for n in args.variants.split(",") if n]
    unknown = [n for n in names if n not in variants]
    if unknown:
        p.error(f"--variants: unknown {unknown}; known: {list(variants)}")
    out = open(args.out, "w") if args.out else None
    print(f"{label}: {args.layers} layer(s), device {mx.default_device()}")

    def emit(kind, name, t, r, row):
        if out:
            rec = {k: v for k, v in row.items() if k != "names"}
            out.write(json.dumps({"kind": kind, "variant": name, "tokens": t, "round": r, **rec}) + "\n")

    vocab = int(config["vocab_size"])
    for t in tokens_list:
        tokens = mx.random.randint(0, vocab, (1, t))
        rows = {n: [] for n in names}
        for n in names:
            modelbench.prefill(variants[n], tokens)  # warm-up
        for r in range(args.rounds):
            for n in (names if r % 2 == 0 else names[::-1]):
                wall, ks = record(lambda: modelbench.prefill(variants[n], tokens))
                rows[n].append(summarize(ks, wall))
                emit("prefill", n, t, r, rows[n][-1])
        for n in names:
            report(f"{n} prefill T={t}", rows[n], 1, args.top)
    if args.decode:
        prompt = mx.random.randint(0, vocab, (args.prompt,))
        loop = modelbench.decode_loop()[1]
        rows = {n: [] for n in names}
        for n in names:
            modelbench.decode(variants[n], prompt, min(args.decode, 4), loop)  # warm-up
        for r in range(args.rounds):
            for n in (names if r % 2 == 0 else names[::-1]):
                wall, ks = record_decode(variants[n], prompt, args.decode, loop)
                row = summarize(ks, wall)
                row["tok_s"] = args.decode / wall
                gemv = row.get("categories", {}).get("w8a8 gemv", {"us": 0.0})["us"]
                print(f"decode round {r} {n:12s} {row['tok_s']:8.1f} tok/s under the profiler, "
                      f"busy {row.get('busy_us', 0):9.1f} us, idle {row.get('idle_us', 0):9.1f} us, "
                      f"gemv {gemv:8.1f} us, {row['kernels']} kernels")
                rows[n].append(row)
                emit("decode", n, args.decode, r, row)
        for n in names:
            report(f"{n} decode N={args.decode} after {args.prompt} prompt tokens", rows[n],
                   args.decode, args.top)
    if out:
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
