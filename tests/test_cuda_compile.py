"""Every CUDA kernel body compiles with ``nvcc`` for sm_90a, wrapped as MLX wraps it;
and what the launchers hand to MLX is checked on any machine (no GPU needed).

``mx.fast.cuda_kernel`` compiles at first use, on the user's GPU; a kernel that does not
compile would fail there, not in CI. This test builds each body the launchers can
produce (:func:`kernel_builds`, the manifest below) the way ``mlx/backend/cuda/custom_kernel.cpp`` does:
MLX's default header, the file's header, then inside ``namespace mlx::core::cu`` a
``__global__`` function taking ``const T* <input>`` (plus ``__grid_constant__ Shape
<input>_shape`` when the body mentions it) and ``T* <output>``, the template arguments as
``constexpr`` / ``using`` lines, then the body. MLX's own ``utils.cuh`` is not shipped in
the wheel as a file (it is compiled into libmlx), so a stand-in with the two names the
bodies use (``Shape``, ``Strides``) is written to a temporary include directory.

Skipped, with the reason printed, when ``nvcc`` is not on PATH.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import pytest

from mlx_w8a8.kernels import cuda, sources
from mlx_w8a8.kernels import cuda_launch as launch

NVCC = shutil.which("nvcc")
ARCH = "-gencode=arch=compute_90a,code=sm_90a"
MAX_NDIM = 10  # mlx/backend/cuda/device/config.h

# dtype name -> the type custom_kernel.cpp writes (dtype_to_cuda_type).
CUDA_TYPES = {
    "bool": "bool", "int8": "int8_t", "int16": "int16_t", "int32": "int32_t",
    "int64": "int64_t", "uint8": "uint8_t", "uint16": "uint16_t", "uint32": "uint32_t",
    "uint64": "uint64_t", "float16": "__half", "bfloat16": "__nv_bfloat16",
    "float32": "float", "float64": "double",
}

STAND_IN_UTILS = f"""#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda/std/array>
#include <cuda/std/limits>
#include <cuda/std/tuple>
namespace mlx::core::cu {{
using Shape = cuda::std::array<int32_t, {MAX_NDIM}>;
using Strides = cuda::std::array<int64_t, {MAX_NDIM}>;
}}
"""

DEFAULT_HEADER = """
#include "mlx/backend/cuda/device/utils.cuh"

#include <cooperative_groups.h>

