"""Does the tuner's isolated per-op timing predict in-model speed?

For a few (M, N, K) it times every linear candidate that can run here in three ways,
paired and alternating, and prints per-launch microseconds:

- ``tuner``: the tuner's own method (``tuning.timing.paired_measure``: independent
  launches on rotated inputs, graph building inside the timed region), its launches
  cycling through copies of the weight in distinct memory (``tuner.cold_copies``).
- ``hot``: the same with one weight, which stays in the last-level cache when it fits.
- ``build``: only the Python cost of building ``chain`` launches (no eval).
- ``chain``: dependent launches, each feeding the next (``x <- y``, N = K), one eval:
  the shape of a sequence of projections in a forward pass.

Usage: ``python bench/tuner_fidelity.py [--cases 128x4096x4096 ...] [--rounds 15]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import mlx.core as mx

from mlx_w8a8.kernels import registry
from mlx_w8a8.kernels.registry import Problem
from mlx_w8a8.tuning import gate, shapes, timing, tuner


def per_launch_us(fn, chain: int) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e6 / chain


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", nargs="+", default=["128x4096x4096", "512x4096x4096", "128x1024x4096"])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--chain", type=int, default=16)
    args = p.parse_args(argv)
    for case in args.cases:
        m, n, k = shapes.parse_shape(case)
        problem = Problem("linear", m, n, k, "bfloat16", "per_channel", 64)
        found = [c for c in registry.candidates(problem) if c.name != "exact"]
        inputs = gate.operands(problem, variants=4, seed=0)
        w, b = inputs[0][1], inputs[0][2]
        xs = [args_[0] for args_ in inputs]
        scale = mx.array(1.0 / k ** 0.5, dtype=mx.bfloat16)
        copies = tuner.cold_copies(gate.weight_nbytes(w))
        cold = gate.cycle_weights(inputs, copies)
        arms = [(c.name, c.run) for c in found]
        tuned = timing.paired_measure(arms, cold, pairs=args.rounds)
        hot = timing.paired_measure(arms, inputs, pairs=args.rounds)
        rows = {
            c.name: {
                "tuner": tuned.timings[c.name].median_ns / 1e3,
                "hot": hot.timings[c.name].median_ns / 1e3,
            }
            for c in found
        }
        for c in found:
            build, dep = [], []
            for r in range(args.rounds):
                build.append(per_launch_us(lambda: [c.run(xs[i % 4], w, b) for i in range(args.chain)], args.chain))
                if n == k:
                    def chained():
                        y = xs[r % 4]
                        for _ in range(args.chain):
                            y = c.run(y, w, b) * scale  # keep values O(1) along the chain
                        mx.eval(y)
                    dep.append(per_launch_us(chained, args.chain))
            rows[c.name]["build"] = statistics.median(build)
            if dep:
                rows[c.name]["chain"] = statistics.median(dep)
        print(json.dumps({"case": case, "chain": tuned.chain, "weight_copies": copies,
                          "us_per_launch": rows}))
        for name, row in rows.items():
            print(f"  {case:>16} {name:>18}: " + "  ".join(f"{k} {v:8.1f} us" for k, v in row.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
