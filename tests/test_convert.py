"""Whole models: quantize, save, load — with stock mlx-lm reading our checkpoints."""

import dataclasses
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


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 64)
        self.up = nn.Linear(64, 128)
        self.down = nn.Linear(128, 64, bias=False)
        self.odd = nn.Linear(64, 10)  # K = 64 divides, N = 10: still converted
        self.head = nn.Linear(10, 7)  # K = 10 is no multiple of any group size: skipped

    def __call__(self, t):
        h = self.embed(t)
        return self.head(self.odd(self.down(nn.relu(self.up(h)))))


def test_quantize_converts_what_it_can(rng):
    model = Tiny()
    w8.quantize(model)
    assert isinstance(model.up, w8.Linear) and isinstance(model.down, w8.Linear)
    assert isinstance(model.odd, w8.Linear)
    assert isinstance(model.head, nn.Linear) and isinstance(model.embed, nn.Embedding)
    skip = Tiny()
    w8.quantize(skip, class_predicate=lambda path, m: path != "down")
    assert isinstance(skip.down, nn.Linear) and isinstance(skip.up, w8.Linear)


class Custom(nn.Linear):
    """A float linear subclass converted its own way (through register_converter)."""


def test_a_registered_converter_comes_before_the_built_in_rules(monkeypatch):
    from mlx_w8a8 import converters

    monkeypatch.setattr(converters, "_CONVERTERS", dict(converters._CONVERTERS))  # undone after
    calls = []

    def to_w8a8(layer, group_size, per_channel):
        calls.append((layer.weight.shape, group_size, per_channel))
        out = w8.Linear.from_linear(layer, group_size=group_size, per_channel=per_channel)
        out.kernel = "exact"
        return out

    converters.register_converter(Custom, lambda layer, gs: layer.weight.shape[-1] % (2 * gs) == 0,
                                  to_w8a8)
    model = nn.Module()
    model.a = Custom(64, 16)  # accepted: converted by to_w8a8, not by the nn.Linear rule
    model.b = Custom(32, 16)  # K = 32: the nn.Linear rule converts it, convertible says no
    model.c = Custom(64, 8)  # a skip pattern keeps it as it is
    model.d = nn.Linear(64, 16)  # unregistered: the built-in rule
    w8.quantize(model, group_size=32, per_channel=False, skip={"c": "float"})
    assert calls == [((16, 64), 32, False)]
    assert isinstance(model.a, w8.Linear) and model.a.kernel == "exact"
    assert type(model.b) is Custom and type(model.c) is Custom
    assert isinstance(model.d, w8.Linear) and model.d.kernel is None
    with pytest.raises(ValueError,
                       match=r"\[mlx_w8a8.register_converter\] layer_type must be a class"):
        converters.register_converter("Linear", to_w8a8, to_w8a8)
    with pytest.raises(ValueError, match=r"convert must be callable, got None"):
        converters.register_converter(Custom, to_w8a8, None)


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


# --- a tiny randomly initialised mlx-lm Llama ------------------------------------------
# Marked per test (not a module-level importorskip), so the tests above still run
# where mlx-lm is not installed.
try:
    from mlx_lm.models import llama
except ImportError:
    llama = None
needs_mlx_lm = pytest.mark.skipif(llama is None, reason="mlx-lm is part of the test extra")


def _tiny_llama():
    args = llama.ModelArgs(
        model_type="llama", hidden_size=128, num_hidden_layers=2, intermediate_size=256,
        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=256,
        tie_word_embeddings=False,
    )
    model = llama.Model(args)
    model.set_dtype(mx.bfloat16)
    mx.eval(model.parameters())
    return model, dataclasses.asdict(args)


def _use(model, kernel):
    for _, m in model.named_modules():
        if isinstance(m, w8.Linear):
            m.kernel = kernel


