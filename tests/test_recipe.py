"""The recommended recipe: per-site SmoothQuant strength from sampled rows, W8A16 floor."""

import json

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_unflatten

import mlx_w8a8 as w8
import oracle
import tiny_lm

pytest.importorskip("mlx_lm", reason="mlx-lm is part of the test extra")
from mlx_w8a8 import recipe as rc  # noqa: E402
from mlx_w8a8.calibrate import calibrate  # noqa: E402
from mlx_w8a8.smooth import groups  # noqa: E402


def _tokens(rng, shape=(2, 32)):
    return mx.array(rng.integers(0, 256, shape))


def _outlier_model(rng, factor=50.0, n=4):
    """A tiny Llama whose norms have n channels scaled by ``factor``, compensated in the
    consumers (the same float function, with trained-model-like outlier channels)."""
    model, _ = tiny_lm.model("llama", rng=rng)
    for blk in model.model.layers:
        for norm, linears in ((blk.input_layernorm, (blk.self_attn.q_proj, blk.self_attn.k_proj,
                                                     blk.self_attn.v_proj)),
                              (blk.post_attention_layernorm, (blk.mlp.gate_proj, blk.mlp.up_proj))):
            f = np.ones(norm.weight.shape[0], np.float32)
            f[rng.choice(f.size, n, replace=False)] = factor
            norm.weight = norm.weight * mx.array(f)
            for layer in linears:
                layer.weight = layer.weight / mx.array(f)[None, :]
    mx.eval(model.parameters())
    return model


def test_w8a8_error_is_the_exact_kernels_error(rng):
    # The recipe's numpy W8A8 must be the package's W8A8: compare with mlx_w8a8.Linear on
    # the exact kernel, on rows with an outlier channel and an all-zero row.
    x = rng.standard_normal((33, 128)).astype(np.float32)
    x[:, 5] *= 40.0
    x[7] = 0.0
    w = rng.standard_normal((48, 128)).astype(np.float32)
    layer = w8.Linear.from_linear(_linear(w))
    layer.kernel = "exact"
    got = np.array(layer(mx.array(x))).astype(np.float64)
    ref = x.astype(np.float64) @ w.astype(np.float64).T
    signal, noise = rc.w8a8_error(x, w)
    np.testing.assert_allclose(signal, np.sum(ref**2), rtol=1e-9)
    np.testing.assert_allclose(noise, np.sum((got - ref) ** 2), rtol=1e-3)


def _linear(w):
    import mlx.nn as nn

    layer = nn.Linear(w.shape[1], w.shape[0], bias=False)
    layer.weight = mx.array(w)
    return layer


def test_capture_samples_every_stride_th_row(rng):
    model, _ = tiny_lm.model("llama", rng=rng)
    # 25 + 75 rows: the stride (10) does not divide the first batch, so the second
    # batch's samples start mid-stride.
    data = [_tokens(rng, (1, 25)), _tokens(rng, (3, 25))]
    path = "model.layers.1.mlp.down_proj"
    seen = []
    calibrate(model, data, layers=[path],
              hooks=[lambda p, m, x: seen.append(np.array(x).reshape(-1, x.shape[-1])) or None])
    every = np.concatenate(seen)
    stats, sample = rc.capture(model, data, rows=10, layers=[path])
    stride = every.shape[0] // 10  # 100 rows -> every 10th, from the first
    np.testing.assert_array_equal(sample[path], every[::stride])
    assert set(sample) == {path} and len(stats) == 15


