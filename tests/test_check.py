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
    from mlx_w8a8.kernels import tensormap
    from mlx_w8a8.kernels.cuda import launch

    lines = check.environment()
    assert "capability cuda_tma: off (no CUDA GPU is MLX's default device)" in lines
    monkeypatch.setattr(launch, "cuda_available", lambda: True)
    monkeypatch.setattr(launch, "is_sm90", lambda: True)
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


# MLX's 4-bit format (grouped4): the 4-bit candidates against the exact W4A8 math.
GROUPED4_CASES = [c for c in check.LINEAR_CASES if c[4] == "grouped4"]


def test_the_4bit_candidates_are_checked_against_the_w4a8_math():
    verdicts = {}
    lines = []
    assert check.run_checks(seed=5, out=lines.append, verdicts=verdicts) == 0, "\n".join(lines)
    assert len(GROUPED4_CASES) >= 3
    problem = registry.Problem("linear", 1, 40, 96, "float32", "grouped4", 32, True)
    act4 = [c for c in check.ACT_GROUP_CASES if c[4] == "grouped4"]
    for name, extra in ((registry.exact_name(problem), 0), (registry.fallback_name(problem), len(act4))):
        assert name in ("exact_w4a8", "mlx_qmm4")
        v = verdicts["linear"][name]  # W8A16 runs the activation-group cases too
        assert v["ok"] and v["shapes"] == len(GROUPED4_CASES) + extra, v
    # the 8-bit ones are not run on 4-bit codes
    assert verdicts["linear"]["exact"]["shapes"] == len(check.LINEAR_CASES) - len(GROUPED4_CASES)
    # activation groups: their exact kernel, on both group-wise formats, and no other
    v = verdicts["linear"]["exact_act_groups"]
    assert v["ok"] and v["shapes"] == len(check.ACT_GROUP_CASES) == 2, v


