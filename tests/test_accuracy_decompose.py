"""bench/accuracy_decompose.py's building blocks against numpy oracles, and its command
on a tiny model folder."""

import json
import os
import sys

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))

import accuracy_decompose as ad  # noqa: E402
import tiny_lm  # noqa: E402


def assert_same_codes(got, x, want):
    """``got`` (float32 math) equals the float64 ``want`` up to float32 rounding, except
    where ``x / scale`` lies within 1e-4 of a rounding tie: there float32's quotient may
    round to the neighbouring code, one step (``scale``) away, and nowhere further."""
    x = np.asarray(x, dtype=np.float64)
    amax = np.abs(x).max(axis=-1, keepdims=True)
    scale = np.broadcast_to(np.where(amax > 0, amax / 127.0, 1.0), x.shape)
    ratio = np.abs(x / scale)
    tie = np.abs(ratio - np.floor(ratio) - 0.5) < 1e-4
    np.testing.assert_allclose(got[~tie], want[~tie], rtol=1e-6, atol=1e-6)
    assert np.all(np.abs(got[tie] - want[tie]) <= scale[tie] * (1 + 1e-5) + 1e-6)


def test_int8_rows_is_the_package_activation_math(rng):
    # per token: the recipe's float64 W8A8 activation math (mlx_w8a8.recipe.quantize_rows);
    # per group: the same on each group of features; a zero row stays zero
    from mlx_w8a8.recipe import quantize_rows

    x = rng.standard_normal((9, 128)).astype(np.float32) * rng.uniform(0.1, 10, (9, 1)).astype(np.float32)
    x[3] = 0
    x[4, 5] = 300.0  # an outlier: the per-token codes of row 4 coarsen, the group ones not
    got = np.array(ad.int8_rows(mx.array(x)))
    assert_same_codes(got, x, quantize_rows(x))
    grouped = np.array(ad.int8_rows(mx.array(x), 32))
    want = quantize_rows(x.reshape(9, 4, 32)).reshape(9, 128)
    assert_same_codes(grouped.reshape(9, 4, 32), x.reshape(9, 4, 32), want.reshape(9, 4, 32))
    assert np.abs(grouped[4, 64:] - x[4, 64:]).max() < np.abs(got[4, 64:] - x[4, 64:]).max()


def test_gptq_is_per_channel_int8_and_fits_its_calibration_inputs_better(rng):
    # the result is on each row's per-channel grid (codes in [-127, 127] times max|w|/127)
    # and its output error on the inputs it was fitted to is below round-to-nearest's
    # (GPTQ minimizes ||(W - Q) X^T||); dead input channels get zero weights
    n, k = 24, 96
    w = rng.standard_normal((n, k))
    x = rng.standard_normal((400, k)) @ rng.standard_normal((k, k)) * 0.3  # correlated
    x[:, 7] = 0
    q = ad.gptq_per_channel(w, x)
    s = np.abs(w).max(axis=1, keepdims=True) / 127
    codes = q / s
    np.testing.assert_allclose(codes, np.rint(codes), atol=1e-6)
    assert np.abs(codes).max() <= 127 + 1e-6 and np.all(q[:, 7] == 0)
    rtn = np.clip(np.rint(w / s), -127, 127) * s
    assert np.linalg.norm((w - q) @ x.T) < 0.8 * np.linalg.norm((w - rtn) @ x.T)


def test_simulated_layer_keeps_its_outlier_channels_out_of_the_int8_rows(rng):
    # out: the kept channels reach the output in float (so an outlier of 1e4 there leaves
    # the rest of the row's codes fine); without it the row's error is the outlier's scale
    lin = nn.Linear(64, 16)
    x = rng.standard_normal((5, 64)).astype(np.float32)
    x[:, 3] = 1e4
    want = np.array(lin(mx.array(x)))
    keep = mx.array(np.array([3, 10], dtype=np.int32))
    kept = ad.Simulated(lin, lin.weight, ad.int8_rows, keep)
    plain = ad.Simulated(lin, lin.weight, ad.int8_rows, None)
    err_kept = np.abs(np.array(kept(mx.array(x))) - want).max()
    err_plain = np.abs(np.array(plain(mx.array(x))) - want).max()
    assert err_kept < 0.05 * err_plain
    exact = ad.Simulated(lin, lin.weight, None, keep)  # no quantization: the same product
    np.testing.assert_allclose(np.array(exact(mx.array(x))), want, rtol=1e-5, atol=1e-2)


def test_command_runs_every_part_on_a_tiny_model(tmp_path, rng):
    m, config = tiny_lm.model("llama", rng=rng)
    folder = tiny_lm.folder(tmp_path / "tiny", m, config)
    text = tiny_lm.text_file(tmp_path / "t.txt", 4 * 257 * 4)
    out = tmp_path / "r.jsonl"
    variants = "float,wpc+atok,smooth+wpc+atok,a0.5+gptq+ag32,wg+out4+atok"
    assert ad.main(["--model", str(folder), "--texts", str(text), "--variants", variants,
                    "--calibration", str(text), "--windows", "2", "--json", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["variant"] for r in rows] == variants.split(",")
    ppl = [r["t.txt"] for r in rows]
    assert all(np.isfinite(ppl)) and all(p > 1 for p in ppl)
    assert len(set(ppl[1:])) > 1 and ppl[1] != ppl[0]  # the parts change the model
    with pytest.raises(ValueError, match="unknown part 'wpcx'"):
        ad.build(folder, "wpcx+atok", [])
    # smooth and a0.5 fold SmoothQuant into the model: its float weights change
    calib = [mx.array(rng.integers(0, 256, (2, 32)))]
    plain = ad.build(folder, "float", calib).model.layers[0].mlp.down_proj.weight
    for variant in ("smooth", "a0.5"):
        smoothed = ad.build(folder, variant, calib).model.layers[0].mlp.down_proj.weight
        assert not np.allclose(np.array(plain), np.array(smoothed)), variant
