"""The oracle's own comparison (``oracle.assert_close``): it must accept exactly the
roundings a correct kernel may produce and fail on anything else, since every CUDA and
Metal test trusts it. Checked on values whose right answer is known: the largest float16
is 65504, rounding to nearest overflows to infinity from 65520; float16 subnormals are
multiples of 2^-24."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import oracle


def f16(values) -> mx.array:
    return mx.array(np.array(values, dtype=np.float16))


def check(got, want, bound=0.0):
    want = np.array(want, dtype=np.float64)
    oracle.assert_close(f16(got), want, np.full(want.shape, bound), "float16")


def test_accepts_the_nearest_value():
    check([1.0, -2.5, 65504.0], [1.0002, -2.5009, 65510.0])


def test_accepts_overflow_to_infinity_past_the_threshold():
    check([-np.inf, np.inf], [-66757.5, 65520.0])


def test_rejects_infinity_below_the_threshold():
    with pytest.raises(AssertionError, match="infinity"):
        check([np.inf], [65519.0])


def test_rejects_infinity_of_the_wrong_sign():
    with pytest.raises(AssertionError, match="infinity"):
        check([np.inf], [-70000.0])


def test_accepts_infinity_where_the_bound_reaches_the_threshold():
    check([np.inf], [65510.0], bound=16.0)


def test_rejects_a_finite_value_far_past_the_threshold():
    with pytest.raises(AssertionError):
        check([65504.0], [1e6])


def test_accepts_subnormal_rounding():
    # 2.495 units of 2^-24 round to 2 units: off by 0.495 units, less than half of one.
    unit = 2.0**-24
    check([2 * unit], [2.495 * unit])


def test_rejects_a_subnormal_off_by_a_unit():
    unit = 2.0**-24
    with pytest.raises(AssertionError):
        check([3 * unit], [1.9 * unit])


def test_rejects_a_nan_pattern_change():
    with pytest.raises(AssertionError, match="NaN"):
        check([1.0], [np.nan])


def test_int8_matmul_is_exact_where_float32_sums_are_not(rng):
    """The oracle's int8 product sums in float64: exact (every partial sum an integer below
    2^53). Same-sign codes summed over K = 4096 pass 2^24, where float32 accumulation
    would round: checked against Python's integers, row by row."""
    a = np.full((3, 4096), 127, dtype=np.int8)
    a[1] = -128
    a[2] = rng.integers(-128, 128, 4096, dtype=np.int8)
    b = rng.integers(100, 128, (5, 4096), dtype=np.int8)
    got = oracle.int8_matmul(a, b)
    assert got.dtype == np.int64
    want = [[sum(int(x) * int(y) for x, y in zip(row, col)) for col in b] for row in a]
    assert got.tolist() == want
    assert abs(want[0][0]) > 2**24  # the float32 mutant would round here
    f32 = (a.astype(np.float32) @ b.astype(np.float32).T).astype(np.int64)
    assert f32.tolist() != want


def test_group_sums_are_exact_per_group(rng):
    """``group_sums`` weights each group's integer sum by its own scale: with scales that
    are powers of two (2^g for group g) the float64 result is an integer, equal to the
    int64 computation; extreme codes make the group sums as large as the kernels meet."""
    m, n, gs, groups = 5, 7, 64, 4
    q = rng.integers(-127, 128, size=(m, gs * groups))
    q[0] = 127
    c = rng.integers(-128, 128, size=(n, gs * groups))
    c[0] = -128
    s = np.tile(2.0 ** np.arange(groups), (n, 1))
    want = sum((q[:, g * gs:(g + 1) * gs] @ c[:, g * gs:(g + 1) * gs].T) << g
               for g in range(groups))
    got = oracle.group_sums(q, c, gs, s)
    assert np.array_equal(got, want.astype(np.float64))


def test_group_sums_with_row_scales_and_offsets(rng):
    """``sum_g t_mg (s_ng P_mng + o_ng R_mg)`` against the formula summed element by
    element (float64; the two orders agree to float64 rounding)."""
    m, n, gs, groups = 3, 4, 32, 3
    q = rng.integers(-127, 128, size=(m, gs * groups))
    c = rng.integers(0, 16, size=(n, gs * groups))
    s, o = rng.standard_normal((n, groups)), rng.standard_normal((n, groups))
    t = rng.random((m, groups))
    want = np.zeros((m, n))
    for i in range(m):
        for j in range(n):
            for g in range(groups):
                cols = slice(g * gs, (g + 1) * gs)
                p = float(np.dot(q[i, cols], c[j, cols]))
                want[i, j] += t[i, g] * (s[j, g] * p + o[j, g] * float(q[i, cols].sum()))
    got = oracle.group_sums(q, c, gs, s, t=t, o=o)
    assert np.allclose(got, want, rtol=1e-12, atol=1e-9)


