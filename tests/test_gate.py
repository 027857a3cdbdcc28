"""The numerical gate: challengers must match the reference candidate."""

import logging
import math

import mlx.core as mx
import numpy as np
import pytest

from mlx_w8a8.kernels import registry
from mlx_w8a8.kernels.registry import Candidate, Problem
from mlx_w8a8.tuning import gate

LINEAR = Problem("linear", 3, 48, 128, "float32", "per_channel", 64)


def _cand(name, run, op="linear"):
    return Candidate(name=name, backend="any", op=op, run=run, digest=name)


def test_compare_accepts_rounding_and_rejects_drift():
    # The seed's own case: a bf16 ulp-level difference passes, 0.5 of drift does not.
    ref = mx.array([1.0, -20.0, 0.0])
    close = mx.array([1.125, -20.125, 0.125])
    drift = mx.array([1.5, -20.0, 0.0])
    assert gate.compare(ref, close)[0]
    ok, worst, detail = gate.compare(ref, drift)
    assert not ok and worst == pytest.approx(0.5) and "element (0,)" in detail


def test_compare_relative_term_scales_with_magnitude():
    # At |r| = 100, rtol 0.01 allows 1.0; at |r| = 1 only atol (0.125) applies.
    ref = mx.array([100.0, 1.0])
    assert gate.compare(ref, mx.array([100.75, 1.0]))[0]
    assert not gate.compare(ref, mx.array([101.5, 1.0]))[0]
    assert not gate.compare(ref, mx.array([100.0, 1.25]))[0]
    # configurable: a looser atol accepts what the default rejects
    assert gate.compare(ref, mx.array([100.0, 1.25]), atol=0.5)[0]


def test_compare_is_in_bfloat16_terms():
    # 1.0 and 1.003 are the same bfloat16 number: with atol = rtol = 0 they still match,
    # while 1.0 vs 1.01 (a different bf16 value) does not.
    ref = mx.array([1.0], dtype=mx.float32)
    assert gate.compare(ref, mx.array([1.003]), atol=0.0, rtol=0.0)[0]
    assert not gate.compare(ref, mx.array([1.01]), atol=0.0, rtol=0.0)[0]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_output_is_rejected(bad):
    ok, worst, _ = gate.compare(mx.array([1.0, 2.0]), mx.array([1.0, bad]))
    assert not ok and worst == math.inf


def test_shape_mismatch_is_rejected():
    assert not gate.compare(mx.zeros((2, 3)), mx.zeros((3, 2)))[0]


def test_exact_mode_requires_equality_of_every_part():
    q = mx.array([[1, -2]], dtype=mx.int8)
    s = mx.array([[0.5]])
    assert gate.compare((q, s, None), (q, s, None), exact=True)[0]
    ok, _, detail = gate.compare((q, s, None), (q, s + 1e-7, None), exact=True)
    assert not ok and "output 1" in detail
    # an int32 product off by one is not "close enough" for an exact op
    a = mx.array([[5]], dtype=mx.int32)
    assert not gate.compare(a, a + 1, exact=True)[0]
    assert not gate.compare(a, a.astype(mx.float32), exact=True)[0]  # dtype matters


def test_operands_pattern_first_then_seeded_random():
    ins = gate.operands(LINEAR, variants=3, seed=5)
    x0, w, b = ins[0]
    assert x0.shape == (3, 128) and x0.dtype == mx.float32 and b is None
    # the pattern is the seed's ramp of multiples of 1/16 in [-0.5, 0.5]
    vals = np.unique(np.array(x0))
    assert set(vals.tolist()) <= set((np.arange(-8, 9) / 16).tolist())
    assert w.shape == (48, 128) and w.per_channel
    again = gate.operands(LINEAR, variants=3, seed=5)
    assert np.array_equal(np.array(ins[2][0]), np.array(again[2][0]))  # deterministic
    assert not np.array_equal(np.array(ins[1][0]), np.array(ins[2][0]))  # rotated inputs differ
    grouped = Problem("linear", 2, 16, 64, "bfloat16", "grouped", 32, True)
    x, wg, bias = gate.operands(grouped, 2)[1]
    assert x.dtype == mx.bfloat16 and not wg.per_channel and wg.group_size == 32 and bias.shape == (16,)
    mm = Problem("int8_matmul", 2, 8, 32, "int8", "int8")
    a, bmat = gate.operands(mm, 2)[0]
    assert a.dtype == mx.int8 and bmat.shape == (8, 32)


