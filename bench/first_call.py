"""What a prefill at a length never run before costs, and where the time goes.

A server meets most prompt lengths once. For each length in ``--lengths`` (run in that
order, after ``--warm`` prefills at the first one), this script times one prefill of
each variant (bf16 and mlx_w8a8, built as the model benchmark builds them) split into
building the graph (``model(tokens)``, Python) and evaluating it (``mx.eval``: MLX's
encode, any kernel compile or module load, the GPU), and counts the files in MLX's
on-disk kernel cache (``$MLX_PTX_CACHE_DIR``, else ``<tmp>/mlx/<version>/ptx``) before
and after, so a compile shows as new files. With ``--profile``, the graph build of the
first call of the mlx_w8a8 variant at each length also runs under ``cProfile`` and the
12 costliest functions (cumulative time) are printed. With ``--warm-up``,
``mlx_w8a8.warm_up(model, max_tokens=max(lengths))`` runs on the mlx_w8a8 variant
before the timed calls and its wall time is printed: the first calls after it should
compile nothing.

Usage: ``python bench/first_call.py [--model llama-3-8b] [--layers 4] [--kernel NAME]
[--table PATH] [--lengths 128,129,130,512,515] [--warm 2] [--warm-up] [--profile]
[--out FILE.jsonl]``. Run it twice in fresh processes to see what the disk cache saves.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mlx.core as mx  # noqa: E402

from mlx_w8a8 import modelbench  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_host_cost import forward  # noqa: E402


def ptx_cache_files() -> int:
    """Files in MLX's on-disk kernel cache (0 where it does not exist)."""
    d = os.environ.get("MLX_PTX_CACHE_DIR") or os.path.join(
        tempfile.gettempdir(), "mlx", mx.__version__, "ptx")
    n = 0
    for _, _, files in os.walk(d):
        n += len(files)
    return n


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="llama-3-8b")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--kernel", default=None)
    p.add_argument("--table", default=None)
    p.add_argument("--lengths", default="128,129,130,512,515,516,2048,2051,2052")
    p.add_argument("--warm", type=int, default=2)
    p.add_argument("--warm-up", action="store_true",
                   help="run mlx_w8a8.warm_up on the mlx_w8a8 model before the timed calls")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    if a.table:
        from mlx_w8a8.tuning import set_tuning_table

        set_tuning_table(a.table)
    lengths = [int(x) for x in a.lengths.split(",")]
    variants, config, label = modelbench.make_variants(a.model, a.layers, 0, a.kernel)
    vocab = int(config["vocab_size"])
    pool = mx.random.randint(0, vocab, (1, max(lengths)), key=mx.random.key(7)).astype(mx.int32)
    out = open(a.out, "a") if a.out else None
    print(f"{label}, {a.layers} layers, kernel {a.kernel or 'table'}; MLX {mx.__version__}; "
          f"kernel cache files at start: {ptx_cache_files()}", flush=True)
    if a.warm_up:
        import mlx_w8a8

        t0 = time.perf_counter()
        report = mlx_w8a8.warm_up(variants["mlx_w8a8"], max_tokens=max(lengths))
        wall = time.perf_counter() - t0
        print(f"warm_up: {len(report.compiled)} calls, {wall:.2f} s wall (scan "
              f"{report.scan_seconds:.2f} s); kernel cache files now: {ptx_cache_files()}",
              flush=True)
        if out:
            out.write(json.dumps({"warm_up_s": round(wall, 6), "calls": len(report.compiled),
                                  "scan_s": round(report.scan_seconds, 6)}) + "\n")
    print(f"{'variant':10s} {'T':>5s} {'call':>4s} {'build ms':>9s} {'eval ms':>9s} {'new cache files':>15s}")
    for i, t in enumerate(lengths):
        tokens = pool[:, :t]
        calls = 1 + (a.warm if i == 0 else 0)
        for name in ("bf16", "mlx_w8a8"):
            for c in range(calls):
                before = ptx_cache_files()
                prof = (cProfile.Profile() if a.profile and c == 0 and name == "mlx_w8a8"
                        else None)
                b, e = forward(variants[name], tokens, prof)
                new = ptx_cache_files() - before
                print(f"{name:10s} {t:5d} {c:4d} {b * 1e3:9.2f} {e * 1e3:9.2f} {new:15d}", flush=True)
                if prof is not None:
                    text = io.StringIO()
                    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(12)
                    print(text.getvalue(), flush=True)
                if out:
                    out.write(json.dumps({"variant": name, "tokens": t, "call": c,
                                          "build_s": round(b, 6), "eval_s": round(e, 6),
                                          "new_cache_files": new}) + "\n")
    if out:
        out.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