def test_round_to_bfloat16_is_round_to_nearest_even(rng):
    """``oracle.round_to``'s bfloat16 rounding equals MLX's float32 -> bfloat16 conversion
    (round to nearest, ties to even) on float32 values, ties included; truncation (a
    mutant: ``np.trunc`` for ``np.rint``) fails on them."""
    v = rng.standard_normal(4096).astype(np.float32) * np.float32(1e3)
    ties = np.array([1 + 2.0**-8, 1 + 3 * 2.0**-8, -(1 + 2.0**-8), 3 * 2.0**-9 * 1.5],
                    dtype=np.float32)  # exactly halfway between two bfloat16 values
    v = np.concatenate([v, ties, ties * np.float32(2.0**-20)])
    want = np.array(mx.array(v).astype(mx.bfloat16).astype(mx.float32)).astype(np.float64)
    got = oracle.round_to(v.astype(np.float64), "bfloat16")
    assert np.array_equal(got, want)
    m, e = np.frexp(v.astype(np.float64))
    truncated = np.ldexp(np.trunc(m * 256.0) / 256.0, e)
    assert not np.array_equal(truncated, want)


def _dequant_case(rng, bits):
    """A 4-bit or 8-bit group-wise weight (group size 32), bfloat16 activations and what a
    float32 kernel of ``oracle.linear_dequant``'s formula returns for them."""
    from mlx_w8a8.weight import QuantizedWeight

    w = mx.array(rng.standard_normal((48, 128)).astype(np.float32) * 0.05).astype(mx.bfloat16)
    qw = QuantizedWeight.from_float(w, 32, per_channel=False, bits=bits)
    x = mx.array(rng.standard_normal((9, 128)).astype(np.float32)).astype(mx.bfloat16)
    xf = np.array(x.astype(mx.float32)).astype(np.float64)
    return qw, xf


def _kernel_like(xf, qw, codes):
    """float32 ``x @ round_bf16(s q + b).T`` from ``codes`` (``[N, K]``), rounded to bf16."""
    s = np.array(qw.scales.astype(mx.float32)).astype(np.float64)
    b = np.array(qw.biases.astype(mx.float32)).astype(np.float64)
    w = oracle.round_to(np.repeat(s, 32, axis=1) * codes + np.repeat(b, 32, axis=1), "bfloat16")
    y = (xf.astype(np.float32) @ w.astype(np.float32).T)
    return mx.array(y).astype(mx.bfloat16)


@pytest.mark.parametrize("bits", [8, 4])
def test_linear_dequant_catches_a_dropped_group_and_a_nibble_swap(rng, bits):
    """The dequantized linear's oracle and bound, as the device tests use them: a float32
    computation of the formula passes; the same with one group's weights zeroed, or (4-bit)
    each byte's two codes swapped, fails."""
    qw, xf = _dequant_case(rng, bits)
    want, bound = oracle.linear_dequant(xf, qw, None, "bfloat16")
    codes = (oracle.codes(qw) if bits == 8 else oracle.codes4(qw)).astype(np.float64)
    oracle.assert_close(_kernel_like(xf, qw, codes), want, bound, "bfloat16")
    s = np.array(qw.scales.astype(mx.float32)).astype(np.float64)
    dropped = codes.copy()
    dropped[:, 32:64] = -np.repeat(np.array(qw.biases.astype(mx.float32))[:, 1:2], 32, axis=1) / \
        np.repeat(s[:, 1:2], 32, axis=1)  # s q + b = 0 over group 1
    with pytest.raises(AssertionError):
        oracle.assert_close(_kernel_like(xf, qw, dropped), want, bound, "bfloat16")
    if bits == 4:
        swapped = codes.reshape(codes.shape[0], -1, 2)[:, :, ::-1].reshape(codes.shape)
        with pytest.raises(AssertionError):
            oracle.assert_close(_kernel_like(xf, qw, swapped), want, bound, "bfloat16")
