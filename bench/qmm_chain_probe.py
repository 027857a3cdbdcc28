"""Why the tuner's race timed ``mx.quantized_matmul`` far below its kernel's time.

Part R16 of ``bench/results/h100_2026-12-06_g.log`` (an NVIDIA H100, MLX 0.32.4) timed
``mlx_qmm`` at 18-21 us per call on every shape at M = 16-64, the lm_head's (525 MB of
codes) included, while part QMM timed the same calls, each evaluated alone, at 88-394
us (the lm_head at M = 16: 394 us). This times one problem's ``mlx_qmm`` arm (and the
subnormal GEMM's, for contrast) the way the tuner does (``timing.paired_measure`` over
the tuner's rotated weight copies, a dependent chain) and in variants that each drop one
ingredient, then one chain by hand with the wall clock read after ``mx.eval`` and again
after ``mx.synchronize()``, each link's output checked against its input times the
dequantized weight in float32: which ingredient makes the time wrong, and whether the
chained calls computed what they return.

``--race`` also runs the tuner's own call (every candidate of the problem, its rounds,
its chain rule, its pruning) and variants that each drop one of those, printing the
chain length and ``mlx_qmm``'s per-round samples (why: docs/cuda.md, Not done).

``--fresh R`` then runs R more hand-built chains of each arm, each round's first
activation scaled by its own power of two, so that every link's expected output differs from
every earlier round's: an output left over from an earlier round (a call that did not
run, its buffer handed back holding what the same call wrote before) fails the check.

``--collide`` (run first) races ``mlx_qmm`` against each other candidate alone, each
pair at a chain length of its own, then checks a hand-built chain of that length on
fresh inputs: which kernel, timed in the same process, makes ``mlx_qmm``'s chained calls
fast, and whether they then compute.

Usage: ``python bench/qmm_chain_probe.py [--m 16] [--n 128256] [--k 4096] [--collide] [--race] [--fresh R]``.
"""

from __future__ import annotations

import argparse
import sys
import time

import mlx.core as mx

from mlx_w8a8.kernels import registry
from mlx_w8a8.kernels.registry import Problem
from mlx_w8a8.tuning import gate, timing
from mlx_w8a8.tuning.tuner import TuneConfig, cold_copies

# The arms of the tuner-like timings: the reference and one W8A8 kernel for contrast.
PAIR = ("mlx_qmm", "cuda_w8a8_gemm_subnormal")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--m", type=int, default=16)
    p.add_argument("--n", type=int, default=128256)
    p.add_argument("--k", type=int, default=4096)
    p.add_argument("--race", action="store_true",
                   help="also the tuner's own timing call and its variants")
    p.add_argument("--collide", action="store_true",
                   help="first: mlx_qmm raced against each other candidate alone, each pair at "
                        "a chain length of its own, then a hand-built chain of that length on "
                        "fresh inputs")
    p.add_argument("--fresh", type=int, default=0, metavar="R",
                   help="also R hand-built chains of each arm on inputs new every round")
    args = p.parse_args(argv)
    if args.fresh < 0:
        p.error(f"--fresh takes a count >= 0, got {args.fresh}")
    prob = Problem(op="linear", m=args.m, n=args.n, k=args.k, dtype="bfloat16",
                   weight_format="grouped", group_size=64)
    cfg = TuneConfig()
    inputs = gate.operands(prob, variants=cfg.rotate, seed=cfg.seed)
    copies = cold_copies(gate.weight_nbytes(inputs[0][1]), cfg.cold_bytes)
    cycled = gate.cycle_weights(inputs, copies)
    found = {c.name: c for c in registry.candidates(prob)}
    arms = [(n, registry.layer_run(found[n], prob)) for n in PAIR if n in found]
    print(f"MLX {mx.__version__}, {mx.default_device()}, {prob}; {len(inputs)} inputs, "
          f"{copies} weight copies")
    link = timing.linear_link
    if args.collide:
        collide(prob, cycled, found, link)
    if args.race:
        race(prob, cfg, cycled, found, link)
    for label, ins, kw in (
            ("as the tuner", cycled, dict(link=link, warmup=len(cycled))),
            ("no link", cycled, dict(link=None, warmup=len(cycled))),
            ("no copies", inputs, dict(link=link, warmup=len(inputs))),
            ("warm-up 2", cycled, dict(link=link, warmup=2))):
        res = timing.paired_measure(arms, ins, pairs=3, chain=8, **kw)
        print(f"{label:13s}", "  ".join(f"{n} {t.median_ns / 1e3:9.1f} us"
                                         for n, t in res.timings.items()), flush=True)
    for n, fn in arms:
        each, done, worst = by_hand(fn, cycled, link, 1.0)
        print(f"by hand, {n}: 8 chained calls {each:.1f} us each after eval, "
              f"{done:.1f} us after synchronize; largest relative error of "
              f"a link's output {worst:.3g}", flush=True)
    for r in range(args.fresh):
        factor = 2.0 ** (r + 1)  # exact in bfloat16: a computed output errs as round 0
        for n, fn in arms:
            each, done, worst = by_hand(fn, cycled, link, factor)
            print(f"fresh round {r + 1} (x times {factor}), {n}: {each:.1f} us each after eval, "
                  f"{done:.1f} after synchronize; largest relative error {worst:.3g}", flush=True)
    return 0


