"""Where a model's prefill time goes: building the graph (Python, before any GPU work)
vs evaluating it, per variant, paired.

MLX is lazy: ``model(tokens, cache=cache)`` only builds the graph (every op's Python and
C++ node construction, nothing runs on the device), ``mx.eval(logits)`` then encodes and
runs it. The build part cannot overlap device work, so a variant whose layers cost more
host time per call pays it in full at every prefill, whatever the GPU's speed. This
script times the two parts separately for the model benchmark's variants (bf16, mlx-lm
8-bit, mlx_w8a8: ``mlx_w8a8.modelbench.make_variants``), one fresh KV cache per
forward, rounds in alternating order after one warm-up forward per variant.

Usage: ``python bench/model_host_cost.py [--model llama-3-8b] [--layers 4]
[--tokens 128,512] [--rounds 10] [--table PATH] [--out FILE.jsonl] [--profile N]``.
Prints per variant and T the median build and eval milliseconds (p25..p75); with
``--profile N``, then the 30 costliest functions (own time, ``cProfile``) of building N
forwards of each variant at the last T.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mlx.core as mx  # noqa: E402

from mlx_w8a8 import modelbench  # noqa: E402


def forward(model, tokens, prof=None):
    """``(build_seconds, eval_seconds)`` of one prefill into a fresh cache; ``prof`` (a
    ``cProfile.Profile``) runs around the build only (MLX's evaluation is C++: a
    profile would only charge it to this function)."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    if prof is not None:
        prof.enable()
    t0 = time.perf_counter()
    logits = model(tokens, cache=cache)
    t1 = time.perf_counter()
    if prof is not None:
        prof.disable()
    mx.eval(logits)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="llama-3-8b")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--tokens", default="128,512")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--table", default=None, help="tuning table (default: the shipped ones)")
    p.add_argument("--out", default=None, help="JSON lines of every round")
    p.add_argument("--profile", type=int, default=0,
                   help="profile the graph build of this many forwards per variant")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.layers < 1:
        p.error(f"--rounds and --layers must be >= 1, got {args.rounds}, {args.layers}")
    try:
        tokens_list = [int(t) for t in args.tokens.split(",")]
    except ValueError:
        p.error(f"--tokens must be comma-separated integers, got {args.tokens!r}")
    if args.table:
        from mlx_w8a8.tuning import set_tuning_table

        set_tuning_table(args.table)
    variants, config, label = modelbench.make_variants(args.model, args.layers)
    out = open(args.out, "w") if args.out else None
    print(f"{label}: {args.layers} layer(s), device {mx.default_device()}, "
          f"{args.rounds} alternating rounds")
    names = list(variants)
    for t in tokens_list:
        tokens = mx.random.randint(0, int(config["vocab_size"]), (1, t))
        for name in names:  # warm-up: decisions, compiles, bound launches
            forward(variants[name], tokens)
        samples = {n: [] for n in names}
        for r in range(args.rounds):
            order = names if r % 2 == 0 else names[::-1]
            for name in order:
                samples[name].append(forward(variants[name], tokens))
            if out:
                out.write(json.dumps({"tokens": t, "round": r, "order": order,
                                      "seconds": {n: samples[n][-1] for n in names}}) + "\n")
        for name in names:
            build = [b * 1e3 for b, _ in samples[name]]
            ev = [e * 1e3 for _, e in samples[name]]
            q = lambda v: statistics.quantiles(v, n=4) if len(v) > 1 else [v[0]] * 3  # noqa: E731
            bq, eq = q(build), q(ev)
            print(f"T={t:5d} {name:12s} build {bq[1]:7.3f} ms ({bq[0]:.3f}..{bq[2]:.3f})  "
                  f"eval {eq[1]:7.3f} ms ({eq[0]:.3f}..{eq[2]:.3f})")
    if out:
        out.close()
    if args.profile > 0:
        profile(variants, tokens, args.profile)
    return 0


def profile(variants, tokens, n: int) -> None:
    """Print the costliest functions (own time) of building ``n`` forwards per variant."""
    import cProfile
    import pstats
    from mlx_lm.models.cache import make_prompt_cache

    for name, model in variants.items():
        caches = [make_prompt_cache(model) for _ in range(n)]
        prof = cProfile.Profile()
        outs = []
        prof.enable()
        for cache in caches:
            outs.append(model(tokens, cache=cache))
        prof.disable()
        mx.eval(outs)
        print(f"--- {name}: graph build of {n} forwards, T={tokens.shape[1]}")
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    sys.exit(main())
