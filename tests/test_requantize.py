"""requantize.per_channel: group-wise layers (8-bit, 4-bit) to per-channel int8, with the cost."""

import math
import re

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten
import pytest

import mlx_w8a8 as w8
from mlx_w8a8 import requantize
from mlx_w8a8.nn import Linear

import tiny_lm


def _grouped_layer(rng, n=48, k=256, group_size=64, dtype=mx.bfloat16, bits=8, bias=True):
    # Rows whose groups have very different ranges: where group-wise scales fit better
    # than one scale per row, so the requantization visibly costs something.
    w = rng.standard_normal((n, k)).astype(np.float32)
    w[:, :group_size] *= 8.0
    q, s, b = mx.quantize(mx.array(w).astype(dtype), group_size=group_size, bits=bits)
    layer = nn.QuantizedLinear(k, n, bias=bias, group_size=group_size, bits=bits)
    layer.weight, layer.scales, layer.biases = q, s, b
    if bias:
        layer.bias = mx.array(rng.standard_normal(n).astype(np.float32)).astype(dtype)
    return layer


def test_rows_become_per_channel_and_match_the_numpy_oracle(rng):
    model = nn.Sequential(_grouped_layer(rng))
    w8.quantize(model)
    layer = model.layers[0]
    assert layer.format == "grouped"
    old = layer.quantized_weight
    codes = np.array(old.codes(), np.float64).reshape(48, -1, 64)
    s = np.array(old.scales.astype(mx.float32), np.float64)[..., None]
    b = np.array(old.biases.astype(mx.float32), np.float64)[..., None]
    w_grouped = (codes * s + b).reshape(48, 256)  # what the group-wise kernels multiply by
    report = requantize.per_channel(model)
    layer = model.layers[0]
    assert isinstance(layer, Linear) and layer.format == "per_channel"
    assert list(report.weight_sqnr_db) == ["layers.0"]
    # oracle: one scale per row, stored in bfloat16, codes from the float64 weight
    scale = np.array(mx.array((np.abs(w_grouped).max(1, keepdims=True) / 127).astype(
        np.float32)).astype(mx.bfloat16).astype(mx.float32), np.float64)
    codes = np.clip(np.rint(w_grouped / scale), -127, 127)
    want = codes * scale
    qw = layer.quantized_weight
    got = (np.array(qw.int8(), np.float64)
           * np.array(qw.channel_scales, np.float64).reshape(-1, 1))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
    sqnr = 10 * np.log10((w_grouped ** 2).sum() / ((w_grouped - want) ** 2).sum())
    assert report.weight_sqnr_db["layers.0"] == pytest.approx(sqnr, abs=0.05)
    assert 20 < sqnr < 60  # a real, finite cost: the test data is not already per-channel
    # the bias is carried over
    assert layer.bias.dtype == mx.bfloat16


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_four_bit_rows_become_per_channel_and_match_the_numpy_oracle(rng, group_size):
    # An mlx-lm 4-bit layer (format "grouped4") is requantized too: its codes unpacked
    # here by numpy from the uint32 words (code j of a word in bits 4j..4j+3), not by the
    # package, and its weight bytes reported (the codes double: 4 -> 8 bits).
    n, k = 48, 256
    model = nn.Sequential(_grouped_layer(rng, n, k, group_size, bits=4, bias=False))
    words = np.array(model.layers[0].weight).astype(np.uint64)
    s = np.array(model.layers[0].scales.astype(mx.float32), np.float64)
    b = np.array(model.layers[0].biases.astype(mx.float32), np.float64)
    before = sum(a.nbytes for a in (model.layers[0].weight, model.layers[0].scales,
                                    model.layers[0].biases))
    w8.quantize(model)
    assert model.layers[0].format == "grouped4"
    codes = np.stack([(words >> (4 * j)) & 15 for j in range(8)], axis=-1).reshape(n, k)
    w_grouped = (codes.reshape(n, -1, group_size) * s[..., None] + b[..., None]).reshape(n, k)
    report = requantize.per_channel(model)
    layer = model.layers[0]
    assert layer.format == "per_channel" and list(report.weight_sqnr_db) == ["layers.0"]
    scale = np.array(mx.array((np.abs(w_grouped).max(1, keepdims=True) / 127).astype(
        np.float32)).astype(mx.bfloat16).astype(mx.float32), np.float64)
    want = np.clip(np.rint(w_grouped / scale), -127, 127) * scale
    qw = layer.quantized_weight
    got = (np.array(qw.int8(), np.float64)
           * np.array(qw.channel_scales, np.float64).reshape(-1, 1))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
    sqnr = 10 * np.log10((w_grouped ** 2).sum() / ((w_grouped - want) ** 2).sum())
    assert report.weight_sqnr_db["layers.0"] == pytest.approx(sqnr, abs=0.05)
    assert 20 < sqnr < 80
    after = sum(a.nbytes for a in (qw.q, qw.scales, qw.biases) if a is not None)
    assert (report.bytes_before, report.bytes_after) == (before, after)
    assert after - before == n * k // 2  # the codes' half byte each; scales stay per group
    assert "their weights" in report.describe() and "->" in report.describe()


