"""mlx_w8a8.Linear: parameters, conversion, serialization, numerics."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

import mlx_w8a8 as w8
import oracle


def test_parameters_are_those_of_an_8bit_quantized_linear():
    layer = w8.Linear(128, 48)
    stock = nn.QuantizedLinear(128, 48, group_size=64, bits=8)
    ours = {k: (v.shape, v.dtype) for k, v in tree_flatten(layer.parameters())}
    theirs = {k: (v.shape, v.dtype) for k, v in tree_flatten(stock.parameters())}
    assert ours == theirs
    assert layer.trainable_parameters() == {}  # frozen, like nn.QuantizedLinear
    assert "bias" not in w8.Linear(128, 48, bias=False)


def test_safetensors_round_trip(tmp_path, rng):
    layer = w8.Linear(128, 48, group_size=32)
    layer.bias = mx.array(rng.standard_normal(48).astype(np.float32))
    path = str(tmp_path / "layer.safetensors")
    mx.save_safetensors(path, dict(tree_flatten(layer.parameters())))
    other = w8.Linear(128, 48, group_size=32)
    other.load_weights(path)
    x = mx.array(rng.standard_normal((3, 128)).astype(np.float32))
    for kernel in (None, "reference"):
        layer.kernel = other.kernel = kernel
        np.testing.assert_array_equal(np.array(layer(x)), np.array(other(x)))
    # After load_weights the layer re-derives its format from the new arrays.
    assert other.quantized_weight.q is other.weight and other.quantized_weight.per_channel


def test_from_linear_per_channel_and_grouped(rng):
    base = nn.Linear(256, 64)
    x = mx.array(rng.standard_normal((2, 7, 256)).astype(np.float32))
    for per_channel in (True, False):
        layer = w8.Linear.from_linear(base, group_size=128, per_channel=per_channel)
        layer.kernel = "reference"
        assert layer.quantized_weight.per_channel == per_channel
        np.testing.assert_array_equal(np.array(layer.bias), np.array(base.bias))
        y = layer(x)
        assert y.shape == (2, 7, 64)
        want, bound = oracle.linear(np.array(x).reshape(-1, 256), layer.quantized_weight,
                                    np.array(base.bias))
        oracle.assert_close(y.reshape(-1, 64), want, bound, "float32")
        dense = np.array(x).reshape(-1, 256).astype(np.float64) @ np.array(base.weight).T + np.array(base.bias)
        db = oracle.sqnr_db(dense, np.array(y).reshape(-1, 64))
        print(f"Linear.from_linear per_channel={per_channel}: SQNR {db:.1f} dB vs float64")
        assert db > 30


def test_from_quantized_linear_keeps_weights_exactly(rng):
    stock = nn.QuantizedLinear(128, 32, bias=True, group_size=32, bits=8)
    stock.bias = mx.array(rng.standard_normal(32).astype(np.float32))
    layer = w8.Linear.from_linear(stock)
    for name in ("weight", "scales", "biases", "bias"):
        np.testing.assert_array_equal(np.array(layer[name]), np.array(stock[name]))
    assert layer.group_size == 32 and not layer.quantized_weight.per_channel
    x = mx.array(rng.standard_normal((4, 128)).astype(np.float32))
    # The default (untuned) path is the stock W8A16 product, bit for bit.
    np.testing.assert_array_equal(np.array(layer(x)), np.array(stock(x)))


def test_bad_construction():
    with pytest.raises(ValueError, match=r"Linear.*group_size 64 does not divide K = 96"):
        w8.Linear(96, 8)
    with pytest.raises(ValueError, match=r"Linear.*input_dims must be a positive int, got 0"):
        w8.Linear(0, 8)
    with pytest.raises(ValueError, match=r"from_linear.*only 8-bit affine.*bits=4"):
        w8.Linear.from_linear(nn.QuantizedLinear(64, 8, group_size=64, bits=4))
    with pytest.raises(ValueError, match=r"from_linear.*nn.Linear or an 8-bit.*Embedding"):
        w8.Linear.from_linear(nn.Embedding(10, 64))


def test_forced_kernel_is_used(rng):
    layer = w8.Linear(64, 16, bias=False)
    x = mx.array(rng.standard_normal((2, 64)).astype(np.float32))
    layer.kernel = "reference"
    want, bound = oracle.linear(np.array(x), layer.quantized_weight, None)
    oracle.assert_close(layer(x), want, bound, "float32")
    layer.kernel = "does_not_exist"
    with pytest.raises(ValueError, match="unknown kernel 'does_not_exist'"):
        layer(x)


def test_works_under_mx_compile(rng):
    # mlx-lm users compile their step functions; the layer's per-channel detection (a
    # host read) must not run on traced values. It runs on the parameters, which are
    # concrete, also right after they were replaced.
    layer = w8.Linear(128, 64)
    x = mx.array(rng.standard_normal((4, 128)).astype(np.float32))
    for kernel in (None, "reference"):
        layer.kernel = kernel
        np.testing.assert_array_equal(np.array(mx.compile(lambda v: layer(v))(x)), np.array(layer(x)))
    fresh = w8.Linear(128, 64)
    fresh.update(layer.parameters())
    fresh.kernel = "reference"
    np.testing.assert_array_equal(np.array(mx.compile(lambda v: fresh(v))(x)), np.array(layer(x)))
