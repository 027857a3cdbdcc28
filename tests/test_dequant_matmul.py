"""``mlx_dequant_matmul`` (mlx_w8a8/kernels/dequant_matmul.py): mx.dequantize, then
MLX's float matmul, against a float64 oracle of the dequantized weight; its refusals and
its bound form. Runs on any MLX device (here: the CPU)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mlx_w8a8.kernels import dequant_matmul, registry
from mlx_w8a8.kernels.registry import Problem
from mlx_w8a8.weight import QuantizedWeight

import oracle


def weight(rng, n, k, group_size, bits, scale_dtype=mx.bfloat16) -> QuantizedWeight:
    """``mx.quantize``'s arrays of rows with a non-zero mean (the biases matter)."""
    w = rng.standard_normal((n, k)).astype(np.float32) / np.sqrt(k) + 0.05
    q, s, b = mx.quantize(mx.array(w), group_size=group_size, bits=bits)
    return QuantizedWeight(q, s.astype(scale_dtype), b.astype(scale_dtype), group_size,
                           per_channel=False, bits=bits)


def want(x: np.ndarray, w: QuantizedWeight, bias) -> tuple[np.ndarray, np.ndarray]:
    """float64 ``x @ dequantize(w).T (+ bias)`` with ``mx.dequantize``'s weight (the
    candidate's first step is MLX's own op) and a float32 summation allowance."""
    wd = oracle.to_numpy(w.dequantize()).astype(np.float64)
    y = x.astype(np.float64) @ wd.T
    bound = w.k * 2.0**-23 * (np.abs(x.astype(np.float64)) @ np.abs(wd).T)
    if bias is not None:
        y = y + bias.astype(np.float64)[None, :]
        bound = bound + 2.0**-24 * np.abs(y)
    return y, bound + 1e-30


# Why each case: a tail-free and an odd M; one row; a weight row of one group (K = group
# size, the shape MLX's CUDA quantized_matmul got wrong); 4-bit codes; float32 scales.
CASES = [(5, 24, 192, 64, 8, True), (1, 70, 256, 32, 8, False), (33, 40, 128, 128, 8, True),
         (7, 48, 64, 64, 8, False), (9, 36, 256, 64, 4, True), (3, 16, 512, 128, 4, False)]


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_matches_the_float64_product(rng, case, dtype):
    m, n, k, gs, bits, with_bias = CASES[case]
    mx_dtype = getattr(mx, dtype)
    w = weight(rng, n, k, gs, bits, mx_dtype)
    x = mx.array(rng.standard_normal((m, k)).astype(np.float32)).astype(mx_dtype)
    bias = mx.array(rng.standard_normal(n).astype(np.float32)).astype(mx_dtype) if with_bias else None
    got = dequant_matmul.linear(x, w, bias)
    assert got.dtype == mx_dtype and got.shape == (m, n)
    y, bound = want(oracle.to_numpy(x), w, None if bias is None else oracle.to_numpy(bias))
    oracle.assert_close(got, y, bound, dtype)


def test_a_wrong_group_is_caught(rng):
    """The oracle can fail: the same matmul on a weight whose first group's scales were
    doubled is outside the bound."""
    w = weight(rng, 24, 192, 64, 8)
    bad = QuantizedWeight(w.q, w.scales.at[:, 0].multiply(2.0), w.biases, 64, per_channel=False)
    x = mx.array(rng.standard_normal((5, 192)).astype(np.float32)).astype(mx.bfloat16)
    y, bound = want(oracle.to_numpy(x), w, None)
    with pytest.raises(AssertionError):
        oracle.assert_close(dequant_matmul.linear(x, bad, None), y, bound, "bfloat16")


def test_registered_as_a_w8a16_candidate_for_group_wise_weights():
    cand = registry.get("linear", dequant_matmul.NAME)
    assert not cand.w8a8 and cand.backend == "any"
    assert cand.supports(Problem("linear", 16, 64, 256, "bfloat16", "grouped", 64))
    assert cand.supports(Problem("linear", 16, 64, 256, "bfloat16", "grouped4", 32))
    p = Problem("linear", 16, 64, 256, "bfloat16", "per_channel")
    assert not cand.supports(p)
    why = registry.refusal(cand, p)
    assert "grouped" in why and "'per_channel'" in why


def test_bound_layer_call_equals_run(rng):
    """``bind`` (the layer's one closure, arrays read at call time) on ``[..., K]``."""
    import mlx_w8a8

    layer = mlx_w8a8.Linear(256, 40, bias=True, per_channel=False, group_size=64)
    x = mx.array(rng.standard_normal((2, 3, 256)).astype(np.float32)).astype(mx.bfloat16)
    layer.set_dtype(mx.bfloat16)
    p = Problem("linear", 6, 40, 256, "bfloat16", "grouped", 64, True)
    f = registry.get("linear", dequant_matmul.NAME).bind(layer, p)
    y = f(x)
    assert y.shape == (2, 3, 40) and y.dtype == mx.bfloat16
    w = QuantizedWeight(layer["weight"], layer["scales"], layer["biases"], 64, per_channel=False)
    assert mx.array_equal(y.reshape(6, 40), dequant_matmul.linear(x.reshape(6, 256), w, layer["bias"])).item()


def test_the_float_weight_bound_refuses_larger_weights(monkeypatch):
    """MLX_W8A8_DEQUANT_MAX_MB: a weight whose float copy would exceed it is refused by
    both dequantize-then-matmul candidates (the reason names the variable), one within
    it is not, 0 refuses every one; a value that is not a number is an error that
    names it."""
    small = Problem("linear", 512, 1024, 1024, "bfloat16", "grouped", 64)  # 2 MiB as bf16
    large = Problem("linear", 512, 4096, 4096, "bfloat16", "grouped4", 64)  # 32 MiB
    names = (dequant_matmul.NAME, "cuda_dequant_matmul")
    monkeypatch.setenv(dequant_matmul.ENV_MAX_MB, "16")
    for name in names:  # (can_implement: the CUDA one is unavailable on this machine)
        cand = registry.get("linear", name)
        ok, why = cand.can_implement(large)
        assert not ok and "MLX_W8A8_DEQUANT_MAX_MB = 16" in why and "N = 4096" in why, why
        assert not cand.supports(large)
        assert cand.can_implement(small) == (True, "") and cand.supports(small)
    assert dequant_matmul.NAME not in {c.name for c in registry.candidates(large)}
    assert dequant_matmul.NAME in {c.name for c in registry.candidates(small)}
    monkeypatch.setenv(dequant_matmul.ENV_MAX_MB, "0")
    assert not registry.get("linear", dequant_matmul.NAME).supports(small)
    monkeypatch.setenv(dequant_matmul.ENV_MAX_MB, "lots")
    with pytest.raises(ValueError, match="MLX_W8A8_DEQUANT_MAX_MB must be a non-negative"):
        dequant_matmul.temp_limit_bytes()
    monkeypatch.delenv(dequant_matmul.ENV_MAX_MB)
    assert registry.get("linear", dequant_matmul.NAME).supports(large)