@needs_mlx_lm
def test_mlx_lm_llama_convert_run_save_load(tmp_path, rng):
    from mlx_lm.utils import load_model

    model, config = _tiny_llama()
    tokens = mx.array(rng.integers(0, 256, (2, 12)))
    ref = np.array(model(tokens).astype(mx.float32)).astype(np.float64)
    w8.quantize(model)
    n_layers = sum(isinstance(m, w8.Linear) for _, m in model.named_modules())
    assert n_layers == 2 * 7 + 1  # q, k, v, o, gate, up, down per block + lm_head
    reports = {}
    for kernel in ("exact", None):  # exact W8A8 math, and the default dispatch
        _use(model, kernel)
        logits = np.array(model(tokens).astype(mx.float32)).astype(np.float64)
        reports[kernel or "default"] = oracle.sqnr_db(ref, logits)
    print(f"tiny Llama logits SQNR vs bf16 model: {reports}")
    # A random tiny model has near-uniform logits; 25 dB still catches a broken layer
    # (a wrong scale or transposed weight drops it to ~0 dB).
    assert min(reports.values()) > 25

    # Stock mlx-lm runs the stored weights as W8A16 (mx.quantized_matmul): our layers
    # forced onto that candidate must give the same outputs bit for bit.
    _use(model, "mlx_qmm")
    want = np.array(model(tokens).astype(mx.float32))
    w8.save(model, tmp_path, config)
    stock, _ = load_model(Path(tmp_path))  # stock mlx-lm: an ordinary 8-bit model
    assert isinstance(stock.model.layers[0].mlp.gate_proj, nn.QuantizedLinear)
    np.testing.assert_array_equal(np.array(stock(tokens).astype(mx.float32)), want)
    ours, _ = w8.load(tmp_path)
    assert isinstance(ours.model.layers[0].mlp.gate_proj, w8.Linear)
    assert ours.model.layers[0].mlp.gate_proj.quantized_weight.per_channel
    _use(ours, "mlx_qmm")
    np.testing.assert_array_equal(np.array(ours(tokens).astype(mx.float32)), want)


@needs_mlx_lm
def test_load_converts_a_stock_8bit_checkpoint(tmp_path, rng):
    # An mlx-lm 8-bit checkpoint (group-wise affine, not per-channel) gets W8A8 layers
    # running the grouped math; its float layers stay float.
    from mlx_lm.utils import save_model, save_config

    model, config = _tiny_llama()
    nn.quantize(model, group_size=64, bits=8, class_predicate=lambda p, m: isinstance(m, nn.Linear) and p != "lm_head")
    save_model(tmp_path, model)
    save_config({**config, "quantization": {"group_size": 64, "bits": 8}}, tmp_path / "config.json")
    tokens = mx.array(rng.integers(0, 256, (1, 9)))
    want = np.array(model(tokens).astype(mx.float32)).astype(np.float64)
    ours, _ = w8.load(tmp_path)
    proj = ours.model.layers[1].self_attn.q_proj
    assert isinstance(proj, w8.Linear) and not proj.quantized_weight.per_channel
    assert isinstance(ours.lm_head, nn.Linear)
    _use(ours, "exact")
    got = np.array(ours(tokens).astype(mx.float32)).astype(np.float64)
    db = oracle.sqnr_db(want, got)
    print(f"stock 8-bit checkpoint, grouped W8A8 vs W8A16 logits: {db:.1f} dB")
    assert db > 25


def test_save_refuses_a_folder_with_other_weight_files(tmp_path):
    # mlx-lm would load a stale shard beside the new weights; saving twice into the same
    # folder (our own model.safetensors) is fine.
    model, config = _tiny_llama()
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

    model, config = _tiny_llama()
    save_model(tmp_path, model)
    save_config(config, tmp_path / "config.json")
    with pytest.warns(UserWarning, match=r"load\] .* holds no 8-bit, 4-bit or W8A8 linear layers"):
        ours, _ = w8.load(tmp_path)
    assert isinstance(ours.lm_head, nn.Linear) and not isinstance(ours.lm_head, w8.Linear)


# --- mixed models, skip patterns, the convert command line -------------------------------
import tiny_lm  # noqa: E402


