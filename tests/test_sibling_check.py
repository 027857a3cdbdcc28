"""The model-level sibling check: sibling groups keep running as one launch at a prefill
length only if that makes the model's own prefill faster than running the members alone."""

import time

import mlx.core as mx
import pytest

import mlx_w8a8
from mlx_w8a8 import siblings, tuning
from mlx_w8a8.kernels import registry
from mlx_w8a8.kernels.registry import Candidate

pytest.importorskip("mlx_lm.models.llama", reason="mlx-lm is part of the test extra")
import tiny_lm  # noqa: E402

QMM = registry.get("linear", "mlx_qmm")
SLEEP = 0.004  # host seconds per call: larger than a tiny prefill's own cost
T = 4  # prefill tokens: the M of every projection



def group_kernel(sleep: float) -> Candidate:
    """A kernel with a multi-weight form for the gate+up sum only (512 x 128 in the tiny
    Llama; q+k+v's 256 x 128 is gate's own shape, left out to keep the cases apart)."""
    def bind_group(problem, members, lead):
        def apply(x):
            time.sleep(sleep)
            x2 = x.reshape(-1, problem.k)
            return [QMM.run(x2, w, b).reshape(*lead, w.n) for w, b in members]
        return None, None, apply

    return Candidate(name="group_kernel", backend="any", op="linear", run=QMM.run,
                     supports=lambda p: p.n == 512, digest="d-group", bind_group=bind_group,
                     w8a8=False)



def model_with_gate_up_group(tuner):
    model, _ = tiny_lm.model("llama", dtype=mx.float32)
    mlx_w8a8.quantize(model)
    gate = model.model.layers[0].mlp.gate_proj
    problem = gate.problem(T, mx.float32)
    summed_problem = type(problem)("linear", T, 512, 128, "float32", gate.format,
                                   gate.group_size, False)
    tiny_lm.record_choice(tuner, summed_problem, "group_kernel")
    assert gate.decision(T, mx.float32) == ("group_kernel", "table+siblings")
    return model, gate, summed_problem


def test_group_launches_that_slow_the_prefill_are_turned_off(check_env):
    registry.register(group_kernel(SLEEP))
    model, gate, summed = model_with_gate_up_group(check_env)
    result = tuning.check_siblings(model, check_env, tokens=(T,), rounds=3)
    assert [(g.problem.n, g.problem.k, g.problem.m) for g in result.groups] == [(512, 128, T)]
    g = result.groups[0]
    assert g.tuned == "group_kernel" and g.reference == "mlx_qmm" and not g.kept
    assert g.ratio < 1.0 and set(g.layers) == {
        "model.layers.0.mlp.gate_proj+up_proj", "model.layers.1.mlp.gate_proj+up_proj"}
    assert result.recorded == 1 and "members alone" in result.describe()
    hit = check_env.lookup(summed)
    assert hit.choice == "mlx_qmm" and not hit.entry["sibling_check"]["kept"]
    # the members now run alone at T: no group decision there any more
    assert "+siblings" not in gate.decision(T, mx.float32)[1]
    assert siblings.together()  # switched back on after the check


def test_group_launches_that_speed_the_prefill_are_kept(check_env):
    # The control: the members alone made slow on the host (their own shape's kernel
    # sleeps), the group launch plain.
    registry.register(group_kernel(0.0))
    registry.register(Candidate(name="slow_alone", backend="any", op="linear",
                                run=tiny_lm.sleeping_qmm(SLEEP), digest="d-slow", w8a8=False))
    model, gate, summed = model_with_gate_up_group(check_env)
    tiny_lm.record_choice(check_env, gate.problem(T, mx.float32), "slow_alone")  # gate/up alone: 256 x 128
    result = tuning.check_siblings(model, check_env, tokens=(T,), rounds=3)
    g = result.groups[0]
    assert g.kept and g.ratio > 1.02
    hit = check_env.lookup(summed)
    assert hit.choice == "group_kernel" and hit.entry["sibling_check"]["kept"]
    assert gate.decision(T, mx.float32)[1] == "table+siblings"


def test_nothing_to_check_without_group_launches(check_env):
    model, _ = tiny_lm.model("llama", dtype=mx.float32)
    mlx_w8a8.quantize(model)
    result = tuning.check_siblings(model, check_env, tokens=(T, 8), rounds=2)
    assert result.groups == () and result.recorded == 0 and result.seconds == {}
    assert "nothing to check" in result.describe()


@pytest.mark.parametrize("kw,match", [
    (dict(tokens=()), "tokens="), (dict(tokens=(0,)), "tokens="), (dict(rounds=1), "rounds=1"),
    (dict(min_improvement_bps=-1), "min_improvement_bps"),
    (dict(extra_rounds=-1), "extra_rounds=-1"),
])
def test_bad_arguments(check_env, kw, match):
    model, _ = tiny_lm.model("llama", dtype=mx.float32)
    with pytest.raises(ValueError, match=rf"\[mlx_w8a8.check_siblings\].*{match}"):
        tuning.check_siblings(model, check_env, **kw)


def test_a_model_without_a_token_embedding_is_refused_by_name(check_env):
    """The prompt's token ids are drawn below the embedding's row count; without an
    embedding the error names this check (not another model check)."""
    import mlx.nn as nn

    import mlx_w8a8

    model = nn.Module()
    model.q_proj, model.k_proj = mlx_w8a8.Linear(64, 32), mlx_w8a8.Linear(64, 32)
    with pytest.raises(ValueError, match=r"^\[mlx_w8a8.check_siblings\] the model has no token embedding"):
        tuning.check_siblings(model, check_env)


@pytest.mark.parametrize("extra,kept,rounds", [(None, True, 12), (0, False, 6)])
def test_an_unsettled_verdict_is_judged_again_over_extra_rounds(check_env, monkeypatch, extra,
                                                                kept, rounds):
    from mlx_w8a8.tuning import model_timing

    registry.register(group_kernel(0.0))
    model, gate, summed = model_with_gate_up_group(check_env)
    calls = []
    monkeypatch.setattr(model_timing, "alternate", tiny_lm.unsettled_then_faster("alone", calls))
    result = tuning.check_siblings(model, check_env, tokens=(T,), rounds=6, extra_rounds=extra)
    g = result.groups[0]
    assert g.kept is kept and g.rounds == rounds and result.rounds == 6
    assert calls[1:] == ([] if extra == 0 else [(["alone", "together"], 6)])
    assert check_env.lookup(summed).entry["sibling_check"]["rounds"] == rounds
    assert ("12 rounds" in result.describe()) is kept
