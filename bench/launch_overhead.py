"""Host cost of one kernel launch in MLX: built-in ops vs ``mx.fast.cuda_kernel``.

A chain of ``--chain`` dependent launches on tiny arrays (so the device work per launch
is a few microseconds) is built, then evaluated; the build (Python and MLX's graph
construction) and the evaluation (encoding, launching, running) are timed separately
and divided by the chain length. Median over ``--rounds``. Arms:

- ``add``: ``y + 1`` (a built-in elementwise op);
- ``qmm``: ``mx.quantized_matmul`` 1 x 256 x 256, 8-bit;
- ``custom``: a one-line ``mx.fast.cuda_kernel`` (``y + 1``), no header;
- ``custom_20k``: the same kernel with a 20 KB header (the size of this package's
  GEMM sources), to see whether the text MLX assembles on every call costs;
- ``gemv``: this package's bound W8A8 GEMV, 1 x 256 x 256 (one launch).

Usage (on a GPU): ``python bench/launch_overhead.py [--chain 200] [--rounds 10]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import mlx.core as mx

from mlx_w8a8.kernels.registry import Problem
from mlx_w8a8.weight import QuantizedWeight

BODY = """
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < inp_shape[1]) out[i] = inp[i] + static_cast<T>(1);
"""


def custom(header: str):
    kern = mx.fast.cuda_kernel(name=f"launch_overhead_{len(header)}", input_names=["inp"],
                               output_names=["out"], source=BODY, header=header)

    def run(y):
        return kern(inputs=[y], template=[("T", y.dtype)], output_shapes=[y.shape],
                    output_dtypes=[y.dtype], grid=(256, 1, 1), threadgroup=(256, 1, 1))[0]
    return run


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--chain", type=int, default=200)
    p.add_argument("--rounds", type=int, default=10)
    args = p.parse_args(argv)
    x = mx.random.normal((1, 256)).astype(mx.bfloat16)
    w = QuantizedWeight.from_float(mx.random.normal((256, 256)).astype(mx.bfloat16) * 0.05)
    mx.eval(x, w.q, w.scales, w.biases)
    header = "".join(f"// header line {i:05d} " + "-" * 40 + "\n" for i in range(20000 // 60))
    arms = {
        "add": lambda y: y + 1,
        "qmm": lambda y: mx.quantized_matmul(y, w.q, w.scales, w.biases, True, 64, 8),
    }
    try:
        arms["custom"] = custom("")
        arms["custom_20k"] = custom(header)
        from mlx_w8a8.kernels import registry

        cand = registry.get("linear", "cuda_int8_gemv")
        problem = Problem("linear", 1, 256, 256, "bfloat16", "per_channel", 64)
        _, quantize, apply = cand.bind_stages(problem, w, None)
        arms["gemv"] = apply if quantize is None else (lambda y: apply(quantize(y)))
    except Exception as error:  # no CUDA here: the other arms still run
        print(f"custom-kernel arms skipped: {type(error).__name__}: {error}")
    rows = {}
    for name, fn in arms.items():
        mx.eval(fn(x))
        builds, evals = [], []
        for _ in range(args.rounds + 1):
            t0 = time.perf_counter()
            y = x
            for _ in range(args.chain):
                y = fn(y)
            t1 = time.perf_counter()
            mx.eval(y)
            t2 = time.perf_counter()
            builds.append((t1 - t0) / args.chain * 1e6)
            evals.append((t2 - t1) / args.chain * 1e6)
        rows[name] = {"build_us": statistics.median(builds[1:]),
                      "eval_us": statistics.median(evals[1:])}
        print(f"{name:>12}: build {rows[name]['build_us']:6.2f} us  eval {rows[name]['eval_us']:6.2f} us "
              f"per launch")
    print(json.dumps({"chain": args.chain, "rounds": args.rounds, "per_launch": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
