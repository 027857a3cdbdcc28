"""MLX's CPU float32 matrix product rate, and which BLAS library the process loaded.

MLX's Linux CPU wheel links the reference BLAS it bundles; run this once as is and once
with OpenBLAS preloaded (``LD_PRELOAD=.../libopenblas.so.0``) to see what the calibration
pass of ``convert`` and ``eval`` gain (``docs/accuracy.md``).

    python bench/cpu_blas.py [--m 1024 --k 576 --n 1536 --repeats 5]
"""

from __future__ import annotations

import argparse
import time

import mlx.core as mx


def loaded_blas() -> list[str]:
    """Paths of the BLAS libraries mapped into this process (Linux; empty elsewhere)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "blas" in line.lower()}
    except OSError:
        return []
    return sorted(p for p in paths if p.startswith("/"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--m", type=int, default=1024)
    p.add_argument("--k", type=int, default=576)
    p.add_argument("--n", type=int, default=1536)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    mx.set_default_device(mx.cpu)
    a = mx.random.normal((args.m, args.k))
    w = mx.random.normal((args.n, args.k))
    mx.eval(a, w)
    best = float("inf")
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        mx.eval(a @ w.T)
        best = min(best, time.perf_counter() - t0)
    flops = 2 * args.m * args.k * args.n
    print(f"MLX {mx.__version__} CPU float32 x @ w.T, {args.m} x {args.k} by {args.k} x {args.n}: "
          f"best of {args.repeats} {best * 1e3:.1f} ms, {flops / best / 1e9:.1f} GFLOP/s")
    print("BLAS libraries loaded:", ", ".join(loaded_blas()) or "none found")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
