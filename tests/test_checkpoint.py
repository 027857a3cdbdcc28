"""mlx_w8a8.checkpoint: save and load, with stock mlx-lm reading our checkpoints; the
atomic swap that keeps the old checkpoint when a save fails or is killed."""

import json
import warnings
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_map

import mlx_w8a8 as w8
import oracle
import tiny_lm
from tiny_checkpoints import (Tiny, force_kernel, layer_kinds, needs_mlx_lm, tiny_llama,
                              tree_bytes)



def test_save_and_load_with_model_instance(tmp_path, rng):
    model = Tiny()
    mx.eval(model.parameters())
    w8.quantize(model, group_size=32)
    t = mx.array(rng.integers(0, 50, (2, 5)))
    out = np.array(model(t))
    w8.save(model, tmp_path, {"note": "tiny"})
    cfg = json.loads((tmp_path / "config.json").read_text())
    # head (K = 10, not convertible) is a float linear layer: written per layer as false,
    # mlx-lm's convention, so both loaders leave it float.
    assert cfg["quantization"] == {"group_size": 32, "bits": 8, "mode": "affine", "head": False}
    assert set(cfg["mlx_w8a8"]["layers"]) == {"up", "down", "odd"} and cfg["note"] == "tiny"
    loaded, cfg2 = w8.load(tmp_path, Tiny())
    assert isinstance(loaded.up, w8.Linear) and loaded.up.quantized_weight.per_channel
    np.testing.assert_array_equal(np.array(loaded(t)), out)


def test_save_without_w8a8_layers_and_load_errors(tmp_path):
    with pytest.raises(ValueError, match=r"save.*no mlx_w8a8.Linear layers"):
        w8.save(Tiny(), tmp_path)
    with pytest.raises(ValueError, match=r"load.*no config.json"):
        w8.load(tmp_path / "missing", Tiny())
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"load.*not valid JSON"):
        w8.load(tmp_path, Tiny())


@needs_mlx_lm
def test_mlx_lm_llama_convert_run_save_load(tmp_path, rng):
    from mlx_lm.utils import load_model

    model, config = tiny_llama()
    tokens = mx.array(rng.integers(0, 256, (2, 12)))
    ref = np.array(model(tokens).astype(mx.float32)).astype(np.float64)
    w8.quantize(model)
    n_layers = sum(isinstance(m, w8.Linear) for _, m in model.named_modules())
    assert n_layers == 2 * 7 + 1  # q, k, v, o, gate, up, down per block + lm_head
    reports = {}
    for kernel in ("exact", None):  # exact W8A8 math, and the default dispatch
        force_kernel(model, kernel)
        logits = np.array(model(tokens).astype(mx.float32)).astype(np.float64)
        reports[kernel or "default"] = oracle.sqnr_db(ref, logits)
    print(f"tiny Llama logits SQNR vs bf16 model: {reports}")
    # A random tiny model has near-uniform logits; 25 dB still catches a broken layer
    # (a wrong scale or transposed weight drops it to ~0 dB).
    assert min(reports.values()) > 25

    # Stock mlx-lm runs the stored weights as W8A16 (mx.quantized_matmul): our layers
    # forced onto that candidate must give the same outputs bit for bit.
    force_kernel(model, "mlx_qmm")
    want = np.array(model(tokens).astype(mx.float32))
    w8.save(model, tmp_path, config)
    stock, _ = load_model(Path(tmp_path))  # stock mlx-lm: an ordinary 8-bit model
    assert isinstance(stock.model.layers[0].mlp.gate_proj, nn.QuantizedLinear)
    np.testing.assert_array_equal(np.array(stock(tokens).astype(mx.float32)), want)
    ours, _ = w8.load(tmp_path)
    assert isinstance(ours.model.layers[0].mlp.gate_proj, w8.Linear)
    assert ours.model.layers[0].mlp.gate_proj.quantized_weight.per_channel
    force_kernel(ours, "mlx_qmm")
    np.testing.assert_array_equal(np.array(ours(tokens).astype(mx.float32)), want)


