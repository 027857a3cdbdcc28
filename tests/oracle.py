"""The numpy oracle of ``docs/numerics.md``: float64 / exact int64 on the host.

Shared by every test module that checks a kernel, whatever backend runs it.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from mlx_w8a8 import check

# Half a unit in the last place of each output dtype, relative.
HALF_ULP = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
# Half the spacing of each dtype's subnormals: the absolute rounding error of results
# below the normal range, where HALF_ULP * |value| is smaller than the spacing.
HALF_SUBNORMAL = {"float32": 2.0**-150, "float16": 2.0**-25, "bfloat16": 2.0**-134}
# Where round-to-nearest overflows to infinity: the largest finite value plus half its ulp.
OVERFLOW = {"float32": (2 - 2.0**-24) * 2.0**127, "float16": 65520.0,
            "bfloat16": (2 - 2.0**-8) * 2.0**127}
# A float32 sum of K rounded terms: generous against K * 2^-24 for the K used here.
F32_SUM_RTOL = 1e-5


# The package ships the activation oracle for `python -m mlx_w8a8.check` (no copy here);
# the kernel tests compare against it, so a fault in it fails them (ties rounded away
# from zero there: 10 cases of tests/test_quantize_rounding.py and test_reference.py).
to_numpy = check.host
quantize_rows = check.quantize_rows


def int8_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Exact ``a @ b.T`` of int8 codes (``|a|, |b| <= 128``), as int64.

    Computed in float64 by BLAS: every product is an integer of at most 2^14, so every
    partial sum of K < 2^39 of them is an integer below 2^53 and exact in any order (with
    or without FMA). numpy's int64 matmul has no BLAS: 2.2 s against 0.08 s in float64 at
    2049 x 1024 x 1434 on a 2-core CPU, ten times that at K = 14336."""
    return (a.astype(np.float64) @ b.astype(np.float64).T).astype(np.int64)


