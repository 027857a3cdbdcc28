"""The ``python -m mlx_w8a8.tune`` command line."""

import io
import os
import subprocess
import sys

import pytest

from mlx_w8a8 import tune
from mlx_w8a8.tuning import table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--pairs", "3", "--warmup", "1", "--dtype", "float32", "--group-size", "32", "--no-progress"]


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv(table.ENV_CACHE_DIR, str(tmp_path / "cache"))
    monkeypatch.delenv(table.ENV_TABLE, raising=False)
    table.reset_reports()


def run(argv):
    out = io.StringIO()
    code = tune.main(argv, out=out)
    return code, out.getvalue()


def test_tunes_writes_then_reuses_the_table(tmp_path):
    path = str(tmp_path / "t.json")
    code, text = run(["--shapes", "2x32x64", "1x64x32", "--table", path] + TINY)
    assert code == 0, text
    assert "measured" in text and "mlx_qmm" in text and "choice" in text
    doc = table.read(path)
    entries = table.matching_entries(doc, table.device_key(), path)
    assert sorted((e["m"], e["n"], e["k"]) for e in entries) == [(1, 64, 32), (2, 32, 64)]
    assert all(e["samples"] == 3 and e["gate"]["atol"] == 0.125 for e in entries)
    before = open(path).read()
    code, text = run(["--shapes", "2x32x64", "1x64x32", "--table", path] + TINY)
    assert code == 0 and text.count("cached") == 2 and "measured" not in text
    assert open(path).read() == before  # nothing re-measured or rewritten
    code, text = run(["--shapes", "2x32x64", "--table", path, "--force"] + TINY)
    assert code == 0 and "measured" in text


def test_default_table_is_the_cache_table(tmp_path):
    code, _ = run(["--shapes", "1x32x64"] + TINY)
    assert code == 0 and table.read(table.cache_table_path()) is not None


def test_gate_and_selection_options_reach_the_table(tmp_path):
    path = str(tmp_path / "t.json")
    code, _ = run(["--shapes", "1x32x64", "--table", path, "--atol", "0.5", "--rtol", "0.02",
                   "--min-improvement", "1234"] + TINY)
    e = table.matching_entries(table.read(path), table.device_key(), path)[0]
    assert code == 0 and e["gate"]["atol"] == 0.5 and e["gate"]["rtol"] == 0.02
    assert e["min_improvement_bps"] == 1234


def test_show_and_export(tmp_path):
    path = str(tmp_path / "t.json")
    other = dict(table.device_key(), backend="cuda", device={"device_name": "NVIDIA H200"})
    table.write_entries(path, other, [{"op": "linear", "m_bucket": 1, "n": 8, "k": 8,
                                       "dtype": "bfloat16", "weight_format": "per_channel",
                                       "group_size": 64, "choice": "cuda_gemv"}])
    with pytest.warns(table.TuningTableWarning, match="measured on cuda NVIDIA H200"):
        run(["--shapes", "1x32x64", "--table", path] + TINY)  # the H200 section is kept
    code, text = run(["--show", path])
    assert code == 0
    assert "this machine" in text and "NVIDIA H200" in text and "unused here" in text
    assert "cuda_gemv" in text and "M" in text and "speedup" in text
    dest = str(tmp_path / "ship" / "tuning.json")
    code, text = run(["--table", path, "--export", dest])
    assert code == 0 and "exported 1 entries" in text
    doc = table.read(dest)
    assert len(doc["sections"]) == 1 and doc["sections"][0]["backend"] == table.backend()


def test_errors_are_reported_not_raised(tmp_path):
    assert run(["--shapes", "1x2"])[0] == 2
    assert run(["--shapes", "mlp", "--m", "0"])[0] == 2
    assert run(["--shapes", "1x8x8", "--min-improvement", "-5"])[0] == 2
    assert run([])[0] == 2
    assert run(["--show", str(tmp_path / "missing.json")])[0] == 1
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    assert run(["--show", str(bad)])[0] == 1
    # tuning into a corrupt table: measured but not written over it
    with pytest.warns(table.TuningTableWarning):
        code, _ = run(["--shapes", "1x32x64", "--table", str(bad)] + TINY)
    assert bad.read_text() == "{"
    # a K the group size does not divide is skipped with a note
    code, text = run(["--shapes", "1x32x48", "--table", str(tmp_path / "t.json")] + TINY)
    assert code == 1 and "does not divide K" in text


def test_two_processes_tuning_different_shapes_keep_both(tmp_path):
    path = str(tmp_path / "shared.json")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "mlx_w8a8.tune", "--table", path] + TINY
    procs = [
        subprocess.Popen(cmd + ["--shapes", shape], cwd=ROOT, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for shape in ("2x32x64,4x32x64", "2x64x32,4x64x32")
    ]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, out + err
    entries = table.matching_entries(table.read(path), table.device_key(), path)
    assert sorted((e["m"], e["n"], e["k"]) for e in entries) == [
        (2, 32, 64), (2, 64, 32), (4, 32, 64), (4, 64, 32)]


def test_module_entry_point_runs(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-m", "mlx_w8a8.tune", "--help"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "--shapes" in r.stdout and "Llama-3-8B" in r.stdout
