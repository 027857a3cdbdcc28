"""The ``python -m mlx_w8a8.eval`` command line: side by side on a tiny model and on a
W8A8 checkpoint, its argument checks, and the library names it re-exports."""

import json

import numpy as np
import pytest

import tiny_lm
from mlx_w8a8.eval import main



def test_cli_side_by_side_on_a_tiny_model(tmp_path, capsys):
    pytest.importorskip("mlx_lm", reason="mlx-lm is part of the test extra")
    rng = np.random.default_rng(0)
    model, config = tiny_lm.model("llama", rng=rng)
    folder = tiny_lm.folder(tmp_path / "m", model, config)
    text = tiny_lm.text_file(tmp_path / "t.txt", 1024)
    out = tmp_path / "r.jsonl"
    rc = main(["--model", str(folder), "--text", str(text), "--variants", "float,w8a16,w8a8",
               "--seq-len", "64", "--samples", "6", "--dtype", "float32", "--json", str(out)])
    assert rc == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["variant"] for r in rows] == ["float", "w8a16", "w8a8"]
    assert all(r["tokens"] == 6 * 63 for r in rows)
    # The float variant is the oracle-checked function above; 8-bit weights and int8
    # activations on a random model move its perplexity by well under 5%.
    base = rows[0]["perplexity"]
    assert 1 < base < 1000
    for r in rows[1:]:
        assert r["perplexity"] == pytest.approx(base, rel=0.05)
        assert r["perplexity"] != base  # the quantized variants really ran
    assert "w8a8" in capsys.readouterr().out
    # An unknown variant is refused with the op's error through argparse, exit status 2.
    assert "int4" in _refused(capsys, ["--model", str(folder), "--text", str(text),
                                       "--variants", "int4"])  # errors go to stderr
    assert "[mlx_w8a8.eval] cannot read" in _refused(capsys, ["--model", str(tmp_path / "none"),
                                                              "--text", str(text)])


def test_cli_on_a_w8a8_checkpoint(tmp_path, capsys):
    pytest.importorskip("mlx_lm", reason="mlx-lm is part of the test extra")
    import mlx_w8a8 as w8

    model, config = tiny_lm.model("llama", rng=np.random.default_rng(1))
    folder = tiny_lm.folder(tmp_path / "m", model, config)
    w8.save(w8.quantize(model), tmp_path / "q", config, source=folder)
    text = tiny_lm.text_file(tmp_path / "t.txt", 512)
    rc = main(["--model", str(tmp_path / "q"), "--text", str(text), "--seq-len", "64",
               "--json", str(tmp_path / "r.jsonl")])
    assert rc == 0
    row = json.loads((tmp_path / "r.jsonl").read_text())
    assert row["variant"] == "w8a8" and row["kernel"] == "exact"
    assert "needs the float model folder" in _refused(
        capsys, ["--model", str(tmp_path / "q"), "--text", str(text), "--variants", "float"])


def _refused(capsys, argv) -> str:
    """stderr of a command line argparse refuses (exit status 2)."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "usage:" in err
    return err


def test_cli_checks_every_argument_before_loading_a_model(tmp_path, capsys, monkeypatch):
    # --variants float,bogus used to evaluate the float variant (tens of seconds on a
    # real model) before refusing bogus.
    pytest.importorskip("mlx_lm", reason="mlx-lm is part of the test extra")
    import mlx_lm.utils

    folder = tiny_lm.folder(tmp_path / "m", *tiny_lm.model("llama"))
    text = tiny_lm.text_file(tmp_path / "t.txt", 512)
    (tmp_path / "empty.txt").write_text("")
    loads = []
    monkeypatch.setattr(mlx_lm.utils, "load_model", lambda *a, **k: loads.append(a) or 1 / 0)
    base = ["--model", str(folder), "--text", str(text)]
    for extra, want in (
        (["--variants", "float,bogus"], "--variants takes a comma-separated list among "
                                        "float,w8a16,w8a8,w8a8_act_groups, got 'float,bogus'"),
        (["--variants", ","], "--variants takes"),
        (["--seq-len", "1"], "--seq-len must be >= 2, got 1"),
        (["--batch-size", "0"], "--batch-size must be >= 1, got 0"),
        (["--samples", "0"], "--samples must be >= 1, got 0"),
        (["--variants", "w8a8", "--kernel", "nope"], "--kernel 'nope'"),
        (["--json", str(tmp_path / "no" / "r.jsonl")], "--json FILE: the folder"),
    ):
        assert want in _refused(capsys, base + extra), extra
    for bad_text in (tmp_path / "none.txt", tmp_path / "empty.txt"):
        err = _refused(capsys, ["--model", str(folder), "--text", str(bad_text)])
        assert "--text must be a non-empty text file" in err
    assert loads == []


def test_the_command_line_module_still_offers_the_library_names():
    # Code imports these from mlx_w8a8.eval; they are mlx_w8a8.evaluation's own objects.
    from mlx_w8a8 import evaluation
    from mlx_w8a8.eval import DTYPES, VARIANTS, load_variant, use_kernel
    from mlx_w8a8.eval import perplexity as from_eval

    assert (from_eval, load_variant, use_kernel) == (
        evaluation.perplexity, evaluation.load_variant, evaluation.use_kernel)
    assert (DTYPES, VARIANTS) == (evaluation.DTYPES, evaluation.VARIANTS)
