"""The CUDA quantize kernels' rounding, modelled in float32 numpy.

``shaders/cuda/quantize.cuh``'s ``RowQuantizer`` computes ``rint(x / s)`` (x / s rounded
to nearest first, as an IEEE division) without a division per element:

- fast path: ``t = RN(x r + 1.5 * 2^23)`` with ``r = RN(1 / s)``, ``n = t - 1.5 * 2^23``,
  ``dd = RN(x r - n)``; ``n`` is trusted for a chunk of 8 when every ``|dd|`` is below a
  margin;
- exact path (``settle_bits``), for the other chunks: ``h = n + copysign(1/2, dd)``,
  ``e = RN(x - h s)``, code ``h + copysign(1/2, e)`` when ``|e| > 2^j s 2^-24``
  (``2^j <= |h| < 2^(j+1)``), else ``rint(h)``;
- tie-free rows (``tie_free_rate``): 16-bit rows whose maximum's significand 127 does not
  divide take ``rint(x r1)`` for every value, ``r1 = RN(r (1 +- 2^-21))`` signed by the
  code of ``amax / 2``, with no check at all.

These tests run the same float32 steps (numpy's float32 multiply and add round to nearest
like the kernel's ``__fmul_rn`` and ``__fadd_rn``; ``fma32`` below rounds a fused
multiply-add once, as ``__fmaf_rn``), with the constants read from the kernel text,
against the division, on inputs built to sit on rint's boundaries and on every bfloat16
and float16 value under a row's maximum; ``tests/test_cuda.py`` checks the kernels
themselves on a GPU.
"""

from __future__ import annotations

import re
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

import oracle

SHADER = Path(__file__).resolve().parent.parent / "mlx_w8a8" / "shaders" / "cuda" / "quantize.cuh"
F32, F64 = np.float32, np.float64


def kernel_constants() -> dict[str, float]:
    """``kRound``, ``kRoundBits``, ``kFastMargin``, ``kTwoM24`` and the fast path's
    smallest scale, as written in quantize.cuh."""
    text = SHADER.read_text()
    found = {
        "round": re.search(r"kRound = ([0-9.]+)f;", text),
        "round_bits": re.search(r"kRoundBits = (0x[0-9A-Fa-f]+)u;", text),
        "margin": re.search(r"kFastMargin = ([0-9.]+)f;", text),
        "unit": re.search(r"kTwoM24 = ([0-9.e-]+)f;", text),
        "min_scale_bits": re.search(r"q\.s >= __int_as_float\((0x[0-9A-Fa-f]+)\)", text),
        "tie_factors": re.search(r"up \? ([0-9.]+)f : ([0-9.]+)f", text),
    }
    missing = [k for k, v in found.items() if v is None]
    assert not missing, f"quantize.cuh no longer spells {missing} as this test expects"
    return {
        "round": float(found["round"].group(1)),
        "round_bits": int(found["round_bits"].group(1), 16),
        "margin": float(found["margin"].group(1)),
        "unit": float(found["unit"].group(1)),
        "min_scale": float(np.array([int(found["min_scale_bits"].group(1), 16)],
                                    dtype=np.uint32).view(np.float32)[0]),
        "tie_up": float(found["tie_factors"].group(1)),
        "tie_down": float(found["tie_factors"].group(2)),
    }


C = kernel_constants()
R = F32(C["round"])


def fma32(a, b, c) -> np.ndarray:
    """``RN32(a * b + c)`` of float32 arrays, rounded once as a fused multiply-add.

    The product of two float32 values is exact in float64 (48 bits); TwoSum gives the
    float64 sum ``s`` and its exact error; rounding ``s`` to float32 is then the single
    rounding of the exact value unless ``s`` sits exactly on a float32 midpoint (double
    rounding's one hazard), where the error's sign decides.
    """
    a, b, c = np.broadcast_arrays(*(np.asarray(v, F32) for v in (a, b, c)))
    p = a.astype(F64) * b.astype(F64)
    cc = c.astype(F64)
    s = p + cc
    bv = s - p
    err = (p - (s - bv)) + (cc - bv)
    f = s.astype(F32)
    g = np.nextafter(f, np.where(s > f.astype(F64), F32(np.inf), F32(-np.inf)))
    mid = (f.astype(F64) + g.astype(F64)) / 2
    tie = (s != f.astype(F64)) & (s == mid) & (err != 0)
    toward_g = np.sign(err) == np.sign(g.astype(F64) - f.astype(F64))
    return np.where(tie & toward_g, g, f)


