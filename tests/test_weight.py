"""QuantizedWeight: MLX's affine 8-bit layout, per-channel detection, int8 view."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from mlx_w8a8 import QuantizedWeight, quantize_weight
import oracle


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16, mx.float16])
@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_per_channel_is_exactly_scale_times_int8(rng, dtype, group_size):
    w = mx.array(rng.standard_normal((48, 256)).astype(np.float32)).astype(dtype)
    qw = quantize_weight(w, group_size=group_size)
    assert qw.per_channel and qw.format == "per_channel" and qw.shape == (48, 256)
    assert qw.scales.dtype == dtype  # mlx-lm keeps scales in the model dtype
    s = oracle.to_numpy(qw.scales).astype(np.float64)
    w_i8 = oracle.codes(qw).astype(np.int64) - 128
    assert np.abs(w_i8).max() <= 127  # -128 is never produced
    # The stored layout dequantizes to s_n * w_i8 (what int8 GEMM computes), up to the
    # rounding of s * q + b in the dequantizer's dtype (q <= 255: 2^8 ulps of s).
    deq = oracle.to_numpy(qw.dequantize()).astype(np.float64)
    want = np.repeat(s, group_size, 1) * w_i8
    ulp = {mx.float32: 2.0**-23, mx.bfloat16: 2.0**-7, mx.float16: 2.0**-10}[dtype]
    assert np.all(np.abs(deq - want) <= np.repeat(s, group_size, 1) * 256 * ulp)
    # The int8 view is q ^ 0x80.
    np.testing.assert_array_equal(np.array(qw.int8()), w_i8.astype(np.int8))
    # Quantization error is at most half a step per element (plus scale rounding).
    wf = oracle.to_numpy(w).astype(np.float64)
    step = s[:, :1]
    assert np.all(np.abs(wf - step * w_i8) <= 0.5 * step * (1 + 2.0**-7) + 1e-12)


def test_stock_mlx_quantized_matmul_reads_per_channel_weights(rng):
    # A per-channel checkpoint is an ordinary 8-bit one to stock MLX.
    w = mx.array(rng.standard_normal((64, 128)).astype(np.float32))
    qw = quantize_weight(w)
    x = mx.array(rng.standard_normal((5, 128)).astype(np.float32))
    got = np.array(mx.quantized_matmul(x, qw.q, qw.scales, qw.biases, group_size=64, bits=8))
    w_i8 = oracle.codes(qw).astype(np.float64) - 128
    want = np.array(x).astype(np.float64) @ (np.array(qw.channel_scales)[:, None] * w_i8).T
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_affine_mode_is_mx_quantize(rng):
    w = mx.array(rng.standard_normal((32, 128)).astype(np.float32))
    qw = quantize_weight(w, group_size=32, per_channel=False)
    q, s, b = mx.quantize(w, group_size=32, bits=8)
    assert not qw.per_channel and qw.format == "grouped"
    for got, want in ((qw.q, q), (qw.scales, s), (qw.biases, b)):
        np.testing.assert_array_equal(np.array(got), np.array(want))


def test_group_wise_asked_for_stays_group_wise():
    # Weights whose groups share their scales (all zero, or one constant) look per-channel
    # to the detection of raw arrays; asked for group-wise, they stay group-wise.
    for w in (mx.zeros((4, 128)), mx.full((4, 128), 0.5)):
        qw = quantize_weight(w, group_size=64, per_channel=False)
        assert not qw.per_channel and qw.format == "grouped"
        np.testing.assert_allclose(np.array(qw.dequantize()), np.array(w), atol=1e-6)


def test_per_channel_detection(rng):
    w = mx.array(rng.standard_normal((16, 128)).astype(np.float32))
    pc = quantize_weight(w)
    # Rebuilt from raw arrays, detection sees uniform row scales and bias = -128 * scale.
    assert QuantizedWeight(pc.q, pc.scales, pc.biases, 64).per_channel
    # One bias off by one ulp makes it general affine: the grouped path must be used.
    b = np.array(pc.biases)
    b[3, 1] = np.nextafter(b[3, 1], 0, dtype=np.float32)
    assert not QuantizedWeight(pc.q, pc.scales, mx.array(b), 64).per_channel
    # A row whose groups have different scales is not per-channel either.
    s = np.array(pc.scales)
    s[0, 1] *= 2
    assert not QuantizedWeight(pc.q, mx.array(s), mx.array(-128 * s), 64).per_channel


def test_zero_row_quantizes_to_zero():
    # An all-zero output channel (pruned) must give scale 0 and dequantize to 0, not NaN.
    w = mx.zeros((4, 64))
    qw = quantize_weight(w)
    assert qw.per_channel
    np.testing.assert_array_equal(np.array(qw.dequantize()), np.zeros((4, 64), np.float32))


def test_from_int8_round_trip(rng):
    w_i8 = rng.integers(-127, 128, (8, 64), dtype=np.int8)
    s = rng.random(8).astype(np.float32) + 0.1
    qw = QuantizedWeight.from_int8(mx.array(w_i8), mx.array(s), group_size=32)
    assert qw.per_channel
    np.testing.assert_array_equal(np.array(qw.int8()), w_i8)
    np.testing.assert_array_equal(np.array(qw.channel_scales), s)


def test_from_quantized_linear_keeps_the_arrays():
    layer = nn.QuantizedLinear(128, 32, group_size=64, bits=8)
    qw = QuantizedWeight(layer.weight, layer.scales, layer.biases, layer.group_size)
    assert qw.q is layer.weight and qw.scales is layer.scales and not qw.per_channel


def test_group_offsets(rng):
    w = mx.array(rng.standard_normal((8, 64)).astype(np.float32))
    qw = quantize_weight(w, group_size=32, per_channel=False)
    want = np.array(qw.biases) + 128 * np.array(qw.scales)
    np.testing.assert_allclose(np.array(qw.group_offsets), want, rtol=1e-7)


def test_bad_weights_are_rejected(rng):
    w = mx.zeros((8, 96))
    with pytest.raises(ValueError, match=r"quantize_weight.*w must be 2-D \[N, K\], got shape \[96\]"):
        quantize_weight(mx.zeros((96,)))
    with pytest.raises(ValueError, match=r"quantize_weight.*group_size 64 does not divide K = 96"):
        quantize_weight(w, group_size=64)
    with pytest.raises(ValueError, match=r"quantize_weight.*group_size must be one of \(32, 64, 128\) \(an int\), got 16"):
        quantize_weight(w, group_size=16)
    with pytest.raises(ValueError, match=r"quantize_weight.*w must be a float16, bfloat16 or float32.*int8"):
        quantize_weight(mx.zeros((8, 96), mx.int8))
    pc = quantize_weight(mx.zeros((8, 128)))
    with pytest.raises(ValueError, match=r"QuantizedWeight.*scales must have shape \[N, K // group_size\] = \[8, 2\].*got \[8, 4\]"):
        QuantizedWeight(pc.q, mx.zeros((8, 4)), pc.biases, 64)
    with pytest.raises(ValueError, match=r"QuantizedWeight.*biases must be a float16.*int32"):
        QuantizedWeight(pc.q, pc.scales, mx.zeros((8, 2), mx.int32), 64)
    with pytest.raises(ValueError, match=r"QuantizedWeight.*q must be a \[N, K // 4\] uint32.*int8"):
        QuantizedWeight(mx.zeros((8, 128), mx.int8), pc.scales, pc.biases, 64)
    with pytest.raises(ValueError, match=r"from_int8.*scales must be a float \[N\] or \[N, 1\].*N = 8"):
        QuantizedWeight.from_int8(mx.zeros((8, 64), mx.int8), mx.zeros((4,)))


def test_group_size_must_be_an_int():
    # 64.0 == 64, so a membership test alone lets it through to MLX's own error.
    w = mx.zeros((8, 128))
    with pytest.raises(ValueError, match=r"quantize_weight.*group_size must be one of.*an int.*got 64\.0 \(float\)"):
        quantize_weight(w, group_size=64.0)
    with pytest.raises(ValueError, match=r"group_size must be one of.*an int.*got True"):
        quantize_weight(w, group_size=True)
    pc = quantize_weight(w)
    with pytest.raises(ValueError, match=r"QuantizedWeight.*group_size must be one of.*an int.*64\.0"):
        QuantizedWeight(pc.q, pc.scales, pc.biases, 64.0)
    assert QuantizedWeight(pc.q, pc.scales, pc.biases, np.int64(64)).group_size == 64


def test_empty_k_is_rejected():
    # K = 0: no group to quantize; MLX would fail later with its own message.
    with pytest.raises(ValueError, match=r"quantize_weight.*K must be a positive multiple.*got K = 0"):
        quantize_weight(mx.zeros((8, 0)))
    with pytest.raises(ValueError, match=r"QuantizedWeight.*K must be a positive.*K = 0"):
        QuantizedWeight(mx.zeros((8, 0), mx.uint32), mx.zeros((8, 0)), mx.zeros((8, 0)), 64)


@pytest.mark.parametrize("bits", [4, 2])
def test_other_bit_widths_are_named(bits):
    # A 4-bit checkpoint's arrays have the right dtypes; only the shapes differ. The
    # message must say "4-bit", not that the scales have the wrong shape.
    q, s, b = mx.quantize(mx.zeros((8, 256)), group_size=64, bits=bits)
    with pytest.raises(ValueError, match=rf"QuantizedWeight.*q holds {bits}-bit codes.*bits=8"):
        QuantizedWeight(q, s, b, 64)


def test_derived_arrays_are_made_once_per_key_and_stay_with_their_weight():
    """QuantizedWeight.derived: ``make`` runs on a key's first call only (the CUDA TMA
    GEMM's map array is made once per weight and tile width, and every launch on the
    weight must name that one array); keys are apart; a copy made with attrs.evolve
    (another object, possibly other arrays) starts empty."""
    import attrs

    w = QuantizedWeight.from_float(mx.random.normal((8, 64)), group_size=64, per_channel=True)
    made = []

    def make(tag):
        def f():
            made.append(tag)
            return mx.array([len(made)])
        return f

    first = w.derived(("maps", 256), make("a"))
    assert w.derived(("maps", 256), make("again")) is first and made == ["a"]
    other = w.derived(("maps", 32), make("b"))
    assert other is not first and made == ["a", "b"]
    copy = attrs.evolve(w)
    assert copy.derived(("maps", 256), make("c")) is not first and made == ["a", "b", "c"]
    assert w.derived(("maps", 256), make("d")) is first and made == ["a", "b", "c"]



# --- scales and biases stay representable ---------------------------------------------
def _stock_layer(qw, x):
    """``x`` through a stock float16 ``nn.QuantizedLinear`` holding ``qw``'s arrays, as
    stock mlx-lm loads a checkpoint (``load_weights`` checks shapes, not dtypes)."""
    layer = nn.QuantizedLinear(qw.k, qw.n, bias=False, group_size=qw.group_size, bits=8)
    layer.set_dtype(mx.float16)
    layer.load_weights([("weight", qw.q), ("scales", qw.scales), ("biases", qw.biases)],
                       strict=True)
    return np.array(layer(x.astype(mx.float16)).astype(mx.float32)).astype(np.float64)


def test_float16_rows_past_32k_keep_finite_scales_and_biases(rng):
    # max |w| = 40000: the float16 scale 315 is finite, but MLX's dequantizer forms
    # s * q (q <= 255: 80k) in the scales' dtype, so float16 storage gave inf in
    # dequantize() and in stock nn.QuantizedLinear. 40000 is above 65504 / 255 and
    # below 65504 / 128, so a check of the bias -128 s alone would not see it.
    w = rng.standard_normal((4, 64)).astype(np.float32)
    w[1, 3] = 40000.0
    qw = quantize_weight(mx.array(w).astype(mx.float16))
    assert qw.per_channel and qw.scales.dtype == qw.biases.dtype == mx.float32
    s = np.array(qw.channel_scales).astype(np.float64)
    w_deq = s[:, None] * (oracle.codes(qw).astype(np.int64) - 128)
    deq = np.array(qw.dequantize()).astype(np.float64)
    assert np.all(np.abs(deq - w_deq) <= s[:, None] * 256 * 2.0**-23)  # s q + b in float32
    x = mx.array(rng.standard_normal((3, 64)).astype(np.float32)).astype(mx.float16)
    want = np.array(x.astype(mx.float32)).astype(np.float64) @ w_deq.T
    got = _stock_layer(qw, x)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * np.abs(want).max())


def test_from_int8_keeps_a_large_float16_scale_finite():
    # A float16 scale of 600 stored its bias -128 * 600 = -76800 as -inf.
    w_i8 = mx.array(np.tile(np.array([[-127, 0, 5, 127], [1, -1, 2, -2]], np.int8), (1, 32)))
    qw = QuantizedWeight.from_int8(w_i8, mx.array([600.0, 0.5]).astype(mx.float16), group_size=64)
    assert qw.per_channel and qw.scales.dtype == qw.biases.dtype == mx.float32
    np.testing.assert_array_equal(np.array(qw.biases), [[-76800.0] * 2, [-64.0] * 2])
    want = np.array([[600.0], [0.5]]) * np.array(w_i8).astype(np.float64)
    deq = np.array(qw.dequantize()).astype(np.float64)
    assert np.all(np.abs(deq - want) <= np.array([[600.0], [0.5]]) * 256 * 2.0**-23)
    # Scales that fit stay in their dtype (mlx-lm keeps scales in the model dtype).
    kept = QuantizedWeight.from_int8(w_i8, mx.array([200.0, 1e-7]).astype(mx.float16), 64)
    assert kept.scales.dtype == mx.float16


def test_tiny_float16_rows_are_not_stored_as_zeros(rng):
    # max |w| = 3e-6: the float16 scale 3e-6 / 127 rounded to 0 (below half of float16's
    # smallest subnormal, 2^-24) and the row was stored as zeros (SQNR 0 dB); mx.quantize
    # keeps about 5.5 dB there. A scale below float16's normal range is rounded up to a
    # multiple of 2^-24, so it is never 0 and no code clips; a row this small is then
    # exact (float16 values below 2^-14 are multiples of 2^-24). Scales stay float16.
    w = rng.standard_normal((4, 128)).astype(np.float32)
    w[0] *= 3e-6 / np.abs(w[0]).max()
    w[1] *= 2e-7 / np.abs(w[1]).max()  # a few units of 2^-24: rounding to nearest
    w[2] *= 2e-3 / np.abs(w[2]).max()  # a subnormal scale (max |w| < 127 * 2^-14)
    w16 = mx.array(w).astype(mx.float16)
    wf = np.array(w16.astype(mx.float32)).astype(np.float64)
    qw = quantize_weight(w16)
    assert qw.scales.dtype == qw.biases.dtype == mx.float16
    s = oracle.to_numpy(qw.scales).astype(np.float64)[:, 0]
    w_i8 = oracle.codes(qw).astype(np.int64) - 128
    assert (s[:3] * 127 >= np.abs(wf[:3]).max(axis=1)).all()  # no code clips
    np.testing.assert_array_equal(s[:2] * w_i8[:2].T, wf[:2].T)  # stored exactly
    deq = np.array(qw.dequantize().astype(mx.float32)).astype(np.float64)
    for row in range(4):
        assert oracle.sqnr_db(wf[row], deq[row]) > 35.0, row