def test_the_command_line_module_still_offers_the_library_names():
    # User code imports these from mlx_w8a8.convert; they are the library's own objects.
    from mlx_w8a8 import checkpoint, converters, folder_convert, quantizer
    from mlx_w8a8.convert import (CONFIG_KEY, convert, kept_by_model, load, quantize,
                                  register_converter, save, w8a8_layers)

    assert (quantize, kept_by_model, w8a8_layers) == (
        quantizer.quantize, quantizer.kept_by_model, quantizer.w8a8_layers)
    assert (save, load, CONFIG_KEY) == (checkpoint.save, checkpoint.load, checkpoint.CONFIG_KEY)
    assert register_converter is converters.register_converter
    assert convert is folder_convert.convert
    assert (w8.quantize, w8.save, w8.load) == (quantize, save, load)


def test_matches_patterns():
    from mlx_w8a8.quantizer import matches

    assert matches("lm_head", "lm_head") and matches("language_model.lm_head", "lm_head")
    assert matches("model.layers.3.mlp.down_proj", "down_proj")
    assert not matches("model.layers.3.mlp.down_proj_x", "down_proj")  # whole names only
    assert matches("model.layers.0.self_attn.q_proj", "model.layers.0.*")
    assert not matches("model.layers.10.self_attn.q_proj", "model.layers.1.*")


def test_quantize_skip_keeps_layers_on_w8a16_or_float():
    model, _ = tiny_lm.model("llama")
    w8.quantize(model, skip={"lm_head": "w8a16", "layers.1.mlp.down_proj": "float", "down_proj": "w8a16"})
    assert type(model.lm_head) is nn.QuantizedLinear and model.lm_head.bits == 8
    assert type(model.model.layers[1].mlp.down_proj) is nn.Linear  # first matching pattern wins
    assert type(model.model.layers[0].mlp.down_proj) is nn.QuantizedLinear
    assert isinstance(model.model.layers[0].mlp.up_proj, w8.Linear)
    plain, _ = tiny_lm.model("llama")
    w8.quantize(plain, skip=["lm_head"])  # an iterable: W8A16
    assert type(plain.lm_head) is nn.QuantizedLinear
    with pytest.raises(ValueError, match=r"quantize\] skip maps layer patterns to one of"):
        w8.quantize(plain, skip={"lm_head": "int4"})
    with pytest.raises(ValueError, match=r"quantize\] skip must be a layer pattern.*got 5 \(int\)"):
        w8.quantize(plain, skip=5)


def _kinds(model):
    """``{path: "W8A8" | "QuantizedLinear" | "Linear"}`` of the linear layers."""
    kinds = {}
    for path, m in model.named_modules():
        if isinstance(m, w8.Linear):
            kinds[path] = "W8A8"
        elif isinstance(m, (nn.QuantizedLinear, nn.Linear)):
            kinds[path] = type(m).__name__
    return kinds


def test_mixed_checkpoint_loads_the_same_in_mlx_lm_and_here(tmp_path, rng):
    from mlx_lm import load as lm_load

    model, config = tiny_lm.model("llama", rng=rng)
    src = tiny_lm.folder(tmp_path / "src", model, config)
    w8.quantize(model, skip={"lm_head": "float", "layers.0.mlp.down_proj": "w8a16"})
    _use(model, "mlx_qmm")
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
        assert _kinds(loaded) == _kinds(model)
        _use(loaded, "mlx_qmm")
        np.testing.assert_array_equal(np.array(loaded(tokens)), want)