def rn32(q: Fraction) -> float:
    """A rational rounded to the nearest float32 (ties to even), exactly."""
    if q == 0:
        return 0.0
    sign, q = (-1 if q < 0 else 1), abs(q)
    e = q.numerator.bit_length() - q.denominator.bit_length()
    if Fraction(2) ** e > q:
        e -= 1
    ulp = Fraction(2) ** (max(e, -126) - 23)
    m = q / ulp
    n = m.numerator // m.denominator
    rem = m - n
    if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and n % 2):
        n += 1
    return sign * float(n * ulp)


def row_constants(x: np.ndarray):
    """``(s, r, u)`` per row of finite ``x`` with amax > 0: the scale, ``RN(1 / s)`` and
    ``s 2^-24``, ``[M, 1]`` float32 each."""
    s = (np.max(np.abs(x), axis=1, keepdims=True) / F32(127)).astype(F32)
    return s, (F32(1) / s).astype(F32), (s * F32(C["unit"])).astype(F32)


def fast(x: np.ndarray, r: np.ndarray):
    """The fast path: ``(t, dd)``, float32 like ``x``."""
    t = fma32(x, r, R)
    return t, fma32(x, r, -(t - R))


def settle(x, t, dd, s, u, threshold=1.0, far_side=False) -> np.ndarray:
    """The exact path: float32 ``t``-like values holding ``rint(RN(x / s)) + 1.5 * 2^23``.
    ``threshold`` and ``far_side`` make the mutants of ``test_exact_path_mutants``."""
    n = t - R
    half = np.copysign(F32(0.5), -dd if far_side else dd).astype(F32)
    h = (n + half).astype(F32)
    e = fma32(-h, s, x)
    pow2 = (h.view(np.uint32) & np.uint32(0x7F800000)).view(F32)
    thr = (pow2 * u * F32(threshold)).astype(F32)
    c = np.where(np.abs(e) > thr, h + np.copysign(F32(0.5), e).astype(F32), h).astype(F32)
    return (c + R).astype(F32)


def codes_of(t: np.ndarray) -> np.ndarray:
    return (t.view(np.uint32) - np.uint32(C["round_bits"])).view(np.int32)


