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