def test_drifting_challenger_is_rejected_with_its_worst_element(caplog):
    qmm = registry.get("linear", "mlx_qmm")
    drift = _cand("drift", lambda x, w, b: qmm.run(x, w, b) + 0.5)
    fine = _cand("fine", lambda x, w, b: qmm.run(x, w, b))
    with caplog.at_level(logging.WARNING, logger="mlx_w8a8.tuning"):
        res = gate.run_gate(LINEAR, qmm, [qmm, drift, fine], gate.operands(LINEAR, 2))
    assert res["mlx_qmm"].passed and res["fine"].passed
    assert res["drift"].status == "rejected" and not res["drift"].passed
    assert res["drift"].worst_error == pytest.approx(0.5, abs=0.01)  # 0.5 after bf16 rounding
    assert "element" in res["drift"].detail and "0.125" in res["drift"].detail
    assert any("rejected numerically incompatible candidate 'drift'" in r.message for r in caplog.records)


def test_drift_only_on_random_input_is_still_caught():
    # A kernel right on the pattern but wrong on general data (e.g. a bad tail path)
    # must fail: that is why the gate also runs a seeded random input.
    qmm = registry.get("linear", "mlx_qmm")
    ins = gate.operands(LINEAR, 2)
    pattern_x = ins[0][0]

    def sneaky(x, w, b):
        y = qmm.run(x, w, b)
        return y if x is pattern_x else y * 1.5

    res = gate.run_gate(LINEAR, qmm, [_cand("sneaky", sneaky)], ins)
    assert res["sneaky"].status == "rejected" and "input 1 (random)" in res["sneaky"].detail


def test_crashing_challenger_is_unavailable_not_fatal():
    qmm = registry.get("linear", "mlx_qmm")

    def crash(x, w, b):
        raise RuntimeError("kernel failed to compile")

    res = gate.run_gate(LINEAR, qmm, [_cand("crash", crash)], gate.operands(LINEAR, 2))
    assert res["crash"].status == "unavailable" and "failed to compile" in res["crash"].detail


def test_failing_reference_raises():
    broken = _cand("mlx_qmm", lambda x, w, b: (_ for _ in ()).throw(RuntimeError("no")))
    with pytest.raises(RuntimeError, match="reference candidate 'mlx_qmm' failed"):
        gate.run_gate(LINEAR, broken, [], gate.operands(LINEAR, 2))


def test_exact_ops_gate_by_equality():
    prob = Problem("int8_matmul", 3, 8, 64, "int8", "int8")
    ref = registry.get("int8_matmul", "reference")
    off = _cand("off_by_one", lambda a, b: ref.run(a, b) + 1, op="int8_matmul")
    res = gate.run_gate(prob, ref, [off], gate.operands(prob, 2))
    assert res["off_by_one"].status == "rejected" and res["off_by_one"].worst_error == 1.0
    qa = Problem("quantize_activation", 3, 0, 64, "float32", "int8", 32)
    qref = registry.get("quantize_activation", "reference")
    same = _cand("same", lambda x, g: qref.run(x, g), op="quantize_activation")
    assert gate.run_gate(qa, qref, [same], gate.operands(qa, 2))["same"].passed


def test_reference_can_be_run_in_float32_when_its_own_precision_is_the_problem():
    # A reference that is only accurate in float32 (as mx.quantized_matmul on MLX's CPU
    # in bfloat16, whose accumulation error exceeds atol at large K) would reject an
    # accurate challenger; with reference_dtype="float32" the truth is the float32 run.
    qmm = registry.get("linear", "mlx_qmm")

    def sloppy(x, w, b):
        y = qmm.run(x, w, b)
        return y + 0.5 if x.dtype == mx.bfloat16 else y

    prob = Problem("linear", 2, 16, 64, "bfloat16", "per_channel", 32)
    ref = _cand("mlx_qmm", sloppy)
    accurate = _cand("accurate", lambda x, w, b: qmm.run(x.astype(mx.float32), w, b).astype(x.dtype))
    ins = gate.operands(prob, 2)
    assert gate.run_gate(prob, ref, [accurate], ins)["accurate"].status == "rejected"
    assert gate.run_gate(prob, ref, [accurate], ins, reference_dtype="float32")["accurate"].passed
    with pytest.raises(ValueError, match="reference_dtype"):
        gate.run_gate(prob, ref, [accurate], ins, reference_dtype="float8")
