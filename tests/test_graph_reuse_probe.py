"""bench/graph_reuse_probe.py on a tiny model on this CPU: a model whose outputs stay the
same passes, and one whose output at a length changes once other lengths ran is caught."""

import io
import os
import sys
from contextlib import redirect_stdout

import mlx.nn as nn
import pytest

pytest.importorskip("mlx_lm.models.llama", reason="mlx-lm is part of the test extra")
import tiny_lm  # noqa: E402

from mlx_w8a8 import modelbench  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
import graph_reuse_probe  # noqa: E402


def run(folder, *extra):
    out = io.StringIO()
    with redirect_stdout(out):
        code = graph_reuse_probe.main(["--model", str(folder), "--layers", "1", "--weights",
                                  "4bit-gs64", "--lengths", "3,9", "--rounds", "2", *extra])
    return code, out.getvalue()


def test_outputs_that_stay_the_same_pass(tmp_path):
    code, text = run(tiny_lm.config_folder(tmp_path / "tiny-llama"))
    assert code == 0, text
    assert text.count("equal to the first") == 4 and "DIFFERS" not in text
    assert "0 of 4 later outputs differ" in text and "grouped4 (4-bit)" in text


class Drifting(nn.Module):
    """The model, its output moved once it has run `after` times: what a call that ran
    the wrong kernel, or none, on a reused graph would look like."""

    def __init__(self, model, after):
        super().__init__()
        self.model, self.after, self.calls = model, after, 0

    def __call__(self, x):
        self.calls += 1
        out = self.model(x)
        return out + 1e-3 if self.calls > self.after and x.shape[1] == 9 else out


def test_an_output_that_changes_after_other_lengths_is_caught(tmp_path, monkeypatch):
    make = modelbench.make_variants

    def drifting(*args, **kw):
        variants, config, label = make(*args, **kw)
        variants["mlx_w8a8"] = Drifting(variants["mlx_w8a8"], after=2)  # the first pass: 2
        return variants, config, label

    monkeypatch.setattr(modelbench, "make_variants", drifting)
    code, text = run(tiny_lm.config_folder(tmp_path / "tiny-llama"))
    assert code == 1
    assert text.count("DIFFERS from the first") == 2 and "2 of 4 later outputs differ" in text
