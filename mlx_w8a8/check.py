"""Self-check of this machine: ``python -m mlx_w8a8.check``.

Prints the MLX version, the default device and ``mx.device_info()``, each kernel
backend (loaded, or why it failed to import), the Metal capabilities with their reasons
(NAX on or off and why), then runs every candidate available here, for every op, on a
few small shapes with tails against a float64 / exact int64 numpy check and prints
``ok`` or ``FAIL`` per candidate. Exits with status 1 if any candidate fails, 0
otherwise. Seconds on a CPU; the first command to run on a new machine.

What each candidate is checked against:

- ``int8_matmul``: exact int64 ``a @ b.T`` (bit-exact).
- ``quantize_activation``: the per-token contract of ``docs/numerics.md`` (codes, scales
  and row sums bit-exact).
- ``linear``: on 8-bit weights (per-channel and group-wise) the W8A8 math, on MLX's
  4-bit weights (``grouped4``) the W4A8 math, in float64 (activations quantized per
  token, exact integer products) within the float32 epilogue bound plus half an ulp of
  the output dtype; the candidates that take float activations (``mlx_qmm``, and
  ``mlx_qmm4`` at 4 bits: W8A16 / W4A16) against ``x @ dequantized(w).T``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable

import mlx.core as mx
import numpy as np

from . import kernels
from .kernels import registry
from .weight import QuantizedWeight

HALF_ULP = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
F32_RTOL = 1e-5  # float32 epilogue bound, relative to sum |x| |w| (docs/numerics.md)

# Shapes: (M, N, K). Each has a tail somewhere: M = 1 (decode), M = 33 and N = 70 one
# past or short of power-of-two tiles, K not a multiple of 32 where the op allows it.
INT8_SHAPES = [(1, 40, 64), (33, 70, 100), (5, 3, 7)]
QUANT_SHAPES = [(5, 96, None), (3, 128, 32), (1, 300, None)]
LINEAR_CASES = [  # (M, N, K, dtype, weight format, group_size, bias)
    (1, 40, 96, "float32", "per_channel", 32, True),
    (33, 70, 128, "bfloat16", "per_channel", 64, False),
    (6, 24, 256, "float16", "grouped", 128, True),
    (17, 40, 192, "float32", "grouped", 64, False),
    # MLX's 4-bit format: decode (M = 1), an odd M and N past a tile, every group size
    (1, 40, 96, "float32", "grouped4", 32, True),
    (33, 70, 256, "bfloat16", "grouped4", 128, False),
    (6, 24, 192, "float16", "grouped4", 64, True),
]
FORMATS = ("per_channel", "grouped", "grouped4")  # the linear weight formats checked
# The same with activation groups (act_scales="group"): 8-bit and 4-bit group-wise.
ACT_GROUP_CASES = [
    (6, 24, 192, "bfloat16", "grouped", 64, True),
    (33, 70, 256, "float32", "grouped4", 128, False),
]


# ---------------------------------------------------------------------------------------
# The numpy oracle.
# ---------------------------------------------------------------------------------------
def quantize_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-token int8 codes and float32 scales of ``x``, bit-exact to the contract of
    ``docs/numerics.md`` (the tests' oracle too: ``tests/oracle.py``).

    Args:
        x: ``[M, K]`` float (the values the kernel sees, already in float32 terms).

    Returns:
        ``(q, scale)``: ``[M, K]`` int8 and ``[M, 1]`` float32 (a row with a NaN or
        infinity: scale NaN, codes 0; an all-zero row: codes 0).
    """
    xf = x.astype(np.float32)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        amax = np.max(np.abs(xf), axis=1, keepdims=True)
        finite = np.isfinite(amax)
        scale = np.where(finite, amax / np.float32(127), np.float32(np.nan)).astype(np.float32)
        usable = finite & (amax > 0)
        safe = np.where(usable, scale, np.float32(1)).astype(np.float32)
        q = np.where(usable, np.clip(np.rint(xf / safe), -127, 127), 0).astype(np.int8)
    return q, scale


def host(a: mx.array) -> np.ndarray:
    """Host copy of ``a``; bfloat16 goes through float32 (numpy has no bfloat16)."""
    return np.array(a.astype(mx.float32) if a.dtype == mx.bfloat16 else a)


