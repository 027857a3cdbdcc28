"""MLX's 4-bit weights as stored (format ``grouped4``): the layout, the exact W4A8 math
against the float64/int64 oracle, the W4A16 reference, and no second copy of the codes."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

import mlx_w8a8 as w8
import oracle
from mlx_w8a8.kernels import reference, registry
from mlx_w8a8.kernels.registry import Problem
from mlx_w8a8.weight import QuantizedWeight


def _weight(rng, n, k, gs, dtype=mx.float32, zero_groups=0):
    """A 4-bit weight as ``mx.quantize`` writes it, with offsets (weights around 0.3, so
    the bias term matters) and the first ``zero_groups`` groups of every row all zero
    (MLX stores scale -1e-7, bias 0 and codes 0 there)."""
    w = 0.3 + 0.05 * rng.standard_normal((n, k))
    w[:, : zero_groups * gs] = 0.0
    w = mx.array(w.astype(np.float32)).astype(dtype)
    return QuantizedWeight.from_float(w, group_size=gs, per_channel=False, bits=4)


def test_codes_are_mlx_nibble_order(rng):
    # MLX packs code j of a word in bits 4j..4j+3: the unpacked codes are the oracle's
    # (read from the words), and dequantizing them is mx.dequantize. A swapped nibble
    # order in unpack4 fails the first assert.
    qw = _weight(rng, 6, 128, 32)
    codes = np.array(qw.codes())
    np.testing.assert_array_equal(codes, oracle.codes4(qw))
    assert codes.max() <= 15 and qw.k == 128 and qw.q.shape == (6, 16)
    s = np.repeat(np.array(qw.scales), 32, axis=1)
    b = np.repeat(np.array(qw.biases), 32, axis=1)
    np.testing.assert_allclose(s * codes + b, np.array(qw.dequantize()), rtol=1e-6, atol=1e-7)


def test_the_4bit_layout_is_validated():
    q, s, b = mx.quantize(mx.zeros((8, 256)), group_size=64, bits=4)
    assert QuantizedWeight(q, s, b, 64, bits=4).format == "grouped4"
    with pytest.raises(ValueError, match=r"QuantizedWeight\] q holds 4-bit codes.*pass bits=4"):
        QuantizedWeight(q, s, b, 64)
    with pytest.raises(ValueError, match=r"QuantizedWeight\] bits must be one of \(4, 8\), got 3"):
        QuantizedWeight(q, s, b, 64, bits=3)
    with pytest.raises(ValueError, match=r"per_channel=True needs 8-bit codes"):
        QuantizedWeight(q, s, b, 64, per_channel=True, bits=4)
    with pytest.raises(ValueError, match=r"QuantizedWeight.int8\] .* 4-bit codes"):
        QuantizedWeight(q, s, b, 64, bits=4).int8()
    with pytest.raises(ValueError, match=r"QuantizedWeight.group_offsets\] .* 4-bit codes"):
        QuantizedWeight(q, s, b, 64, bits=4).group_offsets
    with pytest.raises(ValueError, match=r"quantize_weight\] bits=4 is group-wise affine only"):
        QuantizedWeight.from_float(mx.zeros((8, 256)), 64, per_channel=True, bits=4)


# M = 1 (decode), odd M and N (no tile multiple), K of one group and of many; every
# group size; all-zero groups, which must give exactly the bias term (0 here).
@pytest.mark.parametrize("m, n, k, gs, zero_groups", [
    (1, 33, 64, 32, 0),
    (7, 19, 384, 64, 1),
    (5, 48, 512, 128, 2),
    (3, 9, 128, 128, 1),
])
@pytest.mark.parametrize("with_bias", [False, True])
def test_exact_w4a8_against_the_oracle(rng, m, n, k, gs, zero_groups, with_bias):
    qw = _weight(rng, n, k, gs, zero_groups=zero_groups)
    xn = (rng.standard_normal((m, k)) + 0.5).astype(np.float32)
    bias = (0.1 * rng.standard_normal(n)).astype(np.float32) if with_bias else None
    want, bound = oracle.linear4(xn, qw, bias)
    got = w8.w8a8_linear(mx.array(xn), qw, None if bias is None else mx.array(bias),
                         kernel="exact_w4a8")
    oracle.assert_close(got, want, bound, "float32")
    if zero_groups:  # a row of only zero groups: exactly the bias
        only_zero = mx.array(np.where(np.arange(k) < zero_groups * gs, xn, 0.0).astype(np.float32))
        y = np.array(w8.w8a8_linear(only_zero, qw, kernel="exact_w4a8"))
        assert np.all(y == 0.0)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_exact_w4a8_in_16_bit_dtypes(rng, dtype):
    qw = _weight(rng, 24, 256, 64, dtype=getattr(mx, dtype))
    x = mx.array(rng.standard_normal((4, 256)).astype(np.float32)).astype(getattr(mx, dtype))
    want, bound = oracle.linear4(oracle.to_numpy(x), qw, None)
    got = w8.w8a8_linear(x, qw, kernel="exact_w4a8")
    assert got.dtype == x.dtype
    oracle.assert_close(got, want, bound, dtype)


def test_dropping_the_bias_term_is_caught_by_the_oracle(rng):
    # The mutant: sum_g b_ng R_mg left out (or a dropped group's worth of it). The
    # weights sit around 0.3, so the bias term carries most of the output.
    qw = _weight(rng, 16, 256, 64)
    xn = (rng.standard_normal((3, 256)) + 0.5).astype(np.float32)
    want, bound = oracle.linear4(xn, qw, None)
    q, scale, sums = reference.quantize_rows(mx.array(xn), 64)
    broken = reference._w4a8_code_sum(q, qw) * scale
    with pytest.raises(AssertionError, match="max excess"):
        oracle.assert_close(broken, want, bound, "float32")


def test_qmm4_is_mx_quantized_matmul_at_4_bits(rng):
    qw = _weight(rng, 40, 256, 32)
    x = mx.array(rng.standard_normal((5, 256)).astype(np.float32))
    want = mx.quantized_matmul(x, qw.q, qw.scales, qw.biases, True, 32, 4)
    np.testing.assert_array_equal(np.array(w8.w8a8_linear(x, qw, kernel="mlx_qmm4")),
                                  np.array(want))


def test_only_the_4bit_candidates_take_the_4bit_format():
    # exact and mlx_qmm read 8-bit codes, and so do the 8-bit CUDA kernels: none may be
    # offered for grouped4 (registered here even where their backend is absent, so their
    # supports() are checked directly). The W4A8 kernels read the packed 4-bit words:
    # Metal's GEMM at every M, the GEMVs at M <= 16, the tensor-core GEMV at M <= 32 (the
    # CUDA TMA GEMM refuses here: no Hopper GPU); the dequantize-then-matmul candidates
    # take both group-wise formats.
    for m in (1, 16, 512):
        p = Problem("linear", m, 4096, 4096, "bfloat16", "grouped4", 64)
        takes = {c.name for c in registry.all_candidates() if c.op == "linear" and c.supports(p)
                 and (not c.w8a8 or p.act_scales in c.act_scales)}
        want = {"exact_w4a8", "mlx_qmm4", "metal_w4a8_gemm", "mlx_dequant_matmul",
                "cuda_dequant_matmul"} | (
            {"metal_w4a8_gemv", "cuda_w4a8_gemv", "cuda_w4a8_gemv_mma"} if m <= 16 else set())
        assert takes == want, takes
        assert registry.fallback(p).name == "mlx_qmm4"
        assert registry.exact_name(p) == "exact_w4a8"
    p8 = Problem("linear", 4, 64, 64, "bfloat16", "grouped", 64)
    assert not registry.get("linear", "exact_w4a8").supports(p8)
    assert not registry.get("linear", "mlx_qmm4").supports(p8)
    assert registry.fallback(p8).name == "mlx_qmm" and registry.exact_name(p8) == "exact"
    assert registry.inexact(Problem("linear", 1, 8, 1 << 20, "float32", "grouped4", 128)) is None


def test_a_converted_4bit_layer_holds_the_stored_arrays(rng):
    # No second copy: the layer's parameters are nn.QuantizedLinear's arrays themselves
    # (the same objects, so the same bytes), and running the W4A8 kernel keeps none.
    stock = nn.QuantizedLinear(256, 96, bias=True, group_size=64, bits=4)
    layer = w8.Linear.from_linear(stock)
    for name in ("weight", "scales", "biases", "bias"):
        assert layer[name] is stock[name], name
    assert layer.quantized_weight.q is stock["weight"] and layer.bits == 4
    nbytes = lambda module: sum(v.nbytes for _, v in nn.utils.tree_flatten(module.parameters()))  # noqa: E731
    assert nbytes(layer) == nbytes(stock)
    x = mx.array(rng.standard_normal((1, 256)).astype(np.float32))
    np.testing.assert_array_equal(np.array(layer(x)), np.array(stock(x)))  # M = 1 default: W4A16
    layer.kernel = "exact_w4a8"
    layer(x), layer(x)
    assert nbytes(layer) == nbytes(stock)
    assert sorted(k for k, _ in nn.utils.tree_flatten(layer.parameters())) == [
        "bias", "biases", "scales", "weight"]


def test_quantize_keeps_a_4bit_models_arrays():
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(128, 64)
            self.b = nn.Linear(64, 128, bias=False)

    model = Two()
    nn.quantize(model, group_size=32, bits=4)
    before = {k: v for k, v in nn.utils.tree_flatten(model.parameters())}
    w8.quantize(model)
    after = dict(nn.utils.tree_flatten(model.parameters()))
    assert before.keys() == after.keys()
    assert all(after[k] is before[k] for k in before)
    assert {type(model.a), type(model.b)} == {w8.Linear} and model.b.format == "grouped4"


def test_a_4bit_layer_rebuilds_on_new_arrays(rng):
    # load_weights / update replace the arrays: the layer runs the new ones, still 4-bit.
    layer = w8.Linear(128, 32, bits=4, group_size=32)
    other = QuantizedWeight.from_float(mx.array(rng.standard_normal((32, 128)).astype(np.float32)),
                                       32, per_channel=False, bits=4)
    layer.update({"weight": other.q, "scales": other.scales, "biases": other.biases})
    x = mx.array(rng.standard_normal((1, 128)).astype(np.float32))  # M = 1 default: W4A16
    y = np.array(layer(x)) - np.array(layer["bias"])
    np.testing.assert_array_equal(y, np.array(w8.w8a8_linear(x, other, kernel="mlx_qmm4")))
    assert layer.quantized_weight.q is other.q and layer.format == "grouped4"
