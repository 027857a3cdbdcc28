"""CUDA candidates: kernels in ``shaders/cuda/*.cu`` run through ``mx.fast.cuda_kernel``.

Registered candidates (offered only when ``mx.cuda.is_available()`` and the default
device is the GPU; importing this module never needs CUDA):

- ``cuda_quantize`` (``quantize_activation``): per-token int8 codes, float32 scales and
  optional per-group row sums, one block per row.
- ``cuda_int8_gemm`` (``int8_matmul``): int8 tensor-core GEMM, int32 out: ``wgmma``
  (Hopper, 128 x 256 tile) where the output has enough tiles, ``mma.sync`` otherwise.
- ``cuda_w8a8_gemm`` (``linear``, per-channel weights): quantize (codes, scales and the
  row sums R_m) + GEMM multiplying the stored unsigned weight codes directly
  (``s8 x u8`` tensor-core instructions) with ``- 128 R_m`` and the dequant (+ bias)
  fused in the epilogue; for K > ``U8_MAX_K`` the codes are flipped to int8 instead.
- ``cuda_w8a8_gemm_grouped`` (``linear``, grouped affine weights): quantize with row sums
  + GEMM folding each group's int32 partial sums into float32.
- ``cuda_int8_gemv`` (``linear``, M <= 16, either format): a memory-bound dp4a kernel
  over the stored codes; one launch (each block quantizes x into shared memory) when
  ``M x K`` fits, else quantize + GEMV.

Measured on an NVIDIA H200 (``docs/cuda.md``): the GEMV pays at M = 1 on large weights
and loses at M = 16, the grouped GEMM is ~1.1x ``mx.quantized_matmul``; the tuner, not
this module, decides where each candidate runs.

Kernel source files hold a header and one or more named bodies (see :func:`split`); MLX
wraps each body into a ``__global__`` function (``mlx/backend/cuda/custom_kernel.cpp``).
Sizes reach the kernels through MLX's ``<input>_shape`` arguments, so no scalar arrays
are created per call.
"""

from __future__ import annotations

import functools
import os
import re
from typing import NamedTuple

import mlx.core as mx

from . import registry, sources

# Weight codes are read as 16-byte vectors: K must be a multiple of 16 for the GEMMs
# (the int8 operands) and of 8 for the quantize kernel (8 floats per vector step).
GEMM_K_MULTIPLE = 16
QUANT_K_MULTIPLE = 8
# |a|, |b| <= 128: K * 2^14 < 2^31 keeps the int32 accumulator exact.
MAX_K = 1 << 17
# The per-channel GEMM multiplies int8 activations (|a| <= 127) by the UNSIGNED weight codes
# (q <= 255) and subtracts 128 * sum_k a_k afterwards: the unsigned int32 sum is exact only
# while K * 127 * 255 < 2^31, i.e. K <= 66311. Above that the codes are flipped to int8.
U8_MAX_K = (2**31 - 1) // (127 * 255)
assert U8_MAX_K == 66311
GEMV_MAX_M = 16
FLOAT_DTYPES = ("float16", "bfloat16", "float32")

_BODY = re.compile(r"^// @@ body (\w+)\s*$", re.MULTILINE)
_REQUIRES = re.compile(r"^// @@ requires (\S+)\s*$", re.MULTILINE)


def split(text: str) -> tuple[str, dict[str, str]]:
    """Split a ``.cu`` file into its header and named kernel bodies.

    The header is everything before the first ``// @@ body NAME`` line; each such line
    starts the body ``NAME``, which runs to the next marker or the end of the file.

    Returns:
        ``(header, {name: body})``.
    """
    marks = list(_BODY.finditer(text))
    if not marks:
        raise ValueError("[mlx_w8a8.cuda] kernel file has no '// @@ body NAME' section")
    header = text[: marks[0].start()]
    bodies = {}
    for i, mark in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        bodies[mark.group(1)] = text[mark.end() : end].strip() + "\n"
    return header, bodies


def strip_comments(code: str) -> str:
    """Drop ``//`` comments and blank lines (the kernels have no string literals).

    MLX hashes the full kernel source on every launch to find the compiled module, so
    shorter text is cheaper per launch; the files keep their comments.
    """
    out = []
    for line in code.splitlines():
        if '"' not in line:
            line = line.split("//", 1)[0]
        line = line.rstrip()
        if line.strip():
            out.append(line)
    return "\n".join(out) + "\n"


