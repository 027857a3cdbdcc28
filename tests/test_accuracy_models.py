"""bench/accuracy_models.py's building blocks, against numpy oracles: the W8A16 / W4A16
rows it reports with ``--dequantize``."""

import os
import sys

import mlx.core as mx
import mlx.nn as nn
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))

import accuracy_models as am  # noqa: E402
import oracle  # noqa: E402
from tiny_checkpoints import needs_mlx_lm, tiny_llama  # noqa: E402

import mlx_w8a8 as w8  # noqa: E402


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


@needs_mlx_lm
def test_variants_build_the_layers_their_rows_name(tmp_path, rng):
    # Each variant without calibration: float stays float; w8a8 is per-channel W8A8 of the
    # float weights; w8a16 / w4a16 are mlx-lm's 8- / 4-bit model (gs 64); w8a8_grouped and
    # w4a8 are those models converted as stored (group-wise codes, per-token scales) and
    # compute, on the exact kernels, what the oracle computes from the stored arrays;
    # w8a8_requantized is the 8-bit model requantized per channel (load(per_channel=True)).
    # lm_head stays W8A16 (convert's default). The group-wise variants hold mlx-lm's arrays
    # as stored; a variant left unconverted (an 8-bit QuantizedLinear, W8A16, reported as
    # W8A8) fails the type check.
    from mlx_lm.utils import save_config, save_model

    model, config = tiny_llama()
    folder = tmp_path / "float"
    save_model(folder, model)
    save_config(config, folder / "config.json")
    want = {"w8a8": ("per_channel", 8), "w8a8_grouped": ("grouped", 8), "w4a8": ("grouped4", 4),
            "w8a8_requantized": ("per_channel", 8)}
    x = mx.array(rng.standard_normal((3, 128)).astype(np.float32))
    stored = {}  # mlx-lm's arrays of gate_proj at 8 and 4 bits
    for variant in ("float", "w8a16", "w4a16", *want):
        built = am.build(folder, variant, mx.float32, None, print)
        gate = built.model.layers[0].mlp.gate_proj
        if variant == "float":
            assert type(gate) is nn.Linear
        elif variant in ("w8a16", "w4a16"):
            assert type(gate) is nn.QuantizedLinear and gate.bits == (8 if variant == "w8a16" else 4)
            stored[gate.bits] = (gate.weight, gate.scales, gate.biases)
        else:
            fmt, bits = want[variant]
            assert isinstance(gate, w8.Linear) and gate.format == fmt and gate.bits == bits, variant
            assert gate.kernel == ("exact_w4a8" if bits == 4 else "exact")
            qw = gate.quantized_weight
            if variant in ("w8a8_grouped", "w4a8"):  # the checkpoint's own arrays
                for a, b in zip((qw.q, qw.scales, qw.biases), stored[bits]):
                    assert mx.array_equal(a, b).item(), variant
            expect, bound = (oracle.linear4 if bits == 4 else oracle.linear)(np.array(x), qw, None)
            oracle.assert_close(gate(x), expect, bound, "float32")
        assert type(built.lm_head) is (nn.Linear if variant == "float" else nn.QuantizedLinear)
