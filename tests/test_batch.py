"""Tuning a batch of problems (``tune`` CLI, ``tune_model``): progress, accounting."""

import mlx.nn as nn
import pytest

import mlx_w8a8
from mlx_w8a8.kernels.registry import Problem
from mlx_w8a8.tuning import batch, table
from mlx_w8a8.tuning.tuner import TuneConfig, Tuner

FAST = TuneConfig(pairs=2, warmup=0)


def tuner_at(path):
    return Tuner(table_path=str(path), use_cache=False, use_shipped=False, online=False, config=FAST)


def entries_of(path):
    return table.matching_entries(table.read(str(path)), table.device_key(), str(path))


def test_tune_model_measures_each_distinct_shape_once_per_bucket(tmp_path):
    # two layers share 32x64; the 32x64 with a bias is its own problem
    model = nn.Sequential(nn.Linear(64, 32, bias=False), nn.Linear(64, 32, bias=False),
                          nn.Linear(64, 32, bias=True), nn.Linear(32, 16, bias=False))
    path = tmp_path / "t.json"
    results = mlx_w8a8.tune_model(model, m=[2, 1], dtype="float32", group_size=32,
                                  progress=False, tuner=tuner_at(path))
    got = sorted((p.m, p.n, p.k, p.has_bias) for p, _ in results)
    assert got == sorted((m, n, k, b) for m in (1, 2)
                         for n, k, b in ((32, 64, False), (32, 64, True), (16, 32, False)))
    # (whether the bias variant gets an entry of its own depends on the table's key)
    assert all(o.source in ("measured", "table") and o.entry is not None for _, o in results)
    assert {(e["m_bucket"], e["n"], e["k"]) for e in entries_of(path)} == {
        (m, n, k) for m in (1, 2) for n, k in ((32, 64), (16, 32))}
    # a second call finds them in the table
    again = mlx_w8a8.tune_model(model, m=[1, 2], dtype="float32", group_size=32,
                                progress=False, tuner=tuner_at(path))
    assert all(o.source == "table" for _, o in again)
    with pytest.raises(ValueError, match="no linear layers"):
        mlx_w8a8.tune_model(nn.Sequential(nn.ReLU()), m=[1], tuner=tuner_at(path))
    with pytest.raises(ValueError, match="m must be positive"):
        mlx_w8a8.tune_model(model, m=[0], tuner=tuner_at(path))


def test_progress_is_a_bar_on_a_terminal_and_plain_lines_elsewhere(tmp_path, monkeypatch, capsys):
    path = tmp_path / "t.json"
    problems = [Problem("linear", m, 32, 64, "float32", "per_channel", 32, False) for m in (1, 2)]
    work = batch.Batch(tuner_at(path), problems, progress=True)
    work.run()  # pytest's captured stderr is not a terminal
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = [line for line in err.splitlines() if line.startswith("tune: ")]
    assert [line.split(" (")[0] for line in lines] == ["tune: 1/2 1x32x64", "tune: 2/2 2x32x64"]
    assert "% of the estimated work done" in lines[1] and "elapsed)" in lines[1]
    # on a terminal: tqdm's bar (its redrawn line); without progress: nothing
    tqdm = pytest.importorskip("tqdm")
    monkeypatch.setattr(batch.sys.stderr, "isatty", lambda: True, raising=False)
    bar = batch.Batch(tuner_at(path), problems, progress=True)._bar(1.0)
    assert isinstance(bar, tqdm.tqdm)
    bar.close()
    assert batch.Batch(tuner_at(path), problems, progress=False)._bar(1.0) is None
    assert not batch._terminal(object())  # a stream without isatty is not a terminal


def test_pending_skips_measured_and_saved_counts_what_reached_the_file(tmp_path):
    path = tmp_path / "t.json"
    problems = [Problem("linear", m, 32, 64, "float32", "per_channel", 32, False) for m in (1, 2)]
    first = batch.Batch(tuner_at(path), problems[:1], progress=False)
    first.run()
    assert first.saved() == 1
    both = batch.Batch(tuner_at(path), problems, progress=True)
    assert both.pending() == problems[1:]
    both.run()  # with the bar on (stderr)
    assert [o.source for _, o in both.results] == ["table", "measured"] and both.saved() == 1
    # another tuner replaced that entry since: this batch's measurement is no longer there
    (entry,) = both.measured()
    table.write_entries(str(path), table.device_key(), [dict(entry, measured_at="later")])
    assert both.saved() == 0
    # measured but not written (a corrupt table is never overwritten): nothing saved
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.warns(table.TuningTableWarning):
        lost = batch.Batch(tuner_at(bad), problems[:1], progress=False)
        lost.run()
    assert len(lost.measured()) == 1 and lost.saved() == 0


def test_cost_grows_with_the_weight_and_past_the_knee_with_m():
    p = lambda m, n=64: Problem("linear", m, n, 64, "float32", "per_channel", 32)  # noqa: E731
    assert batch.cost(p(1, 128), "cpu") == 2 * batch.cost(p(1), "cpu")
    assert batch.cost(p(4), "cpu") == 4 * batch.cost(p(1), "cpu")
    assert batch.cost(p(4), "cuda") == batch.cost(p(1), "cuda")  # weight-bound below 64
    assert batch.cost(p(256), "cuda") == 4 * batch.cost(p(64), "cuda")
