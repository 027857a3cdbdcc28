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
