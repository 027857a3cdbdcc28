"""The ``python -m mlx_w8a8.convert`` command line: its arguments, exit statuses, printed
output and output folders, and the library names it re-exports."""

import json

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

import mlx_w8a8 as w8
import oracle
import tiny_lm
from tiny_checkpoints import force_kernel, layer_kinds, needs_mlx_lm, quantized_folder, tree_bytes



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
    force_kernel(ours, "mlx_qmm")
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
    assert set(layer_kinds(stock).values()) == {"QuantizedLinear"}  # 8-bit everywhere for mlx-lm
    kinds = layer_kinds(ours)
    assert {p for p, k in kinds.items() if k == "QuantizedLinear"} == set(worst)
    assert sum(k == "W8A8" for k in kinds.values()) == 12
    force_kernel(ours, "mlx_qmm")
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


@needs_mlx_lm
def test_convert_never_writes_over_its_source_and_wants_force_for_a_full_folder(tmp_path, capsys):
    # --out == --model used to overwrite the float checkpoint in place (exit 0, a stale
    # index left behind); a non-empty --out was written into without a word.
    from mlx_w8a8.convert import main

    model, config = tiny_lm.model("llama", rng=np.random.default_rng(0))
    src = tiny_lm.folder(tmp_path / "models" / "src", model, config)
    (src / "model.safetensors.index.json").write_text('{"weight_map": {}}')
    before = tree_bytes(tmp_path / "models")

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
    assert tree_bytes(tmp_path / "models") == before
    # The same folder spelled another way is still the source.
    refused(["--model", str(src), "--out", str(src / ".." / "src")], "must not be the model folder")

    full = tmp_path / "full"
    full.mkdir()
    (full / "notes.txt").write_text("mine")
    refused(["--model", str(src), "--out", str(full)], "is not empty (notes.txt)")
    assert tree_bytes(full) == {"notes.txt": b"mine"}
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
    assert tree_bytes(tmp_path / "models") == before


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


@needs_mlx_lm
def test_convert_of_a_folder_nothing_converts_says_what_is_true(tmp_path, capsys):
    # A 3-bit checkpoint: no layer converts, and the command line says so at once.
    from mlx_w8a8.convert import main

    model, config, q3 = quantized_folder(tmp_path, "q3", group_size=64, bits=3)
    with pytest.raises(SystemExit) as exit_:
        main(["--model", str(q3), "--out", str(tmp_path / "out")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "is a 3-bit affine checkpoint" in err and "converts 8-bit and 4-bit affine" in err
    assert "convert the float form" in err and "quantize(model) first" not in err
    # save() of such a model says the same, not "quantize it first"
    with pytest.raises(ValueError, match=r"3-bit, which this version does not convert"):
        w8.save(model, tmp_path / "out", config)


@needs_mlx_lm
def test_convert_act_groups_writes_group_wise_layers_that_load_as_such(tmp_path, capsys):
    from mlx_w8a8.convert import main

    rng = np.random.default_rng(5)
    model, config = tiny_lm.model("llama", rng=rng)
    src = tiny_lm.folder(tmp_path / "src", model, config)
    out = tmp_path / "out"
    assert main(["--model", str(src), "--out", str(out), "--act-groups"]) == 0
    listed = json.loads((out / "config.json").read_text())["mlx_w8a8"]["layers"]
    assert listed and all(e == {"group_size": 64, "format": "grouped", "act_scales": "group"}
                          for e in listed.values())
    ours, _ = w8.load(out)
    layers = [m for _, m in ours.named_modules() if isinstance(m, w8.Linear)]
    assert len(layers) == len(listed) and {m.act_scales for m in layers} == {"group"}
    with pytest.raises(SystemExit):
        main(["--model", str(src), "--out", str(tmp_path / "x"), "--act-groups", "--per-channel"])
    assert "contradict" in capsys.readouterr().err
