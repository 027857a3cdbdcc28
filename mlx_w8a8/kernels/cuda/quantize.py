"""The CUDA quantize kernel (``quantize.cu``): per-token int8 codes, float32 scales and,
per format, the row sums; its activation arrays, and the ``cuda_quantize`` definition.

Activation formats (``act_key``): ``("cuda_per_token", "rowsum")`` (one int8 array of
codes, scales and row sums ``R_m``: :func:`rowsum_shape`), ``("cuda_per_token",
"plain")`` (codes, scales), ``("cuda_per_token", "sums", group_size)`` (codes, scales and
per-group sums), ``("cuda_per_token", "sums_map", group_size)`` (the same, the sums
followed by room for a tensor map: :func:`grouped_sums_shape`) and ``("cuda_per_token",
"sums_map_u8", group_size)`` (the same with the codes as ``a + 128``, uint8).
"""

from __future__ import annotations

import functools

import mlx.core as mx

from .. import registry
from .kernel import CudaKernel, float_rows
from .launch import FRAME_CACHE, QUANT_K_MULTIPLE, LaunchSpec, as_f32, framed, leading_shape
from .tiles import GROUPED_TMA_GROUP_SIZES

ROWSUM = ("cuda_per_token", "rowsum")
PLAIN = ("cuda_per_token", "plain")


# The unsigned-code GEMMs' activations travel as one int8 array [R, K] (codes, float32
# scales, int32 row sums: shaders/cuda/shape.cuh), R = M + ceil(8 M / K); R is one of
# MLX's int32 dimensions.
ROWSUM_MAX_ROWS = 2**31 - 1

ROWSUM_MAP_AREA = 256  # shape.cuh kRowsumMapArea: 128 map bytes + up to 127 to align them

# At most 512 threads per quantize block: a block must fit the SM's 64 K registers, and
# the block-per-row bodies use 66-76 per thread (ptxas for sm_90a; 1024 threads would need
# at most 64, and a block that does not fit fails to launch with no error from MLX).
# tests/test_cuda_compile.py checks the product. Rows longer than the threads' register
# cache (K > 32768 for 16-bit T, 16384 for float32) re-read their remaining chunks.
QUANT_MAX_THREADS = 512


def quant_cached(dtype: mx.Dtype) -> int:
    """Chunks of 8 elements each quantize thread keeps in registers (quantize.cu
    ``kCached``: 32 registers, 8 chunks of 16-bit elements or 4 of float32)."""
    return 4 if dtype == mx.float32 else 8


QUANT_WARP_THREADS = 256  # rowsum_warp: 8 rows per block


