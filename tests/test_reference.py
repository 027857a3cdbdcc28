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


def test_qmm_is_not_chosen_where_mlx_cuda_kernel_is_wrong(monkeypatch):
    # MLX 0.32.4's CUDA quantized_matmul is wrong for one group per row at M > 1 (measured
    # on an H200, reference.qmm_supports). There mlx_qmm does not handle the problem, the
    # fallback is the exact kernel, and forcing mlx_qmm is refused; elsewhere, and off
    # CUDA, nothing changes.
    from mlx_w8a8.kernels import registry
    from mlx_w8a8.kernels.registry import Problem

    def problem(m, k, gs):
        return Problem("linear", m, 32, k, "bfloat16", "grouped", gs)

    qmm = registry.get("linear", "mlx_qmm")
    layer = w8.Linear(64, 32, group_size=64, per_channel=False)  # no prior rule at M = 4
    monkeypatch.setattr(reference, "_on_cuda", lambda: False)  # a CPU or Metal backend
    registry.invalidate()
    assert qmm.handles(problem(4, 64, 64))
    assert layer.decision(4, mx.bfloat16) == ("mlx_qmm", "fallback")
    monkeypatch.setattr(reference, "_on_cuda", lambda: True)
    registry.invalidate()
    assert not qmm.handles(problem(4, 64, 64)) and not qmm.handles(problem(256, 128, 128))
    assert qmm.handles(problem(1, 64, 64)) and qmm.handles(problem(4, 128, 64))
    assert qmm.handles(problem(4, 64, 32))
    assert registry.fallback(problem(4, 64, 64)).name == registry.EXACT
    assert registry.fallback(problem(1, 64, 64)).name == "mlx_qmm"
    assert layer.decision(4, mx.bfloat16) == (registry.EXACT, "fallback")
    # M = 1: mlx_qmm handles it; on this CPU the prior's rule for grouped weights names it
    assert layer.decision(1, mx.bfloat16)[0] == "mlx_qmm"
    layer.kernel = "mlx_qmm"
    with pytest.raises(ValueError, match="kernel 'mlx_qmm' cannot run linear for M=4"):
        layer.decision(4, mx.bfloat16)


def _affine4_case(rng, n=48, k=512, gs=64):
    # 4-bit weights around 1 (large biases b, large activation group sums R): a TF32
    # R @ b.T would be off by ~2^-12 of the bias term.
    w = mx.array((1.0 + 0.05 * rng.standard_normal((n, k))).astype(np.float32))
    qw = w8.QuantizedWeight.from_float(w, group_size=gs, per_channel=False, bits=4)
    x = rng.standard_normal((5, k)).astype(np.float32) + 0.5
    return mx.array(x), x, qw


def test_exact_w4a8_is_exact_under_tf32(rng, tf32_matmul):
    x, xn, qw = _affine4_case(rng)
    want, bound = oracle.linear4(xn, qw, None)
    oracle.assert_close(w8.w8a8_linear(x, qw, kernel="exact_w4a8"), want, bound, "float32")


def test_a_plain_float32_bias_matmul_in_w4a8_is_not(rng, tf32_matmul, monkeypatch):
    # The mutant: sum_g R_mg b_ng as one float32 matmul; under TF32 it leaves the bound.
    monkeypatch.setattr(reference, "_offset_sum", lambda r, b: mx.matmul(r.astype(mx.float32), b.T))
    x, xn, qw = _affine4_case(rng)
    want, bound = oracle.linear4(xn, qw, None)
    with pytest.raises(AssertionError, match="max excess"):
        oracle.assert_close(w8.w8a8_linear(x, qw, kernel="exact_w4a8"), want, bound, "float32")
