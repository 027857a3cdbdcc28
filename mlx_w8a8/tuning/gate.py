"""The numerical gate: a challenger must agree with the references, in two stages.

Method (after ``select``/``retain_compatible`` of the affine-projection tuner): run the
references and every challenger on the same inputs (:func:`gate_operands`) and accept a
challenger only if it passes both stages on every input:

1. **User-facing rule** (every ``linear`` candidate): every output element is finite and
   ``|c - r| <= max(atol, rtol * |r|)`` against ``mlx_qmm`` (``mx.quantized_matmul``),
   both sides rounded to bfloat16 first (defaults ``atol = 0.125``, ``rtol = 0.01``).
   This is what a user would accept from a W8A16 layer; it is far too loose to tell a
   correct W8A8 kernel from a broken one (an honest W8A8 error is ~0.03 on outputs of
   magnitude 1, and a kernel that drops the last 16 of K = 14336 stays under 0.125).
2. **W8A8 contract** (candidates with ``w8a8=True``): against the ``exact`` candidate
   (the W8A8 math of ``docs/numerics.md`` in MLX ops), elementwise within the bound
   a float32 epilogue can explain (:func:`w8a8_bound`), plus an SQNR floor against
   ``mlx_qmm`` (``MIN_SQNR_DB``, as torchao's autoquant rejects by ``min_sqnr``).

Ops whose contract is exact (``int8_matmul``, ``quantize_activation``) use equality
with ``exact`` instead. A rejected challenger is logged with its worst element and the
stage that rejected it, and is never chosen; one that raises is ``unavailable`` and
skipped.

The bound of stage 2. Both kernels compute the same integers (codes, scales and int32
dot products are bit-exact by contract); they may differ only in float32 rounding of
the epilogue. With ``u = 2^-24`` and ``gamma(n) = n u / (1 - n u)``, an epilogue that
rounds each term of the output at most ``n`` times lies within ``gamma(n) * T`` of the
exact value, ``T = scale_m * sum_k |q_mk| (|s_nk| |c_nk| + |b'_nk|) + |bias_n|`` (the
output with every term made positive; ``c = q - 128`` the weight codes, ``s`` the
scale and ``b' = b + 128 s`` the offset of ``k``'s group). Per-channel: ``n = 4``
(int32 to float32, two scale products, the bias add). Grouped with ``G`` groups:
``n = 2G + 4`` (one product per group term, at most ``2G - 1`` additions in any order,
the row scale, the bias). For MLX's 4-bit weights (``"grouped4"``, references
``mlx_qmm4`` and ``exact_w4a8``) the same bound holds with ``c = q`` in ``[0, 15]`` and
``b`` the stored bias in place of ``b'``. Two such kernels differ by at most ``2 gamma(n) T``; in
float16/bfloat16 each output is then rounded once more, adding at most one unit in the
last place of the output dtype. ``T`` itself is computed in float32 with non-negative
terms (whose inputs MLX may round to TF32), so it is scaled by
``(1 + gamma(K + 2)) (1 + 2^-9)`` to stay an upper bound.

Where the work is done. Outputs are ``[M, N]``: at prefill M and a large vocabulary
(lm_head, 2048 x 128256) float64 passes over them on the host cost minutes per
candidate (scaled from CPU timings in ``docs/tuning.md``), far more than the timing. So both stages first screen on the device in float32
(:func:`compare`, :func:`compare_w8a8`): every element must be finite and within its
limit by a relative margin (``2^-16`` for stage 1, ``2^-20`` for stage 2) that covers the
float32 rounding of the difference and of the limit. An output that clears the screen
passes, and would pass the float64 test (the margins are proved beside the constants);
any other output, a failing one or one within the margin of a limit, is decided by the
float64 test on the host as before, which also writes the detail. The SQNR sums squares
per row in float32 on the device and the rows in float64.

Gate inputs (:data:`INPUT_NAMES`): the seed's ramp pattern, a seeded random draw, a row
that is zero except the last ``TAIL`` elements of K (a kernel that drops or misreads a
K tail is wrong on all of it) and a row of exact quantization ties ``(j + 1/2) c`` with
``127 c`` as its maximum (a kernel that rounds ties the wrong way, or quantizes with
``/127`` and dequantizes with ``/128``, is off on every element); ``int8_matmul`` gets
runs of ``127`` and ``-128`` instead of ties, whose sums an unchunked float32 matmul
rounds. At ``M > 1`` rows differ (the ramp is shifted per row; the others draw each
row).

This module also makes the operands the tuner times candidates on (:func:`operands`):
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

from ..kernels import registry
from ..kernels.registry import Candidate, Problem
from ..weight import FLOAT_DTYPES_BY_NAME, GROUPED4, QuantizedWeight

log = logging.getLogger("mlx_w8a8.tuning")

ATOL = 0.125
RTOL = 0.01
# Stage 2's floor on 10 log10(sum r^2 / sum (c - r)^2) against mlx_qmm, per input. Per-token
# int8 activations cost 10 log10(12 * 127^2 / crest^2) dB (crest = max|x| / rms(x)): about
# 40 dB for a Gaussian row of K = 4096 (crest ~4.5), more for the other gate inputs. 30 dB
# leaves that margin while a dropped group, a wrong scale or a swapped operand fall far
# below it.
MIN_SQNR_DB = 30.0
# Ops whose every candidate must be bit-exact (docs/numerics.md).
EXACT_OPS = ("int8_matmul", "quantize_activation")
# The seed's 17-value ramp: multiples of 1/16 in [-0.5, 0.5], exact in every float dtype.
PATTERN = np.arange(-8, 9, dtype=np.float32) / 16.0
DEFAULT_GROUP_SIZE = 64
# Nonzero elements at the end of K in the ``k_tail`` input.
TAIL = 32
# The gate's inputs, in order (float activations; int8_matmul's last one is ``extremes``).
INPUT_NAMES = ("pattern", "random", "k_tail", "ties")
INT8_INPUT_NAMES = ("pattern", "random", "k_tail", "extremes")
# float32 unit roundoff.
U32 = 2.0**-24
# Significand bits (with the implicit one) of the output dtypes that round the epilogue.
_SIGNIFICAND = {"float16": 11, "bfloat16": 8}
# The device screens' margins (module docstring). Stage 1: the float32 values are the
# float64 ones (bfloat16 rounded), |c - r| and max(atol, rtol |r|) are each within 2^-23
# of their float64 values, so err32 <= (1 - 2^-16) limit32 implies err <= limit.
# Stage 2: err32 within 2^-24 of err, bound32 = t (factor rounded) within 2^-22 of the
# float64 bound, the ulp exact (from the exponent bits) and the sum rounded once: a
# 2^-20 margin covers them. An honest one-ulp difference of a 16-bit output clears it:
# its limit is that ulp plus a bound of at least ~1e-4 of it.
_CLEAR_STAGE1 = 1.0 - 2.0**-16
_CLEAR_STAGE2 = 1.0 - 2.0**-20

_DTYPES = FLOAT_DTYPES_BY_NAME


@attrs.frozen
class GateResult:
    """The gate's verdict on one candidate.

    Args:
        name: the candidate.
        status: ``"ok"`` (passed), ``"rejected"`` (numerically different) or
            ``"unavailable"`` (raised while running).
        worst_error: the largest stage-1 ``|c - r|`` over all inputs, in bfloat16 terms
            (``inf`` for a non-finite or mismatched output; ``0.0`` when exact).
        detail: for a failure, the worst element: input, index, values and limit.
        stage: the stage that rejected it (1: user-facing rule or exact equality,
            2: the W8A8 contract), ``0`` when it passed or was unavailable.
        sqnr_db: the lowest SQNR against ``mlx_qmm`` over the inputs (stage 2 only;
            ``None`` where stage 2 did not run).
    """

    name: str
    status: str
    worst_error: float = 0.0
    detail: str = ""
    stage: int = 0
    sqnr_db: float | None = None

    @property
    def passed(self) -> bool:
        return self.status == "ok"


def gamma(n: int) -> float:
    """``n u / (1 - n u)``: the relative error of ``n`` float32 roundings (Higham)."""
    return n * U32 / (1.0 - n * U32)


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
    if problem.weight_format == GROUPED4:
        weight = QuantizedWeight.from_float(w, group_size=gs, per_channel=False, bits=4)
    else:
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


def probes(problem: Problem, seed: int = 0) -> list[mx.array]:
    """The two probe activations of the gate: ``k_tail`` and ``ties`` (``extremes``
    for ``int8_matmul``), ``[M, K]`` in the problem's dtype.

    - ``k_tail``: zero except the last ``min(K, TAIL)`` elements of each row (random):
      the whole output comes from the K tail, so a dropped or misread tail is wrong
      by the output's own size.
    - ``ties``: each row is ``c * (127, j_1 + 1/2, j_2 + 1/2, ...)`` with ``c`` a power
      of two and ``j`` random in ``[-100, 99]``: the scale is exactly ``c`` and every
      other element is an exact rounding tie (round half to even is the contract), so
      a kernel that rounds ties otherwise, or dequantizes with another scale
      (``/128`` for ``/127``), is off on every element. Exact in bfloat16 and float16.
    - ``extremes`` (int8): rows of ``127`` and ``-128`` runs, whose products are not
      multiples of a power of two large enough for an unchunked float32 sum to be exact.
    """
    m, k = problem.m, problem.k
    rng = np.random.default_rng(seed + 12345)
    dtype = dtype_of(problem)
    tail = min(k, TAIL)
    if dtype == mx.int8:
        xt = np.zeros((m, k), np.int8)
        xt[:, k - tail :] = rng.integers(-127, 128, (m, tail))
        xe = np.where((np.arange(k)[None, :] + np.arange(m)[:, None]) % 5 == 0, -128, 127)
        return [mx.array(xt), mx.array(xe.astype(np.int8))]
    xt = np.zeros((m, k), np.float32)
    xt[:, k - tail :] = rng.standard_normal((m, tail))
    c = 2.0**-6  # amax = 127 / 64 ~ 2: the magnitude of a normal draw
    xi = (rng.integers(-100, 100, (m, k)) + 0.5) * c
    xi[np.arange(m), np.arange(m) % k] = 127 * c * np.where(np.arange(m) % 2, -1, 1)
    out = [mx.array(xt).astype(dtype), mx.array(xi.astype(np.float32)).astype(dtype)]
    mx.eval(out)
    return out


def _with_weight(problem: Problem, xs: list[mx.array], seed: int, weight: Any) -> list[tuple]:
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


def weight_nbytes(weight: Any) -> int:
    """Bytes of a ``QuantizedWeight`` (codes, scales, biases) or of an int8 array."""
    if isinstance(weight, mx.array):
        return weight.nbytes
    return weight.q.nbytes + weight.scales.nbytes + weight.biases.nbytes


def weight_copies(weight: Any, copies: int) -> list:
    """``copies`` weights equal to ``weight`` in distinct memory (the first is ``weight``).

    A model streams each layer's weight from DRAM once per forward pass; a timing loop
    that calls one weight again and again finds it in the last-level cache (an H200's
    L2 holds a 4096 x 4096 int8 weight three times over) and favours whichever kernel
    is best at cache bandwidth. Rotating through copies whose total exceeds the cache
    times what a model sees. ``x + 0`` makes a new buffer with the same values (the
    dtype is kept: a Python ``0`` is a weak scalar).
    """
    out = [weight]
    for _ in range(copies - 1):
        if isinstance(weight, mx.array):
            out.append(weight + 0)
        else:
            out.append(
                attrs.evolve(
                    weight, q=weight.q + 0, scales=weight.scales + 0, biases=weight.biases + 0,
                    per_channel=weight.per_channel,
                )
            )
    mx.eval([w if isinstance(w, mx.array) else (w.q, w.scales, w.biases) for w in out])
    return out


def operands(
    problem: Problem, variants: int = 2, seed: int = 0, weight: Any = None
) -> list[tuple]:
    """Argument tuples for a candidate's ``run`` (signatures: ``kernels.registry``).

    Args:
        problem: the work.
        variants: how many activation inputs (pattern, then seeded random ones), so a
            timing loop can rotate through them.
        seed: seed of the random draws and of the synthetic weight.
        weight: the weight to use (a ``QuantizedWeight`` for ``linear``, an ``[N, K]``
            int8 array for ``int8_matmul``); synthesized when ``None``. All tuples share
            it (:func:`cycle_weights` spreads them over copies).

    Returns:
        ``variants`` tuples: ``(x, weight, bias)`` for ``linear``, ``(a, b)`` for
        ``int8_matmul``, ``(x, group_size)`` for ``quantize_activation``.
    """
    return _with_weight(problem, activations(problem, variants, seed), seed, weight)


def cycle_weights(inputs: list[tuple], weights: int) -> list[tuple]:
    """``inputs`` (tuples ``(x, weight, ...)`` sharing one weight) extended to cycle
    through ``weights`` copies of the weight (:func:`weight_copies`): ``max(len(inputs),
    weights)`` tuples, tuple ``i`` holding activation ``i % len(inputs)`` and copy
    ``i % weights``."""
    if weights <= 1:
        return inputs
    copies = weight_copies(inputs[0][1], weights)
    n = len(inputs)
    return [
        (inputs[i % n][0], copies[i % weights], *inputs[i % n][2:])
        for i in range(max(n, weights))
    ]


def gate_operands(problem: Problem, seed: int = 0, weight: Any = None) -> list[tuple]:
    """The gate's argument tuples, named by :func:`input_name`: the pattern, a random
    draw, then :func:`probes`. Same weight (and bias) as :func:`operands` with the same
    ``seed`` and ``weight``."""
    xs = activations(problem, 2, seed) + probes(problem, seed)
    return _with_weight(problem, xs, seed, weight)


def input_name(problem: Problem, index: int) -> str:
    """The name of gate input ``index`` (``"input <i>"`` past the known ones)."""
    names = INT8_INPUT_NAMES if problem.op == "int8_matmul" else INPUT_NAMES
    return names[index] if index < len(names) else f"input {index}"


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
        in bfloat16 terms (``inf`` when an output is non-finite or shapes differ;
        where the device screen decides, the float32 rounding of that value),
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
        r32, c32 = r.astype(mx.bfloat16).astype(mx.float32), c.astype(mx.bfloat16).astype(mx.float32)
        if r32.size == 0:
            continue
        err32 = mx.abs(c32 - r32)
        clear = mx.all(mx.isfinite(r32) & mx.isfinite(c32)
                       & (err32 <= mx.maximum(atol, rtol * mx.abs(r32)) * _CLEAR_STAGE1))
        part_worst = mx.max(err32)
        mx.eval(clear, part_worst)
        if clear.item():  # every element clearly within its limit (docstring: screens)
            worst = max(worst, float(part_worst.item()))
            continue
        rn = np.array(r32).astype(np.float64)
        cn = np.array(c32).astype(np.float64)
        err = np.abs(cn - rn)
        limit = np.maximum(atol, rtol * np.abs(rn))
        finite = np.isfinite(rn) & np.isfinite(cn)
        err = np.where(finite, err, np.inf)
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


@attrs.frozen(eq=False)
class Bound:
    """``2 gamma(n) T`` (:func:`w8a8_bound`): ``t``, the ``[M, N]`` float32 sums ``T`` on
    the device, times ``factor``."""

    t: mx.array
    factor: float

    def host(self) -> np.ndarray:
        """The bound in float64 on the host (``[M, N]``)."""
        return np.array(self.t).astype(np.float64) * self.factor


def w8a8_bound(x: mx.array, weight: QuantizedWeight, bias: mx.array | None,
               act_scales: str = "token", form: str = "epilogue") -> Bound:
    """``2 gamma(n) T``: how far two correct float32 W8A8 epilogues may differ (module
    docstring), ``[M, N]``, before any rounding to a 16-bit output dtype.

    Args:
        x: ``[M, K]`` float activation; weight: the ``[N, K]`` weight; bias: ``[N]``.
        act_scales: the problem's activation scaling: with ``"group"`` each code is
            weighed by its own group's scale ``t_mg`` in ``T`` (``docs/numerics.md``).
        form: the challenger's ``Candidate.bound_form``: ``"subnormal"`` (grouped and
            4-bit weights, per-token scales) allows ``gamma(2G + 4) T`` for the
            reference and ``gamma(n_s) T_s`` for the challenger, the subnormal
            promotion's own bound over its unsigned terms (:func:`subnormal_terms_sum`).
    """
    from ..kernels.reference import quantize_groups, quantize_rows  # the exact codes, scales

    n, k, gs = weight.n, weight.k, weight.group_size
    if act_scales == "group":
        q, t_g, _ = quantize_groups(x, gs)
        m = q.shape[0]
        # |q_mk| t_mg: the scale moves inside the sum over k (one per group of k).
        q = (mx.abs(q.astype(mx.float32)).reshape(m, k // gs, gs) * mx.abs(t_g)[..., None])
        q, scale = q.reshape(m, k), mx.array(1.0)
    else:
        q, scale, _ = quantize_rows(x)
    groups = k // gs
    if weight.bits == 4:  # c = q in [0, 15], offset b (docs/numerics.md, W4A8 linear)
        codes = weight.codes().astype(mx.float32).reshape(n, groups, gs)
        off = mx.abs(weight.biases.astype(mx.float32))[..., None]
    else:
        codes = mx.abs(weight.int8().astype(mx.float32)).reshape(n, groups, gs)
        off = mx.abs(weight.group_offsets)[..., None]
    s = mx.abs(weight.scales.astype(mx.float32))[..., None]
    w_abs = (codes * s + off).reshape(n, k)
    t = mx.matmul(mx.abs(q.astype(mx.float32)), w_abs.T) * mx.abs(scale)
    if bias is not None:
        t = t + mx.abs(bias.astype(mx.float32))
    rounds = 4 if weight.per_channel else 2 * groups + 4
    # T is itself a float32 matmul of non-negative terms (relative error <= gamma(K + 2)),
    # whose inputs MLX may round to TF32 (11 significant bits, MLX_ENABLE_TF32): 2^-9
    # covers both roundings of each product.
    factor = (1.0 + gamma(k + 2)) * (1.0 + 2.0**-9)
    if form == "subnormal":
        if weight.per_channel or act_scales != "token":
            raise ValueError("[mlx_w8a8.w8a8_bound] the subnormal form's bound is of grouped "
                             "weights and per-token scales, got per_channel="
                             f"{weight.per_channel}, act_scales={act_scales!r}")
        t_s = subnormal_terms_sum(q, scale, weight, bias)
        return Bound(gamma(rounds) * t + gamma(subnormal_rounds(weight)) * t_s, factor)
    if form != "epilogue":
        raise ValueError(f"[mlx_w8a8.w8a8_bound] form must be 'epilogue' or 'subnormal', got "
                         f"{form!r}")
    return Bound(t, 2.0 * gamma(rounds) * factor)


def subnormal_rounds(weight: QuantizedWeight) -> int:
    """``n_s`` of the subnormal promotion (``docs/numerics.md``): with ``G`` groups in
    offset blocks of ``GB`` (``kernels.cuda.tiles.sub_groups``), each product exact, the
    ``G + blocks (2 GB + 3)`` terms summed in any order with every addition counted twice
    (the tensor core's accumulation is not specified to round to nearest), ``GB`` more
    for a block constant's float32 sum, the sum of the group terms' and the offsets'
    sets, the row scale and the bias."""
    from ..kernels.cuda.tiles import sub_groups  # the kernel's block size

    groups, gb = weight.k // weight.group_size, sub_groups(weight.group_size)
    blocks = -(-groups // gb)
    return 2 * (groups + blocks * (2 * gb + 3)) + gb + 5


def subnormal_terms_sum(q: mx.array, scale: mx.array, weight: QuantizedWeight,
                        bias: mx.array | None) -> mx.array:
    """``T_s``, ``[M, N]`` float32: the subnormal promotion's terms made positive,
    ``|t_m| (sum_k (a_mk + 128) q_nk |s_ng(k)| + sum_g |A_mg| |b_ng| + 128 sum_k q_nk
    |s_ng(k)|) + |bias_n|`` for the activation codes ``a`` (``q`` here) with scales
    ``t`` (``scale``), the stored codes ``q_nk`` and their group sums ``A_mg``."""
    n, k, gs = weight.n, weight.k, weight.group_size
    m = q.shape[0]
    codes = weight.codes().astype(mx.float32).reshape(n, k // gs, gs)
    qs = (codes * mx.abs(weight.scales.astype(mx.float32))[..., None]).reshape(n, k)
    a = q.astype(mx.float32)
    sums = mx.abs(a.reshape(m, k // gs, gs).sum(axis=-1))
    t_s = (mx.matmul(a + 128.0, qs.T) + mx.matmul(sums, mx.abs(weight.biases.astype(mx.float32)).T)
           + 128.0 * qs.sum(axis=1)[None, :]) * mx.abs(scale)
    if bias is not None:
        t_s = t_s + mx.abs(bias.astype(mx.float32))
    return t_s


def _ulp(values: np.ndarray, dtype: str) -> np.ndarray:
    """One unit in the last place of ``dtype`` at ``|values|`` (0 for float32, whose
    rounding the float32 bound already counts)."""
    bits = _SIGNIFICAND.get(dtype)
    if bits is None:
        return np.zeros_like(values)
    _, exponent = np.frexp(np.abs(values))
    tiny = 2.0 ** (-24 if dtype == "float16" else -133)  # the smallest subnormal
    return np.maximum(np.ldexp(1.0, exponent - bits), tiny)


def _ulp_device(values: mx.array, dtype: str) -> mx.array:
    """:func:`_ulp` on the device for non-negative float32 ``values``, exactly: frexp's
    exponent from the exponent bits (``E - 126`` for normal numbers), the unit built as
    a float32 from bits; subnormal and zero inputs give the floor (as frexp's smaller
    exponents do; at zero both sides are zero, so the limit does not matter)."""
    bits = _SIGNIFICAND.get(dtype)
    if bits is None:
        return mx.zeros_like(values)
    biased = (values.view(mx.uint32) >> 23) & 0xFF  # E
    unit = biased.astype(mx.int32) + (1 - bits)  # (E - 126 - bits) + 127
    ulp = mx.where(unit >= 1, (mx.maximum(unit, 1).astype(mx.uint32) << 23).view(mx.float32), 0.0)
    tiny = 2.0 ** (-24 if dtype == "float16" else -133)
    return mx.maximum(ulp, tiny)


def compare_w8a8(
    exact: mx.array, candidate: mx.array, bound: Bound, dtype: str
) -> tuple[bool, float, str]:
    """Stage 2, elementwise: ``|c - e| <= bound + ulp_dtype(max(|c|, |e|))``.

    Args:
        exact: the ``exact`` candidate's output; candidate: the challenger's.
        bound: :func:`w8a8_bound` of the same operands.
        dtype: the output dtype name (its rounding adds one ulp).

    Returns:
        ``(passed, worst_excess, detail)``: ``worst_excess`` is the largest
        ``|c - e| / limit`` (``inf`` for non-finite or mismatched outputs).
    """
    if tuple(exact.shape) != tuple(candidate.shape):
        return False, math.inf, (
            f"shape {tuple(candidate.shape)}, the exact kernel {tuple(exact.shape)}"
        )
    e32, c32 = exact.astype(mx.float32), candidate.astype(mx.float32)
    if e32.size == 0:
        return True, 0.0, ""
    err32 = mx.abs(c32 - e32)
    limit32 = bound.t * bound.factor + _ulp_device(mx.maximum(mx.abs(e32), mx.abs(c32)), dtype)
    clear = mx.all(mx.isfinite(e32) & mx.isfinite(c32) & (err32 <= limit32 * _CLEAR_STAGE2))
    excess32 = mx.max(mx.where(err32 == 0, 0.0, err32 / limit32))
    mx.eval(clear, excess32)
    if clear.item():  # every element clearly within its limit (module docstring: screens)
        return True, float(excess32.item()), ""
    en = np.array(e32).astype(np.float64)
    cn = np.array(c32).astype(np.float64)
    finite = np.isfinite(en) & np.isfinite(cn)
    if not finite.all():
        i = np.unravel_index(int(np.argmin(finite)), en.shape)
        return False, math.inf, (
            f"element {tuple(int(v) for v in i)}: {cn[i]} vs exact {en[i]} (not finite)"
        )
    b64 = bound.host()
    limit = b64 + _ulp(np.maximum(np.abs(en), np.abs(cn)), dtype)
    err = np.abs(cn - en)
    with np.errstate(divide="ignore", invalid="ignore"):
        excess = np.where(err == 0, 0.0, err / limit)
    i = np.unravel_index(int(np.argmax(excess)), err.shape)
    worst = float(excess[i])
    if worst <= 1.0:
        return True, worst, ""
    return False, worst, (
        f"element {tuple(int(v) for v in i)}: {cn[i]:.8g} vs exact {en[i]:.8g}, "
        f"|c - e| = {err[i]:.3g} > {limit[i]:.3g} (float32 epilogue bound "
        f"{b64[i]:.3g} + one {dtype} ulp)"
    )


def sqnr_db(reference: mx.array, candidate: mx.array) -> float:
    """``10 log10(sum r^2 / sum (c - r)^2)`` (``inf`` when equal): squares summed per row
    in float32 on the device, the rows in float64."""
    r = reference.astype(mx.float32)
    r = r.reshape(-1, r.shape[-1]) if r.ndim else r.reshape(1, 1)
    d = candidate.astype(mx.float32).reshape(r.shape) - r
    rows = mx.stack([mx.sum(d * d, axis=-1), mx.sum(r * r, axis=-1)])
    noise, signal = (float(v) for v in np.array(rows).astype(np.float64).sum(axis=1))
    if not math.isfinite(noise):
        return -math.inf
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def run_gate(
    problem: Problem,
    reference: Candidate,
    challengers: Sequence[Candidate],
    inputs: Sequence[tuple],
    atol: float = ATOL,
    rtol: float = RTOL,
    reference_dtype: str | None = None,
    exact: Candidate | None = None,
    min_sqnr_db: float = MIN_SQNR_DB,
) -> dict[str, GateResult]:
    """Gate every challenger against the references on every input tuple.

    Args:
        problem: the work (its op picks exact or tolerance comparison).
        reference: the candidate of stage 1 (``mlx_qmm`` for ``linear``, ``mlx_qmm4``
            for a 4-bit ``linear``, ``exact`` for the exact ops).
        challengers: the others; the reference may be among them (it passes).
        inputs: argument tuples for ``run`` (see :func:`gate_operands`); every one is
            gated.
        atol, rtol: stage 1's tolerance for ``linear``.
        reference_dtype: ``None`` (default) runs the stage-1 reference on the inputs as
            they are; ``"float32"`` runs it on the activation upcast to float32 (same
            stored weights) and rounds its output back to the problem's dtype, so the
            truth is not limited by the reference's own low-precision accumulation
            (``linear`` only; e.g. ``mx.quantized_matmul`` on MLX's CPU in bfloat16).
        exact: ``linear`` only: the W8A8 truth of stage 2 (default: the registered
            exact candidate of the format, ``exact`` or ``exact_w4a8``:
            ``registry.exact_name``). Stage 2 runs for challengers with ``w8a8=True``.
        min_sqnr_db: stage 2's SQNR floor against the stage-1 reference.

    Returns:
        ``{name: GateResult}`` for the reference and every challenger.

    Raises:
        RuntimeError: if a reference raises (then nothing can be gated; the tuner
            abandons).
    """
    exact_op = problem.op in EXACT_OPS
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

    def reference_failed(cand: Candidate, error: Exception) -> RuntimeError:
        return RuntimeError(
            f"[mlx_w8a8.tuning.{problem.op}] reference candidate {cand.name!r} failed: "
            f"{type(error).__name__}: {error}"
        )

    staged = problem.op == "linear" and any(c.w8a8 for c in challengers)
    if staged:
        exact = exact if exact is not None else registry.get(
            problem.op, registry.exact_name(problem))

    def reject(name, stage, worst, index, why, against):
        detail = f"input {index} ({input_name(problem, index)}): {why}"
        log.warning(
            "[mlx_w8a8.tuning] %s: rejected numerically incompatible candidate %r "
            "(stage %d, against %r): %s", describe(problem), name, stage, against, detail,
        )
        return GateResult(name, "rejected", worst, detail, stage)

    # One input at a time (its truths, then every challenger still in the race), so
    # only one input's outputs and bound are held: [M, N] each, large at prefill M.
    pending = [c for c in challengers if c.name != reference.name]
    worst = {c.name: 0.0 for c in pending}
    lowest: dict[str, float | None] = {c.name: None for c in pending}
    verdicts: dict[str, GateResult] = {}
    for index, args in enumerate(inputs):
        pending = [c for c in pending if c.name not in verdicts]
        try:  # even with no challenger left: a reference that fails here is reported
            ref_out = run_reference(args)
            mx.eval(ref_out)
        except Exception as error:
            raise reference_failed(reference, error) from error
        exact_out = None
        bounds: dict[str, Bound] = {}  # by Candidate.bound_form, made on first use
        if staged and any(c.w8a8 for c in pending):
            try:
                exact_out = exact.run(*args)
                mx.eval(exact_out)
            except Exception as error:
                raise reference_failed(exact, error) from error
        for cand in pending:
            name = cand.name
            try:
                out = cand.run(*args)
                mx.eval(out)
            except Exception as error:
                detail = f"raised {type(error).__name__}: {error}"
                log.warning(
                    "[mlx_w8a8.tuning] %s: candidate %r is unavailable (%s); skipped",
                    describe(problem), name, detail,
                )
                verdicts[name] = GateResult(name, "unavailable", math.inf, detail)
                continue
            passed, err, why = compare(ref_out, out, atol, rtol, exact_op)
            worst[name] = max(worst[name], err)
            if not passed:
                verdicts[name] = reject(name, 1, worst[name], index, why, reference.name)
                continue
            if exact_out is None or not cand.w8a8:
                continue
            form = cand.bound_form
            if form not in bounds:
                bounds[form] = w8a8_bound(*args, problem.act_scales, form)
            passed, _, why = compare_w8a8(exact_out, out, bounds[form], problem.dtype)
            if not passed:
                verdicts[name] = reject(name, 2, worst[name], index, why, exact.name)
                continue
            db = sqnr_db(ref_out, out)
            lowest[name] = db if lowest[name] is None else min(lowest[name], db)
            if db < min_sqnr_db:
                why = f"SQNR {db:.1f} dB against {reference.name!r} < {min_sqnr_db} dB"
                verdicts[name] = reject(name, 2, worst[name], index, why, reference.name)
    results = {reference.name: GateResult(reference.name, "ok", 0.0)}
    for cand in challengers:
        if cand.name == reference.name:
            continue
        verdict = verdicts.get(cand.name) or GateResult(cand.name, "ok", worst[cand.name])
        results[cand.name] = attrs.evolve(verdict, sqnr_db=lowest[cand.name])
    return results


def describe(problem: Problem) -> str:
    """A one-line description of ``problem`` for logs."""
    gs = f" gs={problem.group_size}" if problem.group_size else ""
    return (
        f"{problem.op} M={problem.m} N={problem.n} K={problem.k} {problem.dtype} "
        f"{problem.weight_format}{gs}"
    )
