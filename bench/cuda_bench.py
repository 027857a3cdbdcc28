"""CUDA kernels vs MLX and cuBLASLt baselines, in one process, on one GPU.

For each shape (M x K x N, weight ``[N, K]``) it times, paired and in alternating order:

- ``qmm``: ``mx.quantized_matmul`` 8-bit, group 64, on ``mx.quantize`` of the weight
  (W8A16, what MLX users run today),
- ``bf16``: ``mx.matmul`` in bfloat16,
- ``w8a8``: ``cuda_w8a8_gemm`` (per-channel weight: quantize + int8 GEMM + dequant),
- ``w8a8_g``: ``cuda_w8a8_gemm_grouped`` on the same group-64 affine weight as ``qmm``,
- ``gemv`` / ``gemv_g`` (M <= 16): ``cuda_int8_gemv`` on the per-channel / group-64 weight,
- ``i8gemm``: ``cuda_int8_gemm`` (raw int8 -> int32) and ``torch``: ``torch._int_mm`` on
  the same int8 operands (cuBLASLt; needs M > 16),
- ``w8a8_ws`` / ``w8a8_mm_ws`` / ``i8gemm_ws``: the warp-specialized persistent GEMM
  (``cuda_w8a8_gemm_ws`` with its quantize, the GEMM + epilogue alone, the int32 GEMM),
- ``w8a8_tma`` / ``w8a8_mm_tma`` / ``i8gemm_tma``: the same with the TMA producer
  (``cuda_w8a8_gemm_tma``, ``cuda_int8_gemm_tma``),
- ``quant`` / ``quant_warp``: the ``rowsum`` and ``rowsum_warp`` quantize bodies;
  ``quant_base`` (with ``--quant-base DIR``): the ``rowsum`` body built from the
  ``quantize.cu`` / ``quantize.cuh`` / ``shape.cuh`` in DIR (another revision's text), so
  a kernel change is timed against its predecessor in the same run. ``quant/copy`` is
  ``quant``'s time over reading x and writing the codes at the copy bandwidth.

``--arms a,b,...`` times a subset (fewer arms, shorter runs); ``--once A,B`` builds the
first shape and runs each arm twice, untimed (for a profiler: ``ncu -k regex:gemm_w
python bench/cuda_bench.py --once i8gemm_ws,i8gemm --m 8192 --kn 4096x4096``).

Timing: wall clock around ``mx.eval`` (MLX) or around the launches plus
``torch.cuda.synchronize()`` (torch), ``chain`` launches per sample (the graph is built
before the clock starts), warm-up first, ``--pairs`` rounds in alternating order,
medians. Weights and activations rotate over enough copies to exceed twice the L2, so
no arm is timed out of cache. TOPS count 2*M*N*K operations; GB/s count the weight
bytes (int8 codes, or bf16 for ``bf16``) plus activations in and outputs out.

Usage (on the GPU machine): ``python bench/cuda_bench.py [--quick] [--variants]
[--out DIR]``; prints the table last and writes ``cuda_bench.md``/``.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mlx.core as mx  # noqa: E402

from mlx_w8a8.kernels.cuda import (  # noqa: E402
    gemm as cuda_gemm,
    gemm_grouped as cuda_gemm_grouped,
    gemm_ws as cuda_gemm_ws,
    gemv as cuda_gemv,
    launch,
    quantize as cuda_quantize,
    tiles as cuda_tiles,
)
from mlx_w8a8.weight import QuantizedWeight  # noqa: E402

# The registered linears' unbound run paths (quantize + GEMM launches made on each call).
W8A8, W8A8_GROUPED = cuda_gemm.W8A8Gemm(), cuda_gemm_grouped.W8A8GemmGrouped()
W8A8_WS, W8A8_TMA, GEMV = cuda_gemm_ws.W8A8GemmWs(), cuda_gemm_ws.W8A8GemmTma(), cuda_gemv.Int8Gemv()

M_LIST = (1, 16, 64, 128, 256, 512, 1024, 2048, 8192)
KN_LIST = ((4096, 4096), (3584, 18944), (18944, 3584))
INT8_PEAK_TOPS = 1979.0  # H200 dense int8, datasheet
BF16_PEAK_TFLOPS = 989.0
L2_BYTES = 50 * 2**20
TARGET_SAMPLE_S = 0.004
MAX_CHAIN = 200


def device_info() -> dict:
    info = {"mlx": mx.__version__, "python": platform.python_version()}
    try:
        info.update({k: str(v) for k, v in mx.device_info().items()})
    except Exception:
        pass
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm,power.limit",
             "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout.strip()
        info["nvidia_smi"] = smi
    except Exception as error:
        info["nvidia_smi"] = f"unavailable: {error}"
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_cuda"] = str(torch.version.cuda)
    except Exception:
        info["torch"] = "unavailable"
    return info


class Arm:
    """One timed thing: ``build(i)`` makes launch ``i`` lazily (MLX) or runs it (torch)."""

    def __init__(self, name, build, kind="mlx"):
        self.name, self.build, self.kind = name, build, kind
        self.samples: list[float] = []
        self.error = ""

    def sample(self, chain: int, start: int) -> float:
        if self.kind == "mlx":
            outs = [self.build(start + j) for j in range(chain)]
            t0 = time.perf_counter()
            mx.eval(outs)
            return (time.perf_counter() - t0) / chain
        import torch

        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for j in range(chain):
            self.build(start + j)
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / chain


def paired(arms: list[Arm], pairs: int, warmup: int = 3) -> int:
    """Warm up, pick the chain length, then ``pairs`` alternating rounds."""
    singles = {}
    for arm in arms:
        try:
            for i in range(warmup):
                arm.sample(1, i)
            singles[arm.name] = min(arm.sample(4, 10 + 4 * i) for i in range(2))
        except Exception as error:  # an arm that fails is reported, never fatal
            arm.error = f"{type(error).__name__}: {error}"[:200]
    live = [a for a in arms if not a.error]
    if not live:
        return 0
    fastest = min(singles[a.name] for a in live)
    chain = int(min(MAX_CHAIN, max(2, math.ceil(TARGET_SAMPLE_S / max(fastest, 1e-7)))))
    for r in range(pairs):
        order = live if r % 2 == 0 else live[::-1]
        for arm in order:
            arm.samples.append(arm.sample(chain, r * chain))
    return chain


def median_us(arm: Arm) -> float:
    return statistics.median(arm.samples) * 1e6 if arm.samples else float("nan")


_COPY_BW: list[float] = []


def copy_bw_cached() -> float:
    """:func:`copy_bandwidth`, measured once per process."""
    if not _COPY_BW:
        _COPY_BW.append(copy_bandwidth())
    return _COPY_BW[0]


def copy_bandwidth() -> float:
    """Device-to-device copy bandwidth (bytes read + written per second), torch events."""
    import torch

    a = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    a.random_(0, 255)
    for _ in range(3):
        b.copy_(a)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(20):
        start.record()
        b.copy_(a)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del a, b
    return 2 * 2**30 / statistics.median(times)


@contextlib.contextmanager
def kernel_text_from(folder: str):
    """Within the block, the CUDA launchers build their kernels from the files in
    ``folder`` where it has them (another revision's ``gemm_ws.cu``, ``quantize.cu``, a
    header ...) and from the package's otherwise. A ``LaunchSpec`` built inside keeps
    that kernel after the block; the kernel name carries the text's digest, so both
    versions coexist in one process. The loaders' caches are emptied on entry and exit,
    so nothing built outside sees the other text."""
    from mlx_w8a8.kernels import sources

    real = sources.read

    def read(backend, file):
        path = os.path.join(folder, file)
        if backend == "cuda" and os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                return f.read()
        return real(backend, file)

    caches = (launch.load, launch.requires, launch._kernel)
    for c in caches:
        c.cache_clear()
    sources.read = read
    try:
        yield
    finally:
        sources.read = real
        for c in caches:
            c.cache_clear()


def base_quantize_spec(base_dir: str, m: int, k: int, warp: bool = False):
    """The ``rowsum`` (``warp``: ``rowsum_warp``) launch of ``cuda_quantize.quantize_spec`` built
    from the shader text in ``base_dir`` instead of the package's
    (:func:`kernel_text_from`)."""
    with kernel_text_from(base_dir):
        return cuda_quantize.quantize_spec(m, k, mx.bfloat16, row_sum=True, warp=warp)


def rotation_copies(nbytes: int) -> int:
    """Copies of an ``nbytes`` operand the timed launches rotate through: enough to
    exceed twice the L2 (so no launch reads it from cache), 2 to 8."""
    return min(8, max(2, math.ceil(2 * L2_BYTES / max(1, nbytes))))


def bench_shape(m, k, n, pairs, rng, variants=False, only=None, once=None, quant_base=None):
    """Time every arm for one shape; returns a dict of medians and derived numbers."""
    import torch

    copies = rotation_copies(n * k)
    x_copies = rotation_copies(m * k * 2)
    ws = [mx.array((rng.standard_normal((n, k)) / math.sqrt(k)).astype(np.float32)).astype(mx.bfloat16)
          for _ in range(copies)]
    xs = [mx.array(rng.standard_normal((m, k)).astype(np.float32)).astype(mx.bfloat16)
          for _ in range(x_copies)]
    pcs = [QuantizedWeight.from_float(w, 64, per_channel=True) for w in ws]
    grs = [QuantizedWeight.from_float(w, 64, per_channel=False) for w in ws]
    mx.eval(ws, xs, [(p.q, p.scales, p.biases, p.channel_scales) for p in pcs],
            [(g.q, g.scales, g.biases, g.group_offsets) for g in grs])
    # Raw int8 operands (shared by cuda_int8_gemm and torch._int_mm).
    # The unsigned-code GEMMs take the quantize's one array; codes and scales unpacked
    # from it feed the raw and flipped-code arms.
    xa8 = [cuda_quantize.quantize_rowsum(x) for x in xs]
    a8, s8, _ = zip(*(cuda_quantize.unpack_rowsum(a) for a in xa8))
    b8 = [p.int8() for p in pcs]
    mx.eval(xa8, a8, s8, b8)
    C = len(ws)
    X = len(xs)

    def pick(i):
        return xs[i % X], i % C

    arms = [
        Arm("qmm", lambda i: mx.quantized_matmul(pick(i)[0], grs[i % C].q, grs[i % C].scales,
                                                 grs[i % C].biases, transpose=True,
                                                 group_size=64, bits=8)),
        Arm("bf16", lambda i: mx.matmul(xs[i % X], ws[i % C].T)),
        Arm("w8a8", lambda i: W8A8.run(xs[i % X], pcs[i % C], None)),
        Arm("w8a8_g", lambda i: W8A8_GROUPED.run(xs[i % X], grs[i % C], None)),
        # The per-channel GEMM + epilogue alone (activations already quantized): on the
        # unsigned codes with the row-sum correction (the default for K <= U8_MAX_K) and
        # with the codes flipped to int8 (the K > U8_MAX_K path); and the full linear on
        # the mma.sync 128 x 256 tile (when the default is wgmma).
        Arm("w8a8_mm", lambda i: cuda_gemm.gemm_rowsum(xa8[i % X], pcs[i % C], None, mx.bfloat16)),
        Arm("w8a8_mm[flip]", lambda i: cuda_gemm.gemm_per_channel(a8[i % X], s8[i % X], pcs[i % C],
                                                               None, mx.bfloat16)),
        Arm("w8a8[large]", lambda i: _linear_on(xs[i % X], pcs[i % C],
                                                cuda_tiles.GEMM_CONFIGS["large"])),
        Arm("i8gemm", lambda i: cuda_gemm.int8_gemm(a8[i % X], b8[i % C])),
        Arm("quant", lambda i: cuda_quantize.quantize_rowsum(xs[i % X])),
        Arm("quant_warp", lambda i: cuda_quantize.quantize_rowsum(xs[i % X], warp=True)),
        Arm("w8a8_ws", lambda i: W8A8_WS.run(xs[i % X], pcs[i % C], None)),
        Arm("w8a8_mm_ws", lambda i: cuda_gemm.gemm_rowsum(
            xa8[i % X], pcs[i % C], None, mx.bfloat16, cuda_tiles.ws_tile_for(m, n))),
        Arm("i8gemm_ws", lambda i: cuda_gemm_ws.int8_gemm_ws(a8[i % X], b8[i % C])),
        Arm("w8a8_tma", lambda i: W8A8_TMA.run(xs[i % X], pcs[i % C], None)),
        Arm("w8a8_mm_tma", lambda i: cuda_gemm.gemm_rowsum(
            xa8[i % X], pcs[i % C], None, mx.bfloat16, cuda_tiles.tma_tile_for(m, n, k))),
        Arm("i8gemm_tma", lambda i: cuda_gemm_ws.int8_gemm_tma(a8[i % X], b8[i % C])),
    ]
    if m <= cuda_gemv.GEMV_MAX_M:
        arms.append(Arm("gemv", lambda i: GEMV.run(xs[i % X], pcs[i % C], None)))
        arms.append(Arm("gemv_g", lambda i: GEMV.run(xs[i % X], grs[i % C], None)))
    if variants:
        for key, cfg in list(cuda_tiles.GEMM_CONFIGS.items()) + list(cuda_tiles.WS_CONFIGS.items()):
            if key.startswith("grouped"):
                arms.append(Arm(f"w8a8_g[{key}]", lambda i, cfg=cfg: cuda_gemm_grouped.gemm_grouped(
                    *cuda_quantize.quantize(xs[i % X], 64), grs[i % C], None, mx.bfloat16, cfg)))
            else:
                arms.append(Arm(f"i8gemm[{key}]", lambda i, cfg=cfg: cuda_gemm.int8_gemm(
                    a8[i % X], b8[i % C], cfg)))
        for key, cfg in cuda_tiles.TMA_CONFIGS.items():
            arms.append(Arm(f"i8gemm[{key}]", lambda i, cfg=cfg: cuda_gemm.int8_gemm(
                a8[i % X], b8[i % C], cfg)))
        for key, cfg in {**cuda_tiles.WS_CONFIGS, **cuda_tiles.TMA_CONFIGS}.items():
            arms.append(Arm(f"w8a8_mm[{key}]", lambda i, cfg=cfg: cuda_gemm.gemm_rowsum(
                xa8[i % X], pcs[i % C], None, mx.bfloat16, cfg)))
    if quant_base:
        base = base_quantize_spec(quant_base, m, k)
        arms.append(Arm("quant_base", lambda i: base.launch(xs[i % X])[0]))
    if once is not None:  # a comma-separated list of arms, each run twice
        for name in once.split(","):
            arm = next(a for a in arms if a.name == name)
            for j in range(2):
                mx.eval(arm.build(j))
        return None
    if only:
        arms = [a for a in arms if a.name in only]
    torch_arm = None
    if m > 16 and (not only or "torch" in only):
        ta = [torch.from_numpy(np.array(a)).cuda() for a in a8]
        tb = [torch.from_numpy(np.array(b)).cuda() for b in b8]
        torch.cuda.synchronize()
        torch_arm = Arm("torch", lambda i: torch._int_mm(ta[i % X], tb[i % C].t()), kind="torch")
        arms.append(torch_arm)
    chain = paired(arms, pairs)
    ops = 2.0 * m * n * k
    row = {"M": m, "K": k, "N": n, "chain": chain, "copies": C, "x_copies": X, "us": {}, "err": {}}
    for arm in arms:
        row["us"][arm.name] = median_us(arm)
        if arm.error:
            row["err"][arm.name] = arm.error
        if arm.samples:
            q1, q3 = np.percentile(np.array(arm.samples) * 1e6, [25, 75])
            row.setdefault("iqr", {})[arm.name] = [float(q1), float(q3)]
    row["tops"] = {name: ops / (us * 1e-6) / 1e12 for name, us in row["us"].items()}
    bytes_i8 = n * k + m * k * 2 + m * n * 2
    row["gbs"] = {name: bytes_i8 / (us * 1e-6) / 1e9 for name, us in row["us"].items()}
    row["samples_us"] = {a.name: [t * 1e6 for t in a.samples] for a in arms}
    row["ratio"] = ratios(row)
    row["copy_us"] = 3.0 * m * k / copy_bw_cached() * 1e6  # read bf16 x, write int8 codes
    row["ratio"]["quant/copy"] = row["us"].get("quant", float("nan")) / row["copy_us"]
    return row


def _linear_on(x, weight, cfg):
    """The full per-channel linear (as ``W8A8.run``) on tile ``cfg``."""
    if x.shape[1] <= launch.U8_MAX_K:
        return cuda_gemm.gemm_rowsum(cuda_quantize.quantize_rowsum(x), weight, None, mx.bfloat16, cfg)
    xq, xs, _ = cuda_quantize.quantize(x)
    return cuda_gemm.gemm_per_channel(xq, xs, weight, None, mx.bfloat16, cfg)


def paired_ratio(row, base, cand, cand_alias=None):
    """Median over rounds of t_base / t_cand (the samples of one round are paired)."""
    smp = row.get("samples_us", {})
    b, c = smp.get(base), smp.get(cand_alias or cand)
    if not b or not c:
        return float("nan")
    return statistics.median(x / y for x, y in zip(b, c))


def ratios(row, w8a8="w8a8"):
    """The target ratios of one shape; ``w8a8`` names the arm used as the full linear."""
    return {
        "w8a8/qmm": paired_ratio(row, "qmm", w8a8), "w8a8/bf16": paired_ratio(row, "bf16", w8a8),
        "w8a8_g/qmm": paired_ratio(row, "qmm", "w8a8_g"),
        "i8gemm/torch": paired_ratio(row, "torch", "i8gemm"),
        "gemv/qmm": paired_ratio(row, "qmm", "gemv"), "gemv_g/qmm": paired_ratio(row, "qmm", "gemv_g"),
        "ws/bf16": paired_ratio(row, "bf16", "w8a8_ws"), "ws/w8a8": paired_ratio(row, "w8a8", "w8a8_ws"),
        "ws/qmm": paired_ratio(row, "qmm", "w8a8_ws"),
        "mm_ws/mm": paired_ratio(row, "w8a8_mm", "w8a8_mm_ws"),
        "i8ws/torch": paired_ratio(row, "torch", "i8gemm_ws"),
        "i8ws/i8gemm": paired_ratio(row, "i8gemm", "i8gemm_ws"),
        "qwarp/quant": paired_ratio(row, "quant", "quant_warp"),
        "quant/base": paired_ratio(row, "quant_base", "quant"),
        "tma/bf16": paired_ratio(row, "bf16", "w8a8_tma"),
        "tma/ws": paired_ratio(row, "w8a8_ws", "w8a8_tma"),
        "mm_tma/mm_ws": paired_ratio(row, "w8a8_mm_ws", "w8a8_mm_tma"),
        "i8tma/torch": paired_ratio(row, "torch", "i8gemm_tma"),
        "i8tma/i8ws": paired_ratio(row, "i8gemm_ws", "i8gemm_tma"),
    }


def fmt(v, spec=".1f"):
    return "—" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, spec)


def table(rows, copy_bw) -> str:
    lines = [
        "| M | K x N | qmm us | bf16 us | w8a8 us | w8a8_g us | i8gemm us (TOPS, %peak) | torch us (TOPS) | gemv us (GB/s, %copy) | w8a8/qmm | w8a8/bf16 | w8a8_g/qmm | i8gemm/torch | gemv/qmm |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        us, tops, rt = r["us"], r["tops"], r["ratio"]
        i8 = f"{fmt(us.get('i8gemm'))} ({fmt(tops.get('i8gemm'), '.0f')}, {fmt(100 * tops.get('i8gemm', float('nan')) / INT8_PEAK_TOPS, '.0f')}%)"
        th = (f"{fmt(us.get('torch'))} ({fmt(tops.get('torch'), '.0f')})" if "torch" in us
              else "n/a (M <= 16)" if r["M"] <= 16 else "—")
        if "gemv" in us:
            gbs = r["N"] * r["K"] / (us["gemv"] * 1e-6) / 1e9
            gv = f"{fmt(us['gemv'])} ({gbs:.0f}, {100 * gbs * 1e9 / copy_bw:.0f}%)"
        else:
            gv = "—"
        lines.append(
            f"| {r['M']} | {r['K']}x{r['N']} | {fmt(us.get('qmm'))} | {fmt(us.get('bf16'))} | "
            f"{fmt(us.get('w8a8'))} | {fmt(us.get('w8a8_g'))} | {i8} | {th} | {gv} | "
            f"{fmt(rt['w8a8/qmm'], '.2f')} | {fmt(rt['w8a8/bf16'], '.2f')} | "
            f"{fmt(rt['w8a8_g/qmm'], '.2f')} | {fmt(rt['i8gemm/torch'], '.2f')} | "
            f"{fmt(rt['gemv/qmm'], '.2f')} |")
    return "\n".join(lines)


def arms_table(rows, arms, gemm, keys) -> str:
    """A table of ``arms`` (us), the int32 GEMM arm ``gemm`` with its TOPS and share of the
    int8 peak after them, and the paired ratios ``keys`` (baseline / new: > 1 means the
    new arm is faster)."""
    names = list(arms) + [f"{gemm} us (TOPS, %peak)"]
    lines = ["| M | K x N | " + " | ".join([f"{a} us" for a in arms] + names[-1:] + list(keys)) + " |",
             "|---|---|" + "---|" * (len(names) + len(keys))]
    for r in rows:
        us, tops, rt = r["us"], r["tops"], r["ratio"]
        i8 = (f"{fmt(us.get(gemm))} ({fmt(tops.get(gemm), '.0f')}, "
              f"{fmt(100 * tops.get(gemm, float('nan')) / INT8_PEAK_TOPS, '.0f')}%)")
        cells = [fmt(us.get(a)) for a in arms] + [i8] + [fmt(rt[k], ".2f") for k in keys]
        lines.append(f"| {r['M']} | {r['K']}x{r['N']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ws_table(rows) -> str:
    """The warp-specialized (cp.async producer) arms against the first kernels."""
    return arms_table(rows, ("bf16", "w8a8", "w8a8_ws", "i8gemm", "torch", "quant", "quant_warp"),
                      "i8gemm_ws", ("ws/bf16", "ws/w8a8", "ws/qmm", "mm_ws/mm", "i8ws/torch",
                                    "i8ws/i8gemm", "qwarp/quant"))


def tma_table(rows) -> str:
    """The TMA producer's arms against the cp.async producer's and the baselines."""
    return arms_table(rows, ("bf16", "w8a8_ws", "w8a8_tma", "i8gemm_ws", "torch"), "i8gemm_tma",
                      ("tma/bf16", "tma/ws", "mm_tma/mm_ws", "i8tma/torch", "i8tma/i8ws"))


def quant_table(rows) -> str:
    """The quantize arms (rowsum body, bf16 x), the copy-bandwidth floor and the ratios
    (``quant/base``: the base text's time over the current one, > 1 faster now;
    ``quant/copy``: the current time over the floor)."""
    lines = ["| M | K | quant_base us | quant us | quant_warp us | copy floor us | quant/base | quant/copy |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        us, rt = r["us"], r["ratio"]
        lines.append(f"| {r['M']} | {r['K']} | {fmt(us.get('quant_base'))} | {fmt(us.get('quant'))} | "
                     f"{fmt(us.get('quant_warp'))} | {fmt(r.get('copy_us'))} | "
                     f"{fmt(rt.get('quant/base'), '.2f')} | {fmt(rt.get('quant/copy'), '.2f')} |")
    return "\n".join(lines)


def smoke_wgmma(out_dir: str) -> bool:
    """Run the wgmma GEMM once on a small shape with tails and compare exactly; writes
    ``wgmma_ok`` to ``out_dir`` when it is right (so a caller can turn it off if not)."""
    cfg = cuda_tiles.GEMM_CONFIGS.get("wgmma")
    if cfg is None or not launch.is_sm90():
        print("wgmma smoke: not applicable")
        return False
    rng = np.random.default_rng(1)
    for m, n, k in ((300, 392, 1040), (129, 264, 48), (2048, 512, 4096)):
        a = rng.integers(-128, 128, (m, k), dtype=np.int8)
        b = rng.integers(-128, 128, (n, k), dtype=np.int8)
        got = np.array(cuda_gemm.int8_gemm(mx.array(a), mx.array(b), cfg)).astype(np.int64)
        want = (a.astype(np.float64) @ b.astype(np.float64).T).astype(np.int64)
        bad = int(np.sum(got != want))
        print(f"wgmma smoke M={m} N={n} K={k}: {bad} wrong elements", flush=True)
        if bad:
            return False
    open(os.path.join(out_dir, "wgmma_ok"), "w").write("ok\n")
    return True


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer shapes and pairs")
    ap.add_argument("--variants", action="store_true", help="also time every tile config")
    ap.add_argument("--pairs", type=int, default=30)
    ap.add_argument("--m", type=str, default="", help="comma-separated M list")
    ap.add_argument("--kn", type=str, default="", help="comma-separated KxN list")
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    ap.add_argument("--smoke-wgmma", action="store_true", help="only check the wgmma GEMM")
    ap.add_argument("--arms", type=str, default="", help="comma-separated arms to time (default all)")
    ap.add_argument("--once", type=str, default="", help="run these arms twice on the first shape and exit")
    ap.add_argument("--quant-base", default="", help="a folder with another revision's quantize.cu, "
                    "quantize.cuh, shape.cuh: adds the quant_base arm")
    args = ap.parse_args(argv)
    if args.smoke_wgmma:
        os.makedirs(args.out, exist_ok=True)
        return 0 if smoke_wgmma(args.out) else 3
    if not launch.cuda_available():
        print("cuda_bench: MLX has no CUDA GPU here; nothing to measure")
        return 1
    ms = [int(v) for v in args.m.split(",")] if args.m else list(M_LIST)
    kns = [tuple(int(t) for t in v.split("x")) for v in args.kn.split(",")] if args.kn else list(KN_LIST)
    pairs = args.pairs
    if args.quick:
        pairs = min(pairs, 10)
    rng = np.random.default_rng(0)
    if args.once:
        (k, n), m = kns[0], ms[0]
        bench_shape(m, k, n, pairs, rng, args.variants, once=args.once, quant_base=args.quant_base)
        print(f"ran {args.once} at M={m} K={k} N={n}")
        return 0
    info = device_info()
    print(json.dumps(info), flush=True)
    bw = copy_bw_cached()
    print(f"device copy bandwidth: {bw / 1e12:.2f} TB/s", flush=True)
    rows = []
    os.makedirs(args.out, exist_ok=True)
    only = set(args.arms.split(",")) if args.arms else None
    for k, n in kns:
        for m in ms:
            t0 = time.time()
            row = bench_shape(m, k, n, pairs, rng, args.variants, only, quant_base=args.quant_base)
            rows.append(row)
            us = " ".join(f"{a}={v:.1f}" for a, v in row["us"].items())
            print(f"M={m} K={k} N={n} chain={row['chain']} ({time.time() - t0:.1f}s): {us} "
                  f"{json.dumps({a: round(v, 2) for a, v in row['ratio'].items() if math.isfinite(v)})}"
                  + (f" errors={row['err']}" if row["err"] else ""), flush=True)
            with open(os.path.join(args.out, "cuda_bench.json"), "w") as f:
                json.dump({"device": info, "copy_bw": bw, "pairs": pairs, "rows": rows}, f, indent=1)
    md = (table(rows, bw) + "\n\n" + ws_table(rows) + "\n\n" + tma_table(rows) + "\n\n"
          + quant_table(rows))
    header = (f"Measured on {info.get('nvidia_smi', '?')}; MLX {info['mlx']}, torch "
              f"{info.get('torch')} (CUDA {info.get('torch_cuda')}); copy bandwidth "
              f"{bw / 1e12:.2f} TB/s; {pairs} paired rounds, medians.\n\n")
    with open(os.path.join(args.out, "cuda_bench.md"), "w") as f:
        f.write(header + md + "\n")
    print(header + md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