def weight_of(rng: np.random.Generator, n: int, k: int, weight_format: str,
              group_size: int, scale: float = 1.0) -> QuantizedWeight:
    """A random ``[n, k]`` weight (normal, standard deviation ``scale``) stored in
    ``weight_format`` (``per_channel`` or ``grouped``: 8-bit affine; ``grouped4``: MLX's
    4-bit affine, ``bits=4``).

    Raises:
        ValueError: for a format not in :data:`FORMATS`.
    """
    if weight_format not in FORMATS:
        raise ValueError(f"[mlx_w8a8.check] weight format must be one of {FORMATS}, "
                         f"got {weight_format!r}")
    w = mx.array(rng.standard_normal((n, k)).astype(np.float32) * np.float32(scale))
    if weight_format == "grouped4":
        return QuantizedWeight.from_float(w, group_size=group_size, per_channel=False, bits=4)
    return QuantizedWeight.from_float(w, group_size=group_size,
                                      per_channel=weight_format == "per_channel")


def linear_w4a8(x: np.ndarray, w: QuantizedWeight, bias) -> tuple[np.ndarray, np.ndarray]:
    """``(y, bound)`` of the W4A8 math in float64 for float32 activation values ``x``
    and a 4-bit weight ``w``: ``y_mn = t_m sum_g (s_ng sum_k a_mk q_nk + b_ng sum_k a_mk)``
    (unsigned codes ``q`` in [0, 15], exact int64 sums per group)."""
    if w.bits != 4:
        raise ValueError(f"[mlx_w8a8.check] linear_w4a8 takes a 4-bit weight, got bits={w.bits}")
    return _grouped_math(x, w, bias, shift=0)


def linear_w8a8(x: np.ndarray, w: QuantizedWeight, bias) -> tuple[np.ndarray, np.ndarray]:
    """``(y, bound)`` of the W8A8 math in float64 for float32 activation values ``x``:
    ``y_mn = t_m sum_g (s_ng sum_k a_mk (q_nk - 128) + (b_ng + 128 s_ng) sum_k a_mk)``."""
    if w.bits != 8:
        raise ValueError(f"[mlx_w8a8.check] linear_w8a8 takes an 8-bit weight, got bits={w.bits}")
    return _grouped_math(x, w, bias, shift=128)


def linear_act_groups(x: np.ndarray, w: QuantizedWeight, bias) -> tuple[np.ndarray, np.ndarray]:
    """``(y, bound)`` of the math with activation groups (``act_scales="group"``), 8-bit
    or 4-bit group-wise ``w``: ``y_mn = sum_g t_mg (s_ng sum_k a_mk c_nk + o_ng sum_k a_mk)``
    with one activation scale ``t_mg`` per token and group."""
    return _grouped_math(x, w, bias, shift=128 if w.bits == 8 else 0, act_groups=True)


def _grouped_math(x: np.ndarray, w: QuantizedWeight, bias, shift: int, act_groups: bool = False):
    """The per-group integer math of both: codes ``q - shift`` against the per-token
    activation codes (or, with ``act_groups``, per token and group: each group quantized
    as a row), exact int64 sums per group, offsets ``b + shift s``; the bound is the
    float32 epilogue's, relative to ``sum |x| |w|``."""
    gs = w.group_size
    groups = x.shape[1] // gs
    m = x.shape[0]
    if act_groups:
        q, t = quantize_rows(x.reshape(m * groups, gs))
        q, t = q.reshape(m, groups * gs), t.reshape(m, groups, 1).astype(np.float64)
    else:
        q, scale = quantize_rows(x)
        t = np.repeat(scale.astype(np.float64)[:, :, None], groups, axis=1)  # [M, G, 1]
    codes = np.array(w.codes()).astype(np.int64)
    s = host(w.scales).astype(np.float64)
    b = host(w.biases).astype(np.float64)
    qg = q.astype(np.int64).reshape(m, groups, gs)
    wg = (codes - shift).reshape(codes.shape[0], groups, gs)
    per_group = np.einsum("mgk,ngk->mng", qg, wg).astype(np.float64)
    sums = qg.sum(-1).astype(np.float64)
    with np.errstate(invalid="ignore"):
        y = np.einsum("mg,mng->mn", t[:, :, 0],
                      per_group * s[None] + sums[:, None, :] * (b + shift * s)[None])
        w_deq = np.repeat(s, gs, axis=1) * codes + np.repeat(b, gs, axis=1)
        magnitude = (np.abs(qg.astype(np.float64)) * np.abs(t)).reshape(m, groups * gs) @ np.abs(w_deq).T
    if bias is not None:
        y = y + bias[None, :]
        magnitude = magnitude + np.abs(bias)[None, :]
    return y, F32_RTOL * magnitude


