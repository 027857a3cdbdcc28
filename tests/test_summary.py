"""summary/decisions: what a converted model runs, and quantize(kernel=, verbose=)."""

import warnings

import mlx.core as mx
import mlx.nn as nn
import pytest

import mlx_w8a8 as w8


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(64, 32)
        self.o = nn.Linear(32, 64, bias=False)
        self.norm = nn.RMSNorm(64)

    def __call__(self, x):
        return self.o(self.q(self.norm(x)))


def test_quantize_forces_a_kernel_model_wide_and_summarises(capsys):
    model = w8.quantize(Tiny(), group_size=32, kernel="mlx_qmm", verbose=True)
    said = capsys.readouterr().err.strip()
    assert said.startswith("mlx_w8a8: 2 layers (2 per_channel)")
    assert "M=1: mlx_qmm x2 (forced)" in said and "M=512: mlx_qmm x2 (forced)" in said
    assert w8.decisions(model, 4) == {"q": ("mlx_qmm", "forced"), "o": ("mlx_qmm", "forced")}
    y = model(mx.ones((3, 64)))
    assert y.shape == (3, 64)


def test_verbose_names_the_layers_left_float_for_their_k(capsys):
    # As nn.quantize, a float layer whose K the group size does not divide stays float;
    # verbose says which, so a model is not silently half converted.
    model = Tiny()
    model.q = nn.Linear(48, 32)  # 48 = 1.5 groups of 32
    w8.quantize(model, group_size=32, verbose=True)
    said = capsys.readouterr().err
    assert "1 nn.Linear layers kept float, their K not a multiple of group_size 32: q" in said
    assert type(model.q) is nn.Linear and isinstance(model.o, w8.Linear)
    w8.quantize(Tiny(), group_size=32, verbose=True)
    assert "kept float" not in capsys.readouterr().err


def test_unknown_kernel_is_refused_before_anything_converts():
    model = Tiny()
    with pytest.raises(ValueError, match=r"unknown kernel 'nope'"):
        w8.quantize(model, group_size=32, kernel="nope")
    assert isinstance(model.q, nn.Linear)


def test_other_bit_widths_are_reported_not_silently_skipped():
    model = Tiny()
    nn.quantize(model, group_size=32, bits=3, class_predicate=lambda p, m: p == "q")
    with pytest.warns(UserWarning, match=r"3-bit affine QuantizedLinear layers.*left as they are"):
        w8.quantize(model, group_size=32)
    assert isinstance(model.q, nn.QuantizedLinear) and isinstance(model.o, w8.Linear)


def test_a_4bit_layer_converts_and_the_summary_says_4_bit(capsys):
    # MLX's 4-bit layers convert as stored (W4A8); the summary names their width, and
    # the decisions name the 4-bit kernels (the W4A16 reference by default).
    model = Tiny()
    nn.quantize(model, group_size=32, bits=4, class_predicate=lambda p, m: p == "q")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "left as they are" warning
        w8.quantize(model, group_size=32, verbose=True)
    said = capsys.readouterr().err.strip()
    assert said.startswith("mlx_w8a8: 2 layers (1 grouped4 (4-bit), 1 per_channel)"), said
    assert isinstance(model.q, w8.Linear) and model.q.bits == 4
    assert w8.decisions(model, 1, mx.float32)["q"][0] in ("mlx_qmm4", "exact_w4a8")
    assert "format=grouped4, bits=4" in repr(model.q)
    assert w8.summary(nn.Sequential(nn.ReLU())) == "mlx_w8a8: no mlx_w8a8.Linear layers"


def test_decisions_validates_m():
    with pytest.raises(ValueError, match=r"decisions\] m must be a positive int, got 0"):
        w8.decisions(Tiny(), 0)


def test_the_summary_counts_layers_with_activation_groups():
    model = nn.Sequential(nn.Linear(128, 64), nn.Linear(64, 32))
    w8.quantize(model, act_scales="group")
    model.layers[1].act_scales = "token"
    line = w8.summary(model)
    assert line.startswith("mlx_w8a8: 2 layers (2 grouped; 1 with activation groups)"), line
    w8.quantize(plain := nn.Sequential(nn.Linear(128, 64)))
    assert "activation groups" not in w8.summary(plain)


def test_the_summary_counts_layers_with_outlier_channels():
    model = nn.Sequential(nn.Linear(128, 64), nn.Linear(64, 32))
    w8.quantize(model)
    model.layers[0].outliers = (1, 2)
    line = w8.summary(model)
    assert line.startswith("mlx_w8a8: 2 layers (2 per_channel; 1 with outlier channels)"), line
    model.layers[0].outliers = None
    assert "outlier" not in w8.summary(model)
