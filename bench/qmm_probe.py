"""Where does MLX's own ``mx.quantized_matmul`` (8-bit, affine) agree with the float
product of its dequantized weight on this device?

For every M, N, K, group size and dtype of the grid, a fresh weight is quantized with
``mx.quantize`` and ``mx.quantized_matmul(x, wq, scales, biases, transpose=True)`` is
compared with ``x @ mx.dequantize(...).T`` computed in float32; each case is evaluated
twice, the second time right after an unrelated computation that leaves an output-sized
buffer of NaNs behind (to expose a kernel that did not run, or read stale memory). A case
fails where the relative error (max |diff| / max |reference|) exceeds 0.05 (bfloat16
rounding of a K-term sum is far below that) or an output is not finite.

With ``--time R`` each case is also timed: R calls, each evaluated alone, wall clock
(``mx.eval`` waits for the GPU), after one untimed call; printed with the median and the
rate at which that median reads the weight's codes (N x K bytes), a plausibility check:
a rate past the GPU's memory bandwidth means the work was not done.

Usage: ``python bench/qmm_probe.py [--m 1,4,32,256] [--n 32,64,256,1024]
[--k 64,128,256,512,1024,4096] [--group-size 64] [--dtype bfloat16,float32]
[--time 10] [--verbose]`` (``--verbose`` prints every case, right ones too, as it goes: a
run cut off by a time limit still says which cases it covered).
"""

from __future__ import annotations

import argparse
import sys
import time

import mlx.core as mx
import numpy as np


def ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--m", default="1,4,32,256")
    p.add_argument("--n", default="32,64,256,1024")
    p.add_argument("--k", default="64,128,256,512,1024,4096")
    p.add_argument("--group-size", type=int, default=64)
    p.add_argument("--dtype", default="bfloat16,float32")
    p.add_argument("--verbose", action="store_true", help="print every case as it finishes")
    p.add_argument("--time", type=int, default=0, help="timed calls per case (0: none)")
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    print(f"MLX {mx.__version__}, device {mx.default_device()}, group size {args.group_size}")
    bad = total = 0
    for dname in args.dtype.split(","):
        dtype = getattr(mx, dname)
        for k in ints(args.k):
            for n in ints(args.n):
                w = mx.array(rng.standard_normal((n, k)).astype(np.float32)).astype(dtype)
                wq, s, b = mx.quantize(w, group_size=args.group_size, bits=8)
                wd = mx.dequantize(wq, s, b, group_size=args.group_size, bits=8).astype(mx.float32)
                for m in ints(args.m):
                    x = mx.array(rng.standard_normal((m, k)).astype(np.float32)).astype(dtype)
                    ref = np.array(x.astype(mx.float32) @ wd.T)
                    def call():
                        return mx.quantized_matmul(x, wq, s, b, transpose=True,
                                                   group_size=args.group_size, bits=8)
                    errs = []
                    for attempt in range(2):
                        if attempt:  # leave an output-sized buffer of NaNs behind
                            mx.eval(mx.full((m, n), float("nan"), dtype) * 1.0)
                        y = call()
                        got = np.array(y.astype(mx.float32))
                        err = float(np.max(np.abs(got - ref)) / max(np.max(np.abs(ref)), 1e-30))
                        errs.append(err if np.isfinite(got).all() else float("inf"))
                    total += 1
                    timed = ""
                    if args.time > 0:
                        mx.eval(call())
                        ts = []
                        for _ in range(args.time):
                            t0 = time.perf_counter()
                            mx.eval(call())
                            ts.append(time.perf_counter() - t0)
                        med = float(np.median(ts))
                        timed = f"; {med * 1e6:.1f} us, codes read at {n * k / med / 1e9:.0f} GB/s"
                    worst = max(errs)
                    if not worst <= 0.05:
                        bad += 1
                        print(f"WRONG {dname:8s} M={m:4d} N={n:5d} K={k:5d}: relative error "
                              f"{errs[0]:.3g} / {errs[1]:.3g}{timed}", flush=True)
                    elif args.verbose or timed:
                        print(f"ok    {dname:8s} M={m:4d} N={n:5d} K={k:5d}: relative error "
                              f"{errs[0]:.3g} / {errs[1]:.3g}{timed}", flush=True)
    print(f"{bad} of {total} cases wrong")
    return 0


if __name__ == "__main__":
    sys.exit(main())
