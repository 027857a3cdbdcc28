"""Does MLX's CUDA graph cache run a kernel correctly in a place of a cached graph that a
kernel of another cluster shape filled before?

MLX (0.32, and its main branch of 2026-08) keys every node a custom kernel adds to a CUDA
graph as ``"K"``, whatever the kernel's cluster shape, and when a later graph has the same
key it updates the cached executable graph in place (``cudaGraphExecUpdate``). Its own
comment in ``subgraph_to_key`` says such updates are not correct across cluster shapes,
but that check covers child graphs only. This probe builds two one-kernel ops whose
chains make graphs of the same key: ``clustered`` (compiled in clusters of two blocks,
each element doubled) and ``plain`` (no cluster, launched on an odd number of blocks, each
element plus one), runs chains of each in turn, and checks every output against numpy.

Exit status 0 when every output is right, 1 when any is wrong (or a launch raised). Why
the package compiles no kernel in clusters (``docs/cuda.md``, "CUDA graphs and clusters";
``tests/test_sources.py`` checks the kernel sources).

Usage: ``python bench/cluster_graph_probe.py [--lengths 1,2,3,5] [--rounds 2]``.
"""

from __future__ import annotations

import argparse
import sys

import mlx.core as mx
import numpy as np

from mlx_w8a8 import backends

# Threads per block, and elements per op: the clustered op on an even number of blocks,
# the plain one on an odd number (a launch in clusters of two needs an even grid).
BLOCK = 32
CLUSTERED_N = 4 * BLOCK
PLAIN_N = 3 * BLOCK

CLUSTER_HEADER = """
#undef __global__
#define __global__ __attribute__((global)) __attribute__((cluster_dims(2, 1, 1)))
"""
BODY = """
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < x_shape[0]) y[i] = x[i] {op};
"""


def cuda_ops():
    """(clustered, plain): each a function of a float32 vector, one kernel launch."""
    def make(name, op, header, n):
        kernel = mx.fast.cuda_kernel(name=name, input_names=["x"], output_names=["y"],
                                     source=BODY.format(op=op), header=header)

        def run(x):
            return kernel(inputs=[x], grid=(n, 1, 1), threadgroup=(BLOCK, 1, 1),
                          output_shapes=[x.shape], output_dtypes=[x.dtype])[0]
        return run
    return (make("cluster_graph_probe_clustered", "* 2.0f", CLUSTER_HEADER, CLUSTERED_N),
            make("cluster_graph_probe_plain", "+ 1.0f", "", PLAIN_N))


def chain(op, start: np.ndarray, length: int, expect) -> float:
    """``length`` calls of ``op``, each on the previous output, evaluated together (one
    graph); returns the largest absolute error of any output against ``expect`` applied
    as many times in float64 (``inf`` when the evaluation raised)."""
    outs, x = [], mx.array(start)
    for _ in range(length):
        x = op(x)
        outs.append(x)
    try:
        mx.eval(outs)
    except RuntimeError as e:  # a launch MLX reports as failed
        print(f"  raised: {e}", flush=True)
        return float("inf")
    worst, ref = 0.0, start.astype(np.float64)
    for y in outs:
        ref = expect(ref)
        worst = max(worst, float(np.max(np.abs(np.array(y, dtype=np.float64) - ref))))
    return worst


def probe(ops, lengths, rounds: int, seed: int = 0) -> int:
    """Chains of each length: plain, clustered, plain, clustered ... ``rounds`` times, on
    data new every chain. Returns the number of wrong chains (printed as they run)."""
    clustered, plain = ops
    arms = (("plain", plain, PLAIN_N, lambda r: r + 1.0),
            ("clustered", clustered, CLUSTERED_N, lambda r: r * 2.0))
    rng = np.random.default_rng(seed)
    wrong = 0
    for length in lengths:
        for r in range(rounds):
            for name, op, n, expect in arms:
                start = rng.integers(-64, 64, size=n).astype(np.float32)
                err = chain(op, start, length, expect)
                bad = err != 0.0
                wrong += bad
                print(f"length {length}, round {r + 1}, {name:9s}: "
                      f"{'WRONG' if bad else 'right'} (largest error {err:g})", flush=True)
    return wrong


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", default="1,2,3,5",
                   help="chain lengths, comma-separated (default 1,2,3,5)")
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args(argv)
    try:
        lengths = [int(v) for v in args.lengths.split(",")]
    except ValueError:
        p.error(f"--lengths takes comma-separated integers, got {args.lengths!r}")
    if not lengths or min(lengths) < 1 or args.rounds < 1:
        p.error(f"--lengths and --rounds take values >= 1, got {args.lengths!r}, {args.rounds}")
    if not backends.on_cuda():
        print("cluster_graph_probe: needs MLX's CUDA backend on the default device", file=sys.stderr)
        return 2
    print(f"MLX {mx.__version__}, {mx.default_device()}; lengths {lengths}, "
          f"{args.rounds} rounds", flush=True)
    wrong = probe(cuda_ops(), lengths, args.rounds)
    print(f"{wrong} wrong chain(s)")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
