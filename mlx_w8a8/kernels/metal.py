"""Metal candidates: kernels in ``shaders/metal/*.metal`` run through ``mx.fast.metal_kernel``.

Registered candidates (offered only where Metal is present; importing this module never
needs Metal):

- ``metal_quantize`` (``quantize_activation``): per-token int8 codes, float32 scales and
  optional per-group row sums, one threadgroup per row.
- ``metal_nax_int8_gemm`` (``int8_matmul``, M5-class GPUs): ``matmul2d`` int8 -> int32
  on the neural accelerators.
- ``metal_simd_int8_gemm`` (``int8_matmul``, every Apple GPU): int8 widened to half in
  ``simdgroup_matrix``, float accumulation flushed to int32 every 1024 values of K.
- ``metal_nax_w8a8_gemm`` / ``metal_simd_w8a8_gemm`` (``linear``, per-channel weights):
  quantize + the same GEMMs with the dequant (+ bias) epilogue fused.
- ``metal_w8a8_gemm_grouped`` (``linear``, grouped affine weights): quantize with row
  sums + GEMM folding each group's exact sums into float32; NAX kernel where NAX is
  present, the simdgroup-matrix kernel elsewhere.
- ``metal_int8_gemv`` (``linear``, M <= 16, either format): quantize + a memory-bound
  kernel over the stored codes.

Capabilities: Metal is ``mx.metal.is_available()``; NAX follows MLX's
``is_nax_available`` (``mlx/backend/metal/device.cpp``): macOS >= 26.2 and GPU
architecture generation >= 17 (>= 18 for a ``p`` architecture), the generation being the
two digits before the last letter of ``mx.device_info()["architecture"]`` (e.g.
``applegpu_g17g``). Both are computed on first use, without subprocesses, and
:func:`override` replaces either for tests.

How a kernel is launched is one function, :func:`set_executor`: by default it calls the
``mx.fast.metal_kernel`` object; the test suite swaps in a Metal emulator so the same
launch code runs on machines without Metal.
"""

from __future__ import annotations

import contextlib
import functools
import platform
import re
from typing import Any, Callable

import mlx.core as mx

from . import registry, sources

GEMV_MAX_M = 16
MAX_K = 1 << 17  # |a|, |b| <= 128: K * 2^14 <= 2^31 keeps int32 exact
FLOAT_DTYPES = ("float16", "bfloat16", "float32")
QUANT_THREADS = 256
GEMV_THREADS = 256
GEMM_THREADS = 128
SIMD_TILE = 32  # simd_gemm.metal: 32 x 32 per threadgroup
NAX_TILE = 64  # nax_gemm.metal: 64 x 64 per threadgroup
NAX_MIN_MACOS = (26, 2)

_BODY = re.compile(r"^// @@ body (\w+)\s*$", re.MULTILINE)


# ---------------------------------------------------------------------------------------
# Capabilities.
# ---------------------------------------------------------------------------------------
_override: dict[str, bool | None] = {"metal": None, "nax": None}


@functools.lru_cache(maxsize=1)
def _native_metal() -> bool:
    try:
        return bool(mx.metal.is_available())
    except Exception:
        return False


def nax_rule(macos_version: str, architecture: str) -> bool:
    """MLX's ``is_nax_available`` rule on plain values.

    Args:
        macos_version: e.g. ``"26.2"`` (``platform.mac_ver()[0]``; ``""`` off macOS).
        architecture: e.g. ``"applegpu_g17g"`` (``mx.device_info()["architecture"]``).

    Returns:
        True for macOS >= 26.2 and generation >= 17 (>= 18 when the architecture ends
        in ``p``).
    """
    try:
        parts = tuple(int(p) for p in macos_version.split(".")[:2])
    except ValueError:
        return False
    if len(parts) == 1:
        parts = (parts[0], 0)
    if not parts or parts < NAX_MIN_MACOS:
        return False
    if len(architecture) < 3 or not architecture[-3:-1].isdigit():
        return False
    gen = int(architecture[-3:-1])
    return gen >= (18 if architecture[-1] == "p" else 17)


@functools.lru_cache(maxsize=1)
def _native_nax() -> bool:
    if not _native_metal():
        return False
    try:
        arch = str(mx.device_info().get("architecture", ""))
    except Exception:
        return False
    return nax_rule(platform.mac_ver()[0], arch)


def metal_available() -> bool:
    """Whether Metal kernels can run here (or the override says so)."""
    forced = _override["metal"]
    return _native_metal() if forced is None else forced