@functools.lru_cache(maxsize=None)
def load(file: str) -> tuple[str, dict[str, str]]:
    """Header and bodies of ``shaders/cuda/<file>`` as passed to ``mx.fast.cuda_kernel``.

    A ``// @@ requires OTHER.cu`` line in the header puts OTHER's header first; comments
    are stripped (:func:`strip_comments`).
    """
    header, bodies = split(sources.read("cuda", file))
    for other in _REQUIRES.findall(header):
        header = load(other)[0] + header
    return strip_comments(header), {k: strip_comments(v) for k, v in bodies.items()}


def cuda_available() -> bool:
    """True when MLX has a CUDA device and uses the GPU by default."""
    try:
        return bool(mx.cuda.is_available()) and mx.default_device().type == mx.gpu
    except Exception:  # a CPU-only build without mx.cuda, or a broken probe
        return False


class GemmConfig(NamedTuple):
    """Tile shape of the tensor-core GEMM.

    ``bm x bn`` block tile, ``wtm x wtn`` warp tile, ``stages`` cp.async ring depth;
    ``wgmma``: the Hopper warpgroup kernel (``gemm_wgmma.cu``, fixed 128 x 256 tile,
    two warpgroups) instead of ``mma.sync`` (``gemm.cu``).
    """

    bm: int
    bn: int
    wtm: int
    wtn: int
    stages: int
    wgmma: bool = False

    @property
    def file(self) -> str:
        return "gemm_wgmma.cu" if self.wgmma else "gemm.cu"

    @property
    def threads(self) -> int:
        if self.wgmma:
            return 256
        return (self.bm // self.wtm) * (self.bn // self.wtn) * 32

    @property
    def shared_memory(self) -> int:
        # wgmma: + 1024 bytes so the tile base can be rounded up to a 1024-byte boundary.
        return self.stages * (self.bm + self.bn) * 128 + (1024 if self.wgmma else 0)

    def template(self) -> list[tuple[str, int]]:
        if self.wgmma:  # fixed tile: only the ring depth is a parameter
            return [("STAGES", self.stages)]
        return [("BM", self.bm), ("BN", self.bn), ("WTM", self.wtm), ("WTN", self.wtn),
                ("STAGES", self.stages)]


# Configurations the launchers pick from (tile_for / grouped_tile_for); the compile test
# builds each of them. 132 SMs on an H200.
GEMM_CONFIGS = {
    "wgmma": GemmConfig(128, 256, 64, 256, 4, True),
    "large": GemmConfig(128, 256, 64, 64, 3),
    "medium": GemmConfig(128, 128, 64, 64, 4),
    "small": GemmConfig(64, 128, 32, 64, 4),
    "grouped": GemmConfig(128, 128, 64, 32, 4),
    "grouped_small": GemmConfig(64, 128, 32, 32, 4),
}
_SMS = 132
# Use the wgmma kernel on compute capability 9.x (sm_90a) for the large tile; the
# environment variable MLX_W8A8_CUDA_WGMMA=0 turns it off (mma.sync everywhere).
PREFER_WGMMA = os.environ.get("MLX_W8A8_CUDA_WGMMA", "1") != "0"
_ALL_GEMM_CONFIGS = dict(GEMM_CONFIGS)  # the compile test builds every shipped kernel
if not PREFER_WGMMA:
    del GEMM_CONFIGS["wgmma"]


@functools.lru_cache(maxsize=None)
def is_sm90() -> bool:
    """Whether the default GPU is compute capability 9.x (wgmma needs sm_90a)."""
    try:
        return int(mx.device_info().get("compute_capability_major", 0)) == 9
    except Exception:
        return False


def _tiles(m: int, n: int, cfg: GemmConfig) -> int:
    return -(-m // cfg.bm) * -(-n // cfg.bn)


def tile_for(m: int, n: int) -> GemmConfig:
    """The per-channel / int32 GEMM tile for an ``M x N`` output: the 128 x 256 tile once
    it gives at least ~48 blocks (on an H200, mma.sync 128 x 256 beat 128 x 128 even at
    M = 512, N = 4096: 29.5 vs 33.8 us; the wgmma kernel, 22.2 us there, is used on
    Hopper), else smaller mma.sync tiles so more SMs get work."""
    large = GEMM_CONFIGS["large"]
    if _tiles(m, n, large) >= 48:
        return GEMM_CONFIGS["wgmma"] if PREFER_WGMMA and is_sm90() else large
    if m > 64:
        return GEMM_CONFIGS["medium"]
    return GEMM_CONFIGS["small"]


def grouped_tile_for(m: int, n: int) -> GemmConfig:
    """The grouped GEMM tile (float accumulators too, so smaller warp tiles)."""
    return GEMM_CONFIGS["grouped"] if m > 64 else GEMM_CONFIGS["grouped_small"]


# Tests set this to fill every output with a value no kernel writes (``init_value`` of
# mx.fast.cuda_kernel) before each launch, so an element a kernel skips shows up.
POISON: float | None = None

QUANT_MAX_THREADS = 1024
GEMV_THREADS = 256
# Fused GEMV: x's codes live in shared memory (MM * K bytes); a persistent grid.
GEMV_FUSED_MAX_SMEM = 96 * 1024
GEMV_FUSED_BLOCKS = 132  # one block per SM: the grouped kernels need > 128 registers


def gemv_rows_per_warp(m_bucket: int) -> int:
    """Weight rows per warp: more rows share each activation load, but the accumulators
    (RW x MM) must stay in registers (RW = 4 at MM = 16 spills, per ptxas)."""
    return 4 if m_bucket <= 2 else 2


def gemv_bucket(m: int) -> int:
    """Rows of x a GEMV kernel is compiled for: the next of 1, 2, 4, 8, 16."""
    for b in (1, 2, 4, 8, 16):
        if m <= b:
            return b
    raise ValueError(f"[mlx_w8a8.cuda_int8_gemv] M must be in [1, {GEMV_MAX_M}], got {m}")


# Kernel objects -------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _kernel(file: str, body: str, inputs: tuple[str, ...], outputs: tuple[str, ...],
            shared_memory: int = 0):
    """The ``mx.fast.cuda_kernel`` for body ``body`` of ``shaders/cuda/<file>``, built once."""
    header, bodies = load(file)
    stem = file.removesuffix(".cu")
    return mx.fast.cuda_kernel(
        name=f"w8a8_{stem}_{body}",
        input_names=list(inputs),
        output_names=list(outputs),
        source=bodies[body],
        header=header,
        ensure_row_contiguous=True,
        shared_memory=shared_memory,
    )


def _as_f32(a: mx.array) -> mx.array:
    return a if a.dtype == mx.float32 else a.astype(mx.float32)


# Launchers ------------------------------------------------------------------------------
def quantize(x: mx.array, group_size: int | None = None, row_sum: bool = False):
    """Per-token int8 quantization on the GPU.

    Args:
        x: ``[M, K]`` float16/bfloat16/float32, ``K % 8 == 0``.
        group_size: ``None`` or 32/64/128 dividing K (adds per-group row sums).
        row_sum: with ``group_size=None``, also return each row's code sum ``[M, 1]``
            int32 (the per-channel GEMM's correction term).

    Returns:
        ``(q, scale, row_sums)``: ``[M, K]`` int8, ``[M, 1]`` float32 and
        ``[M, K // group_size]`` int32, ``[M, 1]`` int32 (``row_sum``) or ``None``.
    """
    m, k = x.shape
    if k % QUANT_K_MULTIPLE:
        raise ValueError(f"[mlx_w8a8.cuda_quantize] K must be a multiple of {QUANT_K_MULTIPLE}, got {k}")
    # Whole warps (row-sum shuffles), enough that each thread keeps its <= 4 chunks of 8
    # in registers between the two passes (quantize.cu kCached) where K allows.
    threads = min(QUANT_MAX_THREADS, max(32, -(-(k // 8) // (4 * 32)) * 32))
    if group_size is None and row_sum:
        kern = _kernel("quantize.cu", "rowsum", ("x",), ("q", "scale", "rsum"))
        q, scale, rsum = kern(
            inputs=[x], template=[("T", x.dtype)],
            output_shapes=[(m, k), (m, 1), (m, 1)],
            output_dtypes=[mx.int8, mx.float32, mx.int32],
            grid=(m * threads, 1, 1), threadgroup=(threads, 1, 1), init_value=POISON,
        )
        return q, scale, rsum
    if group_size is None:
        kern = _kernel("quantize.cu", "plain", ("x",), ("q", "scale"))
        q, scale = kern(
            inputs=[x], template=[("T", x.dtype)],
            output_shapes=[(m, k), (m, 1)], output_dtypes=[mx.int8, mx.float32],
            grid=(m * threads, 1, 1), threadgroup=(threads, 1, 1), init_value=POISON,
        )
        return q, scale, None
    kern = _kernel("quantize.cu", "sums", ("x",), ("q", "scale", "row_sums"))
    q, scale, sums = kern(
        inputs=[x], template=[("T", x.dtype), ("GS", group_size)],
        output_shapes=[(m, k), (m, 1), (m, k // group_size)],
        output_dtypes=[mx.int8, mx.float32, mx.int32],
        grid=(m * threads, 1, 1), threadgroup=(threads, 1, 1), init_value=POISON,
    )
    return q, scale, sums


def int8_gemm(a: mx.array, b: mx.array, config: GemmConfig | None = None) -> mx.array:
    """``a @ b.T`` for int8 ``a`` ``[M, K]`` and ``b`` ``[N, K]`` as exact int32 ``[M, N]``."""
    m, k = a.shape
    n = b.shape[0]
    cfg = config or tile_for(m, n)
    kern = _kernel(cfg.file, "int32", ("a", "b"), ("c",), cfg.shared_memory)
    return kern(
        inputs=[a, b], template=cfg.template(),
        output_shapes=[(m, n)], output_dtypes=[mx.int32],
        grid=(_tiles(m, n, cfg) * cfg.threads, 1, 1), threadgroup=(cfg.threads, 1, 1),
        init_value=POISON,
    )[0]


def gemm_per_channel(xq, xs, weight, bias, out_dtype, config: GemmConfig | None = None,
                     row_sums: mx.array | None = None):
    """Per-channel W8A8 GEMM on quantized activations (``xq`` int8, ``xs`` f32 [M, 1]).

    With ``row_sums`` (``[M, 1]`` int32, ``quantize(x, row_sum=True)``) the weight codes
    are multiplied unsigned and corrected by ``- 128 * row_sums`` (needs
    ``K <= U8_MAX_K``); without, they are flipped to int8 inside the GEMM.
    """
    m, k = xq.shape
    n = weight.n
    cfg = config or tile_for(m, n)
    if row_sums is not None:
        if k > U8_MAX_K:
            raise ValueError(f"[mlx_w8a8.cuda_w8a8_gemm] unsigned-code GEMM needs K <= "
                             f"{U8_MAX_K} (exact int32 sums), got {k}")
        inputs = [xq, xs, row_sums, weight.q, weight.channel_scales]
        names = ("xq", "xs", "xr", "w", "ws")
        body = "channel_u8"
    else:
        inputs = [xq, xs, weight.q, weight.channel_scales]
        names = ("xq", "xs", "w", "ws")
        body = "channel"
    if bias is not None:
        inputs.append(_as_f32(bias))
        names += ("bias",)
        body += "_bias"
    kern = _kernel(cfg.file, body, names, ("y",), cfg.shared_memory)
    return kern(
        inputs=inputs, template=[("T", out_dtype)] + cfg.template(),
        output_shapes=[(m, n)], output_dtypes=[out_dtype],
        grid=(_tiles(m, n, cfg) * cfg.threads, 1, 1), threadgroup=(cfg.threads, 1, 1),
        init_value=POISON,
    )[0]


def gemm_grouped(xq, xs, xr, weight, bias, out_dtype, config: GemmConfig | None = None):
    """Grouped W8A8 GEMM (``xr`` the ``[M, K // group_size]`` int32 row sums)."""
    m, k = xq.shape
    n = weight.n
    cfg = config or grouped_tile_for(m, n)
    if cfg.wgmma:
        raise ValueError("[mlx_w8a8.cuda_w8a8_gemm_grouped] the grouped GEMM has no wgmma tile")
    inputs = [xq, xs, xr, weight.q, weight.scales, weight.group_offsets]
    names = ("xq", "xs", "xr", "w", "ws", "wo")
    body = "grouped"
    if bias is not None:
        inputs.append(_as_f32(bias))
        names += ("bias",)
        body = "grouped_bias"
    kern = _kernel("gemm.cu", body, names, ("y",), cfg.shared_memory)
    template = [("T", out_dtype), ("ST", weight.scales.dtype), ("GS", weight.group_size)]
    return kern(
        inputs=inputs, template=template + cfg.template(),
        output_shapes=[(m, n)], output_dtypes=[out_dtype],
        grid=(_tiles(m, n, cfg) * cfg.threads, 1, 1), threadgroup=(cfg.threads, 1, 1),
        init_value=POISON,
    )[0]


def gemv_fuses(m: int, k: int) -> bool:
    """Whether the one-launch GEMV (x quantized into shared memory) takes ``M x K``."""
    return gemv_bucket(m) * k <= GEMV_FUSED_MAX_SMEM


def gemv(x, weight, bias, fused: bool | None = None):
    """Small-M W8A8 (``M <= 16``) for either weight format; ``y`` in ``x.dtype``.

    Args:
        x: ``[M, K]`` float activation.
        weight: a ``QuantizedWeight`` ``[N, K]``.
        bias: ``[N]`` or ``None``.
        fused: one launch (quantize x in each block's shared memory) or two (the
            quantize kernel first); ``None`` fuses when ``gemv_fuses(M, K)``.
    """
    m, k = x.shape
    n = weight.n
    mm = gemv_bucket(m)
    rw = gemv_rows_per_warp(mm)
    if fused is None:
        fused = gemv_fuses(m, k)
    grouped = not weight.per_channel
    if grouped:
        w_inputs = [weight.q, weight.scales, weight.group_offsets]
        w_names = ("w", "ws", "wo")
        template = [("T", x.dtype), ("ST", weight.scales.dtype), ("GS", weight.group_size)]
        body = "grouped"
    else:
        w_inputs = [weight.q, weight.channel_scales]
        w_names = ("w", "ws")
        template = [("T", x.dtype)]
        body = "channel"
    if bias is not None:
        w_inputs.append(_as_f32(bias))
        w_names += ("bias",)
        body += "_bias"
    warps = -(-n // rw)
    template += [("MM", mm), ("RW", rw)]
    if fused:
        smem = mm * k
        # The shared-memory size is part of the template so each size is its own kernel
        # (MLX raises the function's dynamic shared-memory limit once, at first load).
        kern = _kernel("gemv.cu", "fused_" + body, ("x",) + w_names, ("y",), smem)
        blocks = min(-(-warps * 32 // GEMV_THREADS), GEMV_FUSED_BLOCKS)
        return kern(
            inputs=[x] + w_inputs, template=template + [("SMEM_BYTES", smem)],
            output_shapes=[(m, n)], output_dtypes=[x.dtype],
            grid=(blocks * GEMV_THREADS, 1, 1), threadgroup=(GEMV_THREADS, 1, 1),
            init_value=POISON,
        )[0]
    xq, xs, _ = quantize(x)
    kern = _kernel("gemv.cu", body, ("xq", "xs") + w_names, ("y",))
    return kern(
        inputs=[xq, xs] + w_inputs, template=template,
        output_shapes=[(m, n)], output_dtypes=[x.dtype],
        grid=(warps * 32, 1, 1), threadgroup=(GEMV_THREADS, 1, 1), init_value=POISON,
    )[0]


# Candidate run functions (signatures: registry.py) -----------------------------------
def _quantize_run(x, group_size):
    return quantize(x, group_size)


def _w8a8_gemm_run(x, weight, bias):
    if x.shape[1] <= U8_MAX_K:  # unsigned codes, exact int32 (see U8_MAX_K)
        xq, xs, xr = quantize(x, row_sum=True)
        return gemm_per_channel(xq, xs, weight, bias, x.dtype, row_sums=xr)
    xq, xs, _ = quantize(x)
    return gemm_per_channel(xq, xs, weight, bias, x.dtype)


def _w8a8_grouped_run(x, weight, bias):
    xq, xs, xr = quantize(x, weight.group_size)
    return gemm_grouped(xq, xs, xr, weight, bias, x.dtype)


def _gemv_run(x, weight, bias):
    return gemv(x, weight, bias)


# Capability checks (cheap; no device memory touched) ------------------------------------
def _float_k_ok(p: registry.Problem) -> bool:
    return p.dtype in FLOAT_DTYPES and p.m >= 1 and p.k % GEMM_K_MULTIPLE == 0 and 0 < p.k < MAX_K


def _supports_quantize(p: registry.Problem) -> bool:
    return p.dtype in FLOAT_DTYPES and p.m >= 1 and p.k > 0 and p.k % QUANT_K_MULTIPLE == 0


def _supports_int8(p: registry.Problem) -> bool:
    return (p.dtype == "int8" and p.m >= 1 and p.n >= 1 and p.k % GEMM_K_MULTIPLE == 0
            and 0 < p.k < MAX_K)


def _supports_gemm(p: registry.Problem) -> bool:
    return p.weight_format == "per_channel" and p.n >= 1 and _float_k_ok(p)


def _supports_grouped(p: registry.Problem) -> bool:
    return p.weight_format == "grouped" and p.n >= 1 and _float_k_ok(p)


def _supports_gemv(p: registry.Problem) -> bool:
    return (p.weight_format in ("per_channel", "grouped") and 1 <= p.m <= GEMV_MAX_M
            and p.n >= 1 and _float_k_ok(p))


def _digest(*files: str, params: str = "") -> str:
    return sources.digest(*(sources.read("cuda", f) for f in files), params)


_GEMM_PARAMS = repr(sorted(GEMM_CONFIGS.items()))
_CANDIDATES = (
    ("cuda_quantize", "quantize_activation", _quantize_run, _supports_quantize,
     _digest("quantize.cu", params=f"threads<={QUANT_MAX_THREADS}")),
    ("cuda_int8_gemm", "int8_matmul", int8_gemm, _supports_int8,
     _digest("gemm.cu", "gemm_wgmma.cu", params=_GEMM_PARAMS)),
    ("cuda_w8a8_gemm", "linear", _w8a8_gemm_run, _supports_gemm,
     _digest("quantize.cu", "gemm.cu", "gemm_wgmma.cu",
             params=f"{_GEMM_PARAMS},u8<={U8_MAX_K}")),
    ("cuda_w8a8_gemm_grouped", "linear", _w8a8_grouped_run, _supports_grouped,
     _digest("quantize.cu", "gemm.cu", params=_GEMM_PARAMS)),
    ("cuda_int8_gemv", "linear", _gemv_run, _supports_gemv,
     _digest("quantize.cu", "gemv.cu",
             params=f"threads={GEMV_THREADS},fused<={GEMV_FUSED_MAX_SMEM},{GEMV_FUSED_BLOCKS}")),
)

for _name, _op, _run, _supports, _dig in _CANDIDATES:
    registry.register(
        registry.Candidate(name=_name, backend="cuda", op=_op, run=_run, supports=_supports,
                           digest=_dig, available=cuda_available)
    )


# What the compile test builds: every body with the template arguments the launchers use.
class KernelBuild(NamedTuple):
    """One kernel as MLX would compile it: file, body, typed inputs/outputs, template."""

    file: str
    body: str
    inputs: tuple[tuple[str, str, int], ...]  # (name, dtype name, ndim)
    outputs: tuple[tuple[str, str], ...]  # (name, dtype name)
    template: tuple[tuple[str, object], ...]  # values: int, bool or a dtype name


def kernel_builds() -> list[KernelBuild]:
    """Every (body, template) combination the launchers above can produce, one per
    tile config / group size / row bucket, with representative dtypes."""
    out = []
    for t in FLOAT_DTYPES:
        out.append(KernelBuild("quantize.cu", "plain", (("x", t, 2),),
                               (("q", "int8"), ("scale", "float32")), (("T", t),)))
        out.append(KernelBuild("quantize.cu", "rowsum", (("x", t, 2),),
                               (("q", "int8"), ("scale", "float32"), ("rsum", "int32")),
                               (("T", t),)))
    for gs in (32, 64, 128):
        out.append(KernelBuild("quantize.cu", "sums", (("x", "bfloat16", 2),),
                               (("q", "int8"), ("scale", "float32"), ("row_sums", "int32")),
                               (("T", "bfloat16"), ("GS", gs))))
    for key in ("wgmma", "large", "medium", "small"):
        tpl = tuple(_ALL_GEMM_CONFIGS[key].template())
        file = _ALL_GEMM_CONFIGS[key].file
        out.append(KernelBuild(file, "int32", (("a", "int8", 2), ("b", "int8", 2)),
                               (("c", "int32"),), tpl))
        for t, body in (("bfloat16", "channel"), ("float16", "channel_bias"),
                        ("float32", "channel"), ("bfloat16", "channel_u8"),
                        ("float16", "channel_u8_bias"), ("float32", "channel_u8"),
                        ("bfloat16", "channel_u8_bias")):
            ins = (("xq", "int8", 2), ("xs", "float32", 2))
            if "_u8" in body:
                ins += (("xr", "int32", 2),)
            ins += (("w", "uint32", 2), ("ws", "float32", 1))
            if body.endswith("bias"):
                ins += (("bias", "float32", 1),)
            out.append(KernelBuild(file, body, ins, (("y", t),), (("T", t),) + tpl))
    for key in ("grouped", "grouped_small"):
        tpl = tuple(GEMM_CONFIGS[key].template())
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
        rw = gemv_rows_per_warp(mm)
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
