"""The public ops: lazy ``mx.array`` in, lazy ``mx.array`` out.

Each op validates its inputs, describes the work as a ``Problem`` and runs the candidate
that :func:`mlx_w8a8.kernels.registry.choose` picks (a forced ``kernel=``, a tuning
table's choice, the built-in prior, or the fallback). Nothing here reads array data back
to the host.

Decide once, run many times, as ``mlx_w8a8.Linear`` does: the decision per problem,
forced kernel and device is kept until the registry's decisions go stale
(``registry.generation``: a table loaded, a candidate registered, a measurement
recorded), and :func:`w8a8_linear` keeps, on the weight, the launches bound to its arrays
and the bias (``Candidate.bind_stages``) and, per activation shape and dtype, bias, forced
kernel and device type, the whole checked and decided call, so a repeated call with no
``stream=`` looks up one entry and launches. As a layer does (``nn.Linear._keep``), it
keeps them from the second call with a key on: the first runs the candidate's ``run``
(direct launches, nothing traced or bound) and only remembers the key, so activation
shapes met once leave nothing for Python's cyclic collector.
"""

from __future__ import annotations

import contextlib
import math

import mlx.core as mx

from .kernels import registry
from .kernels.registry import Problem
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


# At most this many bound launches per weight are kept; past it they are dropped and
# re-made on use (a process calling with ever new shapes stays bounded). Decisions are
# kept by registry.decide (per problem, forced kernel and device type, until
# registry.generation moves; a forced kernel that cannot run raises each time).
_MAX_KEPT = 64


def _bound_run(candidate: registry.Candidate, problem: Problem, weight: QuantizedWeight,
               bias: mx.array | None):
    """``f(x2) -> y`` for ``[M, K]`` ``x2``: ``candidate``'s launches bound to ``weight``
    and ``bias`` (made on first use and kept on the weight, which holds the candidate and
    the bias so that their ids stay theirs), or its ``run`` where it has no bound form."""
    if candidate.bind_stages is None:
        return lambda x2: candidate.run(x2, weight, bias)
    kept = weight._bound
    key = (id(candidate), problem, id(bias))
    hit = kept.get(key)
    if hit is not None:
        return hit[2]
    f = registry.bound_call(candidate, problem, weight, bias)
    if len(kept) >= _MAX_KEPT:
        kept.clear()
    kept[key] = (candidate, bias, f)
    return f


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


def linear_problem(x: mx.array, weight: QuantizedWeight, has_bias: bool) -> Problem:
    """The ``Problem`` a call of :func:`w8a8_linear` with these arguments solves."""
    m = math.prod(x.shape[:-1])
    return Problem(
        "linear", m, weight.n, weight.k, dtype_name(x.dtype), weight.format,
        weight.group_size, has_bias,
    )


def w8a8_linear(
    x: mx.array,
    weight: QuantizedWeight,
    bias: mx.array | None = None,
    *,
    kernel: str | None = None,
    stream: mx.Stream | mx.Device | None = None,
) -> mx.array:
    """``x @ W.T (+ bias)`` for an 8-bit weight ``W``.

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

    Returns:
        ``[..., N]`` in ``x.dtype``.
    """
    key = None  # of the kept call: a call like an earlier one was checked, decided and bound
    if stream is None:
        try:
            key = (x.shape, x.dtype, id(bias), kernel, mx.default_device().type)
            hit = weight._calls.get(key)
        except (AttributeError, TypeError):  # not an array, not a QuantizedWeight
            key = hit = None
        if hit is not None and hit[0] == registry.generation:
            return hit[1](x)
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
    lead = x.shape[:-1]
    problem = linear_problem(x, weight, bias is not None)
    if problem.m == 0:
        return mx.zeros((*lead, weight.n), dtype=x.dtype)
    with _on(stream):
        generation = registry.generation  # read first: a bump while deciding re-decides
        candidate = registry.choose(problem, kernel)
        # A key met for the first time runs the candidate's own run (direct launches,
        # nothing traced or bound) and keeps nothing but the key (mlx_w8a8.met).
        keep = key is not None and weight._met.again(key)
        if keep or key is None:
            f = _bound_run(candidate, problem, weight, bias)
        else:
            f = lambda x2: candidate.run(x2, weight, bias)  # noqa: E731
        if x.ndim != 2:  # [..., K]: flattened to [M, K] and back
            m, k, shape = problem.m, weight.k, (*lead, weight.n)
            f = (lambda run: lambda x_: run(x_.reshape(m, k)).reshape(shape))(f)
        if keep:
            calls = weight._calls
            if len(calls) >= _MAX_KEPT:
                calls.clear()
            calls[key] = (generation, f, bias)  # holds the bias, so that its id stays its own
        return f(x)