# The per-channel GEMM's activation array ---------------------------------------------
# One launch output and one launch input instead of three: MLX's host cost per call
# grows with each array a launch names (docs/cuda.md "Host time per launch").
def rowsum_shape(m: int, k: int) -> tuple[int, int]:
    """The shape of the activation array of ``m`` rows of ``k`` codes: ``[R, k]`` int8,
    ``R = m + ceil((8 m + 256) / k)`` (the codes ``[m, k]``, then ``m`` float32 scales and
    ``m`` int32 row sums, then the map area, zeros where the TMA GEMM writes its map of
    the codes: ``shaders/cuda/shape.cuh``)."""
    return (m + -(-(8 * m + ROWSUM_MAP_AREA) // k), k)


def rowsum_rows_m(r: int, k: int) -> int:
    """The ``m`` of an activation array of ``r`` rows of ``k`` bytes (the inverse of
    :func:`rowsum_shape`, exact for every ``m``: ``r k = m (k + 8) + 256 + e``,
    ``0 <= e < k``; the kernels' ``rowsum_m``)."""
    return (r * k - ROWSUM_MAP_AREA) // (k + 8)


def _check_rowsum_rows(m: int, k: int) -> None:
    r = rowsum_shape(m, k)[0]
    if r > ROWSUM_MAX_ROWS:
        raise ValueError(f"[mlx_w8a8.cuda_quantize] {m} rows of K = {k} need an activation "
                         f"array of {r} rows, over MLX's {ROWSUM_MAX_ROWS}; split the batch")


def pack_rowsum(q: mx.array, scale: mx.array, row_sums: mx.array) -> mx.array:
    """The activation array of codes ``q`` (``[..., K]`` int8), scales ``scale``
    (``[..., 1]``, stored as float32) and row sums ``row_sums`` (``[..., 1]`` int32):
    what the ``rowsum`` quantize writes for the same values (:func:`quantize_rowsum`).
    For callers holding the three arrays (tests, :func:`gemm_per_channel`); the layers
    pass the quantize's array on as it is."""
    k = q.shape[-1]
    m = q.size // k
    r = rowsum_shape(m, k)[0]
    parts = [q.reshape(-1), as_f32(scale).reshape(-1).view(mx.int8),
             row_sums.astype(mx.int32).reshape(-1).view(mx.int8)]
    parts.append(mx.zeros((r * k - m * (k + 8),), dtype=mx.int8))  # the map area
    return mx.concatenate(parts).reshape(r, k)


def unpack_rowsum(xa: mx.array, lead: tuple[int, ...] | None = None):
    """``(q, scale, row_sums)`` of an activation array (:func:`rowsum_shape`): ``[*lead, K]``
    int8, ``[*lead, 1]`` float32 and ``[*lead, 1]`` int32 (``lead``: ``(M,)`` by default)."""
    r, k = xa.shape
    m = rowsum_rows_m(r, k)
    lead = leading_shape(m, lead)
    flat = xa.reshape(-1)
    q = flat[: m * k].reshape(*lead, k)
    scale = flat[m * k: m * k + 4 * m].view(mx.float32).reshape(*lead, 1)
    sums = flat[m * k + 4 * m: m * k + 8 * m].view(mx.int32).reshape(*lead, 1)
    return q, scale, sums


def quantize_spec(m: int, k: int, dtype: mx.Dtype, group_size: int | None = None,
                  row_sum: bool = False, warp: bool = False,
                  lead: tuple[int, ...] | None = None, u8: bool = False) -> LaunchSpec:
    """The launch of :func:`quantize` for ``[M, K]`` ``dtype`` activations, or
    ``[*lead, K]`` ones (``prod(lead) == M``; outputs ``[*lead, ...]``). ``u8`` (with
    ``group_size``): the codes as ``a + 128``, uint8 (``quantize.cu`` ``sums_u8``)."""
    if u8 and group_size is None:
        raise ValueError("[mlx_w8a8.cuda_quantize] u8=True exists with a group_size only")
    return framed(_quantize_frame(m, k, dtype, group_size, row_sum, warp, leading_shape(m, lead),
                                  u8))


@functools.lru_cache(maxsize=FRAME_CACHE)
def _quantize_frame(m: int, k: int, dtype: mx.Dtype, group_size: int | None, row_sum: bool,
                    warp: bool, lead: tuple[int, ...], u8: bool = False) -> LaunchSpec:
    """:func:`quantize_spec` (no weight: the whole launch is shared)."""
    if k % QUANT_K_MULTIPLE:
        raise ValueError(f"[mlx_w8a8.cuda_quantize] K must be a multiple of {QUANT_K_MULTIPLE}, "
                         f"got {k}")
    if warp and (group_size is not None or not row_sum):
        raise ValueError("[mlx_w8a8.cuda_quantize] warp=True exists for row_sum=True, "
                         f"group_size=None only; got row_sum={row_sum}, group_size={group_size}")
    # Whole warps (row-sum shuffles), enough that each thread keeps its chunks of 8 in
    # registers between the two passes (quantize.cu kCached) where K allows.
    threads = min(QUANT_MAX_THREADS, max(32, -(-(k // 8) // (quant_cached(dtype) * 32)) * 32))
    template = [("T", dtype)]
    if row_sum and group_size is None:  # one output: the activation array (rowsum_shape)
        _check_rowsum_rows(m, k)
        shapes, dtypes = [rowsum_shape(m, k)], [mx.int8]
    if warp:
        rows = QUANT_WARP_THREADS // 32
        kern = ("quantize.cu", "rowsum_warp", ("x",), ("xa",))
        return LaunchSpec(kern, (), template, shapes, dtypes,
                          (-(-m // rows) * QUANT_WARP_THREADS, 1, 1), (QUANT_WARP_THREADS, 1, 1))
    if group_size is None and row_sum:
        kern = ("quantize.cu", "rowsum", ("x",), ("xa",))
    elif group_size is None:
        kern = ("quantize.cu", "plain", ("x",), ("q", "scale"))
        shapes, dtypes = [(*lead, k), (*lead, 1)], [mx.int8, mx.float32]
    else:
        kern = ("quantize.cu", "sums_u8" if u8 else "sums", ("x",), ("q", "scale", "row_sums"))
        template.append(("GS", group_size))
        shapes = [(*lead, k), (*lead, 1), (*lead, k // group_size)]
        dtypes = [mx.uint8 if u8 else mx.int8, mx.float32, mx.int32]
    return LaunchSpec(kern, (), template, shapes, dtypes, (m * threads, 1, 1), (threads, 1, 1))


# The group sums' array ends with room for A's tensor map (128 bytes + up to 127 to align).
GROUPED_SUMS_MAP_AREA = 256


def grouped_sums_shape(m: int, k: int, group_size: int) -> tuple[int]:
    """The group-wise TMA GEMM's row-sums array for ``m`` rows of ``k`` codes: ``[m * (k /
    group_size) + 64]`` int32, the per-group code sums ``R_mg`` (row-major ``[m, G]``)
    followed by 256 bytes where the GEMM writes its tensor map of the codes."""
    return (m * (k // group_size) + GROUPED_SUMS_MAP_AREA // 4,)


def _check_tma_group_size(k: int, group_size: int) -> None:
    """A group size the group-wise TMA GEMM takes, dividing K; else ``ValueError``."""
    if group_size not in GROUPED_TMA_GROUP_SIZES or k % group_size:
        raise ValueError(f"[mlx_w8a8.cuda_quantize] group_size must be one of "
                         f"{GROUPED_TMA_GROUP_SIZES} and divide K = {k}, got {group_size}")


def quantize_groups_spec(m: int, k: int, dtype: mx.Dtype, group_size: int,
                         lead: tuple[int, ...] | None = None, u8: bool = False) -> LaunchSpec:
    """The launch of :func:`quantize_groups`: the ``sums`` quantize of :func:`quantize`
    (the same kernel, the same bits) with its row sums in a :func:`grouped_sums_shape`
    array. ``u8``: its ``sums_u8`` body, the codes written as ``a + 128`` (uint8; the
    sums unchanged), for the subnormal promotion."""
    _check_tma_group_size(k, group_size)
    spec = quantize_spec(m, k, dtype, group_size, lead=lead, u8=u8)
    shapes = list(spec.output_shapes)
    shapes[2] = grouped_sums_shape(m, k, group_size)
    return spec._replace(output_shapes=shapes)


def quantize_groups(x: mx.array, group_size: int, u8: bool = False):
    """Per-token int8 quantization for the group-wise TMA GEMM.

    Args:
        x: ``[..., K]`` float16/bfloat16/float32, ``K`` a multiple of ``group_size``.
        group_size: 32, 64 or 128.
        u8: the codes as ``a + 128`` (uint8): the subnormal promotion's activations.

    Returns:
        ``(q, scale, xr)``: ``[..., K]`` int8 (uint8 with ``u8``), ``[..., 1]`` float32
        and the group sums ``[M * K / group_size + 64]`` int32 (:func:`grouped_sums_shape`;
        its first ``M * K / group_size`` values are :func:`quantize`'s row sums of the
        signed codes, row-major).
    """
    k = x.shape[-1]
    m = x.size // k
    return tuple(quantize_groups_spec(m, k, x.dtype, group_size, tuple(x.shape[:-1]),
                                      u8).launch(x))


def quantize_act_groups_spec(m: int, k: int, dtype: mx.Dtype, group_size: int,
                             lead: tuple[int, ...] | None = None) -> LaunchSpec:
    """The launch of :func:`quantize_act_groups`: ``quantize.cu``'s ``groups`` body (one
    scale per row and group: activation groups, ``docs/numerics.md``)."""
    _check_tma_group_size(k, group_size)
    return framed(_quantize_act_groups_frame(m, k, dtype, group_size, leading_shape(m, lead)))


@functools.lru_cache(maxsize=FRAME_CACHE)
def _quantize_act_groups_frame(m: int, k: int, dtype: mx.Dtype, group_size: int,
                               lead: tuple[int, ...]) -> LaunchSpec:
    """:func:`quantize_act_groups_spec` (no weight: the whole launch is shared). One block
    per row of whole warps, one chunk of 8 values per thread and step (quantize.cu
    quantize_row_groups: no values kept between passes, there is one pass)."""
    threads = min(QUANT_MAX_THREADS, max(32, -(-(k // 8) // 32) * 32))
    kern = ("quantize.cu", "groups", ("x",), ("q", "scale", "sums"))
    shapes = [(*lead, k), (*lead, k // group_size), grouped_sums_shape(m, k, group_size)]
    return LaunchSpec(kern, (), [("T", dtype), ("GS", group_size)], shapes,
                      [mx.int8, mx.float32, mx.int32], (m * threads, 1, 1), (threads, 1, 1))


def quantize_act_groups(x: mx.array, group_size: int):
    """Int8 quantization per token and group (activation groups) for the group-wise TMA
    GEMM.

    Args:
        x: ``[..., K]`` float16/bfloat16/float32, ``K`` a multiple of ``group_size``.
        group_size: 32, 64 or 128.

    Returns:
        ``(q, scale, xr)``: ``[..., K]`` int8 codes, ``[..., K / group_size]`` float32
        scales (one per row and group) and the group code sums in a
        :func:`grouped_sums_shape` array.
    """
    k = x.shape[-1]
    m = x.size // k
    return tuple(quantize_act_groups_spec(m, k, x.dtype, group_size, tuple(x.shape[:-1])).launch(x))


# Launchers: build the spec and launch it (every call) -----------------------------------
def quantize(x: mx.array, group_size: int | None = None, row_sum: bool = False,
             warp: bool = False):
    """Per-token int8 quantization on the GPU.

    Args:
        x: ``[M, K]`` float16/bfloat16/float32, ``K % 8 == 0``.
        group_size: ``None`` or 32/64/128 dividing K (adds per-group row sums).
        row_sum: with ``group_size=None``, also return each row's code sum ``[M, 1]``
            int32 (the per-channel GEMM's correction term): :func:`quantize_rowsum`'s
            array, unpacked (:func:`unpack_rowsum`).
        warp: with ``row_sum``, the one-warp-per-row kernel (``rowsum_warp``: 8 rows
            per block, no block barrier) instead of one block per row; same bits.

    Returns:
        ``(q, scale, row_sums)``: ``[M, K]`` int8, ``[M, 1]`` float32 and
        ``[M, K // group_size]`` int32, ``[M, 1]`` int32 (``row_sum``) or ``None``.
    """
    m, k = x.shape
    if row_sum and group_size is None:
        return unpack_rowsum(quantize_rowsum(x, warp))
    out = quantize_spec(m, k, x.dtype, group_size, row_sum, warp).launch(x)
    return (out[0], out[1], out[2] if len(out) == 3 else None)


def quantize_rowsum(x: mx.array, warp: bool = False) -> mx.array:
    """The per-channel GEMM's activations of ``x`` in one launch and one array.

    Args:
        x: ``[..., K]`` float16/bfloat16/float32, ``K % 8 == 0``.
        warp: the one-warp-per-row kernel (``rowsum_warp``); same bits.

    Returns:
        ``[R, K]`` int8 (:func:`rowsum_shape`, ``M`` the rows of ``x``): the codes, then
        the float32 scales and the int32 row sums (:func:`unpack_rowsum` splits it),
        then the map area, zero, for :func:`gemm_rowsum`.
    """
    k = x.shape[-1]
    return quantize_spec(x.size // k, k, x.dtype, None, True, warp).launch(x)[0]


# The definition ---------------------------------------------------------------------------
class Quantize(CudaKernel):
    """``cuda_quantize`` (``quantize_activation``): per-token int8 codes, float32 scales
    and optional per-group row sums, one block per row."""

    name = "cuda_quantize"
    op = "quantize_activation"

    def refusals(self, p: registry.Problem):
        yield float_rows(p)
        if not (p.k > 0 and p.k % QUANT_K_MULTIPLE == 0):
            yield f"K must be a positive multiple of {QUANT_K_MULTIPLE}, got {p.k}"

    def variant(self, p: registry.Problem):
        return p.dtype, p.group_size

    def run(self, x: mx.array, group_size: int | None):
        return quantize(x, group_size)