def linear_w8a16(x: np.ndarray, w: QuantizedWeight, bias) -> tuple[np.ndarray, np.ndarray]:
    """``(y, bound)`` of ``x @ dequantized(w).T`` in float64 (``mlx_qmm``'s math; at 4
    bits ``mlx_qmm4``'s, W4A16)."""
    w_deq = host(mx.dequantize(w.q, w.scales, w.biases, w.group_size, w.bits)).astype(np.float64)
    y = x.astype(np.float64) @ w_deq.T
    magnitude = np.abs(x.astype(np.float64)) @ np.abs(w_deq).T
    if bias is not None:
        y = y + bias[None, :]
        magnitude = magnitude + np.abs(bias)[None, :]
    return y, 1e-4 * magnitude  # MLX's own kernels, inputs rounded to the activation dtype


def within(got: np.ndarray, want: np.ndarray, bound: np.ndarray, dtype: str) -> str | None:
    """None if ``got`` matches, else a one-line description of the worst element."""
    if got.shape != want.shape:
        return f"shape {got.shape}, expected {want.shape}"
    nan = np.isnan(want)
    if not np.array_equal(np.isnan(got), nan):
        return "NaN pattern differs"
    err = np.abs(got - want)
    allow = bound + HALF_ULP[dtype] * np.abs(want)
    bad = (err > allow) & ~nan
    if bad.any():
        i = np.unravel_index(np.argmax(np.where(bad, err - allow, -np.inf)), got.shape)
        return f"at {tuple(int(v) for v in i)}: got {got[i]!r}, want {want[i]!r} (allowed {allow[i]:.3g})"
    return None


# ---------------------------------------------------------------------------------------
# Cases: (problem, call(candidate) -> error or None).
# ---------------------------------------------------------------------------------------
Case = tuple[registry.Problem, Callable[[registry.Candidate], "str | None"]]


def int8_cases(rng: np.random.Generator) -> list[Case]:
    cases = []
    for m, n, k in INT8_SHAPES:
        a = rng.integers(-128, 128, (m, k), dtype=np.int8)
        b = rng.integers(-128, 128, (n, k), dtype=np.int8)
        want = a.astype(np.int64) @ b.astype(np.int64).T

        def call(c, a=a, b=b, want=want):
            got = np.array(c.run(mx.array(a), mx.array(b)))
            return None if np.array_equal(got, want) else f"{int((got != want).sum())} of {want.size} differ"

        cases.append((registry.Problem("int8_matmul", m, n, k, "int8", "int8"), call))
    return cases


def activations(rng: np.random.Generator, m: int, k: int) -> np.ndarray:
    x = (rng.standard_normal((m, k)) * np.exp(rng.uniform(-2, 2, (m, 1)))).astype(np.float32)
    if m > 1:
        x[1] = 0.0  # an all-zero row: scale 0, codes 0
    return x


def quantize_cases(rng: np.random.Generator) -> list[Case]:
    cases = []
    for m, k, gs in QUANT_SHAPES:
        x = activations(rng, m, k)
        q_want, s_want = quantize_rows(x)

        def call(c, x=x, gs=gs, q_want=q_want, s_want=s_want):
            q, s, rs = c.run(mx.array(x), gs)
            if not np.array_equal(np.array(q), q_want):
                return "codes differ"
            if not np.array_equal(np.array(s).reshape(s_want.shape), s_want, equal_nan=True):
                return "scales differ"
            if gs is not None:
                rs_want = q_want.astype(np.int64).reshape(q_want.shape[0], -1, gs).sum(-1)
                if rs is None or not np.array_equal(np.array(rs), rs_want):
                    return "row sums differ"
            return None

        cases.append((registry.Problem("quantize_activation", m, 0, k, "float32", "int8", gs), call))
    return cases


