"""The public ops: lazy ``mx.array`` in, lazy ``mx.array`` out.

Each op validates its inputs, describes the work as a ``Problem`` and runs the candidate
that :func:`mlx_w8a8.kernels.registry.choose` picks (a forced ``kernel=``, a tuning
table's choice, the built-in prior, or the fallback). Nothing here reads array data back
to the host.

Decide once, run many times, as ``mlx_w8a8.Linear`` does, through the same plan path
(:mod:`mlx_w8a8.plans`): :func:`w8a8_linear` keeps, in a ``PlanCache`` on the weight, the
checked, decided and bound call per activation shape and dtype, bias, forced kernel and
device type, from the second call with a key on (the first runs the candidate's ``run``:
direct launches, nothing traced or bound, and only the key is remembered); a repeated call
with no ``stream=`` looks up one entry and launches. A registry invalidation (a table
loaded, a candidate registered, a measurement recorded) clears those caches.
"""

from __future__ import annotations

import contextlib
import math

import mlx.core as mx

from . import plans
from .kernels import registry
from .kernels.registry import ACT_SCALES, Problem
from .weight import FLOAT_DTYPES, MAX_K, QuantizedWeight, describe, dtype_name, check_group_size

__all__ = ["quantize_weight", "quantize_activation", "int8_matmul", "w8a8_linear"]


def quantize_weight(w: mx.array, group_size: int = 64, per_channel: bool = True) -> QuantizedWeight:
    """Quantize a float weight to MLX's affine 8-bit layout.

    Args:
        w: ``[N, K]`` float16/bfloat16/float32 (an ``nn.Linear`` weight).
        group_size: 32, 64 or 128; must divide K.
        per_channel: ``True`` (default) for symmetric per-channel int8, which the int8
            GEMM runs on directly; ``False`` for group-wise affine as ``mx.quantize``.

    Returns:
        QuantizedWeight: ``q`` ``[N, K // 4]`` uint32, ``scales``/``biases``
        ``[N, K // group_size]`` in ``w``'s dtype.
    """
    return QuantizedWeight.from_float(w, group_size=group_size, per_channel=per_channel)


def _on(stream):
    """``with mx.stream(stream)`` when a stream or device was given: the kernel is then
    chosen (and its table key made) for that device, and runs on that stream."""
    return contextlib.nullcontext() if stream is None else mx.stream(stream)


def _check_float_activation(op: str, x) -> None:
    if not isinstance(x, mx.array) or x.dtype not in FLOAT_DTYPES:
        raise ValueError(
            f"[{op}] x must be a float16, bfloat16 or float32 array, got {describe(x)}"
        )
    if x.ndim < 1:
        raise ValueError(f"[{op}] x must have at least one dimension [..., K], got a scalar")


