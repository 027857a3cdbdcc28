"""Why a sibling group stops launching together: runs the model benchmark's sequence
(prefill at each T, then decode) on the mlx_w8a8 variant alone and prints, the first
time each group counts a launch whose outputs a member never took, the Python stack
of that call, and after each phase every group's state (enabled, unused count).

Usage: ``python bench/sibling_trace.py [--model llama-3-8b] [--layers 4]
[--tokens 128,512,2048] [--decode 8] [--prompt 128] [--table PATH]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mlx.core as mx  # noqa: E402

from mlx_w8a8 import modelbench, siblings  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="llama-3-8b")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--tokens", default="128,512,2048")
    p.add_argument("--decode", type=int, default=8)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--table", default=None)
    args = p.parse_args(argv)
    if args.table:
        from mlx_w8a8.tuning import set_tuning_table

        set_tuning_table(args.table)
    variants, config, _ = modelbench.make_variants(args.model, args.layers)
    model = variants["mlx_w8a8"]
    groups = {}
    for name, layer in model.named_modules():
        g = getattr(layer, "_siblings", None)
        if g is not None:
            groups.setdefault(id(g), (name, g))
    seen = set()
    original = siblings.Siblings._unused_launch

    def traced(self):
        if id(self) not in seen:
            seen.add(id(self))
            label = next(n for n, g in groups.values() if g is self)
            print(f"first unused launch in the group of {label}:")
            traceback.print_stack(limit=12)
        return original(self)

    siblings.Siblings._unused_launch = traced

    def state(phase):
        print(phase, " ".join(f"{n.rsplit('.', 1)[0]}:{'on' if g.enabled else 'OFF'}/{g.unused}"
                              for n, g in groups.values()))

    vocab = int(config["vocab_size"])
    for t in [int(v) for v in args.tokens.split(",")]:
        tokens = mx.random.randint(0, vocab, (1, t)).astype(mx.int32)
        for _ in range(3):
            modelbench.prefill(model, tokens)
        state(f"after prefill T={t}")
    if args.decode:
        prompt = mx.random.randint(0, vocab, (args.prompt,)).astype(mx.int32)
        for _ in range(2):
            modelbench.decode(model, prompt, args.decode)
        state("after decode")
    for name, layer in model.named_modules():
        if ".layers.0." in name and name.endswith("proj"):
            text = repr(layer)
            print(name, text[text.find("runs="):])
    return 0


if __name__ == "__main__":
    sys.exit(main())
