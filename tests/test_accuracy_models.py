"""bench/accuracy_models.py's building blocks, against numpy oracles: the W8A16 / W4A16
rows it reports with ``--dequantize``."""

import os
import sys

import mlx.core as mx
import mlx.nn as nn
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))

import accuracy_models as am  # noqa: E402


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
