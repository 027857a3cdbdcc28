"""The numerical gate: challengers must match the references (two stages)."""

import logging
import math

import attrs
import mlx.core as mx
import numpy as np
import pytest

from mlx_w8a8.kernels import registry
from mlx_w8a8.kernels.registry import Candidate, Problem
from mlx_w8a8.tuning import gate

LINEAR = Problem("linear", 3, 48, 128, "float32", "per_channel", 64)


def _cand(name, run, op="linear", w8a8=False):
    # w8a8=False: these fakes wrap mlx_qmm (W8A16), so only stage 1 applies to them.
    return Candidate(name=name, backend="any", op=op, run=run, digest=name, w8a8=w8a8)


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


@pytest.mark.parametrize("problem", [LINEAR, Problem("int8_matmul", 2, 8, 32, "int8", "int8")])
def test_cycled_weights_are_equal_values_in_distinct_memory(problem):
    # A model reads each layer's weight from DRAM; a timing loop over one weight reads
    # it from cache. The copies must hold the same values (same kernel work) in
    # different buffers (a copy that aliases its source would time the cache again).
    ins = gate.cycle_weights(gate.operands(problem, variants=2, seed=1), 5)
    assert len(ins) == 5
    ws = [args[1] for args in ins]

    def arrays(w):
        return [w] if isinstance(w, mx.array) else [w.q, w.scales, w.biases]

    first = [np.asarray(a) for a in arrays(ws[0])]
    for i, w in enumerate(ws[1:], 1):
        if problem.op == "linear":
            assert w.per_channel == ws[0].per_channel and w.group_size == ws[0].group_size
        for a, b in zip(first, arrays(w)):
            b = np.asarray(b)
            assert a.dtype == b.dtype and np.array_equal(a, b)
            assert not np.shares_memory(a, b), f"copy {i} aliases the first weight"
    # activations keep rotating with their own period
    assert np.array_equal(np.asarray(ins[2][0]), np.asarray(ins[0][0]))
    assert not np.array_equal(np.asarray(ins[1][0]), np.asarray(ins[0][0]))
    one = gate.operands(problem, variants=3, seed=1)
    assert gate.cycle_weights(one, 1) is one and len(one) == 3


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
    ref = registry.get("int8_matmul", "exact")
    off = _cand("off_by_one", lambda a, b: ref.run(a, b) + 1, op="int8_matmul")
    res = gate.run_gate(prob, ref, [off], gate.operands(prob, 2))
    assert res["off_by_one"].status == "rejected" and res["off_by_one"].worst_error == 1.0
    qa = Problem("quantize_activation", 3, 0, 64, "float32", "int8", 32)
    qref = registry.get("quantize_activation", "exact")
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


# --- stage 2: the W8A8 contract -------------------------------------------------------
# The planted bugs below were found by mutation runs: each passes the user-facing rule
# (stage 1: bf16 atol 0.125 / rtol 0.01 against mlx_qmm) on the seed's inputs, the
# pattern and one random draw, at the decode shape M = 1, K = 14336 (Llama-3-8B down
# projection; N reduced from 4096 to keep the test fast). Each test asserts both: the
# stage-1 verdict alone accepts it, and the gate rejects it.
BIG = Problem("linear", 1, 512, 14336, "bfloat16", "per_channel", 64)


def planted_w8a8(drop=0, dequant=127.0, ties_away=False):
    """A W8A8 per-channel linear in MLX ops with one bug planted.

    Args:
        drop: ignore the last ``drop`` elements of K (a tile loop that stops early).
        dequant: the divisor of the dequantization scale (127 is right; 128 is the
            /127 vs /128 mistake).
        ties_away: round ties away from zero (one code off on every tie; the
            contract is round half to even).
    """
    from mlx_w8a8.kernels import reference

    def run(x, w, b):
        xf = x.astype(mx.float32)
        amax = mx.max(mx.abs(xf), axis=-1, keepdims=True)
        r = xf / (amax / 127.0)
        q = mx.sign(r) * mx.floor(mx.abs(r) + 0.5) if ties_away else mx.round(r)
        q = mx.clip(q, -127, 127)
        if drop:
            k = x.shape[1]
            q = q * (mx.arange(k) < k - drop)
        acc = reference.int8_matmul(q.astype(mx.int8), w.int8()).astype(mx.float32)
        y = acc * (amax / dequant) * w.channel_scales
        if b is not None:
            y = y + b.astype(mx.float32)
        return y.astype(x.dtype)

    return run


