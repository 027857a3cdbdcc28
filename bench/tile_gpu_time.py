"""GPU time of each GEMM tile configuration, per shape: the kernels' own durations
(CUPTI through ``torch.profiler``), not the wall clock of a chain of launches.

For each ``--m`` and each ``--kn`` shape (K x N), every warp-specialized tile
(``WS_CONFIGS``, ``TMA_CONFIGS``) runs the per-channel W8A8 GEMM on activations
quantized once, ``--reps`` launches each evaluated alone; the same for
``mx.quantized_matmul`` (8-bit, group 64) and the bfloat16 ``x @ w.T``. Printed per shape
and arm: the median kernel time in microseconds (for bf16 and qmm: every kernel of the
call summed), and the quantize kernel's. The wall clock of a model or of the tuner's
chains adds MLX's per-launch host cost to these; where a model waits for its GPU (a
prefill evaluated as one CUDA graph), these are what it waits for.

An earlier version of this script ran on a branch, ``splitk-clusters``
(commit 830cd38; it did not land and is not in this repository), which also timed the
split-K cluster tiles there, with
``MLX_USE_CUDA_GRAPHS=0``: MLX's graph cache leaves a cluster kernel's cluster size on its
graph node for the next kernel (docs/cuda.md).

With ``--int32`` the arms are the raw int8 GEMM (``cuda_gemm.int8_gemm``, int32 output) on
random int8 operands instead, each with its TOPS (2 M N K / kernel time); bf16, qmm and
quantize are not timed then. ``--tiles`` keeps the named tiles only. ``--acc`` adds each cooperative tile with other
accumulator-set counts (``<tile>a<count>``), ``--stages`` each tile with shallower rings
(``<tile>s<stages>``): how a tile's time depends on its loads in flight. ``--coop`` adds
each ping-pong tile with cooperative consumers (``<tile>c``: both warpgroups on every
tile, 64 rows each): where a block gets one tile, a ping-pong block's second warpgroup
has none to take.

With ``--kernel-dir DIR`` each tile is also timed (named ``<tile>+``) on the per-channel
GEMM built from the kernel files in DIR where it has them (a changed ``gemm_ws.cu``,
say), the package's elsewhere, with ``--template NAME=VALUE,...`` appended to its
template arguments: a kernel change timed against the shipped kernel in one process
before it is committed (committing it stales the shipped tuning table). Its output is
compared with the shipped kernel's once per shape and tile; a row says which differ.

With ``--grouped 32,64,128`` the arms are the group-wise TMA GEMM instead
(``gemm_grouped.gemm_grouped_tma`` on weights ``mx.quantize`` wrote at those group sizes,
``--bits 8`` or ``4``), each tile of ``GROUPED_TMA_CONFIGS`` (``GROUPED4_TMA_CONFIGS``)
also with the consumers' MMA order (``<tile>o``, ``GroupedTmaConfig.order``; with
``--live`` instead the rows-past-M skip, ``<tile>l``, ``GroupedTmaConfig.live``; with
``--pipe`` instead each pipelined-promotion run the tile takes at that K and group size,
``<tile>p2`` / ``<tile>p4``, ``GroupedTmaConfig.pipe``, and with ``--live --pipe`` those
runs with the skip too, ``<tile>lp2`` ...), whose outputs must equal the plain tile's bit
for bit (a row says which differ); with ``mx.quantized_matmul`` at the same group size
and bits, the bfloat16 product and the dequantizing GEMM on each of its tiles
(``DEQUANT_CONFIGS``: ``gemm_dequant.gemm_dequant``, no quantize launch; the row gives its
largest difference from ``mx.quantized_matmul`` relative to that output's largest), and
``cuda_dequant_matmul``'s dequantize launch alone (``dequantize``) and with its bf16 GEMM
(``dqmm``).

``--grouped`` also takes ``--kernel-dir DIR`` (and ``--template``): each tile of a kernel
whose files DIR changes (its own or one it requires: ``gemm_grouped_ws.cu``,
``gemm_subnormal.cu``, ``gemm_dequant.cu``, a header) is then also timed built from DIR,
named ``<tile>+``; the group-wise TMA GEMM's and the dequantizing GEMM's outputs must equal
the shipped tile's bit for bit (a row says which differ), the subnormal tiles' largest
difference is printed.

With ``--once`` nothing is timed: each arm is built and evaluated twice, without the
profiler, so that a kernel profiler can attach (``ncu -k regex:grouped python
bench/tile_gpu_time.py --once --grouped 64 --m 2048 --kn 4096x14336``).

Usage: ``python bench/tile_gpu_time.py [--m 16,128,512] [--kn 4096x4096,4096x1024]
[--reps 5] [--int32] [--tiles tma256,tma128pp] [--acc 2,4] [--stages 4,6,8] [--coop]
[--kernel-dir DIR [--template MI=2]] [--grouped 64 [--bits 4] [--live] [--pipe] [--sub]] [--once]``.
Needs a CUDA GPU and torch with CUPTI (not with ``--once``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

from mlx_w8a8.kernels.cuda import (  # noqa: E402
    dequant_matmul as cuda_dequant_matmul,
    gemm as cuda_gemm,
    gemm_dequant as cuda_gemm_dequant,
    gemm_grouped as cuda_gemm_grouped,
    launch as cuda_launch,
    quantize as cuda_quantize,
    tiles as cuda_tiles,
)
from mlx_w8a8.weight import QuantizedWeight  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_timeline import kernels_of  # noqa: E402


# --once: build and evaluate each arm twice, time nothing (for a kernel profiler).
ONCE = False


def timed(fn, reps: int) -> tuple[float, float]:
    """Median over ``reps`` evaluated calls of (kernel time of the call, of which
    quantize kernels), in microseconds; ``(0, 0)`` under ``--once``, after two calls."""
    if ONCE:
        for _ in range(2):
            mx.eval(fn())
        mx.synchronize()
        return 0.0, 0.0
    from torch.profiler import ProfilerActivity, profile

    mx.eval(fn())  # compile, warm
    mx.synchronize()
    totals, quants = [], []
    for _ in range(reps):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            mx.eval(fn())
            mx.synchronize()
        ks = kernels_of(prof)
        totals.append(sum(d for _, _, d in ks))
        quants.append(sum(d for n, _, d in ks if "w8a8_quantize" in n))
    return statistics.median(totals), statistics.median(quants)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--m", default="16,128,512")
    p.add_argument("--kn", default="4096x4096,4096x1024,4096x14336,14336x4096")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--int32", action="store_true", help="time the raw int8 GEMM (int32 out)")
    p.add_argument("--tiles", default="", help="comma-separated tile names (default: all)")
    p.add_argument("--acc", default="", help="comma-separated accumulator-set counts: each "
                   "cooperative tile also with each count it allows (named <tile>a<count>)")
    p.add_argument("--stages", default="", help="comma-separated ring depths: each tile also "
                   "with each depth below its own (named <tile>s<stages>)")
    p.add_argument("--coop", action="store_true", help="each ping-pong tile also with "
                   "cooperative consumers (named <tile>c)")
    p.add_argument("--kernel-dir", default="", help="a folder with changed kernel files "
                   "(e.g. a gemm_ws.cu): each tile also built from them (named <tile>+)")
    p.add_argument("--template", default="", help="with --kernel-dir: NAME=VALUE,... "
                   "template arguments the changed kernels take beyond the package's")
    p.add_argument("--grouped", default="", help="comma-separated group sizes: time the "
                   "group-wise TMA GEMM's tiles, each also with MMA order (<tile>o)")
    p.add_argument("--bits", type=int, choices=(8, 4), default=8,
                   help="with --grouped: the weights' code width")
    p.add_argument("--live", action="store_true", help="with --grouped: each tile also with "
                   "the rows-past-M skip (<tile>l) instead of the MMA order")
    p.add_argument("--pipe", action="store_true", help="with --grouped: each tile also with "
                   "each pipelined-promotion run it takes (<tile>p2, <tile>p4) instead of "
                   "the MMA order (with --live: also with the skip, <tile>lp2 ...)")
    p.add_argument("--sub", action="store_true", help="with --grouped: of the group-wise "
                   "TMA GEMM's tiles only the subnormal promotion's")
    p.add_argument("--once", action="store_true", help="time nothing: evaluate each arm "
                   "twice without the profiler (for ncu)")
    args = p.parse_args(argv)
    global ONCE
    ONCE = args.once
    ms = [int(v) for v in args.m.split(",")]
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.kn.split(",")]
    if args.template and not args.kernel_dir:
        p.error("--template needs --kernel-dir")
    extra = [(name, int(value)) for name, value in
             (item.split("=", 1) for item in args.template.split(",") if item)]
    if args.grouped:
        if args.int32 or args.acc or args.stages or args.coop or args.tiles:
            p.error("--grouped takes only --m, --kn, --reps, --bits, --live, --pipe, --sub, "
                    "--kernel-dir, --template and --once")
        variant = "+".join(v for v, on in (("live", args.live), ("pipe", args.pipe)) if on)
        return grouped_gemms(ms, shapes, [int(v) for v in args.grouped.split(",")],
                             args.bits, args.reps, variant or "order",
                             args.kernel_dir, extra, args.sub)
    if args.live or args.pipe or args.sub:
        p.error("--live, --pipe and --sub need --grouped")
    tiles = {**cuda_tiles.WS_CONFIGS, **cuda_tiles.TMA_CONFIGS}
    if args.tiles:
        unknown = sorted(set(args.tiles.split(",")) - set(tiles))
        if unknown:
            p.error(f"--tiles: unknown {unknown}; known: {sorted(tiles)}")
        tiles = {name: tiles[name] for name in args.tiles.split(",")}
    if args.acc:
        tiles = with_accumulators(tiles, [int(v) for v in args.acc.split(",")])
    if args.stages:
        tiles = with_stages(tiles, [int(v) for v in args.stages.split(",")])
    if args.coop:
        tiles = with_cooperative(tiles)
    if args.kernel_dir and args.int32:
        p.error("--kernel-dir times the per-channel GEMM, not --int32's")
    if args.int32:
        return int32_gemms(ms, shapes, tiles, args.reps)
    rng = np.random.default_rng(0)
    print(f"MLX {mx.__version__}, CUDA graphs {os.environ.get('MLX_USE_CUDA_GRAPHS', '1')}; "
          f"median kernel us of {args.reps} evaluated calls")
    for k, n in shapes:
        w = mx.array(rng.standard_normal((n, k)).astype(np.float32) / np.sqrt(k)).astype(mx.bfloat16)
        qw = QuantizedWeight.from_float(w, 64, per_channel=True)
        wq, sq, bq = mx.quantize(w, group_size=64, bits=8)
        mx.eval(w, qw.q, wq, sq, bq)
        for m in ms:
            x = mx.array(rng.standard_normal((m, k)).astype(np.float32)).astype(mx.bfloat16)
            xa = cuda_quantize.quantize_rowsum(x)  # the unsigned-code GEMMs' one activation array
            mx.eval(x, xa)
            row, differ = {}, []
            row["bf16"] = timed(lambda: x @ w.T, args.reps)[0]
            row["qmm"] = timed(lambda: mx.quantized_matmul(x, wq, sq, bq, transpose=True,
                                                           group_size=64, bits=8), args.reps)[0]
            row["quantize"] = timed(lambda: cuda_quantize.quantize_rowsum(x), args.reps)[0]
            for name, cfg in tiles.items():
                row[name] = timed(lambda: cuda_gemm.gemm_rowsum(xa, qw, None, mx.bfloat16, cfg),
                                  args.reps)[0]
                if args.kernel_dir:
                    spec = changed_gemm_spec(args.kernel_dir, extra, m, k, qw, cfg)
                    want = cuda_gemm.gemm_rowsum(xa, qw, None, mx.bfloat16, cfg)
                    if not mx.array_equal(spec.launch(xa)[0], want).item():
                        differ.append(name + "+")
                    row[name + "+"] = timed(lambda: spec.launch(xa)[0], args.reps)[0]
            best = min((v, kname) for kname, v in row.items() if kname not in ("bf16", "qmm", "quantize"))
            print(f"M={m:5d} K={k:6d} N={n:6d}  " + "  ".join(f"{kname} {v:7.1f}" for kname, v in row.items())
                  + f"  | best {best[1]} {best[0]:.1f} (+quantize {row['quantize']:.1f})"
                  + (f"  | OUTPUT DIFFERS from the package's kernel: {differ}" if differ else ""))
    return 0


def built_from(folder: str, extra: list, make):
    """The ``LaunchSpec`` ``make()`` returns, built from the kernel files in ``folder``
    where it has them (``cuda_bench.kernel_text_from``), with the template arguments
    ``extra`` appended."""
    from cuda_bench import kernel_text_from

    with kernel_text_from(folder):
        spec = make()
    return spec._replace(template=spec.template + extra)


def changed_gemm_spec(folder: str, extra: list, m: int, k: int, weight, cfg):
    """The per-channel GEMM launch (unsigned codes, bfloat16 out) on tile ``cfg`` built
    from the kernel files in ``folder`` with the template arguments ``extra`` appended
    (:func:`built_from`); its outputs must equal the package's launch bit for bit
    (``main`` compares one launch and names the tiles that differ)."""
    return built_from(folder, extra, lambda: cuda_gemm.gemm_per_channel_spec(
        m, k, weight, None, mx.bfloat16, cfg, unsigned=True))


def with_accumulators(tiles: dict, counts: list[int]) -> dict:
    """``tiles`` plus, for each cooperative tile and each count it allows
    (``count * bn <= 128``) other than its own, the tile with that many accumulator sets
    (``WsConfig.accumulators``), named ``<tile>a<count>``."""
    out = {}
    for name, cfg in tiles.items():
        out[name] = cfg
        for c in counts:
            if c != cfg.accumulators and not cfg.pingpong and c * cfg.bn <= 128:
                out[f"{name}a{c}"] = cfg._replace(accumulators=c)
    return out


def with_stages(tiles: dict, depths: list[int]) -> dict:
    """``tiles`` plus, for each tile and each ring depth in ``depths`` from 2 up to below
    its own (a deeper ring would not fit the shared memory the shipped depth fills), the
    tile with that many stages, named ``<tile>s<depth>``."""
    out = {}
    for name, cfg in tiles.items():
        out[name] = cfg
        for d in depths:
            if 2 <= d < cfg.stages:
                out[f"{name}s{d}"] = cfg._replace(stages=d)
    return out


def with_cooperative(tiles: dict) -> dict:
    """``tiles`` plus, for each ping-pong tile, the same tile with cooperative consumers
    (``WsConfig.pingpong`` off), named ``<tile>c``."""
    out = {}
    for name, cfg in tiles.items():
        out[name] = cfg
        if cfg.pingpong:
            out[name + "c"] = cfg._replace(pingpong=False)
    return out


def grouped_variants(cfg, variant: str, k: int, gs: int) -> list[tuple[str, object]]:
    """The ``(label suffix, tile)`` pairs ``--grouped`` times beside tile ``cfg``:
    ``"order"`` the MMA order (``o``), ``"live"`` the rows-past-M skip (``l``),
    ``"pipe"`` each pipelined-promotion run ``cfg`` takes at ``k`` and ``gs`` (``p2``,
    ``p4``), ``"live+pipe"`` the skip and those runs with and without it."""
    if variant in ("order", "live"):
        return [(variant[0], cfg._replace(**{variant: True}))]
    runs = cuda_tiles.pipe_runs(cfg, k, gs)
    out = [(f"p{r}", cfg._replace(pipe=r)) for r in runs]
    if variant == "live+pipe":
        out = [("l", cfg._replace(live=True))] + out + [
            (f"lp{r}", cfg._replace(pipe=r, live=True)) for r in runs]
    return out


def changed_grouped_spec(folder: str, extra: list, m: int, k: int, weight, cfg):
    """The group-wise TMA GEMM launch (bfloat16 out, no bias) on tile ``cfg`` built from
    the kernel files in ``folder`` with the template arguments ``extra`` appended
    (:func:`built_from`)."""
    return built_from(folder, extra, lambda: cuda_gemm_grouped.gemm_grouped_tma_spec(
        m, k, weight, None, mx.bfloat16, cfg))


def changes(folder: str, file: str) -> bool:
    """Whether ``folder`` holds ``file`` or a file it requires (``launch.requires``):
    a kernel built from the folder would then differ from the package's."""
    return bool(folder) and any(os.path.exists(os.path.join(folder, f))
                                for f in cuda_launch.requires(file))