def kernel_codes(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The codes the kernel computes for rows whose scale takes the fast path, and the
    mask of values whose chunk of 8 kept the fast result."""
    s, r, u = row_constants(x)
    t, dd = fast(x, r)
    m, k = x.shape
    keep = np.repeat((np.abs(dd) < F32(C["margin"])).reshape(m, k // 8, 8).all(-1), 8, axis=1)
    return codes_of(np.where(keep, t, settle(x, t, dd, s, u))), keep


def division(x: np.ndarray) -> np.ndarray:
    return oracle.quantize_rows(x)[0].astype(np.int32)


def every_value_under(dtype, amaxes, k=4096) -> np.ndarray:
    """Float32 rows holding every finite ``dtype`` value of magnitude at most each of
    ``amaxes`` (each rounded to the type; bfloat16 as the top half of float32's bits),
    one amax per run of rows and at column 0 of each, padded by repeating: every code
    boundary such rows meet. Every value is exactly one of the type's."""
    bits = np.arange(1 << 16, dtype=np.uint32)
    if dtype == "bfloat16":
        v = (bits << 16).view(F32)
    else:
        v = bits.astype(np.uint16).view(np.float16).astype(F32)
    v = v[np.isfinite(v)]
    rows = []
    for a in amaxes:
        a = v[np.argmin(np.abs(v - F32(a)))]  # the type's value nearest the maximum asked
        w = v[np.abs(v) <= a]
        w = np.resize(w, -(-w.size // (k - 1)) * (k - 1)).reshape(-1, k - 1)
        rows.append(np.concatenate([np.full((w.shape[0], 1), a, F32), w], axis=1))
    return np.concatenate(rows)


# Row maxima of the every-value rows. 1.984375 (bfloat16 significand 254) and 1.1162109375 /
# 1.984375 (float16 significands 1143 = 127 * 9 and 2032 = 127 * 16) are rows the
# tie-free path must leave to the checked one (x / s meets half-integers at many values).
BF16_AMAXES = [1.0, 0.75, 3.140625, 100.5, 2.0 ** -60 * 1.5, 7.0e30, 0.00469970703125, 57344.0,
               1.984375]
F16_AMAXES = [1.0, 0.75, 3.140625, 100.5, 65504.0, 0.00469970703125, 6.103515625e-05,
              1.1162109375, 1.984375]


# fma32 itself --------------------------------------------------------------------------
def test_fma32_rounds_once(rng):
    """Against exact rationals: random operands, cancelling sums, and sums built so the
    float64 sum lands exactly on a float32 midpoint (where rounding twice would differ:
    (1/2 - 2^-47) + (R + 1) is R + 1 correctly, R + 2 when rounded via float64)."""
    a = rng.standard_normal(400).astype(F32) * F32(8)
    b = rng.standard_normal(400).astype(F32)
    c = np.concatenate([-(a[:200] * b[:200]).astype(F32) * F32(1.0000001),
                        rng.standard_normal(200).astype(F32) * F32(100)])
    half_minus = F32(0.5) * F32(1 + 2.0 ** -23)
    one_minus = F32(1 - 2.0 ** -23)
    a = np.concatenate([a, np.full(8, half_minus)])
    b = np.concatenate([b, np.full(8, one_minus)])
    c = np.concatenate([c, (R + F32(1)) + np.arange(-4, 4, dtype=F32) * F32(2)])
    got = fma32(a, b, c)
    want = np.array([rn32(Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z)))
                     for x, y, z in zip(a, b, c)], F32)
    assert got.tobytes() == want.tobytes()
    naive = (a.astype(F64) * b.astype(F64) + c.astype(F64)).astype(F32)
    assert (naive != want).any(), "the midpoint cases no longer exercise double rounding"


# the fast path -------------------------------------------------------------------------
def test_fast_path_equals_the_division_where_it_is_taken(rng):
    x = oracle.near_rounding_boundaries(rng, 64, 4096)
    s, r, _ = row_constants(x)
    assert (s >= F32(C["min_scale"])).all()
    t, dd = fast(x, r)
    keep = np.abs(dd) < F32(C["margin"])
    assert keep.any() and not keep.all()
    wrong = keep & (codes_of(t) != division(x))
    assert not wrong.any(), f"{int(wrong.sum())} fast codes differ from rint(x / s)"
    # |n| <= 127 without a clip (the bound in quantize.cuh).
    assert np.abs(codes_of(t)[keep]).max() <= 127


def test_the_margin_is_what_makes_it_exact(rng):
    """The boundary rows reach the hazard: with no margin (trust n whenever x r is not
    exactly on a boundary) some codes differ from the division's, so the test above can
    fail."""
    x = oracle.near_rounding_boundaries(rng, 64, 4096)
    _, r, _ = row_constants(x)
    t, dd = fast(x, r)
    assert ((np.abs(dd) < F32(0.5)) & (codes_of(t) != division(x))).any()


def test_fast_path_is_taken_on_ordinary_activations(rng):
    """Normal-looking float32 rows keep nearly every chunk on the fast path; bfloat16 rows
    (8-bit mantissas: x / s lands near a half-integer far more often) send a few percent
    of chunks to the exact path, which is why it must be cheap (docs/cuda.md)."""
    x = (rng.standard_normal((256, 4096)) * rng.uniform(0.01, 10, (256, 1))).astype(F32)
    _, keep = kernel_codes(x)
    assert keep.mean() > 0.99
    xb = ((x.view(np.uint32) + np.uint32(0x8000)) & np.uint32(0xFFFF0000)).view(F32)
    _, keep_b = kernel_codes(xb)
    assert 0.005 < 1 - keep_b.mean() < 0.1


# the exact path ------------------------------------------------------------------------
@pytest.mark.parametrize("rows", ["boundaries", "bfloat16", "float16", "normal"])
def test_exact_path_equals_the_division_everywhere(rng, rows):
    """The exact path is applied to whole chunks, so it must be right for every value,
    not only those near a half-integer: boundary rows (ties, a few ulps from one, scales
    2^-90 .. 2^20), every bfloat16 / float16 value under several maxima (|h| = 1/2,
    whose float gap toward 0 is half the other side's, included), and normal rows."""
    if rows == "boundaries":
        x = oracle.near_rounding_boundaries(rng, 64, 4096)
    elif rows == "bfloat16":
        x = every_value_under("bfloat16", BF16_AMAXES)
    elif rows == "float16":
        x = every_value_under("float16", F16_AMAXES)
    else:
        x = (rng.standard_normal((64, 4096)) * rng.uniform(0.01, 10, (64, 1))).astype(F32)
    s, r, u = row_constants(x)
    assert (s >= F32(C["min_scale"])).all()
    t, dd = fast(x, r)
    got = codes_of(settle(x, t, dd, s, u))
    want = division(x)
    wrong = got != want
    assert not wrong.any(), (f"{int(wrong.sum())} exact-path codes differ, e.g. x = "
                             f"{x[wrong][:4]} -> {got[wrong][:4]}, want {want[wrong][:4]}")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_kernel_codes_on_every_value(dtype):
    """Fast path where it is kept, exact path elsewhere, as the kernel runs them: the
    division's codes for every value of the type under each maximum."""
    x = every_value_under(dtype, BF16_AMAXES if dtype == "bfloat16" else F16_AMAXES)
    got, keep = kernel_codes(x)
    assert not keep.all()
    np.testing.assert_array_equal(got, division(x))


def test_exact_ties():
    """x / s exactly j + 1/2 (s = 0.25): rint's tie goes to the even code; no chunk
    holding a tie keeps the fast result, and the exact path decides it (RN(z) = h, the
    addition to 1.5 * 2^23 rounds half to even)."""
    k = 1024
    x = ((np.arange(k) % 9 - 4) * 0.25 + 0.125).astype(F32)[None, :]
    x[0, 0] = -127 / 4.0
    got, keep = kernel_codes(x)
    ties = np.abs(x * 4 - np.rint(x * 4)) == 0.5
    assert ties[0, 1:].all() and not keep[ties].any()
    np.testing.assert_array_equal(got, division(x))
    assert (got[ties] % 2 == 0).all()


@pytest.mark.parametrize("mutant", ["threshold x2", "threshold x0.5", "h on the far side"])
def test_exact_path_mutants(rng, mutant):
    """Each broken variant of the exact path differs from the division somewhere on the
    boundary rows or the every-value rows, so the tests above can fail: a threshold of
    twice or half the float gap's half decides RN(z) = h wrongly a few ulps from it; the
    half-integer on the far side of x r leaves codes a whole step off."""
    x = np.concatenate([oracle.near_rounding_boundaries(rng, 64, 4096),
                        every_value_under("bfloat16", BF16_AMAXES)])
    s, r, u = row_constants(x)
    t, dd = fast(x, r)
    kw = {"threshold x2": {"threshold": 2.0}, "threshold x0.5": {"threshold": 0.5},
          "h on the far side": {"far_side": True}}[mutant]
    assert (codes_of(settle(x, t, dd, s, u, **kw)) != division(x)).any()


@pytest.mark.parametrize("n", range(-127, 128))
def test_code_bits(n):
    """The bits of n + 1.5 * 2^23 are kRoundBits + n, so their low byte is n's two's
    complement byte (the packed code) and their sum less 8 kRoundBits is the codes' sum."""
    t = np.float32(C["round"]) + np.float32(n)
    bits = int(np.array([t]).view(np.uint32)[0])
    assert bits == C["round_bits"] + n
    assert bits & 0xFF == n & 0xFF


# tie-free rows ----------------------------------------------------------------------------
MANTISSA_BITS = {"bfloat16": 7, "float16": 10}


def significand(amax: np.ndarray, dtype: str) -> np.ndarray:
    """The integer significand of each 16-bit ``amax`` (float32 holding a type's value):
    mantissa and implicit bit, the mantissa alone for a subnormal (quantize.cuh)."""
    if dtype == "bfloat16":
        b = (np.asarray(amax, F32).view(np.uint32) >> 16).astype(np.int64)
    else:
        b = np.asarray(amax, F32).astype(np.float16).view(np.uint16).astype(np.int64)
    p = MANTISSA_BITS[dtype]
    mant = b & ((1 << p) - 1)
    return np.where((b & 0x7FFF) >> p, mant | (1 << p), mant)


def tie_free(x: np.ndarray, dtype: str, up=None, down=None):
    """``(codes, rows)``: the tie-free path's codes ``rint(x r1)`` for every value, and the
    rows it takes (fast scale, 127 not dividing the maximum's significand). ``up`` and
    ``down`` replace the kernel's factors (the mutants)."""
    s, r, _ = row_constants(x)
    amax = np.max(np.abs(x), axis=1, keepdims=True)
    half = ((F32(0.5) * amax).astype(F32) / s).astype(F32)
    factor = np.where(np.rint(half) == 64, F32(C["tie_up"] if up is None else up),
                      F32(C["tie_down"] if down is None else down))
    r1 = (r * factor).astype(F32)
    rows = ((s >= F32(C["min_scale"])) & (significand(amax, dtype) % 127 != 0))[:, 0]
    return codes_of(fma32(x, r1, R)), rows


def every_significand(dtype: str, scales) -> list[float]:
    """Row maxima with every significand of the type, at each scale (a power of two)."""
    n = 1 << MANTISSA_BITS[dtype]
    return [sc * (1 + i / n) for sc in scales for i in range(n)]


TIE_FREE_SCALES = {"bfloat16": [1.0, 2.0 ** -92, 2.0 ** 100], "float16": [1.0, 2.0 ** -14]}


def test_tie_free_factors_are_one_plus_minus_2_to_minus_21():
    assert C["tie_up"] == 1 + 2.0 ** -21 and C["tie_down"] == 1 - 2.0 ** -21


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_tie_free_rows_equal_the_division(dtype):
    """Every significand of a row maximum (at the scales in TIE_FREE_SCALES: the fast path's
    smallest bfloat16 scales, large ones, float16's smallest normal) and every value of
    the type under it: where the row takes the tie-free path, its codes are the
    division's, the value amax / 2 (q = 63.5 exactly) included; the rows it leaves are
    exactly those whose significand 127 divides."""
    amaxes = every_significand(dtype, TIE_FREE_SCALES[dtype])
    left = 0
    for i in range(0, len(amaxes), 64):
        x = every_value_under(dtype, amaxes[i:i + 64])
        got, rows = tie_free(x, dtype)
        want = division(x)
        wrong = (got != want) & rows[:, None]
        assert not wrong.any(), (f"{int(wrong.sum())} tie-free codes differ, e.g. x = "
                                 f"{x[wrong][:4]} -> {got[wrong][:4]}, want {want[wrong][:4]}")
        left += int((~rows).sum())
    assert left > 0  # the 127-multiple significands were met, and left to the check


@pytest.mark.parametrize("dtype,mutant", [("bfloat16", "factor 1"), ("float16", "factor 1"),
                                          ("float16", "factor 1 +- 2^-17"),
                                          ("bfloat16", "no 127 rule"), ("float16", "no 127 rule")])
def test_tie_free_mutants(dtype, mutant):
    """The test above can fail: no factor leaves x = amax / 2 on the wrong side in some
    rows; 1 +- 2^-17 moves float16 values across a half-integer (their distance from one
    can be as small as |q| 2^-19); the path taken by rows whose significand 127 divides
    misses their ties."""
    x = every_value_under(dtype, every_significand(dtype, [1.0]))
    kw = {"factor 1": {"up": 1.0, "down": 1.0},
          "factor 1 +- 2^-17": {"up": 1 + 2.0 ** -17, "down": 1 - 2.0 ** -17}}.get(mutant, {})
    got, rows = tie_free(x, dtype, **kw)
    if mutant == "no 127 rule":
        rows[:] = True
    assert ((got != division(x)) & rows[:, None]).any()
