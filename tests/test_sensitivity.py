"""Sensitivity report: per-layer W8A8 / W8A16 SQNR against float, logits SQNR, policy."""

import json

import mlx.core as mx
import numpy as np
import pytest

import oracle
import tiny_lm

pytest.importorskip("mlx_lm", reason="mlx-lm is part of the test extra")
from mlx_w8a8.calibrate import observe  # noqa: E402
from mlx_w8a8.sensitivity import policy, sensitivity  # noqa: E402
from mlx_w8a8.weight import QuantizedWeight  # noqa: E402


def _captured_input(model, batches, path):
    seen = []
    observe(model, batches, lambda p, layer, x: seen.append(np.array(x)) or None, layers=[path])
    return np.concatenate([x.reshape(-1, x.shape[-1]) for x in seen]).astype(np.float32)


def test_report_on_a_tiny_model_matches_the_oracle(rng, tmp_path):
    model, _ = tiny_lm.model("llama", rng=rng)
    # One layer made hard for per-token int8: a few huge input channels of down_proj.
    mlp = model.model.layers[1].mlp
    f = np.ones(mlp.up_proj.weight.shape[0], np.float32)
    f[rng.choice(f.size, 3, replace=False)] = 40.0
    mlp.up_proj.weight = mlp.up_proj.weight * mx.array(f)[:, None]
    mlp.down_proj.weight = mlp.down_proj.weight / mx.array(f)[None, :]
    mx.eval(model.parameters())
    batches = [mx.array(rng.integers(0, 256, (2, 16))), mx.array(rng.integers(0, 256, (1, 9)))]
    report = sensitivity(model, batches)
    assert len(report.layers) == 2 * 7 + 1 and report.tokens == 2 * 16 + 9
    worst = min(report.layers, key=lambda p: report.layers[p]["w8a8_db"])
    assert worst == "model.layers.1.mlp.down_proj"

    # The oracle: float64 products on the captured inputs of two layers.
    for path in ("model.layers.1.mlp.down_proj", "model.layers.0.self_attn.q_proj"):
        layer = dict(model.named_modules())[path]
        x = _captured_input(model, batches, path)
        w = np.array(layer.weight).astype(np.float64)
        y = x.astype(np.float64) @ w.T
        y8, _ = oracle.linear(x, QuantizedWeight.from_float(layer.weight, 64, True), None)
        q, s, b = mx.quantize(layer.weight, group_size=64, bits=8)
        w16 = np.array(mx.dequantize(q, s, b, group_size=64, bits=8)).astype(np.float64)
        entry = report.layers[path]
        assert (entry["k"], entry["n"]) == (w.shape[1], w.shape[0])
        assert entry["w8a8_db"] == pytest.approx(oracle.sqnr_db(y, y8), abs=0.05)
        assert entry["w8a16_db"] == pytest.approx(oracle.sqnr_db(y, x @ w16.T), abs=0.05)

    # Logits: the whole model on W8A8 / W8A16, finite, and W8A8 hurt by the outliers.
    assert np.isfinite(report.logits["w8a8_db"]) and np.isfinite(report.logits["w8a16_db"])
    assert report.logits["w8a8_db"] < report.logits["w8a16_db"]

    table = report.table()
    assert table.splitlines()[1].startswith("model.layers.1.mlp.down_proj")  # worst first
    assert "logits (whole model)" in table.splitlines()[-1]
    saved = json.loads(report.save(tmp_path / "s.json").read_text())
    assert saved["layers"][worst]["w8a8_db"] == pytest.approx(report.layers[worst]["w8a8_db"])
    assert set(saved["logits"]) == {"w8a8_db", "w8a16_db"}

    floor = report.layers[worst]["w8a8_db"] + 1e-6
    assert policy(report, floor) == {worst: "w8a16"}
    assert policy(report, floor, keep="float") == {worst: "float"}
    assert policy(report, -100.0) == {}
    with pytest.raises(ValueError, match=r"policy\] keep must be one of"):
        policy(report, 0.0, keep="int4")


def test_report_needs_float_layers(rng):
    import mlx_w8a8 as w8

    model, _ = tiny_lm.model("llama")
    w8.quantize(model)
    with pytest.raises(ValueError, match=r"sensitivity\] the model has no float nn.Linear"):
        sensitivity(model, [mx.zeros((1, 4), dtype=mx.int32)])