"""


# The manifest: every body with the template arguments the launchers use -----------------
class KernelBuild(NamedTuple):
    """One kernel as MLX would compile it: file, body, typed inputs/outputs, template."""

    file: str
    body: str
    inputs: tuple[tuple[str, str, int], ...]  # (name, dtype name, ndim)
    outputs: tuple[tuple[str, str], ...]  # (name, dtype name)
    template: tuple[tuple[str, object], ...]  # values: int, bool or a dtype name


def _channel_inputs(body: str) -> tuple[tuple[str, str, int], ...]:
    ins = (("xq", "int8", 2), ("xs", "float32", 2))
    if "_u8" in body:
        ins += (("xr", "int32", 2),)
    ins += (("w", "uint32", 2), ("ws", "float32", 1))
    if body.endswith("bias"):
        ins += (("bias", "float32", 1),)
    return ins


def kernel_builds() -> list[KernelBuild]:
    """Every (body, template) combination the launchers can produce, one per tile config
    / group size / row bucket, with representative dtypes."""
    out = []
    for t in launch.FLOAT_DTYPES:
        out.append(KernelBuild("quantize.cu", "plain", (("x", t, 2),),
                               (("q", "int8"), ("scale", "float32")), (("T", t),)))
        for body in ("rowsum", "rowsum_warp"):
            out.append(KernelBuild("quantize.cu", body, (("x", t, 2),),
                                   (("q", "int8"), ("scale", "float32"), ("rsum", "int32")),
                                   (("T", t),)))
    for gs in (32, 64, 128):
        out.append(KernelBuild("quantize.cu", "sums", (("x", "bfloat16", 2),),
                               (("q", "int8"), ("scale", "float32"), ("row_sums", "int32")),
                               (("T", "bfloat16"), ("GS", gs))))
    for key in ("wgmma", "large", "medium", "small"):
        tpl = tuple(launch.ALL_GEMM_CONFIGS[key].template())
        file = launch.ALL_GEMM_CONFIGS[key].file
        out.append(KernelBuild(file, "int32", (("a", "int8", 2), ("b", "int8", 2)),
                               (("c", "int32"),), tpl))
        for t, body in (("bfloat16", "channel"), ("float16", "channel_bias"),
                        ("float32", "channel"), ("bfloat16", "channel_u8"),
                        ("float16", "channel_u8_bias"), ("float32", "channel_u8"),
                        ("bfloat16", "channel_u8_bias")):
            out.append(KernelBuild(file, body, _channel_inputs(body), (("y", t),),
                                   (("T", t),) + tpl))
    for cfg in launch.WS_CONFIGS.values():
        tpl = tuple(cfg.template())
        out.append(KernelBuild(cfg.file, "int32", (("a", "int8", 2), ("b", "int8", 2)),
                               (("c", "int32"),), tpl))
        # Each config's int32 body; the linear bodies in every dtype on the default 128 x 256
        # tile, two on 128 x 128 (the one-producer tiles differ only in PW: int32 covers it).
        linear = (("bfloat16", "channel_u8"), ("float16", "channel_u8_bias"),
                  ("float32", "channel_u8"), ("bfloat16", "channel_u8_bias"))
        if cfg.producers == 1:
            linear = ()
        elif cfg.bn == 128:
            linear = linear[:2]
        for t, body in linear:
            out.append(KernelBuild(cfg.file, body, _channel_inputs(body), (("y", t),),
                                   (("T", t),) + tpl))
    for key in ("grouped", "grouped_small"):
        tpl = tuple(launch.GEMM_CONFIGS[key].template())
        for gs, st, body in ((32, "float16", "grouped"), (64, "bfloat16", "grouped_bias"),
                             (128, "float32", "grouped")):
            ins = (("xq", "int8", 2), ("xs", "float32", 2), ("xr", "int32", 2),
                   ("w", "uint32", 2), ("ws", st, 2), ("wo", "float32", 2))
            if body.endswith("bias"):
                ins += (("bias", "float32", 1),)
            out.append(KernelBuild("gemm.cu", body, ins, (("y", "bfloat16"),),
                                   (("T", "bfloat16"), ("ST", st), ("GS", gs)) + tpl))
    gemv_bodies = (("channel", None, None), ("channel_bias", None, None),
                   ("grouped", "float16", 32), ("grouped_bias", "bfloat16", 64))
    gemv_bodies += tuple(("fused_" + b, st, gs) for b, st, gs in gemv_bodies)
    for i, mm in enumerate((1, 2, 4, 8, 16)):
        rw = launch.gemv_rows_per_warp(mm)
        for j, (body, st, gs) in enumerate(gemv_bodies):
            if (i + j) % 2 and mm not in (1, 16):
                continue  # every body at M = 1 and 16; the middle buckets alternate
            fused = body.startswith("fused_")
            if fused:
                ins = (("x", "bfloat16" if st is None else "float16", 2), ("w", "uint32", 2))
            else:
                ins = (("xq", "int8", 2), ("xs", "float32", 2), ("w", "uint32", 2))
            if st is None:
                ins += (("ws", "float32", 1),)
                tpl = (("T", "bfloat16"),)
            else:
                ins += (("ws", st, 2), ("wo", "float32", 2))
                tpl = (("T", "float16"), ("ST", st), ("GS", gs))
            if body.endswith("bias"):
                ins += (("bias", "float32", 1),)
            tpl += (("MM", mm), ("RW", rw))
            if fused:
                tpl += (("SMEM_BYTES", mm * 4096),)
            out.append(KernelBuild("gemv.cu", body, ins, (("y", tpl[0][1]),), tpl))
    return out


def wrap(build: KernelBuild) -> str:
    """The full translation unit MLX would hand to NVRTC for ``build``."""
    header, bodies = launch.load(build.file)  # the text the launchers pass to MLX
    body = bodies[build.body]
    name = f"custom_kernel_w8a8_{build.file[:-3]}_{build.body}"
    params = []
    for arg, dtype, ndim in build.inputs:
        params.append(f"    const {CUDA_TYPES[dtype]}* {arg}")
        if ndim > 0:  # custom_kernel.cpp: shape/strides/ndim only if the body names them
            if f"{arg}_shape" in body:
                params.append(f"    const __grid_constant__ Shape {arg}_shape")
            if f"{arg}_strides" in body:
                params.append(f"    const __grid_constant__ Strides {arg}_strides")
            if f"{arg}_ndim" in body:
                params.append(f"    const __grid_constant__ int {arg}_ndim")
    for arg, dtype in build.outputs:
        params.append(f"    {CUDA_TYPES[dtype]}* {arg}")
    consts = []
    for key, value in build.template:
        if isinstance(value, bool):
            consts.append(f"  constexpr bool {key} = {'true' if value else 'false'};")
        elif isinstance(value, int):
            consts.append(f"  constexpr int {key} = {value};")
        else:
            consts.append(f"  using {key} = {CUDA_TYPES[value]};")
    return (
        DEFAULT_HEADER + header
        + "namespace mlx::core::cu {\n\nnamespace cg = cooperative_groups;\n\n"
        + f"__global__ void {name}(\n" + ",\n".join(params) + ") {\n"
        + "\n".join(consts) + "\n\n" + body + "\n}\n\n} // namespace mlx::core::cu\n"
    )


def _label(build: KernelBuild) -> str:
    return f"{build.file}:{build.body}:" + ",".join(f"{k}={v}" for k, v in build.template)


# Successful compiles are remembered by the digest of everything that decides them (the
# wrapped source, the stand-in header, the flags, nvcc's version), so an unchanged kernel
# is not compiled again on every run; a failure is always recompiled and shown.
NVCC_CACHE = os.environ.get("MLX_W8A8_NVCC_CACHE") or os.path.join(
    tempfile.gettempdir(), "mlx_w8a8_nvcc_cache")


@functools.lru_cache(maxsize=1)
def _nvcc_version() -> str:
    return subprocess.run([NVCC, "--version"], capture_output=True, text=True).stdout


def _compile(build: KernelBuild, workdir: str, index: int) -> tuple[int, str]:
    text = wrap(build)
    flags = [ARCH, "-std=c++17", "-Xptxas", "-v", "-c"]
    key = hashlib.sha256("\0".join([text, STAND_IN_UTILS, " ".join(flags), _nvcc_version()])
                         .encode()).hexdigest()[:32]
    done = os.path.join(NVCC_CACHE, key + ".log")
    if os.path.exists(done):
        with open(done) as f:
            return 0, "(compiled before, same digest) " + f.read()
    src = os.path.join(workdir, f"k{index}.cu")
    with open(src, "w") as f:
        f.write(text)
    cmd = [NVCC, *flags[:-1], "-I", workdir, "-c", src, "-o", os.path.join(workdir, f"k{index}.o")]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    log = proc.stdout + proc.stderr
    if proc.returncode == 0:
        os.makedirs(NVCC_CACHE, exist_ok=True)
        tmp = f"{done}.{os.getpid()}.{index}.tmp"
        with open(tmp, "w") as f:
            f.write(log)
        os.replace(tmp, done)
    return proc.returncode, log


BUILDS = kernel_builds()


def test_every_shipped_kernel_file_has_builds():
    """Each .cu file shipped is covered by kernel_builds(), so none escapes compilation."""
    from importlib import resources

    shipped = {p.name for p in resources.files("mlx_w8a8").joinpath("shaders", "cuda").iterdir()
               if p.name.endswith(".cu")}
    built = {b.file for b in BUILDS}
    assert shipped == built, f"kernel files without a compile check: {shipped - built}"
    for file in shipped:
        _, bodies = sources.split(sources.read("cuda", file))
        covered = {b.body for b in BUILDS if b.file == file}
        assert covered == set(bodies), f"{file}: bodies never compiled: {set(bodies) - covered}"


@pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH: CUDA kernels not compiled here")
def test_kernels_compile_for_sm90a(tmp_path):
    inc = tmp_path / "mlx" / "backend" / "cuda" / "device"
    inc.mkdir(parents=True)
    (inc / "utils.cuh").write_text(STAND_IN_UTILS)
    jobs = max(1, min(8, os.cpu_count() or 1))
    with ThreadPoolExecutor(jobs) as pool:
        results = list(pool.map(lambda ib: _compile(ib[1], str(tmp_path), ib[0]),
                                enumerate(BUILDS)))
    failures = []
    for build, (rc, log) in zip(BUILDS, results):
        spills = [ln.strip() for ln in log.splitlines() if "spill" in ln and not ln.strip().startswith("0 bytes")]
        regs = [ln.split("Used")[-1].strip() for ln in log.splitlines() if "Used" in ln]
        print(f"{_label(build)}: rc={rc} {'; '.join(regs)} {'; '.join(spills)}")
        if rc != 0:
            failures.append(f"{_label(build)}\n{log[-3000:]}")
    assert not failures, "kernels that do not compile:\n" + "\n\n".join(failures)


# Launch plans, checked on any machine ----------------------------------------------------
class _Recorder:
    """Stands in for mx.fast.cuda_kernel: records each build and launch, returns zeros."""

    def __init__(self):
        self.launches = []

    def __call__(self, *, name, input_names, output_names, source, header,
                 ensure_row_contiguous, shared_memory):
        import mlx.core as mx

        def launch(*, inputs, output_shapes, output_dtypes, grid, threadgroup, template=None,
                   init_value=None, **_):
            self.launches.append(dict(
                name=name, inputs=list(input_names), outputs=list(output_names),
                source=source, header=header, shared_memory=shared_memory, grid=grid,
                threadgroup=threadgroup, template=list(template or []), arrays=inputs))
            return [mx.zeros(s, dtype=d) for s, d in zip(output_shapes, output_dtypes)]

        return launch


def _launch_all():
    """Every launcher, on CPU arrays, over the shapes and configs they can take."""
    import mlx.core as mx

    from mlx_w8a8.weight import QuantizedWeight

    for m, k in ((1, 64), (7, 4096), (3, 18944), (9, 4096)):
        for gs in (None, 32, 64, 128):
            launch.quantize(mx.zeros((m, k), dtype=mx.bfloat16), gs)
        launch.quantize(mx.zeros((m, k), dtype=mx.float16), None, row_sum=True)
        launch.quantize(mx.zeros((m, k), dtype=mx.float32), None, row_sum=True, warp=True)
    a = mx.zeros((300, 256), dtype=mx.int8)
    b = mx.zeros((264, 256), dtype=mx.int8)
    configs = list(launch.ALL_GEMM_CONFIGS.values()) + list(launch.WS_CONFIGS.values())
    for cfg in configs:
        launch.int8_gemm(a, b, cfg)
    launch.int8_gemm_ws(mx.zeros((4096, 256), dtype=mx.int8), mx.zeros((4096, 256), dtype=mx.int8))
    w = mx.random.normal((264, 256))
    pc = QuantizedWeight.from_float(w, 64, per_channel=True)
    gr = QuantizedWeight.from_float(w.astype(mx.float16), 32, per_channel=False)
    bias = mx.zeros((264,), dtype=mx.bfloat16)
    for cfg in configs:
        xq, xs = mx.zeros((300, 256), dtype=mx.int8), mx.ones((300, 1))
        ws = isinstance(cfg, launch.WsConfig)
        if ws or cfg.wgmma or cfg.wtn >= 64:
            if not ws:
                launch.gemm_per_channel(xq, xs, pc, bias, mx.float16, cfg)
                launch.gemm_per_channel(xq, xs, pc, None, mx.float32, cfg)
            xr1 = mx.zeros((300, 1), dtype=mx.int32)
            launch.gemm_per_channel(xq, xs, pc, bias, mx.bfloat16, cfg, row_sums=xr1)
            launch.gemm_per_channel(xq, xs, pc, None, mx.float16, cfg, row_sums=xr1)
        if not ws and not cfg.wgmma:
            xr = mx.zeros((300, 8), dtype=mx.int32)
            launch.gemm_grouped(xq, xs, xr, gr, bias, mx.bfloat16, cfg)
    for m in (1, 2, 3, 8, 16):
        for weight in (pc, gr):
            for fused in (True, False):
                launch.gemv(mx.zeros((m, 256), dtype=mx.bfloat16), weight,
                            bias if m % 2 else None, fused=fused)


def test_launch_plans_are_compiled_and_consistent(monkeypatch):
    """What the launchers hand to MLX, recorded without a GPU: every (file, body, template
    names, tile) is among the builds the compile test compiles; every argument name is one
    the body uses; block sizes are whole warps within limits; shared memory fits a block."""
    import mlx.core as mx

    rec = _Recorder()
    monkeypatch.setattr(mx.fast, "cuda_kernel", rec)
    launch._kernel.cache_clear()
    try:
        _launch_all()
    finally:
        launch._kernel.cache_clear()
    assert rec.launches
    built = {}
    for b in BUILDS:
        key = (b.file, b.body)
        built.setdefault(key, set()).add(tuple(k for k, _ in b.template))
    tiles = {tuple(c.template()) for c in launch.ALL_GEMM_CONFIGS.values()}
    tiles |= {tuple(c.template()) for c in launch.WS_CONFIGS.values()}
    for plan in rec.launches:
        match = [(f, body) for f, body in built if plan["name"] == f"w8a8_{f[:-3]}_{body}"]
        assert len(match) == 1, f"launch {plan['name']} matches no compiled body"
        names = tuple(k for k, _ in plan["template"])
        assert names in built[match[0]], (plan["name"], names, built[match[0]])
        ints = tuple((k, v) for k, v in plan["template"] if k in ("BM", "BN", "WTM", "WTN", "STAGES", "PW"))
        if ints:
            assert ints in tiles, (plan["name"], ints)
        body = plan["source"]
        for arg in plan["inputs"] + plan["outputs"]:
            assert re.search(rf"\b{arg}\b", body), f"{plan['name']}: body never uses {arg!r}"
        tg, grid = plan["threadgroup"][0], plan["grid"][0]
        assert tg % 32 == 0 and 32 <= tg <= 1024 and grid % 32 == 0, (plan["name"], tg, grid)
        assert plan["shared_memory"] <= 227 * 1024, (plan["name"], plan["shared_memory"])
        assert "//" not in body, "comments reach MLX (hashed on every launch)"
        if plan["name"].startswith("w8a8_gemm_ws_"):
            # 8 consumer warps + PW producer warps, within gemm_ws.cu's
            # __launch_bounds__(384, 1); a persistent grid of at most one block per SM.
            pw = dict(plan["template"])["PW"]
            assert tg == 256 + 32 * pw <= 384, (plan["name"], tg, pw)
            assert grid // tg <= launch.SMS, (plan["name"], grid)
    ws_grids = [p["grid"][0] // p["threadgroup"][0] for p in rec.launches
                if p["name"] == "w8a8_gemm_ws_int32"]
    assert launch.SMS in ws_grids, "a persistent grid larger than the SM count was never capped"


def test_per_channel_path_follows_the_unsigned_k_bound(monkeypatch):
    """The registered per-channel linear multiplies the unsigned codes (``channel_u8``,
    quantize with row sums) while K * 127 * 255 < 2^31 and flips them above (``channel``)."""
    import mlx.core as mx

    from mlx_w8a8.weight import QuantizedWeight

    assert cuda.U8_MAX_K * 127 * 255 < 2**31 <= (cuda.U8_MAX_K + 1) * 127 * 255
    rec = _Recorder()
    monkeypatch.setattr(mx.fast, "cuda_kernel", rec)
    launch._kernel.cache_clear()
    try:
        for k in (4096, 66304, 66336):
            w = QuantizedWeight.from_int8(mx.zeros((8, k), dtype=mx.int8), mx.ones((8,)), 32)
            start = len(rec.launches)
            cuda._w8a8_gemm_run(mx.zeros((2, k), dtype=mx.bfloat16), w, None)
            names = [plan["name"] for plan in rec.launches[start:]]
            if k <= cuda.U8_MAX_K:
                assert names == ["w8a8_quantize_rowsum", "w8a8_gemm_channel_u8"], (k, names)
            else:
                assert names == ["w8a8_quantize_plain", "w8a8_gemm_channel"], (k, names)
    finally:
        launch._kernel.cache_clear()


def test_stages_launch_what_run_launches(monkeypatch):
    """Each CUDA linear candidate's two-stage form, recorded on CPU arrays: apply(quantize
    (x)) makes the same launches (kernel, template, grid, input shapes) as run(x); equal
    act_keys come from quantize launches with the same outputs; the one-launch GEMV has no
    stages, its two-launch form has."""
    import mlx.core as mx

    from mlx_w8a8.kernels import registry
    from mlx_w8a8.kernels.registry import Problem
    from mlx_w8a8.weight import QuantizedWeight

    def summary(plans):
        return [(p["name"], p["template"], p["grid"], [a.shape for a in p["arrays"]])
                for p in plans]

    rec = _Recorder()
    monkeypatch.setattr(mx.fast, "cuda_kernel", rec)
    monkeypatch.setattr(cuda, "is_sm90", lambda: True)  # the ws candidates' supports()
    launch._kernel.cache_clear()
    w = mx.random.normal((264, 8192))
    quantize_launches = {}
    try:
        for cand in registry.all_candidates():
            if cand.backend != "cuda" or cand.op != "linear":
                continue
            assert cand.stages is not None, f"{cand.name} has no two-stage form"
            for m, k, fmt in ((16, 8192, "per_channel"), (16, 8192, "grouped"),
                              (2, 1024, "per_channel"), (300, 1024, "per_channel")):
                problem = Problem("linear", m, 264, k, "bfloat16", fmt, 64, False)
                if not cand.supports(problem):
                    continue
                x = mx.zeros((m, k), dtype=mx.bfloat16)
                weight = QuantizedWeight.from_float(w[:, :k], 64, per_channel=fmt == "per_channel")
                staged = cand.stages(problem)
                if cand.name == "cuda_int8_gemv" and launch.gemv_fuses(m, k):
                    assert staged is None, (cand.name, m, k)
                    continue
                key, quant, apply = staged
                start = len(rec.launches)
                cand.run(x, weight, None)
                direct = summary(rec.launches[start:])
                start = len(rec.launches)
                acts = quant(x)
                first = summary(rec.launches[start:])
                apply(acts, weight, None, x.dtype)
                both = summary(rec.launches[start:])
                assert both == direct, (cand.name, m, k, both, direct)
                outs = [(a.shape, a.dtype) for a in acts if a is not None]
                quantize_launches.setdefault((key, m, k), set()).add(repr(outs))
                assert len(first) == 1 and "quantize" in first[0][0], (cand.name, first)
    finally:
        launch._kernel.cache_clear()
    for (key, m, k), outs in quantize_launches.items():
        assert len(outs) == 1, f"act_key {key} names different activation formats: {outs}"
    keys = {key for key, _, _ in quantize_launches}
    assert cuda.ROWSUM in keys and cuda.PLAIN in keys
