"""Whether a model's outputs stay the same when calls of other lengths come between them.

MLX's CUDA backend caches the executable CUDA graphs it builds, keyed by their nodes and
edges (not by the kernels in them), and updates a cached graph in place for the next
graph of the same shape. Prompts of different lengths give a model graphs of one shape
whose kernels differ: mlx_w8a8 picks a kernel per M, and the dequantizing GEMM is built
in clusters of two (``__cluster_dims__``) where the others are not. MLX's own
``subgraph_to_key`` says a cached graph does not update correctly across kernels of
different cluster shapes, and a tuner race measured ``mx.quantized_matmul`` chains far
faster than the same calls unlinked (docs/cuda.md, Not done). This runs the mlx_w8a8
variant of a model (as ``python -m mlx_w8a8.bench --model`` builds it) on one prompt
per length, first in order, then again in other orders, and compares every later
output with the first one of its length bit for bit; each output's SQNR against the
bf16 variant says which one is wrong where they differ.

Usage: ``python bench/graph_reuse_probe.py [--model llama-3-8b] [--layers 4]
[--weights 4bit-gs64] [--lengths 100,200,1000] [--rounds 3]``. Exit status 1 where any
output differs from the first of its length.
"""

from __future__ import annotations

import argparse
import sys

import mlx.core as mx

import mlx_w8a8
from mlx_w8a8 import modelbench


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="llama-3-8b", help="a preset or an mlx-lm folder")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--weights", default="4bit-gs64",
                   help="as python -m mlx_w8a8.bench --weights")
    p.add_argument("--lengths", default="100,200,1000",
                   help="prompt lengths, comma-separated (each its own prompt)")
    p.add_argument("--rounds", type=int, default=3, help="rounds after the first")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    try:
        lengths = [int(t) for t in args.lengths.split(",")]
    except ValueError:
        p.error(f"--lengths takes comma-separated integers, got {args.lengths!r}")
    if not lengths or min(lengths) < 1 or args.rounds < 1:
        p.error(f"--lengths needs lengths >= 1 and --rounds >= 1, got {args.lengths!r}, "
                f"{args.rounds}")
    variants, config, label = modelbench.make_variants(
        args.model, layers=args.layers, seed=args.seed, weights=args.weights)
    bf16, w8 = variants["bf16"], variants["mlx_w8a8"]
    vocab = int(config["vocab_size"])
    prompts = {t: mx.random.randint(0, vocab, (1, t), key=mx.random.key(args.seed + t))
               for t in lengths}
    refs = {t: bf16(prompts[t]).astype(mx.float32) for t in lengths}
    mx.eval(refs)
    print(f"MLX {mx.__version__}, {mx.default_device()}, {label}, {args.weights}; lengths "
          f"{lengths}", flush=True)

    def run(t):
        out = w8(prompts[t]).astype(mx.float32)
        mx.eval(out)
        return out

    first = {t: run(t) for t in lengths}
    print(mlx_w8a8.summary(w8, m=tuple(lengths)), flush=True)
    for t in lengths:
        print(f"first, T = {t}: SQNR against bf16 {modelbench.sqnr_db(refs[t], first[t]):.1f} dB",
              flush=True)
    orders = [lengths[::-1], lengths[1::2] + lengths[0::2], lengths]
    differ = 0
    for r in range(args.rounds):
        order = orders[r % len(orders)]
        for t in order:
            out = run(t)
            same = mx.array_equal(out, first[t]).item()
            differ += not same
            diff = mx.max(mx.abs(out - first[t])).item()
            print(f"round {r + 1}, order {order}, T = {t}: "
                  f"{'equal to the first' if same else 'DIFFERS from the first'} "
                  f"(max |diff| {diff:.3g}; SQNR against bf16 "
                  f"{modelbench.sqnr_db(refs[t], out):.1f} dB)", flush=True)
    print(f"{differ} of {args.rounds * len(lengths)} later outputs differ from the first of "
          f"their length", flush=True)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
