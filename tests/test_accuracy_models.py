"""bench/accuracy_models.py's building blocks, against numpy oracles: the W8A16 / W4A16
rows it reports with ``--dequantize`` and its simulated activation-group variants."""

import os
import sys

import mlx.core as mx
import mlx.nn as nn
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))

import accuracy_models as am  # noqa: E402


def test_group_activations_quantize_each_group_of_each_token(rng):
    # One outlier channel must coarsen only its own group of 64 (one scale per token
    # would coarsen the whole row); an all-zero group stays zero.
    x = rng.standard_normal((5, 192)).astype(np.float32)
    x[:, 70] *= 300.0
    x[2, 128:] = 0.0
    y = np.array(am.GroupActivations(lambda v: v, 64)(mx.array(x)))
    for j in range(0, 192, 64):
        blk = x[:, j:j + 64].astype(np.float64)
        amax = np.abs(blk).max(axis=1, keepdims=True)
        s = np.where(amax > 0, amax / 127, 1.0)
        np.testing.assert_allclose(y[:, j:j + 64], np.clip(np.rint(blk / s), -127, 127) * s,
                                   rtol=1e-6, atol=1e-6)
    row = x.astype(np.float64)
    s_row = np.abs(row).max(axis=1, keepdims=True) / 127
    per_token = np.clip(np.rint(row / s_row), -127, 127) * s_row
    assert np.abs(y[:, :64] - x[:, :64]).max() < 0.1 * np.abs(per_token[:, :64] - x[:, :64]).max()


def test_dequantized_linears_compute_what_quantized_matmul_computes(rng):
    # --dequantize swaps nn.QuantizedLinear for nn.Linear with the dequantized weights:
    # the same products, up to float32 rounding, at 8 and 4 bits, with and without bias.
    for bits, bias in ((8, True), (4, False)):
        lin = nn.Linear(128, 48, bias=bias)
        model = nn.Sequential(nn.QuantizedLinear.from_linear(lin, group_size=64, bits=bits))
        x = mx.array(rng.standard_normal((7, 128)).astype(np.float32))
        want = np.array(model(x))
        am.dequantized(model)
        assert type(model.layers[0]) is nn.Linear
        np.testing.assert_allclose(np.array(model(x)), want, rtol=1e-4, atol=1e-4)