def collide(prob, cycled, found, link) -> None:
    """``mlx_qmm`` against each other candidate alone (6 rounds), each pair at a chain
    length no other step of this process uses (MLX keys its cached CUDA graphs by their
    nodes and edges, not by their kernels, so chains of one length share them), then one
    chain of ``mlx_qmm`` of that length built by hand on inputs no earlier call saw: its
    samples and its outputs' error say whether the pair's other kernel left ``mlx_qmm``'s
    calls timed, or computed, wrongly."""
    qmm = registry.layer_run(found["mlx_qmm"], prob)
    others = [n for n in found if n not in ("mlx_qmm", "exact")]
    for i, name in enumerate(others):
        chain = 9 + i
        res = timing.paired_measure([("mlx_qmm", qmm), (name, registry.layer_run(found[name], prob))],
                                    cycled, pairs=6, warmup=len(cycled), chain=chain, link=link)
        each, done, worst = by_hand(qmm, cycled, link, 2.0 ** (i + 1), count=chain)
        print(f"collide {name:28s} chain {chain}: mlx_qmm per round (us) "
              + " ".join(f"{v / 1e3:.0f}" for v in res.timings["mlx_qmm"].samples_ns)
              + f" ({res.timings['mlx_qmm'].status}, unlinked "
              f"{(res.timings['mlx_qmm'].unlinked_ns or 0) / 1e3:.1f} us)"
              + f"; {name} {res.timings[name].median_ns / 1e3:.1f} us; then by hand on fresh "
              f"inputs {each:.1f} us a call ({done:.1f} to synchronize), largest relative "
              f"error {worst:.3g}", flush=True)


def by_hand(fn, cycled, link, factor: float, count: int = 8):
    """One chain of ``count`` calls of ``fn`` built by hand, its first activation times
    ``factor``: (us per call after ``mx.eval``, after ``mx.synchronize()``, the largest
    relative error of a link's output against its input times the dequantized weight in
    float32)."""
    outs, used = [], []
    t0 = time.perf_counter()
    for j in range(count):
        args = cycled[j % len(cycled)]
        if outs:
            args = link(outs[-1], args)
        elif factor != 1.0:
            args = ((args[0] * factor).astype(args[0].dtype), *args[1:])
        used.append(args)
        outs.append(fn(*args))
    mx.eval(outs)
    t1 = time.perf_counter()
    mx.synchronize()
    t2 = time.perf_counter()
    # Each link's output against its own input times the dequantized weight in float32:
    # a call that did not run leaves a wrong (stale) output behind.
    worst = 0.0
    for y, (x, w, _) in zip(outs, used):
        wd = mx.dequantize(w.q, w.scales, w.biases, group_size=64, bits=8)
        ref = x.astype(mx.float32) @ wd.astype(mx.float32).T
        err = mx.max(mx.abs(y.astype(mx.float32) - ref)) / mx.maximum(mx.max(mx.abs(ref)), 1e-30)
        worst = max(worst, err.item())
    return 1e6 * (t1 - t0) / count, 1e6 * (t2 - t0) / count, worst


def race(prob, cfg, cycled, found, link) -> None:
    """The tuner's timing call (``Tuner._measure`` without its gate: every candidate,
    its rounds, chain rule and pruning) and variants, each with ``mlx_qmm``'s samples."""
    every = [(n, registry.layer_run(c, prob)) for n, c in found.items()]
    two = [a for a in every if a[0] in PAIR]
    tuner = dict(pairs=cfg.pairs, warmup=max(cfg.warmup, len(cycled)), chain=cfg.chain,
                 max_chain=cfg.max_chain, prune_ratio=timing.PRUNE_RATIO, keep=("mlx_qmm",),
                 link=link)
    for label, arms, kw in (
            ("race", every, tuner),
            ("race, two arms", two, tuner),
            ("race, no pruning", every, {**tuner, "prune_ratio": None}),
            ("race, 3 rounds", every, {**tuner, "pairs": 3}),
            ("race, chain 8", every, {**tuner, "chain": 8})):
        res = timing.paired_measure(arms, cycled, **kw)
        qmm = res.timings["mlx_qmm"]
        print(f"{label:17s} chain {res.chain}, {len(arms)} arms: "
              + "  ".join(f"{n} {t.median_ns / 1e3:.1f} us" for n, t in res.timings.items()
                          if t.ok and t.samples_ns), flush=True)
        print(f"{'':17s} mlx_qmm per round (us): "
              + " ".join(f"{v / 1e3:.0f}" for v in qmm.samples_ns)
              + f"; {qmm.status}, unlinked {(qmm.unlinked_ns or 0) / 1e3:.1f} us", flush=True)


if __name__ == "__main__":
    sys.exit(main())
