"""``python -m mlx_w8a8.check``: the report and the pass/fail verdict.

The check must pass on this machine (every available candidate against the numpy
oracle) and must fail, with a non-zero exit status, when a candidate is wrong: each
planted candidate below breaks one property the check is meant to see.
"""

from __future__ import annotations

import subprocess
import sys

import mlx.core as mx
import pytest

from mlx_w8a8 import check, kernels
from mlx_w8a8.kernels import reference, registry


def test_check_passes_here_and_reports_the_machine(capsys):
    assert check.main([]) == 0
    out = capsys.readouterr().out
    assert f"mlx {mx.__version__}" in out and "default device" in out
    assert "capability metal:" in out and "capability nax:" in out
    for op in ("quantize_activation", "int8_matmul", "linear"):
        assert f"ok    {op}" in out
    assert "FAIL" not in out and " 0 failed" in out


def test_module_entry_point_exits_zero():
    proc = subprocess.run([sys.executable, "-m", "mlx_w8a8.check", "--seed", "3"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "candidates checked, 0 failed" in proc.stdout


def test_import_failures_are_reported(monkeypatch):
    monkeypatch.setitem(kernels.UNAVAILABLE, "cuda", "ImportError: libcuda.so.1 missing")
    lines = check.environment()
    assert "kernels cuda: FAILED to import: ImportError: libcuda.so.1 missing" in lines


def test_cuda_capabilities_say_why_tma_is_off(monkeypatch):
    # On a Hopper GPU without a driver that encodes tensor maps, the TMA kernels are off
    # and the report says why; here (no GPU) both CUDA capabilities are off.
    from mlx_w8a8.kernels import cuda, tensormap

    lines = check.environment()
    assert "capability cuda_tma: off (no CUDA GPU is MLX's default device)" in lines
    monkeypatch.setattr(cuda, "cuda_available", lambda: True)
    monkeypatch.setattr(cuda, "is_sm90", lambda: True)
    monkeypatch.setattr(tensormap, "unavailable", lambda: "OSError: no libcuda.so.1")
    lines = check.environment()
    assert "capability cuda_sm90: on (compute capability 9.x)" in lines
    assert "capability cuda_tma: off (OSError: no libcuda.so.1)" in lines


def off_by_one(a, b):
    c = reference.int8_matmul(a, b)
    return c + (mx.arange(c.shape[1]) == c.shape[1] - 1).astype(mx.int32)  # last column wrong


def dropped_k_tail(x, weight, bias):
    """W8A8 on all but the last 32 values of K: within bf16 noise for large K, not here."""
    k = x.shape[1] - 32
    keep = x * (mx.arange(x.shape[1]) < k).astype(x.dtype)
    exact = next(c for c in registry.all_candidates()
                 if c.op == "linear" and c.backend == "any" and c.name != "mlx_qmm")
    return exact.run(keep, weight, bias)


def raises(*args):
    raise RuntimeError("kernel launch failed")


@pytest.mark.parametrize("op, run, supports, message", [
    ("int8_matmul", off_by_one, lambda p: p.op == "int8_matmul", "differ"),
    ("linear", dropped_k_tail, lambda p: p.op == "linear", "got"),
    ("quantize_activation", raises, lambda p: True, "raised RuntimeError: kernel launch failed"),
])
def test_a_wrong_candidate_fails_the_check(op, run, supports, message):
    registry.register(registry.Candidate(name="planted_bug", backend="any", op=op, run=run, supports=supports))
    lines = []
    try:
        failures = check.run_checks(out=lines.append)
    finally:
        registry.unregister(op, "planted_bug")
    assert failures == 1
    text = "\n".join(lines)
    assert f"FAIL  {op:20} planted_bug" in text and message in text
    assert sum(line.startswith("  FAIL") for line in lines) == 1  # the real candidates still pass


def test_check_runs_every_metal_candidate_in_the_emulator():
    """With Metal and NAX forced on and the emulator as executor, the check runs every
    Metal candidate (all NAX tiles included) against the oracle and all pass."""
    from metal_emu import harness
    from mlx_w8a8.kernels import metal

    previous = metal.set_executor(harness.executor)
    lines = []
    try:
        with metal.override(metal=True, nax=True):
            failures = check.run_checks(out=lines.append)
    finally:
        metal.set_executor(previous)
    text = "\n".join(lines)
    assert failures == 0, text
    metal_names = {c.name for c in registry.all_candidates() if c.backend == "metal"}
    for name in metal_names:
        assert f" {name} " in text, f"{name} was not checked:\n{text}"


def test_report_on_this_cpu_becomes_table_entries(tmp_path):
    """``--report`` works on the CPU with the candidates this machine has; the report
    turns into table entries (only exact candidates chosen) through ``tune --from-report``."""
    import json

    from mlx_w8a8 import tune
    from mlx_w8a8.tuning import report, table

    path = tmp_path / "report.json"
    assert check.main(["--report", str(path), "--report-shapes", "1x64x128,40x96x128", "--report-pairs", "3"]) == 0
    doc = json.loads(path.read_text())
    assert doc["report_schema"] == report.REPORT_SCHEMA and doc["section_key"] == table.device_key()
    assert doc["environment"]["mlx"] == mx.__version__ and "nax" in doc["environment"]["capabilities"]
    here = {c.name for c in registry.candidates(registry.Problem("linear", 40, 96, 128, "bfloat16", "per_channel", 64))}
    assert set(doc["exactness"]["linear"]) >= here and all(v["ok"] for v in doc["exactness"]["linear"].values())
    assert [(r["m"], r["n"], r["k"]) for r in doc["timings"]] == [(1, 64, 128), (40, 96, 128)]
    for row in doc["timings"]:
        assert set(row["candidates"]) == here and row["reference"] == "mlx_qmm"
        assert all(c["median_ns"] > 0 for c in row["candidates"].values())

    target = tmp_path / "table.json"
    assert tune.main(["--from-report", str(path), "--table", str(target)]) == 0
    entries = table.read(str(target))["sections"][0]["entries"]
    assert sorted(e["m_bucket"] for e in entries) == [1, 64] and all(e["choice"] in here for e in entries)


def test_report_entries_never_choose_an_inexact_candidate():
    from mlx_w8a8.tuning import report

    doc = {"report_schema": 1, "section_key": {"backend": "metal", "device": {"architecture": "applegpu_g17s"},
                                               "mlx_version": "0", "package_version": "0"},
           "exactness": {"linear": {"mlx_qmm": {"ok": True}, "fast_but_wrong": {"ok": False},
                                    "fast_and_exact": {"ok": True}}},
           "timings": [{"m": 128, "n": 64, "k": 64, "dtype": "bfloat16", "weight_format": "per_channel",
                        "group_size": 64, "reference": "mlx_qmm",
                        "candidates": {"mlx_qmm": {"status": "ok", "median_ns": 100.0, "digest": "a"},
                                       "fast_but_wrong": {"status": "ok", "median_ns": 10.0, "digest": "b"},
                                       "fast_and_exact": {"status": "ok", "median_ns": 50.0, "digest": "c"}}}]}
    key, (entry,) = report.entries_from_report(doc)
    assert key["backend"] == "metal" and entry["choice"] == "fast_and_exact" and entry["speedup"] == 2.0
    assert entry["candidates"]["fast_but_wrong"]["status"] == "inexact"
    doc["exactness"]["linear"]["fast_and_exact"]["ok"] = False
    assert report.entries_from_report(doc)[1][0]["choice"] == "mlx_qmm"
    with pytest.raises(ValueError, match=r"\[mlx_w8a8.tuning.report\].*report_schema"):
        report.entries_from_report({"report_schema": 7})