def test_recipe_chooses_the_best_strength_per_site_and_repairs_outliers(rng):
    model = _outlier_model(rng)
    weights = tree_flatten(model.parameters())

    def copy():
        m, _ = tiny_lm.model("llama")
        m.update(tree_unflatten(weights))
        return m

    calib, t = [_tokens(rng, (4, 32))], _tokens(rng, (2, 32))
    ref = np.array(model(t)).astype(np.float64)
    plain = oracle.sqnr_db(ref, np.array(w8.quantize(copy(), kernel="exact")(t)).astype(np.float64))

    # The oracle of the choice: every grid strength scored in float64 from the maxima.
    before = calibrate(model, calib)
    _, sample = rc.capture(model, calib)
    grid = (None, 0.3, 0.5, 0.7, 0.9)
    want = {}
    for g in groups(model):
        if g.pair != "attn_in" and g.pair != "mlp_in":
            continue
        a = np.max([np.array(before[p].absmax, np.float64) for p in g.linears], axis=0)
        ws = [np.array(dict(weights)[f"{p}.weight"], np.float64) for p in g.linears]
        wmax = np.max([np.abs(w).max(axis=0) for w in ws], axis=0)
        x = sample[g.linears[0]].astype(np.float64)
        errs = {}
        for alpha in grid:
            s = np.ones_like(a) if alpha is None else a**alpha / wmax ** (1 - alpha)
            errs[alpha] = sum(oracle.sqnr_db(x @ w.T, _fake_w8a8(x / s, w * s)) for w in ws)
        want[g.prev] = errs

    smoothed = copy()  # the strength search alone (outlier channels judged apart below)
    chosen = rc.recipe(smoothed, calib, grid=grid, floor_db=-1000, outliers=0)
    for prev, errs in want.items():
        # The oracle's best strength, or one scoring within 0.1 dB of it: where two
        # strengths nearly tie, the recipe's float32 scoring may order them either way
        # (a CI run chose 0.5 for the oracle's 0.3 once); a worse choice still fails.
        best = max(errs.values())
        assert errs[chosen.alphas[prev]] >= best - 0.1, (prev, chosen.alphas[prev], errs)
    assert all(chosen.alphas[p] is not None for p in want)  # 50x outliers: smoothing pays
    assert chosen.keep == {}
    got = np.array(smoothed(t)).astype(np.float64)
    assert np.abs(got - ref).max() <= 2e-5 * np.abs(ref).max()  # the float function kept
    fixed = oracle.sqnr_db(ref, np.array(w8.quantize(smoothed, kernel="exact")(t)).astype(np.float64))
    print(f"W8A8 logits SQNR: plain {plain:.1f} dB, recipe {fixed:.1f} dB")
    assert fixed > plain + 15
    assert "SmoothQuant strength per site (8 sites)" in chosen.summary()


def _fake_w8a8(x, w):
    """Per-row symmetric int8 of x and w (round half to even, clip 127), float64."""
    def q(a):
        s = np.abs(a).max(axis=1, keepdims=True) / 127
        s[s == 0] = 1
        return np.clip(np.rint(a / s), -127, 127) * s
    return q(x) @ q(w).T


def test_floor_keeps_exactly_the_layers_below_it(rng):
    model = _outlier_model(rng)
    weights = tree_flatten(model.parameters())
    calib = [_tokens(rng, (2, 32))]
    first = rc.recipe(model, calib, grid=(None,), floor_db=-1000)  # unsmoothed: outliers stay
    assert set(first.alphas.values()) == {None}
    ranked = sorted(first.layers, key=lambda p: first.layers[p]["w8a8_db"])
    floor = (first.layers[ranked[3]]["w8a8_db"] + first.layers[ranked[4]]["w8a8_db"]) / 2
    again, _ = tiny_lm.model("llama")
    again.update(tree_unflatten(weights))
    second = rc.recipe(again, calib, grid=(None,), floor_db=floor, keep="float")
    assert second.keep == {p: "float" for p in ranked[:4]}
    with pytest.raises(ValueError, match=r"\[mlx_w8a8.recipe\] keep must be one of"):
        rc.recipe(again, calib, keep="int4")
    with pytest.raises(ValueError, match=r"grid must hold alphas in \[0, 1\] or None, got \[1.5\]"):
        rc.recipe(again, calib, grid=[1.5])


def test_builtin_text_is_local_prose():
    text = rc.builtin_text()
    assert "Beautiful is better than ugly." in text  # the Zen, decoded
    assert "Return a new deque object" in text or "deque" in text
    assert len(text) > 20_000