def linear_cases(rng: np.random.Generator) -> list[Case]:
    cases = []
    both = [(*c, "token") for c in LINEAR_CASES] + [(*c, "group") for c in ACT_GROUP_CASES]
    for m, n, k, dtype, fmt, gs, with_bias, acts in both:
        xm = mx.array(activations(rng, m, k)).astype(getattr(mx, dtype))
        x = host(xm)
        w = weight_of(rng, n, k, fmt, gs)
        bias = rng.standard_normal(n).astype(np.float32) if with_bias else None
        # the integer-activation math: W4A8 on 4-bit codes, W8A8 on 8-bit ones; with
        # activation groups, one scale per token and group
        math = (linear_act_groups if acts == "group"
                else linear_w4a8 if fmt == "grouped4" else linear_w8a8)
        exact = math(x, w, bias)
        floats = linear_w8a16(x, w, bias)

        def call(c, xm=xm, w=w, bias=bias, dtype=dtype, exact=exact, floats=floats):
            y = c.run(xm, w, None if bias is None else mx.array(bias))
            if y.dtype != xm.dtype:
                return f"output dtype {y.dtype}, expected {xm.dtype}"
            # w8a8=False: the candidate multiplies the float activations as they are
            want, bound = exact if c.w8a8 else floats
            return within(host(y).astype(np.float64), want, bound, dtype)

        cases.append((registry.Problem("linear", m, n, k, dtype, fmt, gs, with_bias, acts), call))
    return cases


# ---------------------------------------------------------------------------------------
# Report.
# ---------------------------------------------------------------------------------------
def environment() -> list[str]:
    lines = [f"mlx {mx.__version__}; default device {mx.default_device()}"]
    try:
        info = mx.device_info()
        lines.append("device: " + ", ".join(f"{k}={v}" for k, v in sorted(info.items())))
    except Exception as error:
        lines.append(f"device: mx.device_info() failed ({type(error).__name__}: {error})")
    for name, probe in (("metal", lambda: mx.metal.is_available()), ("cuda", lambda: mx.cuda.is_available())):
        try:
            built = bool(probe())
        except Exception:
            built = False
        lines.append(f"MLX {name} backend: {'present' if built else 'absent'}")
    registered: dict[str, int] = {}
    usable: dict[str, int] = {}
    for c in registry.all_candidates():
        registered[c.backend] = registered.get(c.backend, 0) + 1
        try:
            usable[c.backend] = usable.get(c.backend, 0) + bool(c.available())
        except Exception:  # a broken capability probe counts as unavailable
            pass
    for backend in ("cuda", "metal"):
        reason = kernels.UNAVAILABLE.get(backend)
        if reason:
            lines.append(f"kernels {backend}: FAILED to import: {reason}")
        else:
            lines.append(f"kernels {backend}: imported, {registered.get(backend, 0)} candidates registered, "
                         f"{usable.get(backend, 0)} available here")
    for cap, (on, why) in kernels.capabilities().items():
        lines.append(f"capability {cap}: {'on' if on else 'off'} ({why})")
    return lines


def run_checks(seed: int = 0, out=print, verdicts: dict | None = None) -> int:
    """Check every available candidate; returns the number of failures.

    Args:
        verdicts: if given, filled with ``{op: {name: {"backend", "ok", "shapes", "errors"}}}``.
    """
    rng = np.random.default_rng(seed)
    failures = checked = 0
    for op, cases in (("quantize_activation", quantize_cases(rng)), ("int8_matmul", int8_cases(rng)),
                      ("linear", linear_cases(rng))):
        results: dict[str, list[str]] = {}
        backend_of: dict[str, str] = {}
        for problem, call in cases:
            for cand in registry.candidates(problem):
                backend_of[cand.name] = cand.backend
                try:
                    error = call(cand)
                except Exception as exc:  # a crashing candidate is a failure, not a crash of the check
                    error = f"raised {type(exc).__name__}: {str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''}"
                shape = f"M={problem.m} N={problem.n} K={problem.k} {problem.dtype} {problem.weight_format}"
                results.setdefault(cand.name, []).append(None if error is None else f"{shape}: {error}")
        for name in sorted(results):
            errors = [e for e in results[name] if e is not None]
            checked += 1
            status = "ok" if not errors else "FAIL"
            out(f"  {status:4}  {op:20} {name:32} [{backend_of[name]}] {len(results[name])} shapes")
            for e in errors:
                out(f"        {e}")
            failures += bool(errors)
            if verdicts is not None:
                verdicts.setdefault(op, {})[name] = {"backend": backend_of[name], "ok": not errors,
                                                     "shapes": len(results[name]), "errors": errors}
    out(f"{checked} candidates checked, {failures} failed")
    return failures