def test_a_predicate_keeps_the_four_bit_layers(rng):
    model = nn.Sequential(_grouped_layer(rng, n=16, k=128),
                          _grouped_layer(rng, n=16, k=128, bits=4, bias=False))
    w8.quantize(model)
    report = requantize.per_channel(model, class_predicate=lambda p, l: l.format == "grouped")
    assert report.layers == 1
    assert [layer.format for layer in model.layers] == ["per_channel", "grouped4"]


def test_outlier_channels_and_a_forced_kernel_are_kept(rng):
    # A layer of a recipe-converted checkpoint keeps the channels its recipe kept out of
    # the int8 activations (load(per_channel=True) restores them first, then
    # requantizes): dropping them would silently undo the recipe. Its output is the
    # requantized weight's, with the channels' share computed in float.
    model = nn.Sequential(_grouped_layer(rng))
    w8.quantize(model, kernel="exact")
    model.layers[0].outliers = (3, 100, 200)
    requantize.per_channel(model)
    layer = model.layers[0]
    assert layer.format == "per_channel" and layer.kernel == "exact"
    assert layer.outliers == (3, 100, 200)
    x = mx.array(rng.standard_normal((5, 256)).astype(np.float32)).astype(mx.bfloat16)
    x[:, 100] = 300.0  # an outlier channel: kept out of the int8 codes
    plain = Linear.from_weight(layer.quantized_weight, layer.bias)
    plain.kernel = "exact"
    w = np.array(layer.quantized_weight.dequantize().astype(mx.float32), np.float64)
    want = np.array(x.astype(mx.float32), np.float64) @ w.T + np.array(layer.bias.astype(mx.float32))
    err_split = np.abs(np.array(layer(x).astype(mx.float32)) - want).max()
    err_plain = np.abs(np.array(plain(x).astype(mx.float32)) - want).max()
    assert err_split < err_plain / 4


def test_layers_already_per_channel_and_float_layers_are_left_alone(rng):
    model = nn.Sequential(nn.Linear(64, 32), _grouped_layer(rng, n=16, k=64))
    w8.quantize(model, class_predicate=lambda p, m: isinstance(m, nn.QuantizedLinear))
    first = model.layers[0]
    report = requantize.per_channel(model, class_predicate=lambda p, m: False)
    assert report.layers == 0 and model.layers[1].format == "grouped"
    report = requantize.per_channel(model)
    assert model.layers[0] is first  # float nn.Linear untouched
    assert report.layers == 1 and model.layers[1].format == "per_channel"
    assert requantize.per_channel(model).layers == 0  # nothing group-wise is left


def test_a_tiny_lm_reports_logits_and_relinks_its_siblings(rng):
    model, _ = tiny_lm.model("llama", rng=rng)
    nn.quantize(model, group_size=64, bits=8)  # an mlx-lm 8-bit model, as mlx-lm makes it
    w8.quantize(model)
    tokens = mx.array(rng.integers(0, 256, (2, 12)))
    grouped = model(tokens)
    report = requantize.per_channel(model, tokens=tokens)
    assert report.layers > 0
    assert all(layer.format == "per_channel"
               for _, layer in model.named_modules() if isinstance(layer, Linear))
    groups = {id(layer.siblings) for _, layer in model.named_modules()
              if isinstance(layer, Linear) and layer.siblings is not None}
    assert groups  # q/k/v and gate/up are linked again on the new layers
    after = np.array(model(tokens).astype(mx.float32), np.float64)
    ref = np.array(grouped.astype(mx.float32), np.float64)
    want = 10 * math.log10((ref ** 2).sum() / ((ref - after) ** 2).sum())
    assert report.logits_sqnr_db == pytest.approx(want, abs=0.1)
    assert "requantized to per-channel" in report.describe()


