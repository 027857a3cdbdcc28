"""Perplexity: the function against closed forms and a float64 oracle, and the CLI."""

import json

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

import tiny_lm
from mlx_w8a8.eval import main
from mlx_w8a8.evaluation import perplexity


class Fixed(nn.Module):
    """Logits that do not depend on the model: uniform, or a sure guess of ``t + 1``."""

    def __init__(self, vocab, sure=None):
        super().__init__()
        self.vocab, self.sure = vocab, sure

    def __call__(self, t):
        if self.sure is None:
            return mx.zeros((*t.shape, self.vocab))
        hit = mx.arange(self.vocab) == ((t + 1) % self.vocab)[..., None]
        return self.sure * hit.astype(mx.float32)


def test_closed_forms(rng):
    data = [mx.array(rng.integers(0, 50, (3, 9))), mx.array(rng.integers(0, 50, (1, 9)))]
    ppl, count = perplexity(Fixed(50), data)
    assert count == 4 * 8  # each row predicts its tokens 1..T-1
    assert ppl == pytest.approx(50.0, rel=1e-5)  # uniform over 50 tokens
    counting = [mx.array(np.arange(i, i + 12)[None] % 50) for i in range(3)]  # t+1 follows t
    ppl, _ = perplexity(Fixed(50, sure=30.0), counting)
    assert ppl == pytest.approx(1.0, abs=1e-9 + 50 * np.exp(-30.0))
    with pytest.raises(ValueError, match=r"perplexity\] data is empty"):
        perplexity(Fixed(50), [])


@pytest.mark.parametrize("bad", [
    mx.zeros((3, 9)),  # float tokens
    mx.zeros((9,), mx.int32),  # one window without its batch axis
    mx.zeros((3, 1), mx.int32),  # a one-token window predicts nothing
    [[1, 2, 3]],  # a list, not an array
])
def test_refuses_batches_that_are_not_token_windows(bad):
    with pytest.raises(ValueError, match=r"perplexity\] each batch must be a \[B, T\] integer"):
        perplexity(Fixed(50), [bad])


def test_matches_a_float64_oracle_on_a_tiny_llama(rng):
    pytest.importorskip("mlx_lm", reason="mlx-lm is part of the test extra")
    model, _ = tiny_lm.model("llama", rng=rng)
    data = [mx.array(rng.integers(0, 256, (2, 11))), mx.array(rng.integers(0, 256, (1, 11)))]
    nll, count = 0.0, 0
    for b in data:
        logits = np.array(model(b[:, :-1])).astype(np.float64)
        logp = logits - logits.max(-1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
        target = np.array(b[:, 1:])
        nll -= np.take_along_axis(logp, target[..., None], -1).sum()
        count += target.size
    ppl, n = perplexity(model, data)
    assert n == count
    assert ppl == pytest.approx(np.exp(nll / count), rel=1e-5)


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
                                        "float,w8a16,w8a8, got 'float,bogus'"),
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


def test_the_exact_kernel_means_each_layers_exact_math_4bit_included(rng):
    # A 4-bit layer (MLX's grouped4) refuses the 8-bit exact kernel; eval's default
    # (the exact math) must give it exact_w4a8, and the 8-bit layers exact.
    import mlx.nn as nn

    import mlx_w8a8 as w8
    from mlx_w8a8 import evaluation as ev
    from mlx_w8a8.nn import Linear

    four, eight = nn.Linear(64, 64), nn.Linear(64, 32)
    model = nn.Sequential(four, eight)
    nn.quantize(model, group_size=64, bits=4, class_predicate=lambda p, m: p == "layers.0")
    w8.quantize(model)
    assert ev.use_kernel(model, ev.EXACT) == 2
    layers = [m for _, m in model.named_modules() if isinstance(m, Linear)]
    assert sorted(m.kernel for m in layers) == ["exact", "exact_w4a8"]
    x = mx.array(rng.standard_normal((3, 64)).astype("float32"))
    assert model(x).shape == (3, 32)  # both layers run their forced kernels


def test_the_command_line_module_still_offers_the_library_names():
    # Code imports these from mlx_w8a8.eval; they are mlx_w8a8.evaluation's own objects.
    from mlx_w8a8 import evaluation
    from mlx_w8a8.eval import DTYPES, VARIANTS, load_variant, use_kernel
    from mlx_w8a8.eval import perplexity as from_eval

    assert (from_eval, load_variant, use_kernel) == (
        evaluation.perplexity, evaluation.load_variant, evaluation.use_kernel)
    assert (DTYPES, VARIANTS) == (evaluation.DTYPES, evaluation.VARIANTS)