@pytest.fixture(scope="module")
def big():
    """Stage-1 truth on the seed's two inputs, and the new gate's inputs (one weight)."""
    qmm = registry.get("linear", "mlx_qmm")
    new = gate.gate_operands(BIG)
    old = new[:2]  # the pattern and the random draw: what the old gate ran
    truth = [qmm.run(x.astype(mx.float32), w, b).astype(x.dtype) for x, w, b in old]
    return qmm, old, truth, new


@pytest.mark.parametrize("bug, kwargs, stage2_input", [
    ("drop_k_tail_8", dict(drop=8), None),
    ("drop_k_tail_16", dict(drop=16), None),
    ("dequant_by_128", dict(dequant=128.0), None),
    ("ties_away_from_zero", dict(ties_away=True), "ties"),
])
def test_planted_bug_passes_stage_1_but_not_the_gate(big, bug, kwargs, stage2_input):
    qmm, old, truth, new = big
    run = planted_w8a8(**kwargs)
    # The old rule (stage 1 alone, on the old inputs) accepts the broken kernel ...
    for x_args, r in zip(old, truth):
        assert gate.compare(r, run(*x_args))[0], f"{bug}: stage 1 alone now rejects it"
    # ... the gate does not.
    res = gate.run_gate(BIG, qmm, [_cand(bug, run, w8a8=True)], new, reference_dtype="float32")
    assert res[bug].status == "rejected" and res[bug].stage == 2, res[bug]
    if stage2_input:
        assert f"({stage2_input})" in res[bug].detail


GROUPED_BIG = Problem("linear", 1, 512, 14336, "bfloat16", "grouped", 64)