def test_tokens_must_be_two_dimensional(rng):
    model = nn.Sequential(_grouped_layer(rng))
    w8.quantize(model)
    with pytest.raises(ValueError, match=r"requantize.per_channel\] tokens must be a \[B, T\]"):
        requantize.per_channel(model, tokens=mx.array([1, 2, 3]))


def _mlx_lm_folder(tmp_path, rng, bits=8):
    from mlx_lm.utils import save_config, save_model

    from mlx_w8a8.tokens import write_byte_tokenizer

    model, config = tiny_lm.model("llama", rng=rng)
    nn.quantize(model, group_size=64, bits=bits)
    folder = tmp_path / f"{bits}-bit"
    folder.mkdir()
    save_model(folder, model)
    save_config({**config, "quantization": {"group_size": 64, "bits": bits, "mode": "affine"}},
                folder / "config.json")
    write_byte_tokenizer(folder)
    return folder


@pytest.mark.parametrize("bits", [8, 4])
def test_load_per_channel_requantizes_an_mlx_lm_checkpoint(tmp_path, rng, caplog, bits):
    import logging

    from mlx_lm.utils import load_model

    folder = _mlx_lm_folder(tmp_path, rng, bits)
    grouped, config = w8.load(folder)
    formats = {layer.format for _, layer in grouped.named_modules() if isinstance(layer, Linear)}
    assert formats == {"grouped" if bits == 8 else "grouped4"}
    caplog.set_level(logging.INFO, logger="mlx_w8a8")
    model, _ = w8.load(folder, per_channel=True)
    formats = {layer.format for _, layer in model.named_modules() if isinstance(layer, Linear)}
    assert formats == {"per_channel"}
    assert any("requantized to per-channel" in r.getMessage() for r in caplog.records)
    # Saved, the requantized model is an 8-bit checkpoint stock mlx-lm loads with the
    # same weights (the 4-bit folder's config must not describe its layers any more).
    out = tmp_path / "saved"
    w8.save(model, out, config, source=folder)
    stock, _ = load_model(out)
    ours = dict(tree_flatten(model.parameters()))
    theirs = dict(tree_flatten(stock.parameters()))
    assert ours.keys() == theirs.keys()
    assert all(mx.array_equal(ours[key], theirs[key]).item() for key in ours)
    assert theirs["model.layers.0.mlp.down_proj.weight"].shape[1] == 256 // 4  # 8-bit words


@pytest.mark.parametrize("bits", [8, 4])
def test_convert_per_channel_from_an_mlx_lm_folder_prints_the_cost(tmp_path, rng, capsys, bits):
    from mlx_w8a8 import convert

    folder = _mlx_lm_folder(tmp_path, rng, bits)
    text = tmp_path / "calib.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 40)
    out = tmp_path / "out"
    assert convert.main(["--model", str(folder), "--out", str(out), "--per-channel",
                         "--calibration", str(text), "--seq-len", "16", "--samples", "2",
                         "--skip"]) == 0
    printed = capsys.readouterr().out
    assert "requantized to per-channel int8" in printed and "logits SQNR" in printed
    # the weights' bytes: the same for 8-bit codes, the codes' twice for 4-bit ones (per
    # weight: 1 or 1/2 byte, plus a float32 scale and bias per group of 64)
    before, after = re.search(r"their weights ([\d.]+) KiB -> ([\d.]+) KiB", printed).groups()
    want = 1.0 if bits == 8 else (1 + 8 / 64) / (0.5 + 8 / 64)
    assert float(after) / float(before) == pytest.approx(want, rel=1e-3)
    model, _ = w8.load(out)
    formats = {layer.format for _, layer in model.named_modules() if isinstance(layer, Linear)}
    assert formats == {"per_channel"}
    with pytest.raises(SystemExit) as exit_:
        convert.main(["--model", str(folder), "--out", str(tmp_path / "o2"), "--per-channel",
                      "--grouped"])
    assert exit_.value.code == 2


def test_layers_with_activation_groups_are_refused_and_nothing_changes():
    model = nn.Sequential(w8.Linear(128, 16, per_channel=False),
                          w8.Linear(128, 16, per_channel=False, act_scales="group"))
    first = model.layers[0]
    with pytest.raises(ValueError, match=r"layers\.1 scales its activations per weight group"):
        requantize.per_channel(model)
    assert model.layers[0] is first and first.format == "grouped"
