"""Experiment: launch shapes of the activation quantize at M = 64-8192, kernel time.

The shipped ``rowsum`` body runs one block per row with as few threads as keep the row
in registers (64 for a 4096-wide bfloat16 row), so at M = 2048 every block of the grid
is resident at once: all rows are read, then all are written, and the kernel measured
2.2x the copy floor where MLX's own ``astype(int8)`` of the same x measured 1.5x
(docs/history.md, the activation quantize). This script times, with CUPTI and without MLX's CUDA
graphs (run it with ``MLX_USE_CUDA_GRAPHS=0``), against ``astype(int8)`` and the copy
floor (3 M K bytes at the device's copy bandwidth, torch):

- ``rowsum``: the shipped launch (``kernels.cuda.quantize.quantize_spec``);
- ``base:NAME``: the same launch of another revision's kernel text (``--base DIR,...``,
  folders holding its ``quantize.cu`` / ``quantize.cuh``; the arm is named after the
  folder);
- ``rowsum_t128`` / ``rowsum_t256``: the same body with 128 / 256 threads per row;
- ``rowsum_warp``: the shipped one-warp-per-row body;
- ``bound:NAME``: a folder of ``--bound DIR,...``, a kernel text that is *not* exact
  (parts of the work removed, to bound what removing them could gain): timed without
  the comparison, the bytes of its outputs that differ from the shipped launch's
  counted and printed.

Every other variant's codes, scales and row sums are compared bit for bit with the shipped
launch before it is timed (a mismatch is printed and the variant skipped). Variants
tried and dropped are in git history and docs/history.md (a register-streaming
persistent grid; a bulk-copy-fed ring, branch ``quantize-stream``).

Usage: ``MLX_USE_CUDA_GRAPHS=0 python bench/quantize_variants.py [--m 2048,8192]
[--k 4096,14336] [--base DIR,...] [--warp-threads 64,256] [--no-shapes] [--chain 40]``. Needs a CUDA GPU and torch with CUPTI.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

from mlx_w8a8.kernels.cuda import quantize as cuda_quantize  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cuda_bench  # noqa: E402
from chain_timeline import activations, banner, measure  # noqa: E402


def _warp_arm(spec, m: int, threads: int):
    """``spec`` (a ``rowsum_warp`` launch: one warp per row) with ``threads`` per block."""
    rows = threads // 32
    return spec._replace(grid=(-(-m // rows) * threads, 1, 1), threadgroup=(threads, 1, 1)).launch


def variants(m: int, k: int, bases: list[str] = (), shapes: bool = True,
             warp_threads: list[int] = (), bounds: list[str] = ()):
    """``{name: fn(x) -> [xa]}`` (the one activation array, ``cuda_quantize.rowsum_shape``) for
    one shape: the shipped launch, one arm
    per folder of ``bases`` (named after the folder), with ``warp_threads`` one arm per
    folder and block size launching its ``rowsum_warp`` body (``w{threads}:NAME``) and,
    with ``shapes``, the thread-count and warp-per-row arms."""
    spec = cuda_quantize.quantize_spec(m, k, mx.bfloat16, row_sum=True)
    threads = spec.threadgroup[0]
    out = {"rowsum": spec.launch}
    for base in bases:
        name = os.path.basename(os.path.normpath(base))
        out[f"base:{name}"] = cuda_bench.base_quantize_spec(base, m, k).launch
        for t in warp_threads:
            warp = cuda_bench.base_quantize_spec(base, m, k, warp=True)
            out[f"w{t}:{name}"] = _warp_arm(warp, m, t)
    for base in bounds:
        name = os.path.basename(os.path.normpath(base))
        out[f"bound:{name}"] = cuda_bench.base_quantize_spec(base, m, k).launch
    if not shapes:
        return out
    for t in (128, 256):
        if t > threads and k // 8 <= 8 * t:
            wide = spec._replace(grid=(m * t, 1, 1), threadgroup=(t, 1, 1))
            out[f"rowsum_t{t}"] = wide.launch
    out["rowsum_warp"] = cuda_quantize.quantize_spec(m, k, mx.bfloat16, row_sum=True, warp=True).launch
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--m", default="512,2048,8192")
    p.add_argument("--k", default="4096,14336")
    p.add_argument("--base", default="",
                   help="folders (comma-separated) each with another revision's quantize.cu "
                        "/ quantize.cuh writing the one-array layout (bodies with the one "
                        "output xa, shape.cuh); one arm per folder")
    p.add_argument("--bound", default="",
                   help="folders (comma-separated) of kernel texts that are not exact, "
                        "timed without the comparison (bounds on a change's gain)")
    p.add_argument("--no-shapes", action="store_true",
                   help="skip the 128/256-thread and warp-per-row arms")
    p.add_argument("--warp-threads", default="",
                   help="block sizes (comma-separated multiples of 32) at which each "
                        "--base folder's rowsum_warp body is also launched")
    p.add_argument("--chain", type=int, default=40)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    bw = cuda_bench.copy_bandwidth()
    banner(f"chain {args.chain}; kernel us (median); copy bandwidth {bw / 1e9:.0f} GB/s "
           f"(read + written); x copy = kernel time over the copy floor 3 M K / bandwidth; "
           f"x astype = over astype(int8)'s kernel time on the same x")
    for k in [int(v) for v in args.k.split(",")]:
        for m in [int(v) for v in args.m.split(",")]:
            xs, X = activations(m, k, rng)
            fns = variants(m, k, [b for b in args.base.split(",") if b], not args.no_shapes,
                           [int(t) for t in args.warp_threads.split(",") if t],
                           [b for b in args.bound.split(",") if b])
            want = [np.array(a) for a in fns["rowsum"](xs[0])]
            # astype first: every arm is also printed against it (the same bytes moved by
            # MLX's own elementwise kernel, a ratio the measured bandwidth does not enter)
            arms = {"astype(int8)": lambda c: mx.eval([xs[i % X].astype(mx.int8) for i in range(c)])}
            for name, fn in fns.items():
                got = [np.array(a) for a in fn(xs[0])]
                bad = [i for i, (g, w) in enumerate(zip(got, want))
                       if g.shape != w.shape or g.tobytes() != w.tobytes()]
                if name.startswith("bound:"):
                    differ = sum(int(np.count_nonzero(g.view(np.uint8) != w.view(np.uint8)))
                                for g, w in zip(got, want))
                    print(f"M={m:5d} K={k:6d} {name:14s} not exact by design: {differ} "
                          f"bytes differ from rowsum; timed as a bound", flush=True)
                elif bad:
                    print(f"M={m:5d} K={k:6d} {name:14s} DIFFERS from rowsum in outputs {bad}; "
                          f"not timed", flush=True)
                    continue
                arms[name] = lambda c, fn=fn: mx.eval([fn(xs[i % X]) for i in range(c)])
            floor = 3.0 * m * k / bw * 1e6
            astype = None
            for name, fn in arms.items():
                r = measure(fn, args.chain, args.rounds, False)
                astype = astype or r["kernel"]
                print(f"M={m:5d} K={k:6d} {name:14s} kernel {r['kernel']:7.1f}  GB/s "
                      f"{3.0 * m * k / r['kernel'] / 1e3:6.0f}  x copy {r['kernel'] / floor:5.2f}"
                      f"  x astype {r['kernel'] / astype:5.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
