"""Pure-MLX candidates: they run on every device MLX has (CPU included).

- ``exact``: the exact W8A8 math of ``docs/numerics.md`` in MLX ops. Integer dot
  products are float32 matmuls over K-chunks short enough that every partial sum is an
  integer of magnitude <= 2^24, hence exact; chunks are summed in int32.
- ``mlx_qmm``: ``mx.quantized_matmul`` on the stored affine weights (W8A16). The tuner's
  reference and the fallback when nothing has been measured.
- ``exact_w4a8`` and ``mlx_qmm4``: the same two for MLX's 4-bit weights (format
  ``"grouped4"``): the exact W4A8 math, and ``mx.quantized_matmul`` with ``bits=4``.
  ``exact`` and ``mlx_qmm`` take 8-bit weights only; the 4-bit code lives in functions
  of its own so that their digests (which the shipped tuning tables record) stay put.

The module is named for what it is to the other backends: the reference implementation
of ``docs/numerics.md``. The candidate is named ``exact`` so that a tuning table entry
(``"choice"`` vs ``"reference": "mlx_qmm"``) never reads as if the two were one.
"""

from __future__ import annotations

from typing import Hashable

import mlx.core as mx

from .. import backends
from ..weight import GROUPED4
from . import registry, sources

# |a * b| <= 128 * 128 = 2^14, so a chunk of 2^10 products sums to at most 2^24, and every
# integer up to 2^24 is exact in float32: each chunk's float32 matmul is exact whatever
# order the BLAS adds in. (TF32 inputs are exact too: |a|, |b| <= 128 need 8 bits.)
EXACT_CHUNK = 1024
# Bound on the float32 scratch of one grouped block ([groups, M, N]), in elements.
_GROUPED_SCRATCH = 1 << 24


