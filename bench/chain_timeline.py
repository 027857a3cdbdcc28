"""Where a chain of launches loses time: kernel time against the GPU span and the wall
clock, per launch, for the raw int8 GEMM (TMA tiles), ``torch._int_mm`` and the bf16
``mx.matmul`` of the same shape.

``bench/cuda_bench.py`` times ``--chain`` launches in one ``mx.eval`` (wall clock), as a
user who evaluates a batch of work would see them; ``ncu`` and ``tile_gpu_time.py`` time
one kernel. The two differ by what happens between kernels: MLX's per-launch host work,
its CUDA graphs (a graph of up to ``MLX_MAX_OPS_PER_BUFFER`` nodes, 100 on sm_90, is built
on the host before it is launched), the GPU's launch latency. This script records the
same chain with CUPTI (``torch.profiler``) and prints, per arm and shape, in microseconds
per launch:

- ``kernel``: the median kernel duration;
- ``span``: first kernel start to last kernel end, over the chain length;
- ``busy``: the kernels' summed time over the span;
- ``wall``: the wall clock of the chain without the profiler (median of ``--rounds``),
  over the chain length; for torch, launches plus ``torch.cuda.synchronize()``.

With ``--quantize`` the arms are the activation quantization instead (``cuda_quantize.quantize``
with row sums, ``[M, K]`` bf16 in, int8 codes + scales + row sums out) and MLX's own
``x.astype(mx.int8)`` on the same ``x``: the same bytes read and written (2 M K + M K)
by a bare elementwise kernel; the kernel times of the two are the quantize kernel's
distance from a copy, with no launch cost in either.

With ``--linear`` the arms are whole linears at small and medium M (bf16 ``x @ w.T``,
``mx.quantized_matmul`` 8-bit, and the W8A8 linear on the TMA and cp.async
warp-specialized GEMMs as ``mlx_w8a8.Linear`` runs them: quantize + GEMM, launches
bound once), each as a chain of independent launches (what the tuner and the bench
time) and as a chain where launch i's activation depends on launch i - 1's output
(``mx.depends``, as a model's successive layers depend), and for square weights (K = N)
as a chain where launch i's output is launch i + 1's input (``feed``: a data dependency,
which MLX's CUDA graph turns into an edge; ``mx.depends`` adds none):
``kernel`` is then the summed kernel time per launch, and ``busy`` above 1 means
launches overlapped on the GPU.

With ``--linear --quant-smem S1,S2,...`` the TMA W8A8 linear also runs with its
quantize kernel launched with ``S`` bytes of dynamic shared memory that it does not use
(arms ``w8a8_tma_q<S>``): an SM splits its L1 and shared memory per kernel, the GEMM
takes nearly all of it as shared memory and the quantize none, so consecutive launches
of the two may each wait for the SM to change its split; 12 quantize blocks of about
18 KiB ask for the GEMM's split. The outputs are compared with the shipped arm's first.

Inputs rotate over enough copies to exceed twice the L2 (as ``cuda_bench.py``). Run it
once with ``MLX_USE_CUDA_GRAPHS=0`` too to see what the graphs cost or save.

Usage: ``python bench/chain_timeline.py [--m 2048,8192] [--kn 4096x4096,4096x14336]
[--chain 40] [--rounds 5] [--tiles tma256,tma128pp] [--quantize | --linear [--quant-smem 18432]]``.
Needs a CUDA GPU and torch with
CUPTI.
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

from mlx_w8a8.kernels.cuda import (  # noqa: E402
    gemm as cuda_gemm,
    launch,
    quantize as cuda_quantize,
    tiles as cuda_tiles,
)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cuda_bench import rotation_copies  # noqa: E402
from gpu_timeline import kernels_of  # noqa: E402


def activations(m: int, k: int, rng) -> tuple[list, int]:
    """``(xs, X)``: ``X`` evaluated bf16 ``[m, k]`` activations to rotate through."""
    X = rotation_copies(m * k * 2)
    xs = [mx.array(rng.standard_normal((m, k)).astype(np.float32)).astype(mx.bfloat16)
          for _ in range(X)]
    mx.eval(xs)
    return xs, X


def banner(what: str) -> None:
    """The run's first line: MLX's version, whether CUDA graphs are on, then ``what``."""
    print(f"MLX {mx.__version__}, CUDA graphs {os.environ.get('MLX_USE_CUDA_GRAPHS', '1')}, "
          f"MLX_MAX_OPS_PER_BUFFER {os.environ.get('MLX_MAX_OPS_PER_BUFFER', 'default')}; {what}")


def measure(run_chain, chain: int, rounds: int, is_torch: bool) -> dict:
    """``run_chain(chain)`` launches and waits; per-launch figures (see the module doc)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    def sync():
        torch.cuda.synchronize() if is_torch else mx.synchronize()

    run_chain(chain)  # compile, warm, build the graphs once
    sync()
    walls = []
    for _ in range(rounds):
        sync()
        t0 = time.perf_counter()
        run_chain(chain)
        sync()
        walls.append((time.perf_counter() - t0) / chain)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run_chain(chain)
        sync()
    ks = kernels_of(prof)
    if not ks:
        return {"kernel": float("nan"), "span": float("nan"), "busy": float("nan"),
                "wall": statistics.median(walls) * 1e6, "n": 0}
    span = max(s + d for _, s, d in ks) - ks[0][1]
    busy = sum(d for _, _, d in ks)
    # The GEMM's kernels: the longest-running name (a chain may hold small helper kernels).
    by_name: dict[str, list[float]] = {}
    for name, _, d in ks:
        by_name.setdefault(name, []).append(d)
    main = max(by_name.values(), key=sum)
    return {"kernel": statistics.median(main), "span": span / chain, "busy": busy / span,
            "wall": statistics.median(walls) * 1e6, "n": len(ks), "sum": busy / chain}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--m", default="2048,8192")
    p.add_argument("--kn", default="4096x4096,4096x14336,14336x4096")
    p.add_argument("--chain", type=int, default=40)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--tiles", default="auto", help="TMA tile names, or auto (tma_tile_for)")
    p.add_argument("--quantize", action="store_true",
                   help="time the activation quantization against x.astype(int8)")
    p.add_argument("--quant-smem", default="", help="with --linear: comma-separated bytes of "
                   "unused dynamic shared memory for extra quantize launches (arms w8a8_tma_q<S>)")
    p.add_argument("--linear", action="store_true",
                   help="whole linears (bf16, qmm, W8A8) in independent and dependent chains")
    args = p.parse_args(argv)
    import torch

    ms = [int(v) for v in args.m.split(",")]
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.kn.split(",")]
    tiles = args.tiles.split(",")
    unknown = sorted(set(tiles) - set(cuda_tiles.TMA_CONFIGS) - {"auto"})
    if unknown:
        p.error(f"--tiles: unknown {unknown}; known: auto, {sorted(cuda_tiles.TMA_CONFIGS)}")
    rng = np.random.default_rng(0)
    if args.quantize:
        return quantize_chains(ms, sorted({k for k, _ in shapes}), args.chain, args.rounds, rng)
    if args.linear:
        smem = [int(v) for v in args.quant_smem.split(",") if v]
        return linear_chains(ms, shapes, args.chain, args.rounds, rng, smem)
    banner(f"chain {args.chain}; us per launch: kernel (median) / span / wall, busy = kernel "
          f"time over span; TOPS from the kernel time and from the wall clock; * marks the "
          f"tile tma_tile_for picks")
    for k, n in shapes:
        C = rotation_copies(n * k)
        bs = [mx.array(rng.integers(-128, 128, (n, k), dtype=np.int8)) for _ in range(C)]
        wb = [mx.array(rng.standard_normal((n, k)).astype(np.float32)).astype(mx.bfloat16)
              for _ in range(C)]
        tbs = [torch.from_numpy(np.array(b)).cuda().t() for b in bs]
        for m in ms:
            xs, X = activations(m, k, rng)
            as_ = [mx.array(rng.integers(-128, 128, (m, k), dtype=np.int8)) for _ in range(X)]
            tas = [torch.from_numpy(np.array(a)).cuda() for a in as_]
            mx.eval(bs, wb, as_, xs)
            arms = {}
            for t in tiles:
                cfg = cuda_tiles.tma_tile_for(m, n, k) if t == "auto" else cuda_tiles.TMA_CONFIGS[t]
                auto = cfg == cuda_tiles.tma_tile_for(m, n, k)  # the tile the GEMM would pick
                label = f"i8gemm_tma[{t}]" + ("*" if auto else "")
                arms[label] = (lambda c, cfg=cfg: mx.eval(
                    [cuda_gemm.int8_gemm(as_[i % X], bs[i % C], cfg) for i in range(c)]), False)
            arms["bf16"] = (lambda c: mx.eval([xs[i % X] @ wb[i % C].T for i in range(c)]), False)
            arms["torch._int_mm"] = (lambda c: [torch._int_mm(tas[i % X], tbs[i % C])
                                                for i in range(c)], True)
            ops = 2.0 * m * n * k
            for label, (fn, is_torch) in arms.items():
                r = measure(fn, args.chain, args.rounds, is_torch)
                print(f"M={m:5d} K={k:6d} N={n:6d} {label:22s} kernel {r['kernel']:7.1f} "
                      f"span {r['span']:7.1f} wall {r['wall']:7.1f} busy {r['busy']:.3f} "
                      f"kernels {r['n']:4d}  TOPS kernel {ops / r['kernel'] / 1e6:5.0f} "
                      f"wall {ops / r['wall'] / 1e6:5.0f}", flush=True)
    return 0