def test_convert_applies_the_recipe_by_default(tmp_path, capsys):
    from mlx_w8a8.convert import main

    rng = np.random.default_rng()
    model, config = tiny_lm.model("llama", rng=rng)
    src = tiny_lm.folder(tmp_path / "src", model, config)
    out = tmp_path / "out"
    assert main(["--model", str(src), "--out", str(out), "--calibration", "builtin",
                 "--seq-len", "64", "--samples", "4"]) == 0
    printed = capsys.readouterr().out
    assert "recipe: not smoothed (8 SmoothQuant sites left as they are" in printed
    # every quantizable layer; convert's default skip keeps lm_head on W8A16, which ignores them
    assert ("outlier channels kept out of the int8 activations in 15 layers (8 or 16 input "
            "channels each)") in printed
    chosen = json.loads((out / "recipe.json").read_text())
    assert len(chosen["alphas"]) == 8 and len(chosen["layers"]) == 15
    assert len(chosen["outliers"]) == 15
    loaded, _ = w8.load(out)
    assert sum(m.outliers is not None for _, m in loaded.named_modules()
               if isinstance(m, w8.Linear)) == 14
    down = loaded.model.layers[0].mlp.down_proj
    assert isinstance(down, w8.Linear)
    assert down.outliers == tuple(chosen["outliers"]["model.layers.0.mlp.down_proj"])


def _four_bit(model, group_size=32):
    import mlx.nn as nn

    nn.quantize(model, group_size=group_size, bits=4,
                class_predicate=lambda p, m: isinstance(m, nn.Linear)
                and m.weight.shape[-1] % group_size == 0)
    return model


def test_a8_error_is_the_exact_w4a8_error(rng):
    # A stored 4-bit layer's W8A8 error: per-token int8 activations against the layer's
    # own dequantized weights (what exact_w4a8 computes), not a requantized copy.
    import mlx.nn as nn

    x = rng.standard_normal((29, 128)).astype(np.float32)
    x[:, 3] *= 60.0
    x[4] = 0.0
    q = nn.QuantizedLinear.from_linear(_linear(rng.standard_normal((40, 128)).astype(np.float32)),
                                       group_size=64, bits=4)
    layer = w8.Linear.from_linear(q)
    layer.kernel = "exact_w4a8"
    got = np.array(layer(mx.array(x))).astype(np.float64)
    ref = np.array(q(mx.array(x))).astype(np.float64)  # float activations, stored weights
    signal, noise = rc.a8_error(x, rc._dequantized(q))
    np.testing.assert_allclose(signal, np.sum(ref**2), rtol=1e-5)
    np.testing.assert_allclose(noise, np.sum((got - ref) ** 2), rtol=2e-2)
    assert noise > 0


def test_recipe_keeps_stored_layers_below_the_floor_as_stored(rng):
    # A 4-bit checkpoint: nothing to smooth (codes are stored), and the layers whose
    # per-token int8 activations hurt most stay on their stored W4A16 path.
    import mlx.nn as nn

    model = _four_bit(_outlier_model(rng, factor=200.0, n=2))
    calib = [_tokens(rng, (2, 32))]
    first = rc.recipe(model, calib, floor_db=-1000)
    assert first.alphas == {} and first.keep == {}
    assert len(first.layers) == 15 and all(e["bits"] == 4 for e in first.layers.values())
    ranked = sorted(first.layers, key=lambda p: first.layers[p]["w8a8_db"])
    floor = (first.layers[ranked[2]]["w8a8_db"] + first.layers[ranked[3]]["w8a8_db"]) / 2
    second = rc.recipe(model, calib, floor_db=floor)
    assert second.keep == {p: "w8a16" for p in ranked[:3]}
    assert "not smoothed" in second.summary()
    w8.quantize(model, skip=second.keep)
    for path, m in tree_flatten(model.leaf_modules(), is_leaf=lambda m: isinstance(m, nn.Module)):
        if path in second.keep:
            assert type(m) is nn.QuantizedLinear and m.bits == 4
        elif path in first.layers:
            assert isinstance(m, w8.Linear)