def test_convert_cli_smoothed_mixed_checkpoint(tmp_path, capsys):
    from mlx_lm import load as lm_load

    from mlx_w8a8.convert import main

    rng = np.random.default_rng(3)
    model, config = tiny_lm.model("qwen2", rng=rng)  # q/k/v biases: folded too
    src = tiny_lm.folder(tmp_path / "src", model, config)
    text = tiny_lm.text_file(tmp_path / "calib.txt", 2048)
    tokens = mx.array(rng.integers(0, 256, (2, 12)))
    ref = np.array(model(tokens)).astype(np.float64)
    common = ["--model", str(src), "--smooth", "0.7", "--calibration", str(text),
              "--seq-len", "64", "--samples", "4"]

    # 1. Smoothed, lm_head on W8A16 (the default skip), a report with no layer below.
    one = tmp_path / "one"
    assert main([*common, "--out", str(one), "--sqnr-floor", "-1000"]) == 0
    printed = capsys.readouterr().out
    assert "smoothed 8 sites" in printed and "logits (whole model)" in printed
    report = json.loads((one / "sensitivity.json").read_text())["layers"]
    assert len(report) == 15
    stock, _ = lm_load(str(one))  # tokenizer copied from the source folder
    assert type(stock.lm_head) is nn.QuantizedLinear
    assert type(stock.model.layers[0].self_attn.q_proj) is nn.QuantizedLinear
    ours, _ = w8.load(one)
    assert type(ours.lm_head) is nn.QuantizedLinear
    assert isinstance(ours.model.layers[0].self_attn.q_proj, w8.Linear)
    _use(ours, "mlx_qmm")
    got = np.array(stock(tokens)).astype(np.float64)
    np.testing.assert_array_equal(got, np.array(ours(tokens)))
    # The smoothed, 8-bit model still computes the float model's function.
    assert oracle.sqnr_db(ref, got) > 30

    # 2. A floor just above the three weakest layers keeps exactly those on W8A16.
    ranked = sorted(report, key=lambda p: report[p]["w8a8_db"])
    worst = ranked[:3]
    floor = (report[ranked[2]]["w8a8_db"] + report[ranked[3]]["w8a8_db"]) / 2
    two = tmp_path / "two"
    assert main([*common, "--out", str(two), "--sqnr-floor", str(floor), "--skip"]) == 0
    cfg = json.loads((two / "config.json").read_text())
    on_w8a16 = {p for p, v in cfg["quantization"].items() if isinstance(v, dict)}
    assert on_w8a16 == set(worst)  # --skip alone: lm_head no longer skipped
    assert len(cfg["mlx_w8a8"]["layers"]) == 15 - 3
    stock, _ = lm_load(str(two))
    ours, _ = w8.load(two)
    assert set(_kinds(stock).values()) == {"QuantizedLinear"}  # 8-bit everywhere for mlx-lm
    kinds = _kinds(ours)
    assert {p for p, k in kinds.items() if k == "QuantizedLinear"} == set(worst)
    assert sum(k == "W8A8" for k in kinds.values()) == 12
    _use(ours, "mlx_qmm")
    np.testing.assert_array_equal(np.array(stock(tokens)), np.array(ours(tokens)))

    # 3. Errors: smoothing without calibration text; every layer below the floor.
    # Argument errors are argparse's (exit status 2), before any model is loaded.
    def refused(argv):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2
        return capsys.readouterr().err

    assert "need --calibration" in refused(["--model", str(src), "--out", str(tmp_path / "x"),
                                            "--smooth", "0.5"])
    assert main([*common, "--out", str(tmp_path / "y"), "--sqnr-floor", "1000"]) == 2
    assert "no mlx_w8a8.Linear layers" in capsys.readouterr().err
    err = refused(["--model", str(tmp_path / "none"), "--out", str(tmp_path / "z")])
    assert "[mlx_w8a8.convert] model must be an mlx-lm model folder" in err
    err = refused(["--model", str(src), "--out", str(tmp_path / "z"), "--smooth", "0.5",
                   "--calibration", str(tmp_path / "none.txt")])
    assert "calibration must be a text file" in err
    assert not (tmp_path / "z").exists()
    (tmp_path / "z").mkdir()  # an output folder holding another model's shard
    (tmp_path / "z" / "model-00001-of-00004.safetensors").write_bytes(b"")
    assert "already holds weight files" in refused(["--model", str(src), "--out", str(tmp_path / "z")])


# --- nothing lost: output folders, atomic save -------------------------------------------