def nax_available() -> bool:
    """Whether the NAX (``matmul2d`` int8) kernels can run here (or the override says so)."""
    if not metal_available():
        return False
    forced = _override["nax"]
    return _native_nax() if forced is None else forced


@contextlib.contextmanager
def override(metal: bool | None = None, nax: bool | None = None):
    """Pretend Metal / NAX are present (True) or absent (False); None keeps detection.

    Used by tests to reach each dispatch branch. Restores the previous state on exit.
    """
    for name, value in (("metal", metal), ("nax", nax)):
        if value is not None and not isinstance(value, bool):
            raise ValueError(f"[mlx_w8a8.metal.override] {name} must be True, False or None, got {value!r}")
    saved = dict(_override)
    _override.update(metal=metal, nax=nax)
    try:
        yield
    finally:
        _override.update(saved)


# ---------------------------------------------------------------------------------------
# Launching.
# ---------------------------------------------------------------------------------------
Executor = Callable[..., list]


def _call_kernel(kernel, **kwargs):
    return kernel(**kwargs)


_executor: Executor = _call_kernel


def set_executor(executor: Executor | None) -> Executor:
    """Install ``executor(kernel, *, inputs, output_shapes, output_dtypes, grid,
    threadgroup, template, init_value) -> list[mx.array]``; None restores the default
    (calling the kernel). Returns the previous one."""
    global _executor
    previous = _executor
    _executor = _call_kernel if executor is None else executor
    return previous


def split(text: str) -> tuple[str, dict[str, str]]:
    """Split a ``.metal`` file into its header and named bodies (``// @@ body NAME``).

    Raises:
        ValueError: if the file has no body marker.
    """
    marks = list(_BODY.finditer(text))
    if not marks:
        raise ValueError("[mlx_w8a8.metal] kernel file has no '// @@ body NAME' section")
    bodies = {}
    for i, mark in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        bodies[mark.group(1)] = text[mark.end():end].strip() + "\n"
    return text[: marks[0].start()], bodies


@functools.lru_cache(maxsize=None)
def _kernel(file: str, body: str, inputs: tuple[str, ...], outputs: tuple[str, ...]):
    """The ``mx.fast.metal_kernel`` for ``body`` of ``file`` (built once)."""
    header, bodies = split(sources.read("metal", file))
    return mx.fast.metal_kernel(
        name=f"w8a8_{body}",
        input_names=list(inputs),
        output_names=list(outputs),
        source=bodies[body],
        header=sources.read("metal", "common.h") + header,
    )


def _digest(*files: str) -> str:
    return sources.digest(*(sources.read("metal", f) for f in ("common.h", *files)),
                          f"{QUANT_THREADS}/{GEMV_THREADS}/{GEMM_THREADS}/{SIMD_TILE}/{NAX_TILE}")


@functools.lru_cache(maxsize=None)
def _dummy(dtype) -> mx.array:
    return mx.zeros((1,), dtype=dtype)


def _as_kernel_input(x: mx.array) -> tuple[mx.array, bool]:
    """Activations as the kernels read them: bfloat16 as its uint16 bits."""
    if x.dtype == mx.bfloat16:
        return mx.contiguous(x).view(mx.uint16), True
    return x, False


def _out_type(dtype) -> tuple[Any, bool]:
    """(kernel output dtype, carried as bfloat16 bits)."""
    return (mx.uint16, True) if dtype == mx.bfloat16 else (dtype, False)


# ---------------------------------------------------------------------------------------
# Runs (signatures: registry.py).
# ---------------------------------------------------------------------------------------
def quantize(x: mx.array, group_size: int | None = None):
    """Per-token int8 quantization on Metal.

    Args:
        x: ``[M, K]`` float16/bfloat16/float32.
        group_size: None, or 32/64/128 dividing K for per-group row sums.

    Returns:
        ``(q, scales, row_sums)``: ``[M, K]`` int8, ``[M, 1]`` float32 and ``[M, K //
        group_size]`` int32 (``None`` without ``group_size``).
    """
    m, k = x.shape
    gs = int(group_size or 0)
    xin, bf16 = _as_kernel_input(x)
    groups = k // gs if gs else 1
    q, scale, rs = _executor(
        _kernel("quantize.metal", "quantize", ("x",), ("q", "scale", "rs")),
        inputs=[xin],
        template=[("T", xin.dtype), ("BF16", bf16), ("NT", QUANT_THREADS), ("GS", gs)],
        grid=(QUANT_THREADS, m, 1),
        threadgroup=(QUANT_THREADS, 1, 1),
        output_shapes=[(m, k), (m, 1), (m, groups)],
        output_dtypes=[mx.int8, mx.float32, mx.int32],
    )
    return q, scale, (rs if gs else None)