def test_recipe_smooths_only_sites_of_float_layers(rng):
    # gate/up stored 4-bit, the rest float: the mlp_in site (its consumers) and the down
    # site (its producer, up_proj, whose rows would be scaled) must not be smoothed.
    import mlx.nn as nn

    model = _outlier_model(rng)
    nn.quantize(model, group_size=32, bits=4,
                class_predicate=lambda p, m: p.endswith(("gate_proj", "up_proj")))
    chosen = rc.recipe(model, [_tokens(rng, (2, 32))], floor_db=-1000)
    n = len(model.model.layers)
    assert set(chosen.alphas) == {f"model.layers.{i}.{s}" for i in range(n)
                                  for s in ("input_layernorm", "self_attn.v_proj")}
    assert sorted(p for p, e in chosen.layers.items() if e.get("bits") == 4) == sorted(
        f"model.layers.{i}.mlp.{s}" for i in range(n) for s in ("gate_proj", "up_proj"))


def test_outlier_channels_are_the_largest_maxima_up_to_a_share_of_k():
    absmax = np.arange(64, dtype=np.float32)
    absmax[[5, 17]] = 1000.0
    assert rc.outlier_channels(absmax, 2) == (5, 17)
    assert rc.outlier_channels(absmax, 3) == (5, 17, 63)  # sorted
    assert rc.outlier_channels(absmax, 32) == (5, 17, 62, 63)  # at most K // 16 = 4
    assert rc.outlier_channels(absmax, 0) is None and rc.outlier_channels(absmax[:15], 4) is None


def test_w8a8_error_with_outliers_is_the_layers_error(rng):
    # the recipe's numpy model of a layer with outlier channels is what Linear computes
    x = rng.standard_normal((33, 128)).astype(np.float32)
    x[:, 5] *= 40.0
    x[:, 77] *= 25.0
    x[7] = 0.0
    w = rng.standard_normal((48, 128)).astype(np.float32)
    layer = w8.Linear.from_linear(_linear(w))
    layer.kernel = "exact"
    layer.outliers = (5, 77)
    got = np.array(layer(mx.array(x))).astype(np.float64)
    ref = x.astype(np.float64) @ w.astype(np.float64).T
    signal, noise = rc.w8a8_error(x, w, (5, 77))
    np.testing.assert_allclose(noise, np.sum((got - ref) ** 2), rtol=1e-3)
    # what remains with the channels out is mostly the int8 weight error of their columns,
    # which both sides carry: about 0.08 of the unsplit error (at most 0.11 over 300 seeds,
    # so 0.1 failed by chance); with the channels in, the per-token scale is 25-40x larger
    assert noise < 0.25 * rc.w8a8_error(x, w)[1]


def test_recipe_keeps_the_planted_channels_out_and_convert_saves_them(tmp_path, rng):
    # unsmoothed (grid None): each q/k/v and gate/up layer keeps its norm's planted
    # channels out (K // 16 = 8 of 128: the 4 planted ones among them), which raises its
    # SQNR over outliers=0; apply sets them on the converted layers
    model = _outlier_model(rng, factor=80.0, n=4)
    weights = tree_flatten(model.parameters())
    calib = [_tokens(rng, (2, 32))]
    chosen = rc.recipe(model, calib, grid=(None,), floor_db=-1000)
    blk = model.model.layers[0]
    planted = np.flatnonzero(np.array(blk.input_layernorm.weight) > 20)
    got = chosen.outliers["model.layers.0.self_attn.q_proj"]
    assert len(got) == 8 and set(planted) <= set(got)
    again, _ = tiny_lm.model("llama")
    again.update(tree_unflatten(weights))
    plain = rc.recipe(again, calib, grid=(None,), floor_db=-1000, outliers=0)
    assert plain.outliers == {}
    p = "model.layers.0.self_attn.q_proj"
    assert chosen.layers[p]["w8a8_db"] > plain.layers[p]["w8a8_db"] + 3
    assert "kept out of the int8 activations" in chosen.summary()
    with pytest.raises(ValueError, match=r"outliers must be an int >= 0, got -1"):
        rc.recipe(again, calib, outliers=-1)
    w8.quantize(model)
    assert chosen.apply(model) == len(chosen.outliers)
    assert model.model.layers[0].self_attn.q_proj.outliers == got
    assert json.loads(json.dumps(chosen.to_json()))["outliers"][p] == list(got)