def quantize_chains(ms, ks, chain: int, rounds: int, rng) -> int:
    """``--quantize``: the quantize kernel against ``astype(int8)``, per M and K."""
    banner(f"chain {chain}; us per launch: kernel (median) / span / wall; GB/s of the kernel "
          f"time over 3 M K bytes (x read, codes written)")
    for k in ks:
        for m in ms:
            xs, X = activations(m, k, rng)
            arms = {
                "quantize": lambda c: mx.eval(
                    [cuda_quantize.quantize_rowsum(xs[i % X]) for i in range(c)]),
                "astype(int8)": lambda c: mx.eval([xs[i % X].astype(mx.int8) for i in range(c)]),
            }
            for label, fn in arms.items():
                r = measure(fn, chain, rounds, False)
                print(f"M={m:5d} K={k:6d} {label:14s} kernel {r['kernel']:7.1f} span "
                      f"{r['span']:7.1f} wall {r['wall']:7.1f} kernels {r['n']:4d}  GB/s "
                      f"{3.0 * m * k / r['kernel'] / 1e3:6.0f}", flush=True)
    return 0


def linear_chains(ms, shapes, chain: int, rounds: int, rng, quant_smem=()) -> int:
    """``--linear``: whole linears, independent and dependent chains, per M and shape;
    ``quant_smem``: extra TMA arms whose quantize asks for that much shared memory."""
    from mlx_w8a8.kernels import registry
    from mlx_w8a8.weight import QuantizedWeight

    banner(f"chain {chain}; us per launch: sum (every kernel of a launch) / span / wall; "
          f"busy = kernel time over span (> 1: launches overlapped)")
    for k, n in shapes:
        C = rotation_copies(n * k)
        ws = [mx.array(rng.standard_normal((n, k)).astype(np.float32) / np.sqrt(k)).astype(mx.bfloat16)
              for _ in range(C)]
        qws = [QuantizedWeight.from_float(w, 64, per_channel=True) for w in ws]
        gws = [mx.quantize(w, group_size=64, bits=8) for w in ws]
        mx.eval(ws, [q.q for q in qws], gws)
        for m in ms:
            xs, X = activations(m, k, rng)
            problem = registry.Problem("linear", m, n, k, "bfloat16", "per_channel", 64)
            ops = {
                "bf16": lambda x, i: x @ ws[i % C].T,
                "qmm": lambda x, i: mx.quantized_matmul(x, *gws[i % C], transpose=True,
                                                        group_size=64, bits=8),
            }
            for name in ("cuda_w8a8_gemm_tma", "cuda_w8a8_gemm_ws"):
                cand = registry.find("linear", name)
                if cand is not None and cand.available():
                    run = registry.layer_run(cand, problem)
                    ops[name.replace("cuda_w8a8_gemm", "w8a8")] = (
                        lambda x, i, run=run: run(x, qws[i % C], None))
            tma = registry.find("linear", "cuda_w8a8_gemm_tma")
            for size in quant_smem if tma is not None and tma.available() else ():
                ops[f"w8a8_tma_q{size}"] = smem_quantize_arm(tma, problem, qws, C, size)
                x0 = xs[0]
                same = mx.array_equal(ops[f"w8a8_tma_q{size}"](x0, 0), ops["w8a8_tma"](x0, 0)).item()
                print(f"M={m:5d} K={k:6d} N={n:6d} w8a8_tma_q{size}: output "
                      f"{'equals' if same else 'DIFFERS FROM'} the shipped arm's", flush=True)
            for label, op in ops.items():
                def independent(c, op=op):
                    mx.eval([op(xs[i % X], i) for i in range(c)])

                def dependent(c, op=op):
                    y, outs = None, []
                    for i in range(c):
                        x = xs[i % X] if y is None else mx.depends(xs[i % X], y)
                        y = op(x, i)
                        outs.append(y)
                    mx.eval(outs)

                def fed(c, op=op):
                    y, outs = xs[0], []
                    for i in range(c):
                        y = op(y, i)  # the output is the next input: a graph edge
                        outs.append(y)
                    mx.eval(outs)

                modes = [("indep", independent), ("dep", dependent)]
                if k == n:
                    modes.append(("feed", fed))
                for mode, fn in modes:
                    r = measure(fn, chain, rounds, False)
                    print(f"M={m:5d} K={k:6d} N={n:6d} {label:10s} {mode:5s} sum {r['sum']:7.1f} "
                          f"span {r['span']:7.1f} wall {r['wall']:7.1f} busy {r['busy']:.3f} "
                          f"kernels {r['n']:4d}", flush=True)
    return 0


def smem_quantize_arm(cand, problem, qws, copies: int, size: int):
    """``op(x, i)``: ``cand``'s bound apply on weight copy ``i``, fed by the row-sum
    quantize launched with ``size`` bytes of (unused) dynamic shared memory."""
    spec = cuda_quantize.quantize_spec(problem.m, problem.k, mx.bfloat16, row_sum=True)
    spec = spec._replace(kernel=launch._kernel("quantize.cu", "rowsum", ("x",),
                                               ("xa",), shared_memory=size))
    applies = []
    for i in range(copies):
        _, bq, apply = cand.bind_stages(problem, qws[i], None)
        applies.append(apply)
    return lambda x, i: applies[i % copies](tuple(spec.launch(x)))


if __name__ == "__main__":
    sys.exit(main())
