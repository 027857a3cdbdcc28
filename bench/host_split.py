"""Host against GPU in a chain of linears: Python build, MLX encode and GPU wait, per launch.

MLX is lazy. Calling the ops builds a graph in Python (``build``); ``mx.async_eval``
then runs every primitive's ``eval_gpu`` on this thread, which allocates the outputs
and adds a node to a CUDA graph, committing (instantiating or updating, then launching)
a graph every ``MLX_MAX_OPS_PER_BUFFER`` nodes and at the end (``encode``);
``mx.synchronize()`` waits for the GPU (``wait``). Until the first commit the GPU has
nothing to do, so in a chain shorter than one graph the three add up; where the chain
spans several graphs, the GPU runs one graph while the host encodes the next.

Arms, per M on a square weight (K = N), chains of ``--chain`` launches:

- ``bf16``: ``x @ w.T``, one cuBLAS launch;
- ``w8a8``: the TMA W8A8 linear as ``mlx_w8a8.Linear`` runs it (``registry.layer_run``:
  quantize + GEMM, launches bound once);
- ``quant``: its quantize launch alone (``[M, K]`` bf16 in; codes, scales, row sums out);
- ``gemm``: its GEMM launch alone, on codes quantized once before the chain;
- ``add``: ``x + 1`` on the same ``[M, K]`` bf16 (one of MLX's own elementwise kernels);
- ``w8a8c``: ``w8a8``'s bound call (``registry.bound_call``) inside ``mx.compile``, one
  compiled function per weight: a call replays the traced primitives instead of building
  each launch anew. Since ``registry.fuse_stages`` (commit fab117e) the
  ``w8a8`` arm is itself one compiled call, so the two differ by ``layer_run``'s lookup.

``bf16`` and ``w8a8`` run fed (launch i's output is launch i + 1's input, an edge in the
graph), the others independent. Weights and activations rotate over enough copies to
exceed twice the L2. Rounds alternate the arms after one warm-up chain each.

Usage: ``python bench/host_split.py [--m 512,2048] [--n 4096] [--chain 40] [--rounds 7]``;
``--loop ARM --seconds S`` instead runs that arm's chain for S seconds (for a sampling
profiler attached from outside). Needs a CUDA GPU. Run it with ``MLX_USE_CUDA_GRAPHS=0``
or another ``MLX_MAX_OPS_PER_BUFFER`` to see how the split moves.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chain_timeline import activations, banner  # noqa: E402
from cuda_bench import rotation_copies  # noqa: E402

ARMS = ("bf16", "w8a8", "quant", "gemm", "add", "w8a8c")


def make_arms(m: int, n: int, rng) -> dict:
    """``{arm: (op(x, i), fed)}`` and the activations, for M = ``m`` on an n x n weight."""
    from mlx_w8a8.kernels.cuda import quantize as cuda_quantize
    from mlx_w8a8.kernels import registry
    from mlx_w8a8.weight import QuantizedWeight

    C = rotation_copies(n * n)
    ws = [mx.array(rng.standard_normal((n, n)).astype(np.float32) / np.sqrt(n)).astype(mx.bfloat16)
          for _ in range(C)]
    qws = [QuantizedWeight.from_float(w, 64, per_channel=True) for w in ws]
    mx.eval(ws, [q.q for q in qws])
    xs, X = activations(m, n, rng)
    problem = registry.Problem("linear", m, n, n, "bfloat16", "per_channel", 64)
    cand = registry.find("linear", "cuda_w8a8_gemm_tma")
    if cand is None or not cand.available():
        raise SystemExit("host_split: the TMA W8A8 GEMM is not available here")
    run = registry.layer_run(cand, problem)
    spec = cuda_quantize.quantize_spec(m, n, mx.bfloat16, row_sum=True)
    applies = [cand.bind_stages(problem, q, None)[2] for q in qws]
    codes = [tuple(spec.launch(x)) for x in xs]
    compiled = [mx.compile(registry.bound_call(cand, problem, q, None)) for q in qws]
    mx.eval(codes)
    arms = {
        "bf16": (lambda x, i: x @ ws[i % C].T, True),
        "w8a8": (lambda x, i: run(x, qws[i % C], None), True),
        "quant": (lambda x, i: spec.launch(xs[i % X])[0], False),
        "gemm": (lambda x, i: applies[i % C](codes[i % X]), False),
        "add": (lambda x, i: xs[i % X] + 1, False),
        "w8a8c": (lambda x, i: compiled[i % C](x), True),
    }
    return arms, xs


def chain(op, fed: bool, xs, c: int) -> tuple[float, float, float]:
    """One chain: ``(build, encode, wait)`` seconds."""
    t0 = time.perf_counter()
    y, outs = xs[0], []
    for i in range(c):
        y = op(y if fed else None, i)
        outs.append(y)
    t1 = time.perf_counter()
    mx.async_eval(outs)
    t2 = time.perf_counter()
    mx.synchronize()
    t3 = time.perf_counter()
    return t1 - t0, t2 - t1, t3 - t2


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--m", default="512,2048")
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--chain", type=int, default=40)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--loop", choices=ARMS, default=None)
    p.add_argument("--seconds", type=float, default=5.0)
    args = p.parse_args(argv)
    if args.chain < 1 or args.rounds < 1:
        p.error(f"--chain and --rounds must be >= 1, got {args.chain} and {args.rounds}")
    rng = np.random.default_rng(0)
    ms = [int(v) for v in args.m.split(",")]
    banner(f"chain {args.chain}; us per launch, median (p25..p75) of {args.rounds} rounds")
    if args.loop is not None:
        arms, xs = make_arms(ms[0], args.n, rng)
        op, fed = arms[args.loop]
        chain(op, fed, xs, args.chain)
        t_end, chains = time.perf_counter() + args.seconds, 0
        while time.perf_counter() < t_end:
            chain(op, fed, xs, args.chain)
            chains += 1
        print(f"loop {args.loop} M={ms[0]}: {chains} chains of {args.chain}", flush=True)
        return 0
    for m in ms:
        arms, xs = make_arms(m, args.n, rng)
        same = mx.array_equal(arms["w8a8c"][0](xs[0], 0), arms["w8a8"][0](xs[0], 0)).item()
        print(f"M={m:5d} w8a8c output {'equals' if same else 'DIFFERS FROM'} w8a8's", flush=True)
        for op, fed in arms.values():
            chain(op, fed, xs, args.chain)  # compile, warm, build the graphs once
        samples = {a: [] for a in arms}
        for r in range(args.rounds):
            order = list(arms) if r % 2 == 0 else list(reversed(arms))
            for a in order:
                samples[a].append(chain(*arms[a], xs, args.chain))
        for a, rows in samples.items():
            parts = []
            for j, what in enumerate(("build", "encode", "wait", "total")):
                vals = sorted((sum(row) if what == "total" else row[j]) / args.chain * 1e6
                              for row in rows)
                q = statistics.quantiles(vals, n=4) if len(vals) > 1 else [vals[0]] * 3
                parts.append(f"{what} {q[1]:7.1f} ({q[0]:.1f}..{q[2]:.1f})")
            print(f"M={m:5d} N=K={args.n} {a:6s} " + "  ".join(parts), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
