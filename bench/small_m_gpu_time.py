"""GPU time of the small-M W8A8 / W4A8 kernels on group-wise weights: the kernels' own
durations (CUPTI through ``torch.profiler``), not the tuner's chains, whose per-launch
times include the host's cost.

For each ``--m`` and each ``--kn`` shape (K x N), on weights ``mx.quantize`` wrote
(``--bits`` 8 or 4, ``--group-size``) and bfloat16 activations: the bfloat16 ``x @ w.T``,
``mx.quantized_matmul`` at those bits (``qmm``), the plain quantize launch
(``quantize``), the dp4a GEMV on its output (``gemv``, M <= 16; its 4-bit form at 4
bits) and the tensor-core GEMV (``mma``: the shipped depth, ``gemv.MMA_GEMV_DEPTH``, and
row tiles, ``gemv.mma_row_tiles``; ``mma4``: four steps of loads in flight; ``mma_r1`` /
``mma_r2`` / ``mma_r4``: one / two / four tiles of 16 weight rows a block where the
shipped launch has another count and RT NT <= 8, each at the shipped warps a block;
``mma_w8`` / ``mma_w4`` / ``mma_w2``: eight / four / two warps a block where the shipped
launch (``gemv.mma_warps``) has another count; the 4-bit form at 4 bits), each the median
kernel time of ``--reps`` evaluated calls in microseconds, and per quantized arm the
rate at which it read the weight's codes (their bytes, N K or N K / 2, per time, GB/s).
The tensor-core GEMV's outputs in every form but the warp counts must equal the shipped
form's bit for bit (a row names those that do not); the warp counts add their partials in
another order, and a row gives their largest difference relative to the largest output.

Usage: ``python bench/small_m_gpu_time.py [--m 16,32] [--kn 4096x14336,14336x4096]
[--bits 8] [--group-size 64] [--reps 5]``. Needs a CUDA GPU and torch with CUPTI.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

from mlx_w8a8.kernels.cuda import gemv as cuda_gemv, quantize as cuda_quantize  # noqa: E402
from mlx_w8a8.weight import QuantizedWeight  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tile_gpu_time import timed  # noqa: E402

DEFAULT_KN = "4096x1024,4096x4096,4096x6144,14336x4096,4096x14336,4096x28672,4096x128256"


def parse_pairs(text: str, what: str) -> list[tuple[int, int]]:
    try:
        pairs = [tuple(int(v) for v in item.split("x")) for item in text.split(",")]
    except ValueError:
        pairs = []
    if not pairs or any(len(p) != 2 or min(p) < 1 for p in pairs):
        raise ValueError(f"[small_m_gpu_time] {what} takes KxN pairs separated by commas, "
                         f"got {text!r}")
    return pairs


def arms(m: int, x, w, qmm_args, weight) -> dict:
    """The timed calls at ``m`` tokens: name -> function returning the arm's output."""
    xq, xs = cuda_quantize.quantize(x)[:2]
    out = {"bf16": lambda: x @ w.T,
           "qmm": lambda: mx.quantized_matmul(x, *qmm_args, transpose=True,
                                              group_size=weight.group_size, bits=weight.bits),
           "quantize": lambda: cuda_quantize.quantize(x)[0]}
    if m <= cuda_gemv.GEMV_MAX_M:
        out["gemv"] = lambda: cuda_gemv.gemv_quantized(xq, xs, weight, None, x.dtype)
    if m <= cuda_gemv.MMA_GEMV_MAX_M:
        shipped = cuda_gemv.mma_row_tiles(m, weight.n, weight.bits)
        forms = [("mma", cuda_gemv.MMA_GEMV_DEPTH, shipped), ("mma4", 4, shipped)]
        forms += [(f"mma_r{rows}", cuda_gemv.MMA_GEMV_DEPTH, rows) for rows in (1, 2, 4)
                  if rows * -(-m // 8) <= 8 and rows != shipped]
        # every form at the shipped warps (the same sums in the same order as "mma")
        warps = cuda_gemv.mma_warps(m, weight.n, weight.bits, weight.per_channel, shipped)
        forms = [(name, depth, rows, warps) for name, depth, rows in forms]
        forms += [(f"mma_w{w}", cuda_gemv.MMA_GEMV_DEPTH, shipped, w) for w in (8, 4, 2)
                  if w != warps]
        for name, depth, rows, warps in forms:
            spec = cuda_gemv.gemv_mma_spec(m, weight, None, x.dtype, depth=depth, rows=rows,
                                           warps=warps)
            out[name] = (lambda s=spec: s.launch(xq, xs)[0])
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--m", default="16,32")
    p.add_argument("--kn", default=DEFAULT_KN, help=f"KxN shapes (default {DEFAULT_KN})")
    p.add_argument("--group-size", type=int, choices=(64, 128), default=64)
    p.add_argument("--bits", type=int, choices=(8, 4), default=8)
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args(argv)
    try:
        ms = [int(v) for v in args.m.split(",")]
        shapes = parse_pairs(args.kn, "--kn")
    except ValueError as e:
        p.error(str(e))
    if min(ms) < 1 or max(ms) > cuda_gemv.MMA_GEMV_MAX_M:
        p.error(f"--m takes token counts in [1, {cuda_gemv.MMA_GEMV_MAX_M}], got {args.m!r}")
    rng = np.random.default_rng(0)
    print(f"MLX {mx.__version__}, {mx.default_device()}; median kernel us of {args.reps} "
          f"evaluated calls, {args.bits}-bit codes, group size {args.group_size}; GB/s: the "
          f"codes' bytes (N K {args.bits} / 8) per us")
    for k, n in shapes:
        w = mx.array(rng.standard_normal((n, k)).astype(np.float32) / np.sqrt(k)).astype(mx.bfloat16)
        wq, sq, bq = mx.quantize(w, group_size=args.group_size, bits=args.bits)
        weight = QuantizedWeight(wq, sq, bq, args.group_size, per_channel=False, bits=args.bits)
        mx.eval(w, wq, sq, bq)
        for m in ms:
            x = mx.array(rng.standard_normal((m, k)).astype(np.float32)).astype(mx.bfloat16)
            mx.eval(x)
            calls = arms(m, x, w, (wq, sq, bq), weight)
            row = {name: timed(fn, args.reps)[0] for name, fn in calls.items()}
            rates = {name: n * k * args.bits / (8e3 * t) for name, t in row.items()
                     if name not in ("bf16", "quantize") and t > 0}
            shipped = calls["mma"]()
            differ = [name for name in calls if name.startswith("mma") and name != "mma"
                      and not name.startswith("mma_w")
                      and not mx.array_equal(calls[name](), shipped).item()]
            # Other warp counts add the K split's partials in another order: their
            # largest difference from the shipped form, relative to its largest output.
            scale = mx.abs(shipped.astype(mx.float32)).max().item() or 1.0
            wdiff = {name: mx.abs(calls[name]().astype(mx.float32)
                                  - shipped.astype(mx.float32)).max().item() / scale
                     for name in calls if name.startswith("mma_w")}
            print(f"M={m:3d} K={k:6d} N={n:6d}  "
                  + "  ".join(f"{name} {t:7.1f}" for name, t in row.items())
                  + "  | GB/s " + "  ".join(f"{name} {r:6.0f}" for name, r in rates.items())
                  + (f"  | OUTPUT DIFFERS from mma: {', '.join(differ)}" if differ else "")
                  + "".join(f"  | {name} max diff {d:.1e}" for name, d in wdiff.items()),
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