def test_act_group_oracle_is_the_per_group_dequantized_product(rng):
    """The check's activation-group math equals the float64 product of the per-group
    dequantized activations and the dequantized weights, and differs from the
    per-token math (so a kernel computing the wrong one fails the check)."""
    import numpy as np

    m, n, k, gs = 4, 16, 192, 64
    x = check.activations(rng, m, k)
    x[:, 3] *= 200.0
    for fmt in ("grouped", "grouped4"):
        w = check.weight_of(rng, n, k, fmt, gs)
        y, bound = check.linear_act_groups(x, w, None)
        q, t = check.quantize_rows(x.reshape(m * k // gs, gs))
        xd = (q.astype(np.float64) * t.astype(np.float64)).reshape(m, k)
        codes = np.array(w.codes()).astype(np.float64)
        wd = (np.repeat(check.host(w.scales).astype(np.float64), gs, axis=1) * codes
              + np.repeat(check.host(w.biases).astype(np.float64), gs, axis=1))
        np.testing.assert_allclose(y, xd @ wd.T, rtol=1e-12, atol=1e-9)
        token, _ = (check.linear_w8a8 if fmt == "grouped" else check.linear_w4a8)(x, w, None)
        finite = np.isfinite(y)
        assert (np.abs(token - y)[finite] > 10 * bound[finite]).any()


def test_w4a8_oracle_matches_dequantized_float64_products(rng):
    """The oracle's per-group integer form equals the float64 product of the
    dequantized activations and weights (same math, summed another way)."""
    import numpy as np

    m, n, k, gs = 5, 24, 192, 64
    x = check.activations(rng, m, k)
    w = check.weight_of(rng, n, k, "grouped4", gs)
    bias = rng.standard_normal(n).astype(np.float32)
    y, bound = check.linear_w4a8(x, w, bias)
    q, t = check.quantize_rows(x)
    codes = np.array(w.codes()).astype(np.float64)
    assert codes.min() >= 0 and codes.max() <= 15 and codes.max() > 7  # unsigned nibbles
    s = np.repeat(check.host(w.scales).astype(np.float64), gs, axis=1)
    b = np.repeat(check.host(w.biases).astype(np.float64), gs, axis=1)
    want = (q.astype(np.float64) * t.astype(np.float64)) @ (s * codes + b).T + bias
    np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-9)
    assert np.all(y[1] == bias)  # the all-zero row: scale 0, only the bias
    assert np.all(bound >= 0) and bound.max() > 0


def w4a16_claiming_w4a8(x, weight, bias):
    """``mx.quantized_matmul`` on 4-bit codes with the float activations: the W4A16
    product, off the W4A8 math by the activation rounding."""
    return reference.qmm4_linear(x, weight, bias)


def w4a8_signed_codes(x, weight, bias):
    """The W4A8 math with the 4-bit codes read as signed (q - 8) and no offset fix."""
    from mlx_w8a8.weight import QuantizedWeight

    shifted = QuantizedWeight(weight.q, weight.scales, weight.biases + 8 * weight.scales,
                              weight.group_size, per_channel=False, bits=4)
    return reference.w4a8_linear(x, shifted, bias)


def w4a8_dropped_group(x, weight, bias):
    """W4A8 on all but the last group of K."""
    k = x.shape[1] - weight.group_size
    keep = x * (mx.arange(x.shape[1]) < k).astype(x.dtype)
    return reference.w4a8_linear(keep, weight, bias)


@pytest.mark.parametrize("run", [w4a16_claiming_w4a8, w4a8_signed_codes, w4a8_dropped_group])
def test_a_wrong_4bit_candidate_fails_the_check(run):
    registry.register(registry.Candidate(name="planted_4bit", backend="any", op="linear", run=run,
                                         supports=lambda p: p.weight_format == "grouped4"))
    lines = []
    verdicts = {}
    try:
        failures = check.run_checks(out=lines.append, verdicts=verdicts)
    finally:
        registry.unregister("linear", "planted_4bit")
    assert failures == 1, "\n".join(lines)
    assert not verdicts["linear"]["planted_4bit"]["ok"]
    assert verdicts["linear"]["planted_4bit"]["shapes"] == len(GROUPED4_CASES)
    assert all(v["ok"] for name, v in verdicts["linear"].items() if name != "planted_4bit")


def test_report_times_the_4bit_format_and_becomes_table_entries(tmp_path):
    import json

    from mlx_w8a8 import tune
    from mlx_w8a8.tuning import table

    path = tmp_path / "report.json"
    assert check.main(["--report", str(path), "--report-shapes", "3x64x128", "--report-pairs", "3",
                       "--report-format", "both"]) == 0
    doc = json.loads(path.read_text())
    rows = doc["timings"]
    assert [(r["weight_format"], r["reference"]) for r in rows] == [
        ("per_channel", "mlx_qmm"), ("grouped4", "mlx_qmm4")]
    four = registry.Problem("linear", 3, 64, 128, "bfloat16", "grouped4", check.REPORT_GROUP_SIZE)
    assert set(rows[1]["candidates"]) == {c.name for c in registry.candidates(four)} >= {
        "mlx_qmm4", "exact_w4a8"}
    assert all(c["median_ns"] > 0 for c in rows[1]["candidates"].values())
    target = tmp_path / "table.json"
    assert tune.main(["--from-report", str(path), "--table", str(target)]) == 0
    entries = table.read(str(target))["sections"][0]["entries"]
    assert sorted(e["weight_format"] for e in entries) == ["grouped4", "per_channel"]


def test_report_times_activation_groups_and_becomes_their_entries(tmp_path):
    import json

    from mlx_w8a8 import tune
    from mlx_w8a8.tuning import table

    path = tmp_path / "report.json"
    assert check.main(["--report", str(path), "--report-shapes", "3x64x128", "--report-pairs", "3",
                       "--report-act-groups"]) == 0
    rows = json.loads(path.read_text())["timings"]
    assert [(r["weight_format"], r.get("act_scales", "token")) for r in rows] == [
        ("per_channel", "token"), ("grouped", "group"), ("grouped4", "group")]
    assert set(rows[1]["candidates"]) >= {"mlx_qmm", "exact_act_groups"}
    assert "exact" not in rows[1]["candidates"]  # a per-token kernel is never timed for them
    target = tmp_path / "table.json"
    assert tune.main(["--from-report", str(path), "--table", str(target)]) == 0
    entries = table.read(str(target))["sections"][0]["entries"]
    assert sorted((e["weight_format"], e.get("act_scales", "token")) for e in entries) == [
        ("grouped", "group"), ("grouped4", "group"), ("per_channel", "token")]