@needs_mlx_lm
def test_load_converts_a_stock_8bit_checkpoint(tmp_path, rng):
    # An mlx-lm 8-bit checkpoint (group-wise affine, not per-channel) gets W8A8 layers
    # running the grouped math; its float layers stay float.
    from mlx_lm.utils import save_model, save_config

    model, config = tiny_llama()
    nn.quantize(model, group_size=64, bits=8, class_predicate=lambda p, m: isinstance(m, nn.Linear) and p != "lm_head")
    save_model(tmp_path, model)
    save_config({**config, "quantization": {"group_size": 64, "bits": 8}}, tmp_path / "config.json")
    tokens = mx.array(rng.integers(0, 256, (1, 9)))
    want = np.array(model(tokens).astype(mx.float32)).astype(np.float64)
    ours, _ = w8.load(tmp_path)
    proj = ours.model.layers[1].self_attn.q_proj
    assert isinstance(proj, w8.Linear) and not proj.quantized_weight.per_channel
    assert isinstance(ours.lm_head, nn.Linear)
    force_kernel(ours, "exact")
    got = np.array(ours(tokens).astype(mx.float32)).astype(np.float64)
    db = oracle.sqnr_db(want, got)
    print(f"stock 8-bit checkpoint, grouped W8A8 vs W8A16 logits: {db:.1f} dB")
    assert db > 25


def test_save_refuses_a_folder_with_other_weight_files(tmp_path):
    # mlx-lm would load a stale shard beside the new weights; saving twice into the same
    # folder (our own model.safetensors) is fine.
    model, config = tiny_llama()
    w8.quantize(model)
    w8.save(model, tmp_path / "out", config)
    w8.save(model, tmp_path / "out", config)
    mx.save_safetensors(str(tmp_path / "out" / "model-00001-of-00002.safetensors"),
                        {"junk": mx.zeros((3,))})
    before = (tmp_path / "out" / "model.safetensors").stat().st_mtime_ns
    with pytest.raises(ValueError, match=r"save\] .* already holds weight files "
                                         r"\['model-00001-of-00002.safetensors'\]"):
        w8.save(model, tmp_path / "out", config)
    assert (tmp_path / "out" / "model.safetensors").stat().st_mtime_ns == before


def test_loading_a_float_folder_says_nothing_was_converted(tmp_path):
    # load() converts 8-bit and 4-bit layers only; a float folder loads as it is, with a warning
    # rather than silently (the user likely meant quantize or convert).
    from mlx_lm.utils import save_model, save_config

    model, config = tiny_llama()
    save_model(tmp_path, model)
    save_config(config, tmp_path / "config.json")
    with pytest.warns(UserWarning, match=r"load\] .* holds no 8-bit, 4-bit or W8A8 linear layers"):
        ours, _ = w8.load(tmp_path)
    assert isinstance(ours.lm_head, nn.Linear) and not isinstance(ours.lm_head, w8.Linear)


def test_mixed_checkpoint_loads_the_same_in_mlx_lm_and_here(tmp_path, rng):
    from mlx_lm import load as lm_load

    model, config = tiny_lm.model("llama", rng=rng)
    src = tiny_lm.folder(tmp_path / "src", model, config)
    w8.quantize(model, skip={"lm_head": "float", "layers.0.mlp.down_proj": "w8a16"})
    force_kernel(model, "mlx_qmm")
    tokens = mx.array(rng.integers(0, 256, (2, 10)))
    want = np.array(model(tokens))
    out = w8.save(model, tmp_path / "out", config, source=src)
    assert {"tokenizer.json", "tokenizer_config.json"} <= {p.name for p in out.iterdir()}
    q = json.loads((out / "config.json").read_text())["quantization"]
    assert q["lm_head"] is False
    assert q["model.layers.0.mlp.down_proj"] == {"group_size": 64, "bits": 8, "mode": "affine"}

    stock, tokenizer = lm_load(str(out))  # the tokenizer was copied: mlx_lm.load works
    assert tokenizer.encode("ab", add_special_tokens=False) == [97, 98]
    assert type(stock.lm_head) is nn.Linear
    np.testing.assert_array_equal(np.array(stock(tokens)), want)

    ours, _ = w8.load(out)
    given, _ = w8.load(out, tiny_lm.model("llama")[0])
    for loaded in (ours, given):
        assert layer_kinds(loaded) == layer_kinds(model)
        force_kernel(loaded, "mlx_qmm")
        np.testing.assert_array_equal(np.array(loaded(tokens)), want)