def _tree(folder: Path) -> dict:
    """``{relative path: bytes}`` of every file under ``folder``."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@needs_mlx_lm
def test_convert_never_writes_over_its_source_and_wants_force_for_a_full_folder(tmp_path, capsys):
    # --out == --model used to overwrite the float checkpoint in place (exit 0, a stale
    # index left behind); a non-empty --out was written into without a word.
    from mlx_w8a8.convert import main

    model, config = tiny_lm.model("llama", rng=np.random.default_rng(0))
    src = tiny_lm.folder(tmp_path / "models" / "src", model, config)
    (src / "model.safetensors.index.json").write_text('{"weight_map": {}}')
    before = _tree(tmp_path / "models")

    def refused(argv, want):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert want in err, err

    for out, why in ((src, "must not be the model folder"),
                     (src / "w8a8", "is inside the model folder"),
                     (tmp_path / "models", "holds the model folder")):
        refused(["--model", str(src), "--out", str(out)], why)
        refused(["--model", str(src), "--out", str(out), "--force"], why)  # never, even forced
    assert _tree(tmp_path / "models") == before
    # The same folder spelled another way is still the source.
    refused(["--model", str(src), "--out", str(src / ".." / "src")], "must not be the model folder")

    full = tmp_path / "full"
    full.mkdir()
    (full / "notes.txt").write_text("mine")
    refused(["--model", str(src), "--out", str(full)], "is not empty (notes.txt)")
    assert _tree(full) == {"notes.txt": b"mine"}
    (full / "extra.bin").write_bytes(b"keep")
    (full / "model.safetensors.index.json").write_text('{"weight_map": {}}')  # stale
    assert main(["--model", str(src), "--out", str(full), "--force"]) == 0
    assert (full / "notes.txt").read_text() == "mine"  # other files kept
    assert (full / "extra.bin").read_bytes() == b"keep"
    assert not (full / "model.safetensors.index.json").exists()  # would name absent shards
    assert (full / "model.safetensors").is_file() and (full / "tokenizer.json").is_file()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["--model", str(src), "--out", str(empty)]) == 0  # an empty folder is fine
    assert _tree(tmp_path / "models") == before


def _two_models():
    """Two tiny Llamas of one architecture with different weights, converted."""
    a, config = _tiny_llama()
    b, _ = _tiny_llama()
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
    before = _tree(out)
    real = mx.save_safetensors

    def fails_after_first_file(path, *args, **kwargs):
        real(path, *args, **kwargs)
        raise OSError("disk full (injected)")

    monkeypatch.setattr(mx, "save_safetensors", fails_after_first_file)
    with pytest.raises(OSError, match="injected"):
        w8.save(new, out, config)
    monkeypatch.undo()
    assert _tree(out) == before  # the old checkpoint, byte for byte
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no temporary folder left
    loaded, _ = w8.load(out, _tiny_llama()[0])
    _assert_same_parameters(loaded, old)
    # A save that completes replaces it.
    w8.save(new, out, config)
    _assert_same_parameters(w8.load(out, _tiny_llama()[0])[0], new)
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

    float_model, config = _tiny_llama()
    src = tmp_path / "float"
    save_model(src, float_model)
    save_config(config, src / "config.json")
    old, _, _ = _two_models()
    out = tmp_path / "ckpt"
    w8.save(old, out, config)
    before = _tree(out)
    done = subprocess.run([sys.executable, "-c", KILLED_SAVE, str(src), str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert _tree(out) == before
    loaded, _ = w8.load(out)  # as mlx-lm builds it, then converted
    _assert_same_parameters(loaded, old)


@needs_mlx_lm
def test_save_without_a_tokenizer_says_how_to_add_one(tmp_path):
    model, config = _tiny_llama()
    w8.quantize(model)
    with pytest.warns(UserWarning, match=r"\[mlx_w8a8.save\] .*ckpt has no tokenizer.*source="):
        w8.save(model, tmp_path / "ckpt", config)
    src = tiny_lm.folder(tmp_path / "src", *tiny_lm.model("llama"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # with the source's tokenizer: no warning
        w8.save(model, tmp_path / "ckpt2", config, source=src)


@needs_mlx_lm
def test_convert_checks_every_argument_before_loading(tmp_path, monkeypatch, capsys):
    # --smooth 2 used to be refused only after the model was loaded and calibrated.
    import mlx_lm.utils

    from mlx_w8a8.convert import main

    src = tiny_lm.folder(tmp_path / "src", *tiny_lm.model("llama"))
    text = tiny_lm.text_file(tmp_path / "calib.txt", 512)
    loads = []
    monkeypatch.setattr(mlx_lm.utils, "load_model", lambda *a, **k: loads.append(a) or 1 / 0)
    for extra, want in ((["--smooth", "2", "--calibration", str(text)], "--smooth ALPHA must be in [0, 1], got 2.0"),
                        (["--smooth", "-0.1", "--calibration", str(text)], "must be in [0, 1]"),
                        (["--sqnr-floor", "nan", "--calibration", str(text)], "--sqnr-floor must be a finite"),
                        (["--seq-len", "1"], "--seq-len must be >= 2, got 1"),
                        (["--samples", "0"], "--samples must be >= 1"),
                        (["--batch-size", "0"], "--batch-size must be >= 1")):
        with pytest.raises(SystemExit) as exit_:
            main(["--model", str(src), "--out", str(tmp_path / "out"), *extra])
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert "usage:" in err and want in err, err
    assert loads == [] and not (tmp_path / "out").exists()


def _quantized_folder(tmp_path, name, **kwargs):
    """A tiny Llama quantized by mlx-lm (``quantize_model`` with ``kwargs``), saved as
    mlx-lm saves it: ``(model, config, folder)``."""
    from mlx_lm.utils import quantize_model, save_config, save_model

    model, config = _tiny_llama()
    model, config = quantize_model(model, config, **kwargs)
    folder = tmp_path / name
    save_model(folder, model)
    save_config(config, folder / "config.json")
    return model, config, folder


@needs_mlx_lm
def test_convert_of_a_4bit_folder_keeps_the_4bit_model(tmp_path, capsys, rng):
    # mlx-lm's default 4-bit checkpoint converts: every layer keeps its 4-bit arrays
    # (W4A8, nothing requantized), and the output is the same 4-bit model to stock
    # mlx-lm (lm_head is skipped by default and stays a 4-bit QuantizedLinear).
    from mlx_lm.utils import load_model

    from mlx_w8a8.convert import main

    model, config, q4 = _quantized_folder(tmp_path, "q4", group_size=64, bits=4)
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
    _use(ours, "mlx_qmm4")  # the W4A16 product of the stored arrays, as mlx-lm runs it
    np.testing.assert_array_equal(np.array(ours(tokens).astype(mx.float32)), want)
    _use(ours, "exact_w4a8")
    got = np.array(ours(tokens).astype(mx.float32)).astype(np.float64)
    assert oracle.sqnr_db(want.astype(np.float64), got) > 25


@needs_mlx_lm
def test_convert_of_a_4bit_folder_with_calibration_applies_the_recipe(tmp_path, capsys):
    # --calibration on a quantized checkpoint: nothing to smooth, but every stored layer
    # is scored (recipe.json) and a kept one stays a stored 4-bit layer.
    from mlx_w8a8.convert import main

    _, _, q4 = _quantized_folder(tmp_path, "q4", group_size=64, bits=4)
    out = tmp_path / "out"
    assert main(["--model", str(q4), "--out", str(out), "--calibration", "builtin",
                 "--seq-len", "32", "--samples", "2"]) == 0
    said = capsys.readouterr().out
    assert "recipe: not smoothed" in said, said
    chosen = json.loads((out / "recipe.json").read_text())
    assert chosen["alphas"] == {} and len(chosen["layers"]) == 15
    assert all(e["bits"] == 4 for e in chosen["layers"].values())
    ours, _ = w8.load(out)
    for path, m in tree_flatten(ours.leaf_modules(), is_leaf=nn.Module.is_module):
        if path in chosen["keep"] or path == "lm_head":
            assert type(m) is nn.QuantizedLinear and m.bits == 4, path
        elif path in chosen["layers"]:
            assert isinstance(m, w8.Linear) and m.format == "grouped4", path


@needs_mlx_lm
def test_save_load_of_a_4bit_model_with_a_model_given(tmp_path, rng):
    # load(path, model) builds the 4-bit layers itself (no mlx-lm load_model): the
    # parameters read back are the saved ones, bit for bit.
    model, config = _tiny_llama()
    nn.quantize(model, group_size=32, bits=4, class_predicate=lambda p, m: isinstance(m, nn.Linear))
    w8.quantize(model, class_predicate=lambda p, m: p != "lm_head")
    w8.save(model, tmp_path / "out", config)
    fresh, _ = _tiny_llama()
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


@needs_mlx_lm
def test_convert_of_a_folder_nothing_converts_says_what_is_true(tmp_path, capsys):
    # A 3-bit checkpoint: no layer converts, and the command line says so at once.
    from mlx_w8a8.convert import main

    model, config, q3 = _quantized_folder(tmp_path, "q3", group_size=64, bits=3)
    with pytest.raises(SystemExit) as exit_:
        main(["--model", str(q3), "--out", str(tmp_path / "out")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "is a 3-bit affine checkpoint" in err and "converts 8-bit and 4-bit affine" in err
    assert "convert the float form" in err and "quantize(model) first" not in err
    # save() of such a model says the same, not "quantize it first"
    with pytest.raises(ValueError, match=r"3-bit, which this version does not convert"):
        w8.save(model, tmp_path / "out", config)


# --- mixture-of-experts models -----------------------------------------------------------


def _moe(kind: str):
    if kind == "mixtral":
        from mlx_lm.models import mixtral

        args = mixtral.ModelArgs(model_type="mixtral", vocab_size=64, hidden_size=64,
                                 intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)
        return mixtral.Model(args), ["block_sparse_moe.gate"]
    from mlx_lm.models import qwen2_moe

    args = qwen2_moe.ModelArgs(model_type="qwen2_moe", hidden_size=64, num_hidden_layers=2,
                               intermediate_size=128, num_attention_heads=4, num_experts_per_tok=2,
                               num_experts=4, moe_intermediate_size=64,
                               shared_expert_intermediate_size=128, rms_norm_eps=1e-5,
                               vocab_size=64, num_key_value_heads=2)
    return qwen2_moe.Model(args), ["mlp.gate", "mlp.shared_expert_gate"]


@needs_mlx_lm
@pytest.mark.parametrize("kind", ["mixtral", "qwen2_moe"])
def test_quantize_moe_says_experts_were_left_and_keeps_routers(kind, capsys, tmp_path):
    from mlx_lm.utils import load_model

    model, router_names = _moe(kind)
    mx.eval(model.parameters())
    tokens = mx.array(np.random.default_rng(1).integers(0, 64, (1, 6)))
    with pytest.warns(UserWarning, match=r"\[mlx_w8a8.quantize\] 6 mixture-of-experts expert "
                      r"layers \(SwitchLinear, 4 experts each\) were left as they are: .*dense "
                      rf"linear layers only.*; {2 * len(router_names)} router layers"):
        w8.quantize(model, verbose=True)
    modules = dict(model.named_modules())
    routers = [f"model.layers.{i}.{name}" for i in range(2) for name in router_names]
    for path in routers:  # as they were: float nn.Linear, not W8A8
        assert type(modules[path]) is nn.Linear, path
    assert isinstance(modules["model.layers.0.self_attn.q_proj"], w8.Linear)
    if kind == "qwen2_moe":  # the dense shared expert converts
        assert isinstance(modules["model.layers.0.mlp.shared_expert.down_proj"], w8.Linear)
    err = capsys.readouterr().err
    assert "6 mixture-of-experts expert layers not converted" in err  # verbose's summary
    assert w8.summary(model).endswith("; 6 mixture-of-experts expert layers not converted")
    # The checkpoint loads in mlx-lm and here, routers and experts float in both.
    config = {k: v for k, v in dataclasses.asdict(model.args).items() if v is not None}
    w8.save(model, tmp_path / "ckpt", config)
    stock, _ = load_model(tmp_path / "ckpt")
    with pytest.warns(UserWarning, match="expert layers"):
        ours, _ = w8.load(tmp_path / "ckpt")
    for loaded in (stock, ours):
        kinds = dict(loaded.named_modules())
        assert all(type(kinds[p]) is nn.Linear for p in routers)
        assert type(kinds["model.layers.1.self_attn.o_proj"]) is (
            w8.Linear if loaded is ours else nn.QuantizedLinear)
    _use(ours, "mlx_qmm")
    np.testing.assert_array_equal(np.array(stock(tokens)), np.array(ours(tokens)))


def test_quantize_honours_a_models_quant_predicate():
    # mlx-lm's hook: a layer the model says not to quantize stays as it is.
    class Picky(Tiny):
        @property
        def quant_predicate(self):
            return lambda path, module: path != "down"

    model = Picky()
    w8.quantize(model)
    assert type(model.down) is nn.Linear and isinstance(model.up, w8.Linear)