def quantize_activation(
    x: mx.array, group_size: int | None = None, *, kernel: str | None = None,
    stream: mx.Stream | mx.Device | None = None,
):
    """Per-token (per-row) dynamic symmetric int8 quantization.

    ``scale = max|x_row| / 127`` in float32, ``q = clip(rint(x / scale), -127, 127)``.
    An all-zero row gives zeros and scale 0; a row with NaN/Inf gives scale NaN.

    Args:
        x: ``[..., K]`` float16/bfloat16/float32.
        group_size: if given (32, 64 or 128 dividing K), also return per-group row sums.
        kernel: force a candidate by name (default: the tuner's choice).
        stream: the stream or device to run on, as MLX ops take it (default: the
            default stream); the kernel is chosen for that device.

    Returns:
        ``(q, scales)``: ``[..., K]`` int8 and ``[..., 1]`` float32; with
        ``group_size``, ``(q, scales, row_sums)`` with ``[..., K // group_size]`` int32.
        No rows (a leading dimension 0) give empty outputs.

    Raises:
        ValueError: on a non-float or 0-D ``x``, ``K = 0`` (a row without elements has no
            scale), or a group size that is not 32, 64 or 128 or does not divide K.
    """
    op = "mlx_w8a8.quantize_activation"
    _check_float_activation(op, x)
    k = x.shape[-1]
    if k == 0:
        raise ValueError(
            f"[{op}] x must have at least one element per row (K >= 1) to take a "
            f"per-row scale from, got shape {tuple(x.shape)}"
        )
    if group_size is not None:
        check_group_size(op, group_size, k)
    lead = x.shape[:-1]
    m = math.prod(lead)
    if m == 0:  # nothing to quantize or to choose a kernel for (empty batches)
        q, scale = mx.zeros((*lead, k), mx.int8), mx.zeros((*lead, 1), mx.float32)
        if group_size is None:
            return q, scale
        return q, scale, mx.zeros((*lead, k // group_size), mx.int32)
    problem = Problem("quantize_activation", m, 0, k, dtype_name(x.dtype), "int8", group_size)
    x2 = x.reshape(m, k)
    with _on(stream):
        q, scale, sums = registry.choose(problem, kernel).run(x2, group_size)
    q, scale = q.reshape(*lead, k), scale.reshape(*lead, 1)
    if group_size is None:
        return q, scale
    return q, scale, sums.reshape(*lead, k // group_size)


def int8_matmul(
    a: mx.array, b: mx.array, *, kernel: str | None = None,
    stream: mx.Stream | mx.Device | None = None,
) -> mx.array:
    """Exact int8 matrix product ``a @ b.T``.

    Args:
        a: ``[M, K]`` int8.
        b: ``[N, K]`` int8 (a weight as stored, row per output feature).
        kernel: force a candidate by name (default: the tuner's choice).
        stream: the stream or device to run on, as MLX ops take it (default: the
            default stream); the kernel is chosen for that device.

    Returns:
        ``[M, N]`` int32, bit-exact.

    Raises:
        ValueError: on a non-int8 or non-2-D operand, mismatched K, or K >= 2^17 (where
            an int32 sum of int8 products can overflow).
    """
    op = "mlx_w8a8.int8_matmul"
    for label, arr in (("a", a), ("b", b)):
        if not isinstance(arr, mx.array) or arr.dtype != mx.int8 or arr.ndim != 2:
            want = "[M, K]" if label == "a" else "[N, K]"
            raise ValueError(f"[{op}] {label} must be a 2-D {want} int8 array, got {describe(arr)}")
    if a.shape[1] != b.shape[1]:
        raise ValueError(
            f"[{op}] K mismatch: a is {list(a.shape)} and b is {list(b.shape)}; "
            f"both must have the same last dimension"
        )
    m, k = a.shape
    n = b.shape[0]
    if k >= MAX_K:
        raise ValueError(
            f"[{op}] K = {k} is too large: the int32 result is exact only for K < 2^17 = "
            f"{MAX_K} (|a * b| <= 2^14, and K = 2^17 products of -128 * -128 sum to 2^31)"
        )
    if m == 0 or n == 0 or k == 0:
        return mx.zeros((m, n), dtype=mx.int32)
    problem = Problem("int8_matmul", m, n, k, "int8", "int8")
    with _on(stream):
        return registry.choose(problem, kernel).run(a, b)


def linear_problem(x: mx.array, weight: QuantizedWeight, has_bias: bool,
                   act_scales: str = "token") -> Problem:
    """The ``Problem`` a call of :func:`w8a8_linear` with these arguments solves."""
    m = math.prod(x.shape[:-1])
    return Problem(
        "linear", m, weight.n, weight.k, dtype_name(x.dtype), weight.format,
        weight.group_size, has_bias, act_scales,
    )


def w8a8_linear(
    x: mx.array,
    weight: QuantizedWeight,
    bias: mx.array | None = None,
    *,
    kernel: str | None = None,
    stream: mx.Stream | mx.Device | None = None,
    act_scales: str = "token",
) -> mx.array:
    """``x @ W.T (+ bias)`` for an 8-bit (or 4-bit) weight ``W``.

    The W8A8 candidates quantize ``x`` per token to int8, multiply in int8 with int32
    accumulation and dequantize in the epilogue (``docs/numerics.md``). The tuner may
    instead pick ``mlx_qmm`` (``mx.quantized_matmul``, W8A16) where that is faster; with
    no tuning-table entry ``mlx_qmm`` runs. Pass ``kernel="exact"`` (or another
    W8A8 candidate) to force the W8A8 math.

    Args:
        x: ``[..., K]`` float16/bfloat16/float32.
        weight: a :class:`QuantizedWeight` of shape ``[N, K]``.
        bias: optional ``[N]`` float.
        kernel: force a candidate by name (default: the tuner's choice).
        stream: the stream or device to run on, as MLX ops take it (default: the
            default stream); the kernel is chosen for that device.
        act_scales: ``"token"`` (one int8 scale per token) or ``"group"`` (one per
            token and weight group; group-wise weights only): ``Linear.act_scales``.

    Returns:
        ``[..., N]`` in ``x.dtype``.
    """
    key = plan = None  # key of the kept call: an earlier one like it was checked and decided
    if stream is None:
        try:
            key = (x.shape, x.dtype, id(bias), kernel, act_scales, mx.default_device().type)
            plan = weight._plans.plans.get(key)
        except (AttributeError, TypeError):  # not an array or a QuantizedWeight; no plans yet
            pass
        if plan is not None:
            return plan(x)
    op = "mlx_w8a8.w8a8_linear"
    _check_float_activation(op, x)
    if not isinstance(weight, QuantizedWeight):
        raise ValueError(
            f"[{op}] weight must be a QuantizedWeight (make one with "
            f"mlx_w8a8.quantize_weight), got {describe(weight)}"
        )
    if x.shape[-1] != weight.k:
        raise ValueError(
            f"[{op}] K mismatch: x has last dimension {x.shape[-1]} but the weight is "
            f"[N, K] = {list(weight.shape)}"
        )
    if bias is not None and (
        not isinstance(bias, mx.array) or bias.dtype not in FLOAT_DTYPES
        or tuple(bias.shape) != (weight.n,)
    ):
        raise ValueError(
            f"[{op}] bias must be a float array of shape [N] = [{weight.n}], "
            f"got {describe(bias)}"
        )
    if act_scales not in ACT_SCALES or (act_scales == "group" and weight.per_channel):
        raise ValueError(
            f"[{op}] act_scales must be one of {ACT_SCALES} ('group' with group-wise "
            f"weights only), got {act_scales!r} for a {weight.format} weight"
        )
    lead = x.shape[:-1]
    problem = linear_problem(x, weight, bias is not None, act_scales)
    if problem.m == 0:
        return mx.zeros((*lead, weight.n), dtype=x.dtype)
    with _on(stream):
        stamp = registry.generation  # read first: an invalidation while deciding keeps nothing
        candidate = registry.choose(problem, kernel)
        if key is None:  # on a given stream: a call of its own, nothing kept
            return plans.weight_plan(candidate, problem, weight, bias, lead, False)(x)
        cache = weight._plans
        if cache is None:
            cache = plans.PlanCache()
            object.__setattr__(weight, "_plans", cache)  # the weight is frozen; its plans are not
        plan = plans.weight_plan(candidate, problem, weight, bias, lead, cache.met(key))
        return cache.keep(key, plan, stamp=stamp)(x)
