"""Calibration statistics: per-input-channel maxima as running reductions."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

import mlx_w8a8 as w8
from mlx_w8a8.calibrate import calibrate, linear_layers, observe


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(40, 32)
        self.up = nn.Linear(32, 64)
        self.down = nn.Linear(64, 32, bias=False)

    def __call__(self, t):
        return self.down(nn.relu(self.up(self.embed(t))))


def _inputs(model, batches):
    """The inputs of up and down, computed directly (float64 on the host)."""
    h = [np.array(model.embed(b)).reshape(-1, 32).astype(np.float64) for b in batches]
    h = np.concatenate(h)
    w, b = np.array(model.up.weight).astype(np.float64), np.array(model.up.bias).astype(np.float64)
    return {"up": h, "down": np.maximum(h @ w.T + b, 0)}


def test_absmax_is_the_max_over_every_batch(rng):
    model = MLP()
    mx.eval(model.parameters())
    # Batches of different shapes; 20 random tokens: each batch alone misses the maximum
    # of some of the 32 channels, so keeping one batch's maxima (no running max) fails.
    batches = [mx.array(rng.integers(0, 40, (2, 5))), mx.array(rng.integers(0, 40, (1, 7))),
               mx.array(rng.integers(0, 40, (3, 1)))]  # T = 1: a single token per row
    stats = calibrate(model, batches)
    want = _inputs(model, batches)
    assert set(stats) == {"up", "down"}
    for path, x in want.items():
        got = np.array(stats[path].absmax)
        assert got.dtype == np.float32 and got.shape == (x.shape[1],)
        np.testing.assert_allclose(got, np.abs(x).max(axis=0), rtol=1e-6, atol=1e-7)
        assert stats[path].tokens == 10 + 7 + 3


def test_model_is_restored_and_unchanged(rng):
    model = MLP()
    mx.eval(model.parameters())
    t = mx.array(rng.integers(0, 40, (2, 6)))
    before = np.array(model(t))
    calibrate(model, [t])
    assert isinstance(model.up, nn.Linear) and isinstance(model.down, nn.Linear)
    np.testing.assert_array_equal(np.array(model(t)), before)

    def broken(path, layer, x):
        raise RuntimeError("hook failed")

    with pytest.raises(RuntimeError, match="hook failed"):
        observe(model, [t], broken)
    assert type(model.up) is nn.Linear and type(model.down) is nn.Linear  # put back on error


def test_hooks_see_every_layer_input_and_subsets(rng):
    model = MLP()
    mx.eval(model.parameters())
    seen = []
    batches = [mx.array(rng.integers(0, 40, (2, 3)))]
    calibrate(model, batches, hooks=[lambda p, layer, x: seen.append((p, x.shape)) or None])
    assert seen == [("up", (2, 3, 32)), ("down", (2, 3, 64))]
    assert set(calibrate(model, batches, layers=["down"])) == {"down"}


def test_quantized_layers_are_observed_too(rng):
    model = MLP()
    mx.eval(model.parameters())
    w8.quantize(model, group_size=32)
    assert set(linear_layers(model)) == {"up", "down"}
    stats = calibrate(model, [mx.array(rng.integers(0, 40, (1, 4)))])
    assert set(stats) == {"up", "down"}


def test_errors():
    model = MLP()
    with pytest.raises(ValueError, match=r"calibrate.*batches is empty"):
        calibrate(model, [])
    with pytest.raises(ValueError, match=r"calibrate.*\['embed'\] are not linear layers"):
        calibrate(model, [mx.zeros((1, 2), dtype=mx.int32)], layers=["embed"])