def group_sums(q: np.ndarray, c: np.ndarray, group_size: int, s: np.ndarray,
               t: np.ndarray | None = None, o: np.ndarray | None = None) -> np.ndarray:
    """``sum_g t_mg (s_ng P_mng + o_ng R_mg)`` in float64, with each group's integer sum
    ``P_mng = sum_{k in g} q_mk c_nk`` exact (``R_mg = sum_{k in g} q_mk``; ``t`` absent:
    1, ``o`` absent: no ``R`` term).

    Each ``P_g`` is one float64 BLAS product, exact as :func:`int8_matmul`'s (integers
    of at most 2^15 each, group sums below 2^53 in any order); the groups are then
    combined in float64, one group at a time (an ``[M, N]`` accumulator, no ``[M, N, G]``
    array): numpy's int64 einsum took 1.5 s for 200 x 2176 x 1024 at group size 32 on a
    2-core CPU, and its ``[M, N, G]`` array grows with the model's sizes.

    Args:
        q: ``[M, K]`` integer codes; c: ``[N, K]`` integer codes.
        s, o: ``[N, G]`` float; t: ``[M, G]`` float.
    """
    m, k = q.shape
    qf, cf = q.astype(np.float64), c.astype(np.float64)
    y = np.zeros((m, c.shape[0]))
    for g in range(k // group_size):
        cols = slice(g * group_size, (g + 1) * group_size)
        term = (qf[:, cols] @ cf[:, cols].T) * s[None, :, g]
        if o is not None:
            term = term + qf[:, cols].sum(-1, keepdims=True) * o[None, :, g]
        y += term if t is None else t[:, g:g + 1] * term
    return y


def codes(weight) -> np.ndarray:
    """``[N, K]`` uint8 codes of a ``QuantizedWeight`` (independent of the package's view)."""
    return np.array(weight.q).view(np.uint8).reshape(weight.n, weight.k)


def linear(x: np.ndarray, weight, bias: np.ndarray | None):
    """W8A8 linear in float64 plus the error bound a float32 kernel may show.

    Args:
        x: ``[M, K]`` float32 values of the activation.
        weight: a ``QuantizedWeight``.
        bias: ``[N]`` or ``None``.

    Returns:
        ``(y, bound)``: ``[M, N]`` float64 each; ``bound`` is the float32 rounding
        allowance before the output-dtype rounding.
    """
    q, scale = quantize_rows(x)
    c = codes(weight).astype(np.int64)
    s = to_numpy(weight.scales).astype(np.float64)
    b = to_numpy(weight.biases).astype(np.float64)
    gs = weight.group_size
    w_deq = np.repeat(s, gs, axis=1) * c + np.repeat(b, gs, axis=1)  # [N, K] float64
    sc = scale.astype(np.float64)
    with np.errstate(invalid="ignore"):
        if weight.per_channel:
            acc = int8_matmul(q, (c - 128).astype(np.int8)).astype(np.float64)
            y = acc * sc * s[:, 0][None, :]
        else:
            m, k = q.shape
            r = q.astype(np.float64).reshape(m, k // gs, gs).sum(-1)  # [M, G], exact
            b_prime = b + 128.0 * s
            y = sc * (group_sums(q, c - 128, gs, s) + r @ b_prime.T)
        magnitude = np.abs(sc) * (np.abs(q.astype(np.float64)) @ np.abs(w_deq).T)
    if bias is not None:
        y = y + bias.astype(np.float64)[None, :]
        magnitude = magnitude + np.abs(bias.astype(np.float64))[None, :]
    return y, F32_SUM_RTOL * magnitude + 1e-30


def codes4(weight) -> np.ndarray:
    """``[N, K]`` int64 codes of a 4-bit ``QuantizedWeight``, from its uint32 words as
    MLX documents them (code ``j`` of a word in bits ``4j .. 4j + 3``), independent of
    the package's unpacking (which reads bytes)."""
    words = np.array(weight.q).astype(np.int64)
    return np.stack([(words >> (4 * j)) & 0xF for j in range(8)], axis=-1).reshape(
        weight.n, weight.k)


def linear4(x: np.ndarray, weight, bias: np.ndarray | None):
    """W4A8 linear in float64 (exact int64 group sums) plus the float32 rounding
    allowance, as :func:`linear` for 8-bit weights (``docs/numerics.md``, W4A8):
    ``y_mn = t_m sum_g (s_ng P_mng + b_ng R_mg)``."""
    q, scale = quantize_rows(x)
    c = codes4(weight)
    s = to_numpy(weight.scales).astype(np.float64)
    b = to_numpy(weight.biases).astype(np.float64)
    gs = weight.group_size
    m, k = q.shape
    r = q.astype(np.float64).reshape(m, k // gs, gs).sum(-1)  # [M, G], exact
    sc = scale.astype(np.float64)
    w_deq = np.repeat(s, gs, axis=1) * c + np.repeat(b, gs, axis=1)
    with np.errstate(invalid="ignore"):
        y = sc * (group_sums(q, c, gs, s) + r @ b.T)
        magnitude = np.abs(sc) * (np.abs(q.astype(np.float64)) @ np.abs(w_deq).T)
    if bias is not None:
        y = y + bias.astype(np.float64)[None, :]
        magnitude = magnitude + np.abs(bias.astype(np.float64))[None, :]
    return y, F32_SUM_RTOL * magnitude + 1e-30


def linear_subnormal(x: np.ndarray, weight, bias: np.ndarray | None):
    """The subnormal promotion's oracle (``docs/numerics.md``): :func:`linear` (8-bit) or
    :func:`linear4`'s value, with the allowance ``gamma(n_s) T_s`` added, ``T_s`` the
    promotion's unsigned terms made positive, in float64 (``tuning.gate`` computes the
    same on the device)."""
    from mlx_w8a8.tuning.gate import gamma, subnormal_rounds

    y, bound = (linear4 if weight.bits == 4 else linear)(x, weight, bias)
    q, scale = quantize_rows(x)
    c = (codes(weight) if weight.bits == 8 else codes4(weight)).astype(np.float64)
    s = np.abs(to_numpy(weight.scales).astype(np.float64))
    b = np.abs(to_numpy(weight.biases).astype(np.float64))
    gs = weight.group_size
    m, k = q.shape
    qs = np.repeat(s, gs, axis=1) * c
    a = q.astype(np.float64)
    sums = np.abs(a.reshape(m, k // gs, gs).sum(-1))
    with np.errstate(invalid="ignore"):
        t_s = np.abs(scale.astype(np.float64)) * ((a + 128.0) @ qs.T + sums @ b.T
                                                  + 128.0 * qs.sum(axis=1)[None, :])
    if bias is not None:
        t_s = t_s + np.abs(bias.astype(np.float64))[None, :]
    return y, bound + gamma(subnormal_rounds(weight)) * np.nan_to_num(t_s)


def round_to(v: np.ndarray, dtype: str) -> np.ndarray:
    """``v`` (float64) rounded once to ``dtype``'s nearest value, ties to even, as float64:
    float16 by numpy's correctly rounded conversion; bfloat16 (8 significant bits) from
    ``v``'s own binary exponent. Normal-range bfloat16 values only (asserted)."""
    if dtype == "float16":
        return v.astype(np.float16).astype(np.float64)
    assert dtype == "bfloat16", dtype
    m, e = np.frexp(v)  # v = m 2^e, 0.5 <= |m| < 1
    assert np.all((e >= -125) | (v == 0)), "bfloat16 subnormals are not modelled"
    return np.ldexp(np.rint(m * 256.0) / 256.0, e)


def dequantized(weight, dtype: str) -> np.ndarray:
    """``[N, K]`` float64: each weight ``s q + b`` rounded once to ``dtype`` (scales and
    biases first rounded to ``dtype`` where stored in another), the codes read as
    :func:`codes` / :func:`codes4` read them."""
    c = (codes(weight) if weight.bits == 8 else codes4(weight)).astype(np.float64)
    s = round_to(to_numpy(weight.scales).astype(np.float64), dtype)
    b = round_to(to_numpy(weight.biases).astype(np.float64), dtype)
    gs = weight.group_size
    return round_to(np.repeat(s, gs, axis=1) * c + np.repeat(b, gs, axis=1), dtype)


def linear_dequant(x: np.ndarray, weight, bias: np.ndarray | None, dtype: str):
    """The dequantized linear (``docs/numerics.md``, dequantized weights) in float64 plus
    the float32 summation allowance: each weight ``s q + b`` rounded once to ``dtype``
    (scales and biases first rounded to ``dtype`` where stored in another), then
    ``x @ w.T (+ bias)`` exactly. Codes read from the uint32 words as MLX documents them
    (:func:`codes`, :func:`codes4`).

    Returns:
        ``(y, bound)`` as :func:`linear`; the bound allows ``K 2^-23 sum |x w|`` (every
        float32 addition of the tensor cores' sum off by up to an ulp) and one rounding
        of the bias addition.
    """
    w = dequantized(weight, dtype)
    xf = x.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        y = xf @ w.T
        magnitude = np.abs(xf) @ np.abs(w).T
    bound = weight.k * 2.0**-23 * magnitude
    if bias is not None:
        y = y + bias.astype(np.float64)[None, :]
        bound = bound + 2.0**-24 * (np.abs(y) + np.abs(bias.astype(np.float64))[None, :])
    return y, bound + 1e-30


def quantize_groups(x: np.ndarray, group_size: int):
    """Per-token, per-group int8 codes and float32 scales (``docs/numerics.md``,
    activation groups): :func:`quantize_rows` applied to each group of a row.

    Returns:
        ``(q, scale)``: ``[M, K]`` int8 and ``[M, K // group_size]`` float32.
    """
    m, k = x.shape
    q, scale = quantize_rows(x.reshape(m * (k // group_size), group_size))
    return q.reshape(m, k), scale.reshape(m, k // group_size)


def linear_act_groups(x: np.ndarray, weight, bias: np.ndarray | None):
    """W8A8 (8-bit grouped) or W4A8 (4-bit) linear with activation groups in float64
    (exact int64 group sums) plus the float32 rounding allowance:
    ``y_mn = sum_g t_mg (s_ng P_mng + o_ng R_mg)``, ``o = b + 128 s`` for 8-bit codes
    (``P`` on ``c - 128``), ``o = b`` for 4-bit ones."""
    gs = weight.group_size
    q, t = quantize_groups(x, gs)
    if weight.bits == 8:
        c = codes(weight).astype(np.int64) - 128
    else:
        c = codes4(weight).astype(np.int64)
    s = to_numpy(weight.scales).astype(np.float64)
    b = to_numpy(weight.biases).astype(np.float64)
    o = b + 128.0 * s if weight.bits == 8 else b
    m, k = q.shape
    groups = k // gs
    qg = q.astype(np.float64).reshape(m, groups, gs)
    tg = t.astype(np.float64)
    w_deq = np.repeat(s, gs, axis=1) * (c + (128 if weight.bits == 8 else 0)) + np.repeat(b, gs, axis=1)
    with np.errstate(invalid="ignore"):
        y = group_sums(q, c, gs, s, t=tg, o=o)
        qt = (np.abs(qg) * np.abs(tg)[..., None]).reshape(m, k)
        magnitude = qt @ np.abs(w_deq).T
    if bias is not None:
        y = y + bias.astype(np.float64)[None, :]
        magnitude = magnitude + np.abs(bias.astype(np.float64))[None, :]
    return y, F32_SUM_RTOL * magnitude + 1e-30


def assert_close(got: mx.array, want: np.ndarray, bound: np.ndarray, dtype: str):
    """``|got - want| <= bound + half an ulp of dtype`` (of its subnormals below the
    normal range), NaN where ``want`` is NaN, and an infinity of ``want``'s sign only
    where ``|want|`` within its bound reaches dtype's overflow threshold."""
    g = to_numpy(got).astype(np.float64)
    assert g.shape == want.shape, (g.shape, want.shape)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(g), nan), "NaN pattern differs from the oracle"
    inf = np.isinf(g) & ~nan
    may_overflow = np.abs(want) + bound >= OVERFLOW[dtype]
    assert np.all(may_overflow[inf] & (np.sign(g[inf]) == np.sign(want[inf]))), (
        "an infinity where the oracle's value cannot round to one")
    nan = nan | inf
    err = np.abs(g - want)[~nan]
    allow = (bound + np.maximum(HALF_ULP[dtype] * np.abs(want), HALF_SUBNORMAL[dtype]))[~nan]
    worst = int(np.argmax(err - allow)) if err.size else 0
    assert np.all(err <= allow), (
        f"max excess {float((err - allow)[worst]):.3g} at flat index {worst}: "
        f"got {g[~nan][worst]!r}, want {want[~nan][worst]!r}"
    )


def assert_same_but_rounding(got: mx.array, want: mx.array, x: mx.array, weight,
                             bias: mx.array | None = None):
    """``got`` equals ``want`` (float32 outputs of one layer, one of them under
    ``mx.compile``) up to the rounding either may do its own way; a wrong product or a
    lost term is off by far more.

    Two effects are allowed. MLX's compile fuses a W8A8 epilogue's float ops into one
    kernel, and a GPU compiler may turn ``p * s + b`` into one FMA, which rounds once
    where the eager ops round twice: at most ``2^-22 (|want| + |b|)`` apart (one rounding
    of the product and one of the sum, ``|p s| <= |y| + |b|``, a factor two to spare).
    And a float kernel (``mx.quantized_matmul``, W8A16) may sum its K products in another
    order when compiled (measured on an NVIDIA H200: 5 float32 ulps): each order is
    within ``K 2^-24 sum |x w|`` of the exact sum, so twice that, doubled again for the
    weight's dequantization, bounds the two. Args: ``x`` ``[M, K]``, ``weight`` a
    ``QuantizedWeight``, ``bias`` ``[N]`` or ``None``."""
    g, w = to_numpy(got).astype(np.float64), to_numpy(want).astype(np.float64)
    assert g.shape == w.shape, (g.shape, w.shape)
    b = 0.0 if bias is None else np.abs(to_numpy(bias).astype(np.float64))
    wf = np.abs(to_numpy(weight.dequantize()).astype(np.float64))
    sums = np.abs(to_numpy(x).astype(np.float64)).reshape(-1, weight.k) @ wf.T
    allow = 2.0**-22 * (np.abs(w) + b) + 4 * weight.k * 2.0**-24 * sums.reshape(w.shape)
    err = np.abs(g - w)
    i = int(np.argmax(err - allow))
    assert np.all(err <= allow), (
        f"{int(np.sum(err > allow))} of {err.size} elements off; worst at flat index {i}: "
        f"got {g.flat[i]!r}, want {w.flat[i]!r}, difference {float(err.flat[i]):.3g} > "
        f"allowed {float(allow.flat[i]):.3g}")


def sqnr_db(signal: np.ndarray, approx: np.ndarray) -> float:
    """Signal-to-quantization-noise ratio in dB."""
    noise = np.sum((signal - approx) ** 2)
    return float(10 * np.log10(np.sum(signal**2) / max(noise, 1e-300)))


def random_int8(rng: np.random.Generator, shape) -> np.ndarray:
    """Full-range int8, -128 included."""
    return rng.integers(-128, 128, size=shape, dtype=np.int8)


def near_rounding_boundaries(rng, rows: int, k: int) -> np.ndarray:
    """``[rows, k]`` float32 rows whose values sit on or near rint's boundaries.

    Row ``i`` holds its amax ``127 s0`` at column 0 (``s0`` log-uniform over 2^-90 ..
    2^20) and elsewhere ``(j + 1/2 + delta) s`` for random ``|j| <= 126`` (``s`` the row's
    float32 scale ``amax / 127``), rounded to float32 and moved by -3 .. 3 ulps. Each run
    of 8 values (``k % 8 == 0``) shares one distance ``|delta|``: 0 (ties, or a few ulps
    from one) or ``2^-e`` for ``e`` in 8 .. 24, with random signs. So ``x / s`` is a tie,
    a hair from one, or anywhere between: where a quantizer that does not divide exactly
    (a reciprocal multiply, say) rounds the other way, and where a check of its error has
    to draw the line.
    """
    s0 = np.exp2(rng.uniform(-90, 20, (rows, 1)))
    amax = (127 * s0).astype(np.float32)
    s = amax / np.float32(127)
    j = rng.integers(-126, 127, (rows, k)).astype(np.float64)
    e = rng.integers(8, 26, (rows, k // 8, 1))  # 25: delta = 0
    dist = np.where(e == 25, 0.0, np.exp2(-e.astype(np.float64)) * rng.uniform(1, 2, e.shape))
    delta = np.repeat(dist, 8, axis=2).reshape(rows, k) * rng.choice([-1.0, 1.0], (rows, k))
    x = ((j + 0.5 + delta) * s.astype(np.float64)).astype(np.float32)
    x = (x.view(np.int32) + rng.integers(-3, 4, (rows, k)).astype(np.int32)).view(np.float32)
    x[:, 0] = amax[:, 0]
    return x
