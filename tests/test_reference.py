"""The exact kernel (kernels/reference.py) where MLX runs float32 matmuls in TF32."""

import mlx.core as mx
import numpy as np
import pytest

import mlx_w8a8 as w8
import oracle
from mlx_w8a8.kernels import reference


def _tf32(a: mx.array) -> mx.array:
    """``a`` rounded to TF32 (11 significant bits, nearest even), kept in float32."""
    bits = a.astype(mx.float32).view(mx.uint32)
    lsb = (bits >> 13) & 1
    rounded = (bits + 0xFFF + lsb) & 0xFFFFE000
    return rounded.view(mx.float32)


@pytest.fixture
def tf32_matmul(monkeypatch):
    """Every float32 ``mx.matmul`` rounds its inputs to TF32, as MLX does on hardware
    with reduced-precision float32 matmuls unless ``MLX_ENABLE_TF32=0``."""
    real = mx.matmul

    def matmul(a, b, *args, **kwargs):
        if a.dtype == mx.float32 and b.dtype == mx.float32:
            a, b = _tf32(a), _tf32(b)
        return real(a, b, *args, **kwargs)

    monkeypatch.setattr(mx, "matmul", matmul)
    return real


def _affine_case(rng, n=48, k=512, gs=32):
    # Weights with a large common offset: the offsets b' = b + 128 s and the activation
    # row sums R are large, so a TF32-rounded R @ b'.T is off by ~2^-11 of that term.
    w = mx.array((1.0 + 0.05 * rng.standard_normal((n, k))).astype(np.float32))
    qw = w8.quantize_weight(w, group_size=gs, per_channel=False)
    x = rng.standard_normal((5, k)).astype(np.float32) + 0.5
    return mx.array(x), x, qw


def test_tf32_emulation_rounds(tf32_matmul):
    a = mx.array([[1.0 + 2.0**-12]])
    assert mx.matmul(a, mx.ones((1, 1))).item() == 1.0  # the fixture's matmul is TF32
    assert tf32_matmul(a, mx.ones((1, 1))).item() != 1.0


def test_exact_grouped_linear_is_exact_under_tf32(rng, tf32_matmul):
    x, xn, qw = _affine_case(rng)
    want, bound = oracle.linear(xn, qw, None)
    got = w8.w8a8_linear(x, qw, kernel="exact")
    oracle.assert_close(got, want, bound, "float32")


def test_a_plain_float32_offset_matmul_is_not(rng, tf32_matmul, monkeypatch):
    # The mutant: R @ b'.T as one float32 matmul. Under TF32 it leaves the float32
    # bound, which is what the split in _offset_sum is for.
    monkeypatch.setattr(reference, "_offset_sum", lambda r, b: mx.matmul(r.astype(mx.float32), b.T))
    x, xn, qw = _affine_case(rng)
    want, bound = oracle.linear(xn, qw, None)
    got = w8.w8a8_linear(x, qw, kernel="exact")
    with pytest.raises(AssertionError, match="max excess"):
        oracle.assert_close(got, want, bound, "float32")


def test_split11_is_exact_and_sign_preserving(rng):
    a = mx.array((rng.standard_normal(1000) * 10.0 ** rng.integers(-20, 20, 1000)).astype(np.float32))
    parts = reference._split11(a)
    total = np.array(parts[0]).astype(np.float64) + np.array(parts[1]) + np.array(parts[2])
    np.testing.assert_array_equal(total, np.array(a).astype(np.float64))
    for p in parts:
        pn = np.array(p)
        assert np.all((pn == 0) | (np.sign(pn) == np.sign(np.array(a))))
        np.testing.assert_array_equal(np.array(_tf32(p)), pn)  # representable in TF32
