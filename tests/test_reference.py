"""The exact kernel (kernels/reference.py) where MLX runs float32 matmuls in TF32."""

import mlx.core as mx
import numpy as np
import pytest

import mlx_w8a8 as w8
import oracle
from mlx_w8a8 import backends
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
    from mlx_w8a8.tuning import prior

    def problem(m, k, gs):
        return Problem("linear", m, 32, k, "bfloat16", "grouped", gs)

    qmm = registry.get("linear", "mlx_qmm")
    layer = w8.Linear(64, 32, group_size=64, per_channel=False)
    # no prior rule at M = 4 (the CPU's M = 1 rule kept): the fallback decides there
    monkeypatch.setitem(prior.RULES, ("cpu", "linear", "grouped"), [(1, 1, 0, ("mlx_qmm",))])
    monkeypatch.setattr(backends, "on_cuda", lambda: False)  # a CPU or Metal backend
    registry.invalidate()
    assert qmm.handles(problem(4, 64, 64))
    assert layer.decision(4, mx.bfloat16) == ("mlx_qmm", "fallback")
    monkeypatch.setattr(backends, "on_cuda", lambda: True)
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


# --- activation groups (exact_act_groups) ------------------------------------------------


def _weights(rng, n, k, gs):
    w = mx.array((rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32))
    return {8: w8.quantize_weight(w, group_size=gs, per_channel=False),
            4: w8.QuantizedWeight.from_float(w, gs, False, bits=4)}


def _outlier_rows(rng, m, k):
    # One channel ~300x the others (SmolLM2 has one ~2,600x the median): per-token codes
    # of every other channel then hold a few levels only; per-group codes do not.
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[:, 5] *= 300.0
    return x


@pytest.mark.parametrize("gs", [32, 64, 128])
def test_quantize_groups_is_the_oracle_bit_for_bit(rng, gs):
    x = _outlier_rows(rng, 7, 4 * gs)
    x[1, gs : 2 * gs] = 0.0  # an all-zero group: scale 0, codes 0 (the others unaffected)
    x[2, 3] = np.nan  # a non-finite group: its scale NaN, codes 0; other groups' kept
    x[3, 2 * gs] = np.inf
    q, t, r = reference.quantize_groups(mx.array(x), gs)
    q_want, t_want = oracle.quantize_groups(x, gs)
    np.testing.assert_array_equal(np.array(q), q_want)
    np.testing.assert_array_equal(np.array(t), t_want)  # NaN where the oracle has NaN
    np.testing.assert_array_equal(np.array(r), q_want.astype(np.int64).reshape(7, 4, gs).sum(-1))
    assert np.isnan(t_want[2, 0]) and np.isfinite(t_want[2, 1:]).all() and t_want[1, 1] == 0


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_exact_act_groups_is_the_oracle(rng, bits, dtype, tf32_matmul):
    # Under TF32 emulation too: only the integer group products go through a matmul.
    m, n, k, gs = 9, 40, 256, 64
    qw = _weights(rng, n, k, gs)[bits]
    x = mx.array(_outlier_rows(rng, m, k)).astype(getattr(mx, dtype))
    bias = mx.array(rng.standard_normal(n).astype(np.float32)).astype(getattr(mx, dtype))
    xn = np.array(x.astype(mx.float32))
    want, bound = oracle.linear_act_groups(xn, qw, np.array(bias.astype(mx.float32)))
    got = w8.w8a8_linear(x, qw, bias, kernel="exact_act_groups", act_scales="group")
    oracle.assert_close(got, want, bound, dtype)


def test_exact_act_groups_mutants_fail_the_oracle(rng, monkeypatch):
    # Per-token scales in place of the group scales (broadcast to every group), or the
    # offset term dropped: each leaves the oracle's bound by far.
    m, n, k, gs = 6, 24, 256, 64
    qw = _weights(rng, n, k, gs)[8]
    xn = _outlier_rows(rng, m, k)
    want, bound = oracle.linear_act_groups(xn, qw, None)
    real = reference.quantize_groups

    def per_token(x, group):
        q, s, _ = reference.quantize_rows(x, group)
        _, _, r = reference.quantize_rows(x, group)
        return q, mx.broadcast_to(s, (x.shape[0], x.shape[1] // group)), r

    for mutant in (per_token,
                   lambda x, g: (lambda q, t, r: (q, t, mx.zeros_like(r)))(*real(x, g))):
        monkeypatch.setattr(reference, "quantize_groups", mutant)
        got = reference.act_groups_linear(mx.array(xn), qw, None)
        excess = np.abs(np.array(got).astype(np.float64) - want) / bound
        assert excess.max() > 100, excess.max()


@pytest.mark.parametrize("bits", [8, 4])
def test_activation_groups_cut_the_error_of_an_outlier_channel(rng, bits):
    # What the mode is for: against the W8A16 product of the same weights, per-group
    # scales keep the error of the rows with an outlier channel far below per-token ones.
    m, n, k, gs = 16, 64, 512, 64
    qw = _weights(rng, n, k, gs)[bits]
    x = mx.array(_outlier_rows(rng, m, k))
    w16 = np.array(x) @ np.array(qw.dequantize()).astype(np.float64).T
    token = np.array(reference.w4a8_linear(x, qw, None) if bits == 4
                     else reference.w8a8_linear(x, qw, None))
    group = np.array(reference.act_groups_linear(x, qw, None))
    err = lambda y: np.linalg.norm(y - w16) / np.linalg.norm(w16)  # noqa: E731
    assert err(group) < err(token) / 2, (err(group), err(token))  # 2.6-3.1x over 20 seeds


def test_only_exact_act_groups_and_w8a16_take_activation_groups():
    # (mlx_dequant_matmul is W8A16 / W4A16 too: it ignores act_scales, as mlx_qmm does.)
    # A per-token kernel must never run an act_scales="group" problem (its result would
    # be the other math): the registry refuses it centrally, and says why.
    from mlx_w8a8.kernels import registry

    for fmt, w16 in (("grouped", "mlx_qmm"), ("grouped4", "mlx_qmm4")):
        p = registry.Problem("linear", 16, 64, 256, "bfloat16", fmt, 64, False, "group")
        assert {c.name for c in registry.candidates(p)} == {"exact_act_groups", w16,
                                                            "mlx_dequant_matmul"}
        assert registry.exact_name(p) == "exact_act_groups"
        assert "per token only" in registry.refusal(registry.get("linear", registry.exact_name(
            registry.Problem("linear", 16, 64, 256, "bfloat16", fmt, 64))), p)
        token = registry.Problem("linear", 16, 64, 256, "bfloat16", fmt, 64)
        assert "exact_act_groups" not in {c.name for c in registry.candidates(token)}
    with pytest.raises(ValueError, match="needs group-wise weights"):
        registry.Problem("linear", 16, 64, 256, "bfloat16", "per_channel", 64, False, "group")