def planted_grouped_ties_away(x, w, b):
    """The exact grouped W8A8 linear with ties rounded away from zero (the contract is
    round half to even): one activation code off by one on every other tie."""
    from mlx_w8a8.kernels import reference

    xf = x.astype(mx.float32)
    scale = mx.max(mx.abs(xf), axis=-1, keepdims=True) / 127.0
    r = xf / scale
    q = mx.clip(mx.sign(r) * mx.floor(mx.abs(r) + 0.5), -127, 127).astype(mx.int8)
    m, k = q.shape
    sums = q.astype(mx.int32).reshape(m, k // w.group_size, w.group_size).sum(-1)
    return reference.w8a8_apply((q, scale, sums), w, b, x.dtype)


def test_planted_grouped_bug_passes_stage_1_but_not_the_gate():
    # The grouped bound allows 2G + 4 float32 roundings (G = K / group_size = 224 here);
    # one that allowed 2K + 4 (every product rounded) would be 64 times wider and let
    # this kernel through: on the ties probe its error is a few times the true bound
    # and far below the wide one. The per-channel bugs above cannot tell the two apart.
    qmm = registry.get("linear", "mlx_qmm")
    ins = gate.gate_operands(GROUPED_BIG)
    x, w, b = ins[0]
    assert w.format == "grouped"
    truth = qmm.run(x.astype(mx.float32), w, b).astype(x.dtype)
    assert gate.compare(truth, planted_grouped_ties_away(x, w, b))[0], "stage 1 alone rejects it"
    bug = _cand("grouped_ties_away", planted_grouped_ties_away, w8a8=True)
    res = gate.run_gate(GROUPED_BIG, qmm, [bug], ins, reference_dtype="float32")
    assert res[bug.name].status == "rejected" and res[bug.name].stage == 2, res[bug.name]
    assert "(ties)" in res[bug.name].detail
    # Where it is caught: between the bound and the 2K + 4 one.
    x, w, b = next(args for i, args in enumerate(ins) if gate.input_name(GROUPED_BIG, i) == "ties")
    exact = registry.get("linear", "exact").run(x, w, b).astype(mx.float32)
    err = np.abs(np.array(planted_grouped_ties_away(x, w, b).astype(mx.float32) - exact))
    bound = gate.w8a8_bound(x, w, b)
    groups = GROUPED_BIG.k // GROUPED_BIG.group_size
    wide = bound.host() * gate.gamma(2 * GROUPED_BIG.k + 4) / gate.gamma(2 * groups + 4)
    ulp = 2.0 ** (np.frexp(np.abs(np.array(exact)))[1] - 8)
    assert (err > bound.host() + ulp).any() and (err <= wide + ulp).all()


W4_BIG = Problem("linear", 1, 512, 14336, "bfloat16", "grouped4", 64)


def planted_w4a8(drop_group=False, swap_nibbles=False):
    """The exact W4A8 linear with one bug planted.

    Args:
        drop_group: leave out the last group of K (codes and bias term): a group loop
            that stops one short.
        swap_nibbles: read each byte's high nibble as the even element (MLX puts the
            even element in the low nibble).
    """
    from mlx_w8a8.kernels import reference

    def run(x, w, b):
        if swap_nibbles:
            swapped = ((w.q & 0x0F0F0F0F) << 4) | ((w.q >> 4) & 0x0F0F0F0F)
            w = attrs.evolve(w, q=swapped)
        q, scale, sums = reference.quantize_rows(x, w.group_size)
        if drop_group:
            m, k = q.shape
            q = (q.astype(mx.int32) * (mx.arange(k) < k - w.group_size)).astype(mx.int8)
            sums = q.astype(mx.int32).reshape(m, -1, w.group_size).sum(-1)
        return reference.w4a8_apply((q, scale, sums), w, b, x.dtype)

    return run


@pytest.fixture(scope="module")
def w4_big():
    """The 4-bit reference (mx.quantized_matmul at 4 bits) and the gate's inputs."""
    qmm4 = registry.get("linear", "mlx_qmm4")
    ins = gate.gate_operands(W4_BIG)
    assert ins[0][1].format == "grouped4" and ins[0][1].bits == 4
    return qmm4, ins


def test_planted_4bit_dropped_group_passes_stage_1_but_not_the_gate(w4_big):
    # One group of 224 left out: within the user-facing rule on the seed's ramp pattern
    # (the gate's first input), so stage 1 alone would pass it there; the exact W4A8
    # truth (exact_w4a8, the format's exact candidate) rejects it on that same input.
    qmm4, ins = w4_big
    run = planted_w4a8(drop_group=True)
    x, w, b = ins[0]
    truth = qmm4.run(x.astype(mx.float32), w, b).astype(x.dtype)
    assert gate.compare(truth, run(x, w, b))[0], "stage 1 alone rejects it on the pattern"
    res = gate.run_gate(W4_BIG, qmm4, [_cand("drop_group", run, w8a8=True)], ins,
                        reference_dtype="float32")
    assert res["drop_group"].status == "rejected" and res["drop_group"].stage == 2
    assert res["drop_group"].detail.startswith("input 0 (pattern)"), res["drop_group"]
    assert "float32 epilogue bound" in res["drop_group"].detail, res["drop_group"]


def test_planted_4bit_wrong_nibble_order_is_rejected(w4_big):
    qmm4, ins = w4_big
    run = planted_w4a8(swap_nibbles=True)
    res = gate.run_gate(W4_BIG, qmm4, [_cand("swapped", run, w8a8=True)], ins,
                        reference_dtype="float32")
    assert res["swapped"].status == "rejected", res["swapped"]


def test_the_exact_w4a8_kernel_and_a_correct_rewrite_pass_the_4bit_gate(w4_big):
    # The control: the planted kernel without a bug, and exact_w4a8 itself, pass both
    # stages with SQNR to spare; the stage-2 truth is exact_w4a8, not the 8-bit exact.
    qmm4, ins = w4_big
    exact4 = registry.get("linear", "exact_w4a8")
    res = gate.run_gate(W4_BIG, qmm4, [exact4, _cand("clean4", planted_w4a8(), w8a8=True)], ins,
                        reference_dtype="float32")
    for name in ("exact_w4a8", "clean4"):
        assert res[name].passed, res[name]
        assert res[name].sqnr_db > gate.MIN_SQNR_DB + 5


AG_BIG = Problem("linear", 1, 512, 14336, "bfloat16", "grouped", 64, False, "group")


def test_act_group_problems_are_held_to_the_act_group_math():
    # The stage-2 truth of an act_scales="group" problem is exact_act_groups: a kernel
    # that computes the per-token math instead (close to W8A16, so stage 1 may pass it)
    # is rejected there, and a correct rewrite (per group, as the oracle) passes.
    from mlx_w8a8.kernels import reference

    qmm = registry.get("linear", "mlx_qmm")
    ins = gate.gate_operands(AG_BIG)
    token = Candidate(name="per_token", backend="any", op="linear", digest="t",
                      run=reference.w8a8_linear, act_scales=("group",))
    rewrite = Candidate(name="rewrite", backend="any", op="linear", digest="r",
                        run=lambda x, w, b: reference.act_groups_apply(
                            reference.quantize_groups(x, w.group_size), w, b, x.dtype),
                        act_scales=("group",))
    res = gate.run_gate(AG_BIG, qmm, [token, rewrite, registry.get("linear", "exact_act_groups")],
                        ins, reference_dtype="float32")
    assert res["per_token"].status == "rejected" and res["per_token"].stage == 2, res["per_token"]
    assert res["rewrite"].passed and res["exact_act_groups"].passed, res


def test_the_exact_kernel_and_a_correct_rewrite_pass_both_stages(big):
    # The control for the planted bugs: the same code without a bug is accepted, and so
    # is the ``exact`` candidate; both sit above the SQNR floor with margin.
    qmm, _, _, new = big
    exact = registry.get("linear", "exact")
    res = gate.run_gate(BIG, qmm, [exact, _cand("clean", planted_w8a8(), w8a8=True)], new,
                        reference_dtype="float32")
    for name in ("exact", "clean"):
        assert res[name].passed, res[name]
        assert res[name].sqnr_db > gate.MIN_SQNR_DB + 5


def test_sqnr_floor_rejects_what_the_bound_cannot_see():
    # Stage 2's exact truth is replaced by the candidate itself, so only the SQNR
    # floor against mlx_qmm can reject it: a kernel at ~20 dB (output noise of 10 %).
    qmm = registry.get("linear", "mlx_qmm")
    prob = Problem("linear", 4, 64, 256, "float32", "per_channel", 64)
    ins = gate.gate_operands(prob)
    noisy = _cand("noisy", lambda x, w, b: qmm.run(x, w, b) * 1.1, w8a8=True)
    res = gate.run_gate(prob, qmm, [noisy], ins, atol=10.0, rtol=1.0, exact=noisy)
    assert res["noisy"].status == "rejected" and "SQNR" in res["noisy"].detail
    assert res["noisy"].stage == 2
    ok = gate.run_gate(prob, qmm, [noisy], ins, atol=10.0, rtol=1.0, exact=noisy, min_sqnr_db=15.0)
    assert ok["noisy"].passed and 19 < ok["noisy"].sqnr_db < 22


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("fmt", ["per_channel", "grouped"])
def test_epilogue_reordering_stays_inside_the_bound(dtype, fmt):
    # A correct kernel may order its float32 epilogue differently: scale products in
    # the other order, groups summed backwards. The bound must accept that (it is the
    # float32 rounding the contract allows), while one float32 ulp more per element
    # on a large output is still tiny next to the bugs above.
    from mlx_w8a8.kernels import reference

    prob = Problem("linear", 3, 64, 512, dtype, fmt, 32, True)
    ins = gate.gate_operands(prob)

    def reordered(x, w, b):
        if w.per_channel:
            q, scale, _ = reference.quantize_rows(x)
            acc = reference.int8_matmul(q, w.int8()).astype(mx.float32)
            y = acc * (scale * w.channel_scales)  # the other association
            return (y + b.astype(mx.float32)).astype(x.dtype)
        q, scale, sums = reference.quantize_rows(x, w.group_size)
        m, k = q.shape
        groups = k // w.group_size
        xq = q.astype(mx.float32).reshape(m, groups, w.group_size)
        wq = w.int8().astype(mx.float32).reshape(w.n, groups, w.group_size)
        y = mx.zeros((m, w.n))
        for g in reversed(range(groups)):  # groups summed last to first
            p = xq[:, g] @ wq[:, g].T
            y = y + p * w.scales[:, g].astype(mx.float32) + sums[:, g : g + 1].astype(mx.float32) * w.group_offsets[:, g]
        return (y * scale + b.astype(mx.float32)).astype(x.dtype)

    res = gate.run_gate(prob, registry.get("linear", "mlx_qmm"), [_cand("re", reordered, w8a8=True)],
                        ins, reference_dtype="float32")
    assert res["re"].passed, res["re"]


def test_bound_is_float32_rounding_not_bf16_slack():
    # The stage-2 bound is a few float32 ulps of the output's magnitude sum, orders of
    # magnitude below the stage-1 atol: that is what makes it able to see a K tail.
    prob = Problem("linear", 2, 32, 4096, "float32", "per_channel", 64)
    x, w, b = gate.gate_operands(prob)[1]
    bound = gate.w8a8_bound(x, w, b).host()
    assert bound.shape == (2, 32) and (bound > 0).all()
    assert bound.max() < 1e-3 * gate.ATOL
    grouped = Problem("linear", 2, 32, 4096, "float32", "grouped", 64)
    xg, wg, bg = gate.gate_operands(grouped)[1]
    assert gate.w8a8_bound(xg, wg, bg).host().max() > bound.max()  # 2G + 4 roundings, not 4


def test_probes_expose_tails_and_ties():
    prob = Problem("linear", 3, 16, 256, "bfloat16", "per_channel", 64)
    ins = gate.gate_operands(prob)
    assert [gate.input_name(prob, i) for i in range(len(ins))] == list(gate.INPUT_NAMES)
    tail = np.array(ins[2][0].astype(mx.float32))
    assert not tail[:, : 256 - gate.TAIL].any() and (tail[:, -gate.TAIL :] != 0).all()
    ties = np.array(ins[3][0].astype(mx.float32))
    amax = np.abs(ties).max(axis=1, keepdims=True)
    codes = ties / (amax / 127)
    off_max = np.abs(ties) != amax
    assert np.all(np.abs(codes[off_max] % 1) == 0.5)  # every other element is a tie
    mm = Problem("int8_matmul", 2, 8, 64, "int8", "int8")
    mins = gate.gate_operands(mm)
    assert gate.input_name(mm, 3) == "extremes" and np.array(mins[3][0]).min() == -128
    # every input of a problem shares its weight (and bias) with the timing operands
    assert all(args[1] is ins[0][1] for args in ins)


# The device screens (gate.py docstring): float32 on the device, float64 on the host only
# for outputs that do not clear them. The verdicts must be the float64 rule's.
def _stage1_float64(r, c, atol, rtol):
    rn = np.array(r.astype(mx.bfloat16).astype(mx.float32)).astype(np.float64)
    cn = np.array(c.astype(mx.bfloat16).astype(mx.float32)).astype(np.float64)
    ok = np.isfinite(rn) & np.isfinite(cn) & (np.abs(cn - rn) <= np.maximum(atol, rtol * np.abs(rn)))
    return bool(ok.all()), float(np.abs(cn - rn).max())


def _stage2_float64(e, c, bound, dtype):
    en = np.array(e.astype(mx.float32)).astype(np.float64)
    cn = np.array(c.astype(mx.float32)).astype(np.float64)
    limit = bound.host() + gate._ulp(np.maximum(np.abs(en), np.abs(cn)), dtype)
    return bool((np.isfinite(en) & np.isfinite(cn) & (np.abs(cn - en) <= limit)).all())


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_screened_verdicts_equal_the_float64_rule(rng, dtype):
    # Errors drawn around each element's limit (0.5x to 1.5x, and exactly at it): every
    # output's verdict and stage 1's worst error equal the float64 rule's.
    for trial in range(40):
        m, n = int(rng.integers(1, 5)), int(rng.integers(1, 300))
        ref = mx.array((rng.standard_normal((m, n)) * 10 ** rng.uniform(-3, 3)).astype(np.float32))
        ref = ref.astype(getattr(mx, dtype))
        r32 = np.array(ref.astype(mx.bfloat16).astype(mx.float32)).astype(np.float64)
        limit = np.maximum(gate.ATOL, gate.RTOL * np.abs(r32))
        # every element clearly within (the screen decides), around the limit, at it
        scale = (rng.uniform(0.05, 0.9, (m, n)), rng.uniform(0.5, 1.5, (m, n)),
                 np.ones((m, n)))[trial % 3]
        cand = mx.array((r32 + limit * scale * rng.choice([-1, 1], (m, n))).astype(np.float32))
        cand = cand.astype(getattr(mx, dtype))
        got, worst, _ = gate.compare(ref, cand)
        ok64, worst64 = _stage1_float64(ref, cand, gate.ATOL, gate.RTOL)
        # The screen's worst is the float32 difference, rounded once; rounding is monotone,
        # so the float32 maximum is the float64 maximum rounded (bfloat16 values whose
        # exponents differ by more than 16 have an inexact float32 difference).
        assert got == ok64 and worst in (worst64, float(np.float32(worst64))), trial
        t = mx.array(rng.uniform(0.1, 10, (m, n)).astype(np.float32))
        bound = gate.Bound(t, 1e-6)
        b64 = bound.host()
        e = mx.array(rng.standard_normal((m, n)).astype(np.float32)).astype(getattr(mx, dtype))
        e64 = np.array(e.astype(mx.float32)).astype(np.float64)
        lim2 = b64 + gate._ulp(np.abs(e64), dtype)
        c2 = mx.array((e64 + lim2 * scale).astype(np.float32)).astype(getattr(mx, dtype))
        assert gate.compare_w8a8(e, c2, bound, dtype)[0] == _stage2_float64(e, c2, bound, dtype), trial


def test_screen_leaves_what_float32_cannot_tell_to_float64():
    # A float32 output whose error is one float32 step above the float64 bound but not
    # above the bound computed in float32 (t times the factor rounds up): the screen's
    # margin sends it to the float64 test, which rejects it. (Found by search; without
    # the margin the screen would accept it.)
    t, c = 1.2677323818206787, 6.058307349121606e-07
    factor = 2.0 * gate.gamma(4) * (1.0 + gate.gamma(4096 + 2)) * (1.0 + 2.0**-9)
    assert c > t * factor and c <= (mx.array([t]) * factor).item()  # the adversarial case
    bound = gate.Bound(mx.array([[t]]), factor)
    ok, _, detail = gate.compare_w8a8(mx.zeros((1, 1)), mx.array([[c]]), bound, "float32")
    assert not ok and "float32 epilogue bound" in detail
    # and the same error a float32 step lower passes
    lower = float(np.nextafter(np.float32(c), np.float32(0)))
    assert gate.compare_w8a8(mx.zeros((1, 1)), mx.array([[lower]]), bound, "float32")[0]


def test_device_ulp_is_frexps():
    values = np.concatenate([np.abs(np.random.default_rng(3).standard_normal(1000) *
                                    10.0 ** np.random.default_rng(4).uniform(-30, 30, 1000)),
                             [0.0, 1e-40, 2.0**-126, 1.0, 2.0, 65504.0, 3e38]]).astype(np.float32)
    for dtype in ("bfloat16", "float16", "float32"):
        got = np.array(gate._ulp_device(mx.array(values), dtype)).astype(np.float64)
        want = gate._ulp(values.astype(np.float64), dtype)
        nonzero = values > 0  # at 0 frexp's exponent is 0; both errors are 0 there
        np.testing.assert_array_equal(got[nonzero], want[nonzero])


def test_sqnr_sums_rows_on_the_device(rng):
    r = rng.standard_normal((7, 4096)).astype(np.float32)
    c = r + rng.standard_normal((7, 4096)).astype(np.float32) * 1e-3
    want = 10 * np.log10(np.sum(r.astype(np.float64) ** 2) / np.sum((c.astype(np.float64) - r) ** 2))
    assert gate.sqnr_db(mx.array(r), mx.array(c)) == pytest.approx(want, abs=1e-3)
    assert gate.sqnr_db(mx.array(r), mx.array(r)) == math.inf
    assert gate.sqnr_db(mx.array(r[0]), mx.array(c[0])) == pytest.approx(
        10 * np.log10(np.sum(r[0].astype(np.float64) ** 2) / np.sum((c[0].astype(np.float64) - r[0]) ** 2)), abs=1e-3)
    c[3, 5] = np.inf
    assert gate.sqnr_db(mx.array(r), mx.array(c)) == -math.inf


def test_screens_fail_what_is_not_finite_where_the_limit_overflowed():
    # An infinite reference makes stage 1's limit infinite and an infinite T makes stage
    # 2's: |c - r| = inf is then "within" it in float32; the outputs must still fail.
    assert not gate.compare(mx.array([math.inf, 1.0]), mx.array([1.0, 1.0]))[0]
    bound = gate.Bound(mx.array([[math.inf]]), 1e-6)
    assert not gate.compare_w8a8(mx.array([[math.inf]]), mx.array([[1.0]]), bound, "float32")[0]
