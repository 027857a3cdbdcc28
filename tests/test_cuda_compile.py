"""Every CUDA kernel body compiles with ``nvcc`` for sm_90a, wrapped as MLX wraps it;
and what the launchers hand to MLX is checked on any machine (no GPU needed).

``mx.fast.cuda_kernel`` compiles at first use, on the user's GPU; a kernel that does not
compile would fail there, not in CI. This test builds each body the launchers can
produce (``cuda.kernel_builds()``) the way ``mlx/backend/cuda/custom_kernel.cpp`` does:
MLX's default header, the file's header, then inside ``namespace mlx::core::cu`` a
``__global__`` function taking ``const T* <input>`` (plus ``__grid_constant__ Shape
<input>_shape`` when the body mentions it) and ``T* <output>``, the template arguments as
``constexpr`` / ``using`` lines, then the body. MLX's own ``utils.cuh`` is not shipped in
the wheel as a file (it is compiled into libmlx), so a stand-in with the two names the
bodies use (``Shape``, ``Strides``) is written to a temporary include directory.

Skipped, with the reason printed, when ``nvcc`` is not on PATH.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from mlx_w8a8.kernels import cuda, sources

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


def wrap(build: cuda.KernelBuild) -> str:
    """The full translation unit MLX would hand to NVRTC for ``build``."""
    header, bodies = cuda.load(build.file)  # the text the launchers pass to MLX
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


def _label(build: cuda.KernelBuild) -> str:
    return f"{build.file}:{build.body}:" + ",".join(f"{k}={v}" for k, v in build.template)


def _compile(build: cuda.KernelBuild, workdir: str, index: int) -> tuple[int, str]:
    src = os.path.join(workdir, f"k{index}.cu")
    with open(src, "w") as f:
        f.write(wrap(build))
    cmd = [NVCC, ARCH, "-std=c++17", "-I", workdir, "-Xptxas", "-v", "-c", src,
           "-o", os.path.join(workdir, f"k{index}.o")]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    return proc.returncode, proc.stdout + proc.stderr


BUILDS = cuda.kernel_builds()


def test_every_shipped_kernel_file_has_builds():
    """Each .cu file shipped is covered by kernel_builds(), so none escapes compilation."""
    from importlib import resources

    shipped = {p.name for p in resources.files("mlx_w8a8").joinpath("shaders", "cuda").iterdir()
               if p.name.endswith(".cu")}
    built = {b.file for b in BUILDS}
    assert shipped == built, f"kernel files without a compile check: {shipped - built}"
    for file in shipped:
        _, bodies = cuda.split(sources.read("cuda", file))
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
        print(f"{_label(build)}: rc={rc} {'; '.join(regs)}")
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

    for m, k in ((1, 64), (7, 4096), (3, 18944)):
        for gs in (None, 32, 64, 128):
            cuda.quantize(mx.zeros((m, k), dtype=mx.bfloat16), gs)
        cuda.quantize(mx.zeros((m, k), dtype=mx.float16), None, row_sum=True)
    a = mx.zeros((300, 256), dtype=mx.int8)
    b = mx.zeros((264, 256), dtype=mx.int8)
    for cfg in cuda._ALL_GEMM_CONFIGS.values():
        cuda.int8_gemm(a, b, cfg)
    w = mx.random.normal((264, 256))
    pc = QuantizedWeight.from_float(w, 64, per_channel=True)
    gr = QuantizedWeight.from_float(w.astype(mx.float16), 32, per_channel=False)
    bias = mx.zeros((264,), dtype=mx.bfloat16)
    for cfg in cuda._ALL_GEMM_CONFIGS.values():
        xq, xs = mx.zeros((300, 256), dtype=mx.int8), mx.ones((300, 1))
        if cfg.wgmma or cfg.wtn >= 64:
            cuda.gemm_per_channel(xq, xs, pc, bias, mx.float16, cfg)
            cuda.gemm_per_channel(xq, xs, pc, None, mx.float32, cfg)
            xr1 = mx.zeros((300, 1), dtype=mx.int32)
            cuda.gemm_per_channel(xq, xs, pc, bias, mx.bfloat16, cfg, row_sums=xr1)
            cuda.gemm_per_channel(xq, xs, pc, None, mx.float16, cfg, row_sums=xr1)
        if not cfg.wgmma:
            xr = mx.zeros((300, 8), dtype=mx.int32)
            cuda.gemm_grouped(xq, xs, xr, gr, bias, mx.bfloat16, cfg)
    for m in (1, 2, 3, 8, 16):
        for weight in (pc, gr):
            for fused in (True, False):
                cuda.gemv(mx.zeros((m, 256), dtype=mx.bfloat16), weight, bias if m % 2 else None,
                          fused=fused)


def test_launch_plans_are_compiled_and_consistent(monkeypatch):
    """What the launchers hand to MLX, recorded without a GPU: every (file, body, template
    names, tile) is among the builds the compile test compiles; every argument name is one
    the body uses; block sizes are whole warps within limits; shared memory fits a block."""
    import mlx.core as mx

    rec = _Recorder()
    monkeypatch.setattr(mx.fast, "cuda_kernel", rec)
    cuda._kernel.cache_clear()
    try:
        _launch_all()
    finally:
        cuda._kernel.cache_clear()
    assert rec.launches
    built = {}
    for b in BUILDS:
        key = (b.file, b.body)
        built.setdefault(key, set()).add(tuple(k for k, _ in b.template))
    tiles = {tuple(c.template()) for c in cuda._ALL_GEMM_CONFIGS.values()}
    for launch in rec.launches:
        match = [(f, body) for f, body in built if launch["name"] == f"w8a8_{f[:-3]}_{body}"]
        assert len(match) == 1, f"launch {launch['name']} matches no compiled body"
        names = tuple(k for k, _ in launch["template"])
        assert names in built[match[0]], (launch["name"], names, built[match[0]])
        ints = tuple((k, v) for k, v in launch["template"] if k in ("BM", "BN", "WTM", "WTN", "STAGES"))
        if ints:
            assert ints in tiles, (launch["name"], ints)
        body = launch["source"]
        for arg in launch["inputs"] + launch["outputs"]:
            assert re.search(rf"\b{arg}\b", body), f"{launch['name']}: body never uses {arg!r}"
        tg, grid = launch["threadgroup"][0], launch["grid"][0]
        assert tg % 32 == 0 and 32 <= tg <= 1024 and grid % 32 == 0, (launch["name"], tg, grid)
        assert launch["shared_memory"] <= 227 * 1024, (launch["name"], launch["shared_memory"])
        assert "//" not in body, "comments reach MLX (hashed on every launch)"


def test_per_channel_path_follows_the_unsigned_k_bound(monkeypatch):
    """The registered per-channel linear multiplies the unsigned codes (``channel_u8``,
    quantize with row sums) while K * 127 * 255 < 2^31 and flips them above (``channel``)."""
    import mlx.core as mx

    from mlx_w8a8.weight import QuantizedWeight

    assert cuda.U8_MAX_K * 127 * 255 < 2**31 <= (cuda.U8_MAX_K + 1) * 127 * 255
    rec = _Recorder()
    monkeypatch.setattr(mx.fast, "cuda_kernel", rec)
    cuda._kernel.cache_clear()
    try:
        for k in (4096, 66304, 66336):
            w = QuantizedWeight.from_int8(mx.zeros((8, k), dtype=mx.int8), mx.ones((8,)), 32)
            start = len(rec.launches)
            cuda._w8a8_gemm_run(mx.zeros((2, k), dtype=mx.bfloat16), w, None)
            names = [launch["name"] for launch in rec.launches[start:]]
            if k <= cuda.U8_MAX_K:
                assert names == ["w8a8_quantize_rowsum", "w8a8_gemm_channel_u8"], (k, names)
            else:
                assert names == ["w8a8_quantize_plain", "w8a8_gemm_channel"], (k, names)
    finally:
        cuda._kernel.cache_clear()