@needs_mlx_lm
def test_save_load_of_a_4bit_model_with_a_model_given(tmp_path, rng):
    # load(path, model) builds the 4-bit layers itself (no mlx-lm load_model): the
    # parameters read back are the saved ones, bit for bit.
    model, config = tiny_llama()
    nn.quantize(model, group_size=32, bits=4, class_predicate=lambda p, m: isinstance(m, nn.Linear))
    w8.quantize(model, class_predicate=lambda p, m: p != "lm_head")
    w8.save(model, tmp_path / "out", config)
    fresh, _ = tiny_llama()
    loaded, _ = w8.load(tmp_path / "out", fresh)
    layer = loaded.model.layers[1].self_attn.v_proj
    assert isinstance(layer, w8.Linear) and layer.bits == 4 and layer.group_size == 32
    assert type(loaded.lm_head) is nn.QuantizedLinear and loaded.lm_head.bits == 4
    want, got = dict(tree_flatten(model.parameters())), dict(tree_flatten(loaded.parameters()))
    assert want.keys() == got.keys()
    for key in want:
        assert got[key].dtype == want[key].dtype, key
        np.testing.assert_array_equal(oracle.to_numpy(got[key]), oracle.to_numpy(want[key]),
                                      err_msg=key)



# --- nothing lost: atomic save -----------------------------------------------------------


def _two_models():
    """Two tiny Llamas of one architecture with different weights, converted."""
    a, config = tiny_llama()
    b, _ = tiny_llama()
    b.update(tree_map(lambda x: x + 1.0, b.parameters()))
    for m in (a, b):
        mx.eval(m.parameters())
        w8.quantize(m)
    return a, b, config


def _assert_same_parameters(a, b):
    """Every parameter of the two models equal (compared in float32)."""
    pa, pb = dict(tree_flatten(a.parameters())), dict(tree_flatten(b.parameters()))
    assert sorted(pa) == sorted(pb)
    for key in pa:
        np.testing.assert_array_equal(np.array(pa[key].astype(mx.float32)),
                                      np.array(pb[key].astype(mx.float32)), err_msg=key)


@needs_mlx_lm
def test_save_failing_mid_write_keeps_the_old_checkpoint(tmp_path, monkeypatch):
    old, new, config = _two_models()
    out = tmp_path / "ckpt"
    w8.save(old, out, config)
    (out / "tokenizer.json").write_text("{}")
    before = tree_bytes(out)
    real = mx.save_safetensors

    def fails_after_first_file(path, *args, **kwargs):
        real(path, *args, **kwargs)
        raise OSError("disk full (injected)")

    monkeypatch.setattr(mx, "save_safetensors", fails_after_first_file)
    with pytest.raises(OSError, match="injected"):
        w8.save(new, out, config)
    monkeypatch.undo()
    assert tree_bytes(out) == before  # the old checkpoint, byte for byte
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no temporary folder left
    loaded, _ = w8.load(out, tiny_llama()[0])
    _assert_same_parameters(loaded, old)
    # A save that completes replaces it.
    w8.save(new, out, config)
    _assert_same_parameters(w8.load(out, tiny_llama()[0])[0], new)
    assert (out / "tokenizer.json").read_text() == "{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


KILLED_SAVE = """
import os, signal, sys
from pathlib import Path
import mlx.core as mx
import mlx_w8a8 as w8
from mlx_lm.utils import load_model

model, config = load_model(Path(sys.argv[1]))
model.update(__import__("mlx.utils").utils.tree_map(lambda x: x * 3.0, model.parameters()))
w8.quantize(model)
real = mx.save_safetensors

def killed_after_first_file(path, *args, **kwargs):
    real(path, *args, **kwargs)
    os.kill(os.getpid(), signal.SIGKILL)

mx.save_safetensors = killed_after_first_file
w8.save(model, sys.argv[2], config)
"""


