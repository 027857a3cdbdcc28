"""Host (Python) cost of one CUDA linear launch: per call vs bound once, kernel call stubbed.

Runs on any machine: ``mx.fast.cuda_kernel`` is replaced by a stub whose launch returns
ready-made arrays at once, so what is timed is the Python of the launch path alone (list,
template, shape and grid building, the kernel lookup, the candidate and layer plumbing),
not MLX's C++ custom-kernel node nor any GPU work. Arms, per case:

- ``run``: ``candidate.run(x, w, None)``, the launch path built on every call (what
  ``mlx_w8a8.Linear`` ran for CUDA candidates before ``Candidate.bind_stages``);
- ``staged``: ``apply(quantize(x), w, None, dtype)`` of ``candidate.stages`` (two-stage
  candidates only; what the layer ran for them before);
- ``bound``: the closures of ``candidate.bind_stages(problem, w, None)``;
- ``layer_old`` / ``layer_bound``: an ``mlx_w8a8.Linear`` forced to the candidate, with
  the candidate registered without / with ``bind_stages`` (activation sharing off, so
  every call quantizes);
- ``op``: the functional ``mlx_w8a8.w8a8_linear(x, w, kernel=<candidate>)`` (its input
  checks, decision and bound launches kept per weight after the first call);
- ``qmm``: graph build of ``mx.quantized_matmul`` on the same weight (CPU), for scale.

The bound launches replay through ``mx.compile``
(``LaunchSpec.bound``, ``registry.fuse_stages``): the stub makes a kernel call free, so
the ``bound``, ``layer_bound`` and ``op`` arms now charge the replay's cost without the
launch-building cost it saves (3.4-4.3 us per launch on an H200's host); compare those
on a GPU with ``bench/host_split.py``.

Arms alternate block by block (A B C ..., then reversed); per-call time = block time /
calls. Reported: median and p25..p75 per arm and the per-block ratios to ``run``.

Usage: ``python bench/dispatch_cuda_stub.py [--blocks 200] [--calls 200] [--out FILE.jsonl]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import attrs  # noqa: E402
import mlx.core as mx  # noqa: E402

import mlx_w8a8  # noqa: E402
import mlx_w8a8.nn as w8nn  # noqa: E402
from mlx_w8a8.kernels import registry  # noqa: E402
from mlx_w8a8.kernels.cuda import launch  # noqa: E402
from mlx_w8a8.kernels.registry import Problem  # noqa: E402
from mlx_w8a8.tuning import render  # noqa: E402

# (label, candidate, M, N, K): a decode GEMV and a prefill-sized per-channel GEMM.
CASES = (
    ("gemv_m1", "cuda_int8_gemv", 1, 4096, 4096),
    ("gemm_m128", "cuda_w8a8_gemm", 128, 4096, 4096),
)


def stub_cuda_kernel(**build):
    """Stands in for ``mx.fast.cuda_kernel``: the launch returns the arrays its first launch
    made (zeros of the output shapes), so a launch costs one call and no allocation. Each
    kernel object is launched with one shape here (the kernel cache is cleared per case).
    The arrays are evaluated when made: a bound launch traced under ``mx.compile`` then
    holds them as constants (unevaluated ones would carry the trace's graph)."""
    made = []

    def launch_stub(*, output_shapes, output_dtypes, **_):
        if not made:
            made.append([mx.zeros(s, dtype=d) for s, d in zip(output_shapes, output_dtypes)])
            mx.eval(made[0])
        return made[0]
    return launch_stub


def time_blocks(arms: dict, blocks: int, calls: int) -> dict[str, list[float]]:
    names = list(arms)
    out = {n: [] for n in names}
    for b in range(blocks):
        for n in (names if b % 2 == 0 else names[::-1]):
            f = arms[n]
            start = time.perf_counter()
            for _ in range(calls):
                f()
            out[n].append((time.perf_counter() - start) / calls)
    return out


def arms_for(name: str, m: int, n: int, k: int) -> dict:
    cand = registry.get("linear", name)
    dense = mx.random.normal((n, k)) * 0.02
    qw = mlx_w8a8.quantize_weight(dense, group_size=64, per_channel=True)
    layer = mlx_w8a8.Linear.from_weight(qw)
    layer_old = mlx_w8a8.Linear.from_weight(qw)
    x = mx.random.normal((m, k)).astype(mx.bfloat16)
    mx.eval(x, qw.q, qw.scales, qw.biases, qw.channel_scales)
    problem = Problem("linear", m, n, k, "bfloat16", "per_channel", 64, False)
    arms = {"run": lambda: cand.run(x, qw, None)}
    stages = cand.stages(problem)
    if stages is not None:
        _, quantize, apply = stages
        arms["staged"] = lambda: apply(quantize(x), qw, None, mx.bfloat16)
    _, bq, ba = cand.bind_stages(problem, qw, None)
    arms["bound"] = (lambda: ba(x)) if bq is None else (lambda: ba(bq(x)))
    # Two layers on the same weight: one forced to the candidate as registered, one to a
    # copy without bind_stages (the per-call path), registered under another name.
    old = attrs.evolve(cand, name=name + "_per_call", bind_stages=None)
    registry.register(old)
    layer.kernel, layer_old.kernel = name, old.name
    arms["layer_old"] = lambda: layer_old(x)
    arms["layer_bound"] = lambda: layer(x)
    arms["op"] = lambda: mlx_w8a8.w8a8_linear(x, qw, kernel=name)
    arms["qmm"] = lambda: mx.quantized_matmul(x, qw.q, qw.scales, qw.biases, True, 64, 8)
    for f in arms.values():  # warm-up: kernels built, layers' decisions made and bound
        for _ in range(3):
            f()
    return arms


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--blocks", type=int, default=200)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--out", help="append the JSON lines to this file")
    args = p.parse_args(argv)
    mx.set_default_device(mx.cpu)
    mx.fast.cuda_kernel = stub_cuda_kernel
    w8nn.share_activations(False)  # every layer call quantizes, as run does
    for c in [c for c in registry.all_candidates() if c.backend == "cuda"]:
        registry.register(attrs.evolve(c, available=lambda: True))
    launch.is_sm90 = lambda: True
    head = ["case", "arm", "per call (median)", "p25..p75", "ratio to run (p25..p75)"]
    body, records = [], []
    for label, name, m, n, k in CASES:
        launch._kernel.cache_clear()
        times = time_blocks(arms_for(name, m, n, k), args.blocks, args.calls)
        stats, ratios = {}, {}
        for arm, ts in times.items():
            med, lo, hi = render.spread(ts)
            stats[arm] = {"median_us": round(med * 1e6, 3), "p25_us": round(lo * 1e6, 3),
                          "p75_us": round(hi * 1e6, 3)}
            ratios[arm] = render.spread([a / b for a, b in zip(ts, times["run"])])
            r = ratios[arm]
            body.append([label, arm, f"{med * 1e6:.2f} us", f"{lo * 1e6:.2f}..{hi * 1e6:.2f}",
                         f"{r[0]:.2f}x ({r[1]:.2f}..{r[2]:.2f})"])
        records.append({
            "bench": "dispatch_cuda_stub", "case": label, "candidate": name, "m": m, "n": n,
            "k": k, "dtype": "bfloat16", "blocks": args.blocks, "calls_per_block": args.calls,
            "per_call": stats,
            "ratio_to_run": {a: [round(v, 3) for v in r] for a, r in ratios.items()},
            "machine": platform.processor() or platform.machine(), "mlx": mx.__version__,
        })
    print(render.columns(head, body))
    print("kernel call stubbed: MLX's custom-kernel node and any GPU work are not included")
    for r in records:
        line = json.dumps(r, allow_nan=False)
        print(line)
        if args.out:
            with open(args.out, "a", encoding="utf-8") as f:
                f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