def changed_dequant_spec(folder: str, extra: list, m: int, k: int, weight, cfg):
    """The dequantizing GEMM's launch (bfloat16, no bias) on tile ``cfg`` built from the
    kernel files in ``folder`` with the template arguments ``extra`` appended
    (:func:`built_from`)."""
    return built_from(folder, extra, lambda: cuda_gemm_dequant.gemm_dequant_spec(
        m, k, weight, None, mx.bfloat16, cfg))


def grouped_gemms(ms, shapes, group_sizes, bits: int, reps: int, variant: str = "order",
                  kernel_dir: str = "", extra=(), sub_only: bool = False) -> int:
    """``--grouped``: the group-wise TMA GEMM's kernel time per tile, plain and with
    ``variant`` on (:func:`grouped_variants`), and built from ``kernel_dir``'s files
    where given (``<tile>+``, for the kernels they change: :func:`changes`), against
    ``mx.quantized_matmul`` and bf16, per shape, group size and M; each variant's outputs
    compared with the plain tile's, bit for bit. ``sub_only``: of the group-wise TMA GEMM
    only the subnormal promotion's tiles."""
    from mlx_w8a8.weight import QuantizedWeight

    configs = cuda_tiles.GROUPED4_TMA_CONFIGS if bits == 4 else cuda_tiles.GROUPED_TMA_CONFIGS
    # The folder's arms, for the kernels its files change.
    dq_dir = kernel_dir if changes(kernel_dir, cuda_tiles.DequantConfig.file) else ""
    sub_dir = kernel_dir if changes(kernel_dir, "gemm_subnormal.cu") else ""
    tma_dir = kernel_dir if changes(kernel_dir, "gemm_grouped_ws.cu") else ""
    rng = np.random.default_rng(0)
    print(f"MLX {mx.__version__}, {bits}-bit group-wise weights; median kernel us of {reps} "
          f"evaluated calls (GEMM kernel alone; quantize: the group sums' quantize)")
    for k, n in shapes:
        w = mx.array(rng.standard_normal((n, k)).astype(np.float32) / np.sqrt(k)).astype(mx.bfloat16)
        for gs in group_sizes:
            wq, sq, bq = mx.quantize(w, group_size=gs, bits=bits)
            qw = QuantizedWeight(wq, sq, bq, gs, per_channel=False, bits=bits)
            mx.eval(wq, sq, bq)
            for m in ms:
                x = mx.array(rng.standard_normal((m, k)).astype(np.float32)).astype(mx.bfloat16)
                xq, xs, xr = cuda_quantize.quantize_groups(x, gs)
                mx.eval(x, xq, xs, xr)
                row, differ = {}, []
                row["bf16"] = timed(lambda: x @ w.T, reps)[0]
                row["qmm"] = timed(lambda: mx.quantized_matmul(
                    x, wq, sq, bq, transpose=True, group_size=gs, bits=bits), reps)[0]
                row["quantize"] = timed(lambda: cuda_quantize.quantize_groups(x, gs)[2], reps)[0]
                for name, cfg in ({} if sub_only else configs).items():
                    plain = cuda_gemm_grouped.gemm_grouped_tma(xq, xs, xr, qw, None, mx.bfloat16, cfg)
                    arms = [(name, cfg)]
                    for tag, other in grouped_variants(cfg, variant, k, gs):
                        if not mx.array_equal(cuda_gemm_grouped.gemm_grouped_tma(
                                xq, xs, xr, qw, None, mx.bfloat16, other), plain).item():
                            differ.append(name + tag)
                        arms.append((name + tag, other))
                    for label, c in arms:
                        row[label] = timed(lambda: cuda_gemm_grouped.gemm_grouped_tma(
                            xq, xs, xr, qw, None, mx.bfloat16, c), reps)[0]
                    if tma_dir:
                        spec = changed_grouped_spec(tma_dir, list(extra), m, k, qw, cfg)
                        if not mx.array_equal(spec.launch(xq, xs, xr)[0], plain).item():
                            differ.append(name + "+")
                        row[name + "+"] = timed(lambda: spec.launch(xq, xs, xr)[0], reps)[0]
                # The subnormal promotion's tiles (their own quantize: codes a + 128), its
                # largest difference from the plain 128-wide tile relative to that output's
                # largest (the two forms round differently: docs/numerics.md).
                uq = cuda_quantize.quantize_groups(x, gs, u8=True)
                mx.eval(*uq)
                base = cuda_gemm_grouped.gemm_grouped_tma(
                    xq, xs, xr, qw, None, mx.bfloat16, next(iter(configs.values()))).astype(mx.float32)
                sub_rel = plus_rel = 0.0
                first_sub, sub_unequal = None, []  # tiles whose output differs from the first's
                for name, cfg in cuda_tiles.SUB_TMA_CONFIGS.items():
                    if cfg.bits != bits:
                        continue
                    got = cuda_gemm_grouped.gemm_grouped_tma(*uq, qw, None, mx.bfloat16, cfg)
                    if first_sub is None:
                        first_sub = got
                    elif not mx.array_equal(got, first_sub).item():
                        sub_unequal.append(name)
                    sub_rel = max(sub_rel, (mx.abs(got.astype(mx.float32) - base).max()
                                            / mx.abs(base).max()).item())
                    row[name] = timed(lambda: cuda_gemm_grouped.gemm_grouped_tma(
                        *uq, qw, None, mx.bfloat16, cfg), reps)[0]
                    if sub_dir:
                        # The changed kernel against this one: the largest difference
                        # relative to the largest output (a summation order changed
                        # moves bfloat16 roundings; a wrong term moves far more).
                        spec = changed_grouped_spec(sub_dir, list(extra), m, k, qw, cfg)
                        new = spec.launch(*uq)[0].astype(mx.float32)
                        plus_rel = max(plus_rel, (mx.abs(new - got.astype(mx.float32)).max()
                                                  / mx.abs(got.astype(mx.float32)).max()).item())
                        row[name + "+"] = timed(lambda: spec.launch(*uq)[0], reps)[0]
                best = min((v, kname) for kname, v in row.items()
                           if kname not in ("bf16", "qmm", "quantize"))
                # The dequantizing GEMM (no quantize launch), each tile; its largest
                # difference from mx.quantized_matmul relative to that output's largest.
                ref = mx.quantized_matmul(x, wq, sq, bq, transpose=True, group_size=gs, bits=bits)
                dq, rel = {}, 0.0
                for name, cfg in cuda_tiles.DEQUANT_CONFIGS.items():
                    got = cuda_gemm_dequant.gemm_dequant(x, qw, None, cfg)
                    rel = max(rel, (mx.abs(got.astype(mx.float32) - ref.astype(mx.float32)).max()
                                    / mx.abs(ref.astype(mx.float32)).max()).item())
                    dq[name] = timed(lambda: cuda_gemm_dequant.gemm_dequant(x, qw, None, cfg), reps)[0]
                    if dq_dir:  # the same tile built from the folder: its outputs bit for bit
                        spec = changed_dequant_spec(dq_dir, list(extra), m, k, qw, cfg)
                        if not mx.array_equal(spec.launch(x)[0], got).item():
                            differ.append(name + "+")
                        dq[name + "+"] = timed(lambda: spec.launch(x)[0], reps)[0]
                dq_best = min((v, kname) for kname, v in dq.items())
                # Dequantize, then MLX's bf16 GEMM (cuda_dequant_matmul): the dequantize
                # launch alone, and the call (both kernels).
                dq["dequantize"] = timed(
                    lambda: cuda_dequant_matmul.dequantize(qw, mx.bfloat16), reps)[0]
                dq["dqmm"] = timed(lambda: cuda_dequant_matmul.product(
                    x, cuda_dequant_matmul.dequantize(qw, mx.bfloat16), None), reps)[0]
                print(f"M={m:5d} K={k:6d} N={n:6d} gs={gs:3d}  "
                      + "  ".join(f"{kname} {v:7.1f}" for kname, v in {**row, **dq}.items())
                      + f"  | best {best[1]} {best[0]:.1f} (+quantize {row['quantize']:.1f})"
                      + f"  | subnormal max diff vs the plain tile {sub_rel:.2g}"
                      + f" (tiles unequal to the first: {sub_unequal or 'none'})"
                      + (f" (<tile>+ vs <tile>: {plus_rel:.2g})" if sub_dir else "")
                      + f"  | dequant {dq_best[1]} {dq_best[0]:.1f} (max diff vs qmm {rel:.2g})"
                      + (f"  | OUTPUT DIFFERS from the plain tile: {differ}" if differ else ""))
    return 0


def int32_gemms(ms, shapes, tiles, reps: int) -> int:
    """``--int32``: each tile's raw int8 GEMM kernel time and TOPS per shape."""
    rng = np.random.default_rng(0)
    print(f"MLX {mx.__version__}; median kernel us (TOPS) of {reps} evaluated calls, int32 output")
    for k, n in shapes:
        b = mx.array(rng.integers(-128, 128, (n, k), dtype=np.int8))
        for m in ms:
            a = mx.array(rng.integers(-128, 128, (m, k), dtype=np.int8))
            mx.eval(a, b)
            row = {name: timed(lambda: cuda_gemm.int8_gemm(a, b, cfg), reps)[0]
                   for name, cfg in tiles.items()}
            ops = 2.0 * m * n * k
            print(f"M={m:5d} K={k:6d} N={n:6d}  " + "  ".join(
                f"{name} {us:7.1f} ({ops / us / 1e6:5.0f})" for name, us in row.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
