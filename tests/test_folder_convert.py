"""mlx_w8a8.folder_convert: what converting a quantized (4-bit) model folder writes,
with and without calibration (run through the command line, as users do)."""

import json

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

import mlx_w8a8 as w8
import oracle
from tiny_checkpoints import force_kernel, needs_mlx_lm, quantized_folder



@needs_mlx_lm
def test_convert_of_a_4bit_folder_keeps_the_4bit_model(tmp_path, capsys, rng):
    # mlx-lm's default 4-bit checkpoint converts: every layer keeps its 4-bit arrays
    # (W4A8, nothing requantized), and the output is the same 4-bit model to stock
    # mlx-lm (lm_head is skipped by default and stays a 4-bit QuantizedLinear).
    from mlx_lm.utils import load_model

    from mlx_w8a8.convert import main

    model, config, q4 = quantized_folder(tmp_path, "q4", group_size=64, bits=4)
    out = tmp_path / "out"
    assert main(["--model", str(q4), "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "'w8a8': 14" in said and "'w8a16': 1" in said, said
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization"]["bits"] == 4 and cfg["quantization"]["group_size"] == 64
    layers = cfg["mlx_w8a8"]["layers"]
    assert len(layers) == 14 and all(
        e == {"group_size": 64, "format": "grouped4", "bits": 4} for e in layers.values())
    tokens = mx.array(rng.integers(0, 256, (2, 9)))
    want = np.array(model(tokens).astype(mx.float32))
    stock, _ = load_model(out)  # stock mlx-lm: the same 4-bit model
    gate_proj = stock.model.layers[0].mlp.gate_proj
    assert type(gate_proj) is nn.QuantizedLinear and gate_proj.bits == 4
    np.testing.assert_array_equal(np.array(stock(tokens).astype(mx.float32)), want)
    ours, _ = w8.load(out)
    layer = ours.model.layers[0].mlp.gate_proj
    assert isinstance(layer, w8.Linear) and layer.bits == 4 and layer.format == "grouped4"
    force_kernel(ours, "mlx_qmm4")  # the W4A16 product of the stored arrays, as mlx-lm runs it
    np.testing.assert_array_equal(np.array(ours(tokens).astype(mx.float32)), want)
    force_kernel(ours, "exact_w4a8")
    got = np.array(ours(tokens).astype(mx.float32)).astype(np.float64)
    assert oracle.sqnr_db(want.astype(np.float64), got) > 25


@needs_mlx_lm
def test_convert_of_a_4bit_folder_with_calibration_applies_the_recipe(tmp_path, capsys,
                                                                      monkeypatch):
    # --calibration on a quantized checkpoint: nothing to smooth, but every stored layer
    # is scored (recipe.json) and a kept one stays a stored 4-bit layer. A random tiny
    # model has no layer below the floor, so the recipe here keeps the three lowest.
    from mlx_w8a8 import recipe as rc
    from mlx_w8a8.convert import main

    real = rc.recipe

    def keep_three(model, batches, **kw):
        chosen = real(model, batches, **kw)
        lowest = sorted(chosen.layers, key=lambda p: chosen.layers[p]["w8a8_db"])[:3]
        chosen.keep = {p: "w8a16" for p in lowest}
        return chosen

    monkeypatch.setattr(rc, "recipe", keep_three)
    _, _, q4 = quantized_folder(tmp_path, "q4", group_size=64, bits=4)
    out = tmp_path / "out"
    assert main(["--model", str(q4), "--out", str(out), "--calibration", "builtin",
                 "--seq-len", "32", "--samples", "2"]) == 0
    said = capsys.readouterr().out
    assert "recipe: not smoothed" in said, said
    chosen = json.loads((out / "recipe.json").read_text())
    assert chosen["alphas"] == {} and len(chosen["layers"]) == 15
    assert all(e["bits"] == 4 for e in chosen["layers"].values())
    assert len(chosen["keep"]) == 3
    ours, _ = w8.load(out)
    for path, m in tree_flatten(ours.leaf_modules(), is_leaf=nn.Module.is_module):
        if path in chosen["keep"] or path == "lm_head":
            assert type(m) is nn.QuantizedLinear and m.bits == 4, path
        elif path in chosen["layers"]:
            assert isinstance(m, w8.Linear) and m.format == "grouped4", path


@needs_mlx_lm
def test_convert_outliers_sets_the_recipes_channels_per_layer(tmp_path, capsys):
    # --outliers N: N channels per layer (at most K / 16: 8 of this model's K = 128), or
    # none with 0 (the speed of the plain W8A8 layers); refused without the recipe
    from mlx_w8a8.convert import main

    _, _, q4 = quantized_folder(tmp_path, "q4", group_size=64, bits=4)
    calib = ["--calibration", "builtin", "--seq-len", "32", "--samples", "2"]
    for n, want in ((4, 4), (0, 0)):
        out = tmp_path / f"out{n}"
        assert main(["--model", str(q4), "--out", str(out), *calib, "--outliers", str(n)]) == 0
        chosen = json.loads((out / "recipe.json").read_text())
        assert chosen["outliers"] and all(len(c) == want for c in chosen["outliers"].values()) \
            if want else chosen["outliers"] == {}
        ours, _ = w8.load(out)
        found = [m.outliers for _, m in ours.named_modules() if isinstance(m, w8.Linear)]
        assert found and all((len(c) == want) if want else c is None for c in found)
    capsys.readouterr()
    for bad, said in ((["--outliers", "-1", *calib], "--outliers must be >= 0, got -1"),
                      (["--outliers", "4"], "needs --calibration")):
        with pytest.raises(SystemExit) as stopped:
            main(["--model", str(q4), "--out", str(tmp_path / "bad"), *bad])
        assert stopped.value.code == 2 and said in capsys.readouterr().err


@needs_mlx_lm
def test_convert_sqnr_floor_without_smooth_is_the_recipes_floor(tmp_path, capsys):
    # --sqnr-floor DB with --calibration (no --smooth) keeps the recipe (outlier channels
    # too) and moves its floor: exactly the layers the recipe scores below DB stay as
    # stored. A floor that took the sensitivity report's path instead (no recipe.json,
    # no outlier channels) fails here.
    from mlx_w8a8.convert import main

    _, _, q4 = quantized_folder(tmp_path, "q4", group_size=64, bits=4)
    calib = ["--calibration", "builtin", "--seq-len", "32", "--samples", "2"]
    first = tmp_path / "first"
    assert main(["--model", str(q4), "--out", str(first), *calib]) == 0
    scored = json.loads((first / "recipe.json").read_text())
    assert scored["floor_db"] == 25.0 and scored["keep"] == {}  # a random tiny model
    ranked = sorted(scored["layers"], key=lambda p: scored["layers"][p]["w8a8_db"])
    floor = (scored["layers"][ranked[3]]["w8a8_db"] + scored["layers"][ranked[4]]["w8a8_db"]) / 2
    out = tmp_path / "out"
    assert main(["--model", str(q4), "--out", str(out), *calib, "--sqnr-floor", str(floor),
                 "--outliers", "32"]) == 0  # the default count, given: allowed with a floor
    said = capsys.readouterr().out
    assert f"4 of 15 layers below {floor:g} dB kept off W8A8" in said, said
    chosen = json.loads((out / "recipe.json").read_text())
    assert chosen["floor_db"] == floor and set(chosen["keep"]) == set(ranked[:4])
    assert not (out / "sensitivity.json").exists()
    ours, _ = w8.load(out)
    for path, m in tree_flatten(ours.leaf_modules(), is_leaf=nn.Module.is_module):
        if path in ranked[:4]:
            assert type(m) is nn.QuantizedLinear and m.bits == 4, path
        elif path in ranked[4:] and path != "lm_head":  # scored, skipped by default
            assert isinstance(m, w8.Linear) and list(m.outliers) == scored["outliers"][path], path