def quantize_rows(x: mx.array, group_size: int | None = None):
    """Per-token symmetric int8 quantization of ``x`` (``[M, K]`` float).

    Returns:
        ``(q, scale, row_sums)``: ``[M, K]`` int8, ``[M, 1]`` float32 and, when
        ``group_size`` is given, ``[M, K // group_size]`` int32 (else ``None``).
    """
    xf = x.astype(mx.float32)
    amax = mx.max(mx.abs(xf), axis=-1, keepdims=True)
    finite = mx.isfinite(amax)  # NaN or Inf anywhere in the row -> not finite
    scale = mx.where(finite, amax / 127.0, float("nan"))
    usable = finite & (amax > 0)
    safe = mx.where(usable, scale, 1.0)
    q = mx.where(usable, mx.clip(mx.round(xf / safe), -127, 127), 0).astype(mx.int8)
    row_sums = None
    if group_size is not None:
        m, k = q.shape
        row_sums = q.astype(mx.int32).reshape(m, k // group_size, group_size).sum(-1)
    return q, scale, row_sums


def int8_matmul(a: mx.array, b: mx.array) -> mx.array:
    """``a @ b.T`` for int8 ``a`` ``[M, K]``, ``b`` ``[N, K]``, as exact int32 ``[M, N]``."""
    m, k = a.shape
    n = b.shape[0]
    acc = mx.zeros((m, n), dtype=mx.int32)
    for k0 in range(0, k, EXACT_CHUNK):
        ac = a[:, k0 : k0 + EXACT_CHUNK].astype(mx.float32)
        bc = b[:, k0 : k0 + EXACT_CHUNK].astype(mx.float32)
        acc = acc + mx.matmul(ac, bc.T).astype(mx.int32)
    return acc


def _grouped_sum(q: mx.array, weight) -> mx.array:
    """``sum_g s_ng * P_mng`` in float32, ``P`` the exact per-group int8 dot products."""
    m, k = q.shape
    n, gs = weight.n, weight.group_size
    groups = k // gs
    xq = q.astype(mx.float32).reshape(m, groups, gs).transpose(1, 0, 2)  # [G, M, gs]
    wq = weight.int8().astype(mx.float32).reshape(n, groups, gs).transpose(1, 2, 0)  # [G, gs, N]
    s = weight.scales.astype(mx.float32).T.reshape(groups, 1, n)  # [G, 1, N]
    block = max(1, _GROUPED_SCRATCH // max(1, m * n))
    acc = mx.zeros((m, n), dtype=mx.float32)
    for g0 in range(0, groups, block):
        p = mx.matmul(xq[g0 : g0 + block], wq[g0 : g0 + block])  # exact: gs * 2^14 < 2^24
        acc = acc + (p * s[g0 : g0 + block]).sum(axis=0)
    return acc


def _split11(a: mx.array) -> list[mx.array]:
    """``a`` (float32) as three float32 arrays of at most 11 significant bits each, of
    the sign of ``a``, summing to ``a`` exactly (truncation of the mantissa: each
    difference is exact)."""
    mask = mx.array(0xFFFFE000, dtype=mx.uint32)  # sign, exponent, top 10 mantissa bits
    hi = (a.view(mx.uint32) & mask).view(mx.float32)
    rest = a - hi
    mid = (rest.view(mx.uint32) & mask).view(mx.float32)
    return [hi, mid, rest - mid]


def _offset_sum(row_sums: mx.array, offsets: mx.array) -> mx.array:
    """``sum_g R_mg * b'_ng`` (``[M, N]`` float32) with every product exact even where
    MLX runs float32 matmuls in TF32 (``MLX_ENABLE_TF32``, inputs rounded to 11
    significant bits): ``|R| <= 127 * 128`` is split as ``128 R_hi + R_lo`` (both of at
    most 7 bits, the sign of ``R``) and ``b'`` by :func:`_split11`, so each of the six
    matmuls multiplies exactly and only its float32 sums round (``docs/numerics.md``)."""
    r = row_sums.astype(mx.int32)
    r_hi = mx.where(r < 0, -((-r) // 128), r // 128)  # toward zero: |R| = 128|R_hi| + |R_lo|
    r_lo = (r - 128 * r_hi).astype(mx.float32)
    r_hi = r_hi.astype(mx.float32)
    acc_hi = acc_lo = None
    for part in _split11(offsets.astype(mx.float32)):
        hi, lo = mx.matmul(r_hi, part.T), mx.matmul(r_lo, part.T)
        acc_hi = hi if acc_hi is None else acc_hi + hi
        acc_lo = lo if acc_lo is None else acc_lo + lo
    return acc_hi * 128.0 + acc_lo


def w8a8_apply(acts, weight, bias: mx.array | None, out_dtype: mx.Dtype) -> mx.array:
    """The exact W8A8 product on activations quantized by :func:`quantize_rows` (with
    the weight's group size for grouped weights)."""
    q, scale, row_sums = acts
    if weight.per_channel:
        acc = int8_matmul(q, weight.int8()).astype(mx.float32)
        y = acc * scale * weight.channel_scales
    else:
        partial = _grouped_sum(q, weight)
        partial = partial + _offset_sum(row_sums, weight.group_offsets)
        y = partial * scale
    if bias is not None:
        y = y + bias.astype(mx.float32)
    return y.astype(out_dtype)


def w8a8_linear(x: mx.array, weight, bias: mx.array | None) -> mx.array:
    """Exact W8A8 linear (per-channel or grouped, by ``weight.format``)."""
    acts = quantize_rows(x, None if weight.per_channel else weight.group_size)
    return w8a8_apply(acts, weight, bias, x.dtype)


def w8a8_stages(problem):
    """``(act_key, quantize, apply)`` of the exact kernel (``Candidate.stages``)."""
    group = None if problem.weight_format == "per_channel" else problem.group_size
    return ("exact", group), (lambda x: quantize_rows(x, group)), w8a8_apply


def qmm_linear(x: mx.array, weight, bias: mx.array | None) -> mx.array:
    """W8A16: ``mx.quantized_matmul`` on the stored weights, no activation quantization."""
    y = mx.quantized_matmul(
        x, weight.q, weight.scales, weight.biases, transpose=True,
        group_size=weight.group_size, bits=8,
    )
    if bias is not None:
        y = y + bias
    return y if y.dtype == x.dtype else y.astype(x.dtype)


def qmm_bind(layer, problem):
    """``x -> y`` for ``layer`` (an ``mlx_w8a8.Linear``) as ``nn.QuantizedLinear`` runs
    it: one ``mx.quantized_matmul`` on ``[..., K]``, no reshape, the arrays read from the
    layer at call time. Same math as :func:`qmm_linear`.

    Whether the result needs a cast back to ``x``'s dtype is decided here from the
    layer's dtypes; a layer re-binds when its parameters are replaced (``Linear``
    forgets its plans then), so a ``set_dtype`` is seen.
    """
    group = layer.group_size
    dtype = getattr(mx, problem.dtype)
    kept = {layer["scales"].dtype} | ({layer["bias"].dtype} if problem.has_bias else set())
    if kept == {dtype}:  # quantized_matmul and the bias add keep x's dtype
        if problem.has_bias:
            return lambda x: mx.quantized_matmul(
                x, layer["weight"], layer["scales"], layer["biases"], True, group, 8
            ) + layer["bias"]
        return lambda x: mx.quantized_matmul(
            x, layer["weight"], layer["scales"], layer["biases"], True, group, 8)

    def run(x):
        y = mx.quantized_matmul(x, layer["weight"], layer["scales"], layer["biases"],
                                True, group, 8)
        if problem.has_bias:
            y = y + layer["bias"]
        return y.astype(dtype)
    return run


_EXACT_RUNS = (
    ("linear", w8a8_linear),
    ("int8_matmul", int8_matmul),
    ("quantize_activation", quantize_rows),
)


def _digest(*entries, params: str = "") -> str:
    """A candidate's digest: the code of this module its functions reach (constants
    such as ``EXACT_CHUNK`` included), ``sources.closure_digest``."""
    return sources.closure_digest(entries, (__name__,), params=params)


def takes_8bit(problem) -> bool:
    """Whether ``problem`` is not on 4-bit codes (``exact``'s and ``mlx_qmm``'s code
    reads 8-bit codes; ``exact_w4a8`` and ``mlx_qmm4`` take the 4-bit format)."""
    return problem.weight_format != GROUPED4


for _op, _run in _EXACT_RUNS:
    _stages = w8a8_stages if _op == "linear" else None
    registry.register(
        registry.Candidate(
            name=registry.EXACT, backend="any", op=_op, run=_run,
            digest=_digest(_run, _stages),
            stages=_stages,
            supports=takes_8bit,
        )
    )


# The exact W4A8 linear ----------------------------------------------------------------
# |a q| <= 127 * 15, so one group's products sum to at most 127 * 15 * 128 = 243840 <
# 2^24 in magnitude: each group's float32 matmul is exact whatever order the BLAS adds
# in (and in TF32: |a| needs 8 bits, q 4).
assert 127 * 15 * 128 < 1 << 24


def _w4a8_code_sum(q: mx.array, weight) -> mx.array:
    """``sum_g s_ng * P_mng`` in float32 (``[M, N]``), ``P`` the exact per-group dot
    products of int8 activation codes ``q`` ``[M, K]`` with the weight's unsigned 4-bit
    codes, unpacked from the stored words for this call only."""
    m, k = q.shape
    n, gs = weight.n, weight.group_size
    groups = k // gs
    xq = q.astype(mx.float32).reshape(m, groups, gs).transpose(1, 0, 2)  # [G, M, gs]
    wq = weight.codes().astype(mx.float32).reshape(n, groups, gs).transpose(1, 2, 0)  # [G, gs, N]
    s = weight.scales.astype(mx.float32).T.reshape(groups, 1, n)  # [G, 1, N]
    block = max(1, _GROUPED_SCRATCH // max(1, m * n))
    acc = mx.zeros((m, n), dtype=mx.float32)
    for g0 in range(0, groups, block):
        p = mx.matmul(xq[g0 : g0 + block], wq[g0 : g0 + block])  # exact: |P| < 2^24
        acc = acc + (p * s[g0 : g0 + block]).sum(axis=0)
    return acc


def w4a8_apply(acts, weight, bias: mx.array | None, out_dtype: mx.Dtype) -> mx.array:
    """The exact W4A8 product on activations quantized by :func:`quantize_rows` with
    the weight's group size: ``y = t_m (sum_g s_ng P_mng + sum_g b_ng R_mg) (+ bias)``,
    ``R`` the groups' activation code sums (``docs/numerics.md``, W4A8 linear)."""
    q, scale, row_sums = acts
    partial = _w4a8_code_sum(q, weight) + _offset_sum(row_sums, weight.biases)
    y = partial * scale
    if bias is not None:
        y = y + bias.astype(mx.float32)
    return y.astype(out_dtype)


def w4a8_linear(x: mx.array, weight, bias: mx.array | None) -> mx.array:
    """Exact W4A8 linear: ``x`` ``[M, K]`` float, ``weight`` a 4-bit
    :class:`mlx_w8a8.weight.QuantizedWeight`, ``bias`` ``[N]`` or ``None``; ``[M, N]``
    in ``x.dtype``."""
    return w4a8_apply(quantize_rows(x, weight.group_size), weight, bias, x.dtype)


def w4a8_stages(problem):
    """``(act_key, quantize, apply)`` of the exact W4A8 kernel: the activations are
    those of the grouped exact kernel (same key)."""
    group = problem.group_size
    return ("exact", group), (lambda x: quantize_rows(x, group)), w4a8_apply


def takes_4bit(problem) -> bool:
    """Whether ``problem`` is on MLX's 4-bit codes (format ``"grouped4"``)."""
    return problem.weight_format == GROUPED4


registry.register(
    registry.Candidate(
        name=registry.EXACT_W4A8, backend="any", op="linear", run=w4a8_linear,
        digest=_digest(w4a8_linear, w4a8_stages),
        stages=w4a8_stages,
        supports=takes_4bit,
    )
)


# The exact math with activation groups (act_scales="group") -----------------------------
# Code of its own (``exact_act_groups``): nothing above changes, so ``exact``'s and
# ``exact_w4a8``'s digests stay those the shipped tables recorded.


def quantize_groups(x: mx.array, group_size: int):
    """Per-token, per-group symmetric int8 quantization of ``x`` (``[M, K]`` float):
    each group of ``group_size`` consecutive features of a row is quantized as
    :func:`quantize_rows` quantizes a row (``docs/numerics.md``, activation groups).

    Returns:
        ``(q, scales, row_sums)``: ``[M, K]`` int8, ``[M, K // group_size]`` float32
        and ``[M, K // group_size]`` int32 (each group's code sum).
    """
    m, k = x.shape
    groups = k // group_size
    # Each group is quantized as quantize_rows quantizes a row: the same code, per group.
    q, scale, row_sums = quantize_rows(x.reshape(m * groups, group_size), group_size)
    return q.reshape(m, k), scale.reshape(m, groups), row_sums.reshape(m, groups)


def act_groups_apply(acts, weight, bias: mx.array | None, out_dtype: mx.Dtype) -> mx.array:
    """The exact product on activations quantized by :func:`quantize_groups` with the
    weight's group size: ``y = sum_g t_mg (s_ng P_mng + o_ng R_mg) (+ bias)``, ``t`` the
    activation group scales, ``o = b'`` (8-bit codes, offset by 128) or ``b`` (4-bit
    codes), ``P`` each group's exact integer dot product (``docs/numerics.md``)."""
    q, scales, row_sums = acts
    m, k = q.shape
    n, gs = weight.n, weight.group_size
    groups = k // gs
    if weight.bits == 8:
        codes, offsets = weight.int8(), weight.group_offsets
    else:
        codes, offsets = weight.codes(), weight.biases
    xq = q.astype(mx.float32).reshape(m, groups, gs).transpose(1, 0, 2)  # [G, M, gs]
    wq = codes.astype(mx.float32).reshape(n, groups, gs).transpose(1, 2, 0)  # [G, gs, N]
    s = weight.scales.astype(mx.float32).T.reshape(groups, 1, n)  # [G, 1, N]
    o = offsets.astype(mx.float32).T.reshape(groups, 1, n)  # [G, 1, N]
    t = scales.T.reshape(groups, m, 1)  # [G, M, 1]
    r = row_sums.astype(mx.float32).T.reshape(groups, m, 1)  # exact: |R| <= 127 * 128
    block = max(1, _GROUPED_SCRATCH // max(1, m * n))
    acc = mx.zeros((m, n), dtype=mx.float32)
    for g0 in range(0, groups, block):
        b = slice(g0, g0 + block)
        p = mx.matmul(xq[b], wq[b])  # exact: |P| <= 127 * 128 * 128 < 2^24
        acc = acc + (t[b] * (p * s[b] + r[b] * o[b])).sum(axis=0)
    y = acc
    if bias is not None:
        y = y + bias.astype(mx.float32)
    return y.astype(out_dtype)


def act_groups_linear(x: mx.array, weight, bias: mx.array | None) -> mx.array:
    """Exact W8A8 (8-bit grouped) or W4A8 (4-bit) linear with activation groups."""
    return act_groups_apply(quantize_groups(x, weight.group_size), weight, bias, x.dtype)


def act_groups_stages(problem):
    """``(act_key, quantize, apply)`` of ``exact_act_groups``: the 8- and 4-bit forms
    take the same activations (same key, which no per-token kernel's key equals)."""
    group = problem.group_size
    return ("exact_act_groups", group), (lambda x: quantize_groups(x, group)), act_groups_apply


def takes_groups(problem) -> bool:
    """Whether ``problem`` is on group-wise weights (8-bit ``grouped`` or ``grouped4``),
    the formats whose activations can be quantized per group."""
    return problem.weight_format in ("grouped", GROUPED4)


registry.register(
    registry.Candidate(
        name=registry.EXACT_ACT_GROUPS, backend="any", op="linear", run=act_groups_linear,
        digest=_digest(act_groups_linear, act_groups_stages),
        stages=act_groups_stages,
        supports=takes_groups,
        act_scales=("group",),  # per-token problems are exact's and exact_w4a8's
    )
)


def qmm_supports(problem) -> bool:
    """Whether ``mx.quantized_matmul`` gives the right product for ``problem`` here.

    MLX 0.32.4's CUDA kernel does not where a weight row is one group (K <= group size)
    and M > 1: measured on an NVIDIA H200 (bench/compile_probe.py, bench/qmm_probe.py;
    bench/results/h200_2026-12-01_s18_{d,e}*, ..._s19_a*) it returned zeros, stale data
    or non-finite values at K = 64 with group size 64 for every M in 2-256 and N in
    32-4096 (bfloat16, float16 and float32, stock ``nn.QuantizedLinear`` alike) and at
    K = 128 with group size 128 in bfloat16, while M = 1, two or more groups per row
    (group size 64 or 128 up to K = 4096) and group size 32 (K = 32-4096) were right,
    and so was float32 at K = 128 with group size 128. Such a layer runs the exact W8A8
    kernel instead (``registry.fallback``)."""
    return not (problem.m > 1 and problem.k <= (problem.group_size or 0) and backends.on_cuda())


def qmm8_supports(problem) -> bool:
    """``mlx_qmm``: 8-bit codes where ``mx.quantized_matmul`` is right
    (:func:`qmm_supports`)."""
    return takes_8bit(problem) and qmm_supports(problem)


def qmm4_supports(problem) -> bool:
    """``mlx_qmm4``: 4-bit codes, with :func:`qmm_supports`' guard (MLX's CUDA kernel
    was measured wrong at 8 bits where a row is one group; not measured at 4 bits, so
    the exact kernel runs there too)."""
    return takes_4bit(problem) and qmm_supports(problem)


# MLX's CUDA ``quantized_matmul`` (0.32, affine, a weight row of two or more groups) runs
# its precompiled GEMV where M < 8 and otherwise a CUTLASS GEMM compiled at run time, one
# module per M tile (the next power of two of M, clamped to 16..64), dtype, bits and group
# size. Each module compiled for about 40 s on a fresh NVIDIA H100 host (MLX keeps them
# in its on-disk PTX cache after that), so a layer served through it must be warmed up
# at each tile: :func:`qmm_variant`. Hazard: this mirrors MLX's dispatch
# (``mlx/backend/cuda/quantized``); a key too fine only costs a warm-up call more.
QMM_GEMV_ROWS = 8
QMM_TILES = (16, 32, 64)


def qmm_variant(problem) -> Hashable:
    """What ``mx.quantized_matmul`` compiles for ``problem`` (``Candidate.variant``): on
    MLX's CUDA backend ``"gemv"`` for M < :data:`QMM_GEMV_ROWS`, else the GEMM's M tile;
    elsewhere one key (Metal and the CPU compile nothing per shape)."""
    if not backends.on_cuda():
        return "precompiled"
    if problem.m < QMM_GEMV_ROWS:
        return "gemv"
    tile = 1 << (problem.m - 1).bit_length()
    return min(max(tile, QMM_TILES[0]), QMM_TILES[-1])


def qmm4_linear(x: mx.array, weight, bias: mx.array | None) -> mx.array:
    """W4A16: ``mx.quantized_matmul`` with ``bits=4`` on the stored 4-bit weights."""
    y = mx.quantized_matmul(
        x, weight.q, weight.scales, weight.biases, transpose=True,
        group_size=weight.group_size, bits=4,
    )
    if bias is not None:
        y = y + bias
    return y if y.dtype == x.dtype else y.astype(x.dtype)


def qmm4_bind(layer, problem):
    """``x -> y`` for a 4-bit ``mlx_w8a8.Linear``: one ``mx.quantized_matmul`` with
    ``bits=4`` on ``[..., K]``, as ``nn.QuantizedLinear`` runs it (:func:`qmm_bind`'s
    contract; same math as :func:`qmm4_linear`)."""
    group = layer.group_size
    dtype = getattr(mx, problem.dtype)
    kept = {layer["scales"].dtype} | ({layer["bias"].dtype} if problem.has_bias else set())

    def run(x):
        y = mx.quantized_matmul(x, layer["weight"], layer["scales"], layer["biases"],
                                True, group, 4)
        if problem.has_bias:
            y = y + layer["bias"]
        return y if kept == {dtype} else y.astype(dtype)
    return run


registry.register(
    registry.Candidate(
        name="mlx_qmm",
        backend="any",
        op="linear",
        run=qmm_linear,
        bind=qmm_bind,
        supports=qmm8_supports,
        variant=qmm_variant,
        digest=_digest(qmm_linear, qmm_bind, params=f"mx.quantized_matmul {mx.__version__}"),
        w8a8=False,
    )
)


registry.register(
    registry.Candidate(
        name=registry.QMM4,
        backend="any",
        op="linear",
        run=qmm4_linear,
        bind=qmm4_bind,
        supports=qmm4_supports,
        variant=qmm_variant,
        digest=_digest(qmm4_linear, qmm4_bind, params=f"mx.quantized_matmul bits=4 {mx.__version__}"),
        w8a8=False,
    )
)
