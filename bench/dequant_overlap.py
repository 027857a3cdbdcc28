"""Prefill with the dequantize-then-matmul kernels' float weights made on a side stream.

For an mlx-lm checkpoint format (``--weights 8bit-gs64`` ...), builds the model bench's
variants (``mlx_w8a8.modelbench.make_variants``) and times the prefill of the bf16 model
and of the mlx_w8a8 model under each ``mlx_w8a8.kernels.dequant_matmul.overlap`` mode
(``off``: the float weight in the call's stream; ``side``: on a second stream, unbounded;
``next``: on a second stream, not before the previous such call's input is ready), in
alternating rounds, with each arm's working memory (peak above the memory in use before
its first prefill) and its logits against the ``off`` arm's.

    python bench/dequant_overlap.py --weights 4bit-gs64 --tokens 512,2048 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import sys

import mlx.core as mx

from mlx_w8a8 import modelbench
from mlx_w8a8.kernels import dequant_matmul as dq
from mlx_w8a8.tuning.model_timing import alternate, prefill


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="llama-3-8b")
    p.add_argument("--weights", default="4bit-gs64")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--tokens", default="512,2048")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--modes", default="off,side,next")
    p.add_argument("--kernel", default=None, help="force this kernel in every layer")
    args = p.parse_args(argv)
    modes = args.modes.split(",")
    variants, config, label = modelbench.make_variants(
        args.model, args.layers, weights=args.weights, kernel=args.kernel)
    bf16, w8 = variants["bf16"], variants["mlx_w8a8"]
    print(f"{label}: {args.layers} layer(s), weights {args.weights}, modes {modes}, "
          f"{args.rounds} alternating rounds")
    arms = ["bf16", *modes]

    def run(name, tokens):
        if name == "bf16":
            return prefill(bf16, tokens)
        dq.overlap = name
        dq._last[0] = None
        try:
            return prefill(w8, tokens)
        finally:
            dq.overlap = "off"

    for t in (int(v) for v in args.tokens.split(",")):
        tokens = mx.random.randint(0, int(config["vocab_size"]), (1, t),
                                   key=mx.random.key(t)).astype(mx.int32)
        work, logits = {}, {}
        for name in arms:  # first calls: working memory and logits
            logits[name] = modelbench.working_memory(lambda: run(name, tokens)[1], work, name)
        for name in arms[1:]:
            same = mx.array_equal(logits[name], logits[arms[1]]).item()
            print(f"T={t} {name}: logits equal to {arms[1]}'s: {same}")
        del logits
        for _ in range(2):
            for name in arms:
                run(name, tokens)
        times = alternate(arms, args.rounds, lambda n: run(n, tokens)[0])
        med = {n: statistics.median(v) for n, v in times.items()}
        for name in arms:
            ratios = [b / s for b, s in zip(times["bf16"], times[name])]
            print(f"T={t} {name:5s} {t / med[name]:10.4g} tok/s  "
                  f"{statistics.median(ratios):.3f}x bf16 (rounds {min(ratios):.3f}.."
                  f"{max(ratios):.3f})  working memory {work[name] / 2**30:.2f} GiB")
        mx.clear_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