# ---------------------------------------------------------------------------------------
# The report an M-series (or any) owner sends back.
# ---------------------------------------------------------------------------------------
# (M, N, K) of a Llama-3-8B-sized linear layer: decode, small batch, prefill.
REPORT_SHAPES = [(1, 4096, 4096), (16, 4096, 4096), (128, 4096, 4096), (512, 4096, 4096), (512, 14336, 4096)]
REPORT_GROUP_SIZE = 64


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """``"1x4096x4096,128x4096x4096"`` -> ``[(1, 4096, 4096), (128, 4096, 4096)]``.

    Raises:
        ValueError: a shape that is not three positive integers with K a multiple of 64.
    """
    shapes = []
    for part in text.split(","):
        try:
            m, n, k = (int(v) for v in part.strip().lower().split("x"))
        except ValueError:
            raise ValueError(f"[mlx_w8a8.check] --report-shapes: {part!r} is not MxNxK") from None
        if min(m, n, k) < 1 or k % REPORT_GROUP_SIZE:
            raise ValueError(f"[mlx_w8a8.check] --report-shapes: {part!r} needs positive sizes and K a multiple "
                             f"of {REPORT_GROUP_SIZE}")
        shapes.append((m, n, k))
    return shapes


def time_shape(m: int, n: int, k: int, dtype: str = "bfloat16", pairs: int = 10, seed: int = 0,
               weight_format: str = "per_channel", act_scales: str = "token") -> dict:
    """Paired median time of every ``linear`` candidate available here for a layer of
    ``(m, n, k)`` with weights in ``weight_format`` (``per_channel``: W8A8 per-channel;
    ``grouped``: group-wise 8-bit; ``grouped4``: MLX's 4-bit format) and activation
    scaling ``act_scales`` against the format's reference (``registry.fallback_name``:
    ``mlx_qmm``, or ``mlx_qmm4`` at 4 bits, both ``mx.quantized_matmul``)."""
    from .tuning import timing

    rng = np.random.default_rng(seed)
    w = weight_of(rng, n, k, weight_format, REPORT_GROUP_SIZE, scale=0.02)
    xs = [(mx.array(rng.standard_normal((m, k)).astype(np.float32)).astype(getattr(mx, dtype)),) for _ in range(2)]
    mx.eval(w.q, w.scales, w.biases, *[x for (x,) in xs])
    problem = registry.Problem("linear", m, n, k, dtype, weight_format, REPORT_GROUP_SIZE,
                               False, act_scales)
    cands = registry.candidates(problem)  # the fallback first
    arms = [(c.name, (lambda x, c=c: c.run(x, w, None))) for c in cands]
    result = timing.paired_measure(arms, xs, pairs=pairs)
    row = {"m": m, "n": n, "k": k, "dtype": dtype, "weight_format": weight_format,
           "group_size": REPORT_GROUP_SIZE, "has_bias": False, "reference": cands[0].name,
           "pairs": result.rounds, "chain": result.chain, "candidates": {}}
    if act_scales != "token":
        row["act_scales"] = act_scales
    for c in cands:
        t = result.timings[c.name]
        entry = {"backend": c.backend, "digest": c.digest, "status": t.status}
        if t.ok:
            entry.update(median_ns=round(t.median_ns, 1), p25_ns=round(t.p25_ns, 1), p75_ns=round(t.p75_ns, 1))
            if c.name != cands[0].name:
                ratios = result.ratios(cands[0].name, c.name)
                entry["ratio_to_reference"] = round(float(sorted(ratios)[len(ratios) // 2]), 4) if ratios else None
        elif t.detail:
            entry["detail"] = t.detail[:300]
        row["candidates"][c.name] = entry
    return row


def build_report(seed: int = 0, shapes: list[tuple[int, int, int]] | None = None, pairs: int = 10,
                 out=print, formats: tuple[str, ...] = ("per_channel",),
                 act_groups: bool = False) -> dict:
    """The report :mod:`mlx_w8a8.tuning.report` reads: this machine, each candidate's
    exactness (the self-check) and times at model shapes, one row per shape and weight
    format in ``formats`` (``per_channel``, ``grouped4``), and with ``act_groups`` one
    more per shape for each group-wise format with activation groups."""
    import datetime
    import os
    import platform

    from .tuning import report, table

    verdicts: dict = {}
    run_checks(seed, out, verdicts)
    timings = []
    for fmt in formats:
        for m, n, k in shapes if shapes is not None else REPORT_SHAPES:
            out(f"  timing linear M={m} N={n} K={k} bfloat16 {fmt} ...")
            timings.append(time_shape(m, n, k, pairs=pairs, seed=seed, weight_format=fmt))
    for fmt in ("grouped", "grouped4") if act_groups else ():
        for m, n, k in shapes if shapes is not None else REPORT_SHAPES:
            out(f"  timing linear M={m} N={n} K={k} bfloat16 {fmt}, activation groups ...")
            timings.append(time_shape(m, n, k, pairs=pairs, seed=seed, weight_format=fmt,
                                      act_scales="group"))
    try:
        uname = os.uname().release
    except AttributeError:  # pragma: no cover - not POSIX
        uname = ""
    return {
        "report_schema": report.REPORT_SCHEMA,
        "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "section_key": table.device_key(),
        "environment": {
            "macos": platform.mac_ver()[0], "darwin": uname, "platform": platform.platform(),
            "python": platform.python_version(), "mlx": mx.__version__, "default_device": str(mx.default_device()),
            "lines": environment(),
            "capabilities": {cap: {"on": bool(on), "why": why} for cap, (on, why) in kernels.capabilities().items()},
        },
        "exactness": verdicts,
        "timings": timings,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mlx_w8a8.check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    parser.add_argument("--report", metavar="FILE",
                        help="also time every linear candidate against mlx_qmm at model shapes and write a JSON "
                             "report (turn it into a table with python -m mlx_w8a8.tune --from-report FILE)")
    parser.add_argument("--report-shapes", metavar="MxNxK,...",
                        help="shapes the report times (default: " + ",".join("x".join(map(str, s)) for s in REPORT_SHAPES) + ")")
    parser.add_argument("--report-pairs", type=int, default=10, help="paired rounds per shape (default 10)")
    parser.add_argument("--report-format", default="per_channel",
                        choices=("per_channel", "grouped4", "both"),
                        help="weight format the report times: per_channel (8-bit W8A8, the default), "
                             "grouped4 (MLX's 4-bit affine format: the W4A8 kernels against mlx_qmm4) "
                             "or both")
    parser.add_argument("--report-act-groups", action="store_true",
                        help="also time the group-wise 8-bit and 4-bit formats with activation "
                             "groups (act_scales='group')")
    args = parser.parse_args(argv)
    print("mlx_w8a8 self-check")
    for line in environment():
        print(f"  {line}")
    if not args.report:
        return 1 if run_checks(args.seed) else 0
    try:
        shapes = parse_shapes(args.report_shapes) if args.report_shapes else None
    except ValueError as error:
        parser.error(str(error))
    formats = ("per_channel", "grouped4") if args.report_format == "both" else (args.report_format,)
    doc = build_report(args.seed, shapes, args.report_pairs, formats=formats,
                       act_groups=args.report_act_groups)
    import json

    from .cachedir import write_text_atomic

    write_text_atomic(args.report, json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"report written to {args.report}")
    return 1 if any(not v["ok"] for per_op in doc["exactness"].values() for v in per_op.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
