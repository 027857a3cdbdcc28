"""The numerical gate: a challenger must agree with the reference candidate.

Method (after ``select``/``retain_compatible`` of the affine-projection tuner): run the
reference and every challenger on the same inputs — a deterministic pattern and a
seeded random draw — and accept a challenger only if every output element is finite
and ``|c - r| <= max(atol, rtol * |r|)``, both sides rounded to bfloat16 first
(defaults ``atol = 0.125``, ``rtol = 0.01``). Ops whose contract is exact
(``int8_matmul``, ``quantize_activation``) use equality instead. A rejected challenger
is logged with its worst element and is never chosen; one that raises is
``unavailable`` and skipped.

This module also makes the operands the tuner feeds candidates (:func:`operands`):
synthetic weights of the problem's shape and format, with activations of the
magnitude a trained layer sees.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Sequence

import attrs
import mlx.core as mx
import numpy as np

from ..kernels.registry import Candidate, Problem
from ..weight import QuantizedWeight

log = logging.getLogger("mlx_w8a8.tuning")

ATOL = 0.125
RTOL = 0.01
# Ops whose every candidate must be bit-exact (docs/numerics.md).
EXACT_OPS = ("int8_matmul", "quantize_activation")
# The seed's 17-value ramp: multiples of 1/16 in [-0.5, 0.5], exact in every float dtype.
PATTERN = np.arange(-8, 9, dtype=np.float32) / 16.0
DEFAULT_GROUP_SIZE = 64

_DTYPES = {"float16": mx.float16, "bfloat16": mx.bfloat16, "float32": mx.float32}


@attrs.frozen
class GateResult:
    """The gate's verdict on one candidate.

    Args:
        name: the candidate.
        status: ``"ok"`` (passed), ``"rejected"`` (numerically different) or
            ``"unavailable"`` (raised while running).
        worst_error: the largest ``|c - r|`` over all inputs, in bfloat16 terms
            (``inf`` for a non-finite or mismatched output; ``0.0`` when exact).
        detail: for a failure, the worst element: input, index, values and limit.
    """

    name: str
    status: str
    worst_error: float = 0.0
    detail: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "ok"


def dtype_of(problem: Problem) -> mx.Dtype:
    """The activation dtype of ``problem``.

    Raises:
        ValueError: for a dtype the gate cannot make inputs in.
    """
    if problem.op == "int8_matmul":
        return mx.int8
    try:
        return _DTYPES[problem.dtype]
    except KeyError:
        raise ValueError(
            f"[mlx_w8a8.tuning.{problem.op}] cannot make inputs of dtype {problem.dtype!r}; "
            f"valid: {sorted(_DTYPES)}"
        ) from None


def make_weight(problem: Problem, seed: int = 0) -> QuantizedWeight:
    """A synthetic ``[N, K]`` weight in ``problem``'s format (scale ``1/sqrt(K)``).

    The scale is that of an ``nn.Linear`` init, so outputs have the magnitude of the
    inputs, as in a trained model. Scales are stored in the activation dtype.
    """
    gs = problem.group_size or DEFAULT_GROUP_SIZE
    key = mx.random.key(seed)
    w = mx.random.normal((problem.n, problem.k), key=key) * (1.0 / math.sqrt(problem.k))
    w = w.astype(dtype_of(problem))
    weight = QuantizedWeight.from_float(
        w, group_size=gs, per_channel=problem.weight_format == "per_channel"
    )
    mx.eval(weight.q, weight.scales, weight.biases)
    return weight


def _pattern(shape: tuple[int, int]) -> np.ndarray:
    m, k = shape
    idx = np.arange(m * k).reshape(m, k)
    # Shift each row so rows differ (a row-constant error would otherwise hide).
    return PATTERN[(idx + 3 * (idx // k)) % len(PATTERN)]


def _int8_pattern(shape: tuple[int, int], salt: int) -> np.ndarray:
    m, k = shape
    r, c = np.meshgrid(np.arange(m), np.arange(k), indexing="ij")
    return (((r * 7 + c * 3 + r * c + salt) % 255) - 127).astype(np.int8)


def activations(problem: Problem, variants: int, seed: int = 0) -> list[mx.array]:
    """``variants`` activation inputs for ``problem``: the pattern first, then random.

    Returns:
        ``[M, K]`` arrays in the problem's dtype (int8 for ``int8_matmul``); random
        float draws are standard normal, random int8 draws uniform in ``[-127, 127]``.
    """
    shape = (problem.m, problem.k)
    dtype = dtype_of(problem)
    out = []
    for i in range(variants):
        if i == 0:
            host = _int8_pattern(shape, 0) if dtype == mx.int8 else _pattern(shape)
            out.append(mx.array(host).astype(dtype))
            continue
        key = mx.random.key(seed * 1000 + i)
        if dtype == mx.int8:
            out.append(mx.random.randint(-127, 128, shape, key=key).astype(mx.int8))
        else:
            out.append(mx.random.normal(shape, key=key).astype(dtype))
    mx.eval(out)
    return out


def operands(
    problem: Problem, variants: int = 2, seed: int = 0, weight: Any = None
) -> list[tuple]:
    """Argument tuples for a candidate's ``run`` (signatures: ``kernels.registry``).

    Args:
        problem: the work.
        variants: how many activation inputs (pattern, then seeded random ones); all
            share one weight, so a timing loop can rotate through them.
        seed: seed of the random draws and of the synthetic weight.
        weight: the weight to use (a ``QuantizedWeight`` for ``linear``, an ``[N, K]``
            int8 array for ``int8_matmul``); synthesized when ``None``.

    Returns:
        ``variants`` tuples: ``(x, weight, bias)`` for ``linear``, ``(a, b)`` for
        ``int8_matmul``, ``(x, group_size)`` for ``quantize_activation``.
    """
    xs = activations(problem, variants, seed)
    if problem.op == "quantize_activation":
        return [(x, problem.group_size) for x in xs]
    if problem.op == "int8_matmul":
        if weight is None:
            weight = mx.array(_int8_pattern((problem.n, problem.k), 11))
        return [(x, weight) for x in xs]
    if weight is None:
        weight = make_weight(problem, seed)
    bias = None
    if problem.has_bias:
        bias = (mx.random.normal((problem.n,), key=mx.random.key(seed + 7)) * 0.1).astype(
            dtype_of(problem)
        )
        mx.eval(bias)
    return [(x, weight, bias) for x in xs]


def _parts(out) -> list:
    if isinstance(out, (tuple, list)):
        return list(out)
    return [out]


def compare(
    reference: Any, candidate: Any, atol: float = ATOL, rtol: float = RTOL, exact: bool = False
) -> tuple[bool, float, str]:
    """Compare one candidate output with the reference output.

    Args:
        reference, candidate: an ``mx.array`` or a tuple of them (``None`` allowed
            where both are ``None``).
        atol, rtol: the tolerance ``max(atol, rtol * |r|)`` (ignored when ``exact``).
        exact: require equal shapes, dtypes and values (NaN nowhere).

    Returns:
        ``(passed, worst_error, detail)``; ``worst_error`` is the largest ``|c - r|``
        in bfloat16 terms (``inf`` when an output is non-finite or shapes differ),
        ``detail`` describes the worst element on failure.
    """
    refs, cands = _parts(reference), _parts(candidate)
    if len(refs) != len(cands):
        return False, math.inf, f"returned {len(cands)} outputs, the reference {len(refs)}"
    worst, worst_detail, passed = 0.0, "", True
    for part, (r, c) in enumerate(zip(refs, cands)):
        if r is None or c is None:
            if r is not c:
                return False, math.inf, f"output {part}: one side is None"
            continue
        if tuple(r.shape) != tuple(c.shape):
            return False, math.inf, (
                f"output {part}: shape {tuple(c.shape)}, the reference {tuple(r.shape)}"
            )
        if exact:
            rn, cn = np.array(r), np.array(c)
            if rn.dtype != cn.dtype:
                return False, math.inf, f"output {part}: dtype {cn.dtype}, the reference {rn.dtype}"
            diff = rn.astype(np.float64) - cn.astype(np.float64)
            bad = ~(diff == 0)
            err = np.abs(diff)
            if bad.any():
                i = np.unravel_index(int(np.argmax(np.where(np.isnan(err), np.inf, err))), err.shape)
                e = float(err[i]) if np.isfinite(err[i]) else math.inf
                return False, e, (
                    f"output {part} element {tuple(int(v) for v in i)}: {cn[i]} vs reference "
                    f"{rn[i]} (exact op: must be equal)"
                )
            continue
        rn = np.array(r.astype(mx.bfloat16).astype(mx.float32)).astype(np.float64)
        cn = np.array(c.astype(mx.bfloat16).astype(mx.float32)).astype(np.float64)
        err = np.abs(cn - rn)
        limit = np.maximum(atol, rtol * np.abs(rn))
        finite = np.isfinite(rn) & np.isfinite(cn)
        err = np.where(finite, err, np.inf)
        if err.size == 0:
            continue
        with np.errstate(divide="ignore", invalid="ignore"):
            excess = np.nan_to_num(err / limit, nan=0.0, posinf=np.inf)  # 0 / 0: equal
        i = np.unravel_index(int(np.argmax(excess)), err.shape)
        part_worst = float(err.max())
        if not finite.all() or (err > limit).any():
            passed = False
            worst = max(worst, part_worst)
            worst_detail = (
                f"output {part} element {tuple(int(v) for v in i)}: {cn[i]:.6g} vs reference "
                f"{rn[i]:.6g}, |c - r| = {err[i]:.6g} > max({atol}, {rtol} * |r|) = {limit[i]:.6g}"
            )
        else:
            worst = max(worst, part_worst)
    return passed, worst, worst_detail


def run_gate(
    problem: Problem,
    reference: Candidate,
    challengers: Sequence[Candidate],
    inputs: Sequence[tuple],
    atol: float = ATOL,
    rtol: float = RTOL,
    reference_dtype: str | None = None,
) -> dict[str, GateResult]:
    """Gate every challenger against ``reference`` on every input tuple.

    Args:
        problem: the work (its op picks exact or tolerance comparison).
        reference: the candidate whose outputs are the truth (``mlx_qmm`` for
            ``linear``, ``reference`` for the exact ops).
        challengers: the others; the reference may be among them (it passes).
        inputs: argument tuples for ``run`` (see :func:`operands`).
        atol, rtol: tolerance for ``linear``.
        reference_dtype: ``None`` (default) runs the reference on the inputs as they
            are; ``"float32"`` runs it on the activation upcast to float32 (same
            stored weights) and rounds its output back to the problem's dtype, so the
            truth is not limited by the reference's own low-precision accumulation
            (``linear`` only; e.g. ``mx.quantized_matmul`` on MLX's CPU in bfloat16).

    Returns:
        ``{name: GateResult}`` for the reference and every challenger.

    Raises:
        RuntimeError: if the reference itself raises or gives a non-finite output on
            a finite input (then nothing can be gated; the tuner abandons).
    """
    exact = problem.op in EXACT_OPS
    upcast = reference_dtype not in (None, "native") and problem.op == "linear"
    if upcast and reference_dtype not in _DTYPES:
        raise ValueError(
            f"[mlx_w8a8.tuning.{problem.op}] reference_dtype must be None, 'native' or one of "
            f"{sorted(_DTYPES)}, got {reference_dtype!r}"
        )

    def run_reference(args):
        if not upcast:
            return reference.run(*args)
        x, *rest = args
        return reference.run(x.astype(_DTYPES[reference_dtype]), *rest).astype(x.dtype)

    try:
        ref_outs = [run_reference(args) for args in inputs]
        mx.eval(ref_outs)
    except Exception as error:
        raise RuntimeError(
            f"[mlx_w8a8.tuning.{problem.op}] reference candidate {reference.name!r} failed: "
            f"{type(error).__name__}: {error}"
        ) from error
    results = {reference.name: GateResult(reference.name, "ok", 0.0)}
    for cand in challengers:
        if cand.name == reference.name:
            continue
        worst, status, detail = 0.0, "ok", ""
        for index, (args, ref_out) in enumerate(zip(inputs, ref_outs)):
            try:
                out = cand.run(*args)
                mx.eval(out)
            except Exception as error:
                status, worst = "unavailable", math.inf
                detail = f"raised {type(error).__name__}: {error}"
                log.warning(
                    "[mlx_w8a8.tuning] %s: candidate %r is unavailable (%s); skipped",
                    describe(problem), cand.name, detail,
                )
                break
            passed, err, why = compare(ref_out, out, atol, rtol, exact)
            worst = max(worst, err)
            if not passed:
                status = "rejected"
                detail = f"input {index} ({'pattern' if index == 0 else 'random'}): {why}"
                log.warning(
                    "[mlx_w8a8.tuning] %s: rejected numerically incompatible candidate %r "
                    "against %r: %s", describe(problem), cand.name, reference.name, detail,
                )
                break
        results[cand.name] = GateResult(cand.name, status, worst, detail)
    return results


def describe(problem: Problem) -> str:
    """A one-line description of ``problem`` for logs."""
    gs = f" gs={problem.group_size}" if problem.group_size else ""
    return (
        f"{problem.op} M={problem.m} N={problem.n} K={problem.k} {problem.dtype} "
        f"{problem.weight_format}{gs}"
    )