def _gemm(nax: bool, a, b, *, flip, mode, gs, out_dtype, sa=None, sw=None, ws=None, wo=None,
          rs=None, bias=None):
    m, n = a.shape[0], b.shape[0]
    f32 = _dummy(mx.float32)
    kdtype, bf16 = _out_type(out_dtype)
    tile = NAX_TILE if nax else SIMD_TILE
    file, body = ("nax_gemm.metal", "nax_gemm") if nax else ("simd_gemm.metal", "simd_gemm")
    (out,) = _executor(
        _kernel(file, body, ("a", "b", "sa", "sw", "ws", "wo", "rs", "bias"), ("out",)),
        inputs=[a, b, f32 if sa is None else sa, f32 if sw is None else sw,
                f32 if ws is None else ws, f32 if wo is None else wo,
                _dummy(mx.int32) if rs is None else rs, f32 if bias is None else bias],
        template=[("TB", b.dtype), ("FLIP", flip), ("MODE", mode), ("GS", gs), ("TO", kdtype),
                  ("OUT_BF16", bf16), ("HAS_BIAS", bias is not None)],
        grid=(-(-n // tile) * GEMM_THREADS, -(-m // tile), 1),
        threadgroup=(GEMM_THREADS, 1, 1),
        output_shapes=[(m, n)],
        output_dtypes=[kdtype],
    )
    return out.view(mx.bfloat16) if bf16 else out


def nax_int8_matmul(a: mx.array, b: mx.array) -> mx.array:
    """``a @ b.T`` (``[M, K]``, ``[N, K]`` int8) as exact ``[M, N]`` int32, on NAX."""
    return _gemm(True, a, b, flip=False, mode=0, gs=32, out_dtype=mx.int32)


def simd_int8_matmul(a: mx.array, b: mx.array) -> mx.array:
    """``a @ b.T`` (``[M, K]``, ``[N, K]`` int8) as exact ``[M, N]`` int32, simdgroup_matrix."""
    return _gemm(False, a, b, flip=False, mode=0, gs=32, out_dtype=mx.int32)


def _bias32(bias):
    return None if bias is None else bias.astype(mx.float32)


def _linear_per_channel(nax: bool, x, weight, bias):
    q, sa, _ = quantize(x)
    return _gemm(nax, q, weight.codes(), flip=True, mode=1, gs=weight.group_size,
                 out_dtype=x.dtype, sa=sa, sw=weight.channel_scales, bias=_bias32(bias))


def nax_w8a8_linear(x: mx.array, weight, bias: mx.array | None) -> mx.array:
    """Per-channel W8A8 linear on NAX: ``x`` ``[M, K]`` float -> ``[M, N]`` in x.dtype."""
    return _linear_per_channel(True, x, weight, bias)


def simd_w8a8_linear(x: mx.array, weight, bias: mx.array | None) -> mx.array:
    """Per-channel W8A8 linear with simdgroup_matrix: ``[M, K]`` -> ``[M, N]`` in x.dtype."""
    return _linear_per_channel(False, x, weight, bias)


def grouped_w8a8_linear(x: mx.array, weight, bias: mx.array | None) -> mx.array:
    """Grouped (general affine 8-bit) W8A8 linear; NAX kernel where NAX is present."""
    q, sa, rs = quantize(x, weight.group_size)
    return _gemm(nax_available(), q, weight.codes(), flip=True, mode=2, gs=weight.group_size,
                 out_dtype=x.dtype, sa=sa, ws=weight.scales.astype(mx.float32),
                 wo=weight.group_offsets, rs=rs, bias=_bias32(bias))


def int8_gemv(x: mx.array, weight, bias: mx.array | None) -> mx.array:
    """Decode W8A8 linear for ``M <= 16`` rows, per-channel or grouped weights."""
    m = x.shape[0]
    if not 1 <= m <= GEMV_MAX_M:
        raise ValueError(f"[mlx_w8a8.linear] metal_int8_gemv takes M in 1..{GEMV_MAX_M} rows, got M = {m}")
    n = weight.n
    grouped = not weight.per_channel
    q, sa, rs = quantize(x, weight.group_size if grouped else None)
    f32 = _dummy(mx.float32)
    kdtype, bf16 = _out_type(x.dtype)
    per_group = GEMV_THREADS // 32
    (out,) = _executor(
        _kernel("gemv.metal", "gemv", ("xq", "sa", "w", "sw", "ws", "wo", "rs", "bias"), ("out",)),
        inputs=[q, sa, weight.codes(),
                f32 if grouped else weight.channel_scales,
                weight.scales.astype(mx.float32) if grouped else f32,
                weight.group_offsets if grouped else f32,
                rs if grouped else _dummy(mx.int32),
                f32 if bias is None else _bias32(bias)],
        template=[("MODE", 2 if grouped else 1), ("GS", weight.group_size), ("MAXM", GEMV_MAX_M),
                  ("NT", GEMV_THREADS), ("TO", kdtype), ("OUT_BF16", bf16),
                  ("HAS_BIAS", bias is not None)],
        grid=(-(-n // per_group) * GEMV_THREADS, 1, 1),
        threadgroup=(GEMV_THREADS, 1, 1),
        output_shapes=[(m, n)],
        output_dtypes=[kdtype],
    )
    return out.view(mx.bfloat16) if bf16 else out


# ---------------------------------------------------------------------------------------
# What each candidate takes.
# ---------------------------------------------------------------------------------------
def _sizes_ok(p: registry.Problem) -> bool:
    return p.m >= 1 and p.k >= 1 and p.k <= MAX_K and (p.op == "quantize_activation" or p.n >= 1)


def _supports_quantize(p: registry.Problem) -> bool:
    return (_sizes_ok(p) and p.dtype in FLOAT_DTYPES
            and (p.group_size is None or (p.group_size in (32, 64, 128) and p.k % p.group_size == 0)))


def _supports_int8(p: registry.Problem) -> bool:
    return _sizes_ok(p) and p.weight_format == "int8" and p.dtype == "int8"


def _supports_per_channel(p: registry.Problem) -> bool:
    return _sizes_ok(p) and p.weight_format == "per_channel" and p.dtype in FLOAT_DTYPES


def _supports_grouped(p: registry.Problem) -> bool:
    return (_sizes_ok(p) and p.weight_format == "grouped" and p.dtype in FLOAT_DTYPES
            and p.group_size in (32, 64, 128) and p.k % p.group_size == 0)


def _supports_gemv(p: registry.Problem) -> bool:
    return (p.m <= GEMV_MAX_M and p.weight_format in ("per_channel", "grouped")
            and (_supports_per_channel(p) or _supports_grouped(p)))


def pick(problem: registry.Problem) -> registry.Candidate | None:
    """The Metal candidate capability alone would use for ``problem`` (before tuning).

    NAX kernels where NAX is present, the simdgroup-matrix kernels on other Apple GPUs,
    the GEMV for decode-sized M; None where no Metal candidate runs ``problem`` here.
    The tuner measures instead of trusting this; it is what a table-less default and
    the tests of the capability override use.
    """
    order = {
        "quantize_activation": ["metal_quantize"],
        "int8_matmul": ["metal_nax_int8_gemm", "metal_simd_int8_gemm"],
        "linear": ["metal_int8_gemv", "metal_nax_w8a8_gemm", "metal_simd_w8a8_gemm",
                   "metal_w8a8_gemm_grouped"],
    }[problem.op]
    for name in order:
        candidate = registry.get(problem.op, name)
        if candidate.handles(problem):
            return candidate
    return None


_NAX = ("nax_gemm.metal",)
_SIMD = ("simd_gemm.metal",)
_Q = ("quantize.metal",)
for _name, _op, _run, _supports, _files, _avail in (
    ("metal_quantize", "quantize_activation", quantize, _supports_quantize, _Q, metal_available),
    ("metal_nax_int8_gemm", "int8_matmul", nax_int8_matmul, _supports_int8, _NAX, nax_available),
    ("metal_simd_int8_gemm", "int8_matmul", simd_int8_matmul, _supports_int8, _SIMD, metal_available),
    ("metal_nax_w8a8_gemm", "linear", nax_w8a8_linear, _supports_per_channel, _Q + _NAX, nax_available),
    ("metal_simd_w8a8_gemm", "linear", simd_w8a8_linear, _supports_per_channel, _Q + _SIMD, metal_available),
    ("metal_w8a8_gemm_grouped", "linear", grouped_w8a8_linear, _supports_grouped, _Q + _NAX + _SIMD,
     metal_available),
    ("metal_int8_gemv", "linear", int8_gemv, _supports_gemv, _Q + ("gemv.metal",), metal_available),
):
    registry.register(registry.Candidate(
        name=_name, backend="metal", op=_op, run=_run, supports=_supports,
        digest=_digest(*_files), available=_avail,
    ))