@needs_mlx_lm
def test_save_killed_mid_write_keeps_the_old_checkpoint(tmp_path):
    import signal
    import subprocess
    import sys

    from mlx_lm.utils import save_config, save_model

    float_model, config = tiny_llama()
    src = tmp_path / "float"
    save_model(src, float_model)
    save_config(config, src / "config.json")
    old, _, _ = _two_models()
    out = tmp_path / "ckpt"
    w8.save(old, out, config)
    before = tree_bytes(out)
    done = subprocess.run([sys.executable, "-c", KILLED_SAVE, str(src), str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert tree_bytes(out) == before
    loaded, _ = w8.load(out)  # as mlx-lm builds it, then converted
    _assert_same_parameters(loaded, old)


@needs_mlx_lm
def test_save_without_a_tokenizer_says_how_to_add_one(tmp_path):
    model, config = tiny_llama()
    w8.quantize(model)
    with pytest.warns(UserWarning, match=r"\[mlx_w8a8.save\] .*ckpt has no tokenizer.*source="):
        w8.save(model, tmp_path / "ckpt", config)
    src = tiny_lm.folder(tmp_path / "src", *tiny_lm.model("llama"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # with the source's tokenizer: no warning
        w8.save(model, tmp_path / "ckpt2", config, source=src)


@needs_mlx_lm
def test_activation_groups_survive_save_and_load(tmp_path, rng):
    # Saved per layer in the "mlx_w8a8" entry, brought back by load (with a model given
    # and by mlx-lm's builder); load(act_scales=) sets them on a stock 8-bit checkpoint.
    model, config = tiny_llama()
    nn.quantize(model, group_size=64, bits=8, class_predicate=lambda p, m: isinstance(m, nn.Linear))
    stock = tmp_path / "stock"
    from mlx_lm.utils import save_config, save_model

    save_model(stock, model)
    save_config({**config, "quantization": {"group_size": 64, "bits": 8}}, stock / "config.json")
    ours, _ = w8.load(stock)
    assert {m.act_scales for _, m in ours.named_modules() if isinstance(m, w8.Linear)} == {"token"}
    ours, _ = w8.load(stock, act_scales="group")
    layers = [m for _, m in ours.named_modules() if isinstance(m, w8.Linear)]
    assert layers and {m.act_scales for m in layers} == {"group"}
    ours.model.layers[0].mlp.up_proj.act_scales = "token"  # one layer differs: kept as is
    w8.save(ours, tmp_path / "out", config, source=stock)
    saved = json.loads((tmp_path / "out" / "config.json").read_text())["mlx_w8a8"]["layers"]
    assert saved["model.layers.0.mlp.down_proj"]["act_scales"] == "group"
    assert "act_scales" not in saved["model.layers.0.mlp.up_proj"]
    for given in (None, tiny_llama()[0]):
        back, _ = w8.load(tmp_path / "out", given)
        assert back.model.layers[0].mlp.down_proj.act_scales == "group"
        assert back.model.layers[0].mlp.up_proj.act_scales == "token"
    with pytest.raises(ValueError, match="per_channel=True"):
        w8.load(stock, per_channel=True, act_scales="group")


def test_outlier_channels_survive_save_and_load(tmp_path, rng):
    # saved per layer in the "mlx_w8a8" entry (stock mlx-lm ignores it), restored by load
    # with a model given and by mlx-lm's builder, and by the server's loader
    model, config = tiny_llama()
    w8.quantize(model)
    model.model.layers[0].mlp.down_proj.outliers = (3, 40)
    w8.save(model, tmp_path / "out", config)
    saved = json.loads((tmp_path / "out" / "config.json").read_text())["mlx_w8a8"]["layers"]
    assert saved["model.layers.0.mlp.down_proj"]["outliers"] == [3, 40]
    assert "outliers" not in saved["model.layers.0.mlp.up_proj"]
    for given in (None, tiny_llama()[0]):
        back, _ = w8.load(tmp_path / "out", given)
        assert back.model.layers[0].mlp.down_proj.outliers == (3, 40)
        assert back.model.layers[0].mlp.up_proj.outliers is None
