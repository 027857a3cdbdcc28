"""The model-level prefill check: a layer group switches to its challenger (the
reference for a W8A8 choice, else the fastest other kernel its entry timed) only if that
makes the model's own prefill faster."""

import time

import attrs
import mlx.core as mx
import pytest

from mlx_w8a8 import tuning
from mlx_w8a8.kernels import registry
from mlx_w8a8.kernels.registry import Candidate
from mlx_w8a8.tuning import linears, prefill_check

pytest.importorskip("mlx_lm.models.llama", reason="mlx-lm is part of the test extra")
import tiny_lm  # noqa: E402

QMM = registry.get("linear", "mlx_qmm")
SLEEP = 0.008  # host seconds per call: well above a tiny prefill's own cost and its noise
T = 16


def check_down_proj(check_env, model, choice: str, timed: list[str]):
    """Record ``choice`` (``timed``: the candidates its race timed) for the first
    down_proj's entry at ``T``, run the check; ``(down_proj, problem, result, its group)``."""
    down = model.model.layers[0].mlp.down_proj
    problem = down.problem(T, mx.float32)
    tiny_lm.record_choice(check_env, problem, choice, timed)
    result = tuning.check_prefill(model, check_env, tokens=[T], rounds=4)
    return down, problem, result, next(g for g in result.groups if g.problem == problem)


def test_a_reference_choice_is_challenged_and_switched_where_the_challenger_is_faster(check_env):
    model = tiny_lm.converted()
    registry.register(Candidate(name="mlx_qmm", backend="any", op="linear",
                                run=tiny_lm.sleeping_qmm(SLEEP), digest=QMM.digest))
    registry.register(Candidate(name="fast", backend="any", op="linear", run=QMM.run,
                                digest="d-fast", w8a8=False))
    down = model.model.layers[0].mlp.down_proj  # 128 x 256
    problem = down.problem(T, mx.float32)
    tiny_lm.record_choice(check_env, problem, "mlx_qmm", ["mlx_qmm", "fast"])
    assert prefill_check.challenger(check_env.lookup(problem).entry, problem) == "fast"
    result = tuning.check_prefill(model, check_env, tokens=[T], rounds=4)
    g = next(g for g in result.groups if g.problem == problem)
    assert g.tuned == "mlx_qmm" and g.challenger == "fast" and g.switched and g.ratio > 1.02
    assert set(g.layers) == {"model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj"}
    hit = check_env.lookup(problem)
    assert hit.choice == "fast" and hit.entry["prefill_check"]["switched"]
    assert down.decision(T, mx.float32) == ("fast", "table")
    assert all(layer.kernel is None for _, layer in linears.w8a8_linears(model))
    assert "switched to fast" in result.describe()


def test_a_challenger_is_timed_after_its_plans_are_made(check_env):
    # Switching a layer's kernel makes it plan again (decide, bind) on its next call;
    # "slow_bind" binds slowly but runs fast, the reference runs slowly: timed with its
    # binding, the challenger would lose.
    model = tiny_lm.converted()
    registry.register(Candidate(name="mlx_qmm", backend="any", op="linear",
                                run=tiny_lm.sleeping_qmm(SLEEP), digest=QMM.digest))

    def slow_bind(layer, problem):
        time.sleep(0.05)
        return lambda x: QMM.run(x, layer.quantized_weight, None)

    registry.register(Candidate(name="slow_bind", backend="any", op="linear", run=QMM.run,
                                bind=slow_bind, digest="d-slow_bind", w8a8=False))
    _, _, _, g = check_down_proj(check_env, model, "mlx_qmm", ["mlx_qmm", "slow_bind"])
    assert g.challenger == "slow_bind" and g.switched and g.ratio > 1.02


def test_a_w8a8_choice_slower_than_the_reference_in_the_model_is_switched_back(check_env):
    model = tiny_lm.converted()
    registry.register(Candidate(name="host_heavy", backend="any", op="linear",
                                run=tiny_lm.sleeping_qmm(SLEEP), digest="d-host_heavy", w8a8=False))
    down, problem, _, g = check_down_proj(check_env, model, "host_heavy", ["mlx_qmm", "host_heavy"])
    assert g.tuned == "host_heavy" and g.challenger == "mlx_qmm" and g.switched
    assert check_env.lookup(problem).choice == "mlx_qmm"
    assert down.decision(T, mx.float32) == ("mlx_qmm", "table")


def test_a_challenger_that_is_not_faster_leaves_the_choice(check_env):
    model = tiny_lm.converted()
    registry.register(Candidate(name="host_heavy", backend="any", op="linear",
                                run=tiny_lm.sleeping_qmm(SLEEP), digest="d-host_heavy", w8a8=False))
    _, problem, result, g = check_down_proj(check_env, model, "mlx_qmm", ["mlx_qmm", "host_heavy"])
    assert g.challenger == "host_heavy" and not g.switched and g.ratio < 1.0
    hit = check_env.lookup(problem)
    assert hit.choice == "mlx_qmm" and hit.entry["prefill_check"]["switched"] is False
    assert "mlx_qmm kept" in result.describe()


def test_only_entries_of_the_checked_length_with_a_challenger_are_checked(check_env):
    model = tiny_lm.converted()
    # no entry at all: everything decides the fallback and nothing is checked
    result = tuning.check_prefill(model, check_env, tokens=[T], rounds=2)
    assert result.groups == () and result.recorded == 0
    assert "nothing to check" in result.describe()
    # an entry of another M bucket (256): not T = 16's to rewrite
    registry.register(Candidate(name="host_heavy", backend="any", op="linear", run=QMM.run,
                                digest="d-host_heavy", w8a8=False))
    down = model.model.layers[0].mlp.down_proj
    tiny_lm.record_choice(check_env, down.problem(256, mx.float32), "mlx_qmm", ["mlx_qmm", "host_heavy"])
    assert tuning.check_prefill(model, check_env, tokens=[T], rounds=2).groups == ()
    # at T = 256 the same entry is checked
    assert [g.problem.m for g in tuning.check_prefill(model, check_env, tokens=[256], rounds=2,
                                                      record=False).groups] == [256]


@pytest.mark.parametrize("kw,match", [
    (dict(tokens=[]), "tokens"), (dict(rounds=1), "rounds=1"),
    (dict(min_improvement_bps=-1), "min_improvement_bps"),
    (dict(extra_rounds=-1), "extra_rounds=-1"),
])
def test_bad_arguments(check_env, kw, match):
    with pytest.raises(ValueError, match=match):
        tuning.check_prefill(tiny_lm.converted(), check_env, **kw)


def test_a_model_without_a_token_embedding_is_refused_by_name(check_env):
    """The prompt's token ids are drawn below the embedding's row count; without an
    embedding the error names this check (not another model check)."""
    import mlx.nn as nn

    import mlx_w8a8

    model = nn.Module()
    model.q_proj, model.k_proj = mlx_w8a8.Linear(64, 32), mlx_w8a8.Linear(64, 32)
    with pytest.raises(ValueError, match=r"^\[mlx_w8a8.check_prefill\] the model has no token embedding"):
        tuning.check_prefill(model, check_env)


def test_a_sibling_group_left_alone_by_its_summed_entry_is_tried_as_one_launch(check_env):
    # gate/up's summed entry (512 x 128) chose "fast", which has no multi-weight form, so
    # they run alone on their own entry's kernel (256 x 128: host_heavy, slow); the
    # summed entry also timed "group", which has one. The check launches gate/up as one
    # on it, and switches the summed entry to it.
    model = tiny_lm.converted()
    launches = []

    def bind_group(problem, members, lead=None):
        def apply(x):
            launches.append(len(members))
            return [QMM.run(x, w, b) for w, b in members]
        return None, None, apply

    registry.register(Candidate(name="host_heavy", backend="any", op="linear",
                                run=tiny_lm.sleeping_qmm(SLEEP), digest="d-host_heavy", w8a8=False))
    registry.register(Candidate(name="fast", backend="any", op="linear", run=QMM.run,
                                digest="d-fast", w8a8=False))
    registry.register(Candidate(name="slow_bind", backend="any", op="linear", run=QMM.run,
                                bind_group=bind_group, digest="d-slow_bind", w8a8=False))
    mlp = model.model.layers[0].mlp
    own = mlp.gate_proj.problem(T, mx.float32)  # 256 x 128: gate, up (and lm_head)
    tiny_lm.record_choice(check_env, own, "host_heavy", ["mlx_qmm", "host_heavy"])
    summed = attrs.evolve(own, n=512)
    tiny_lm.record_choice(check_env, summed, "fast", ["mlx_qmm", "fast", "slow_bind"])
    assert prefill_check.group_challenger(check_env.lookup(summed).entry, summed) == "slow_bind"
    assert mlp.gate_proj._group_decision(T, mx.float32) is None  # alone before the check
    result = tuning.check_prefill(model, check_env, tokens=[T], rounds=4)
    g = next(g for g in result.groups if g.problem == summed)
    assert set(g.layers) == {"model.layers.0.mlp.gate_proj+up_proj",
                             "model.layers.1.mlp.gate_proj+up_proj"}
    assert g.tuned == "fast" and g.challenger == "slow_bind" and g.switched, g
    assert launches  # it ran as one launch in its variant
    assert check_env.lookup(summed).choice == "slow_bind"
    assert mlp.gate_proj.decision(T, mx.float32) == ("slow_bind", "table+siblings")
    assert not isinstance(registry._chooser, prefill_check._Override)  # put back
    # an entry the sibling check judged is left to it
    entry = dict(check_env.lookup(summed).entry, choice="fast", sibling_check={"kept": False})
    check_env.record(check_env.claim(summed), entry)
    result = tuning.check_prefill(tiny_lm.converted(), check_env, tokens=[T], rounds=2,
                                  record=False)
    assert summed not in {g.problem for g in result.groups}


@pytest.mark.parametrize("extra,switched,rounds", [(None, True, 12), (0, False, 6)])
def test_an_unsettled_verdict_is_judged_again_over_extra_rounds(check_env, monkeypatch, extra,
                                                                switched, rounds):
    from mlx_w8a8.tuning import model_timing

    model = tiny_lm.converted()
    registry.register(Candidate(name="fast", backend="any", op="linear", run=QMM.run,
                                digest="d-fast", w8a8=False))
    problem = model.model.layers[0].mlp.down_proj.problem(T, mx.float32)
    tiny_lm.record_choice(check_env, problem, "mlx_qmm", ["mlx_qmm", "fast"])
    calls = []
    monkeypatch.setattr(model_timing, "alternate", tiny_lm.unsettled_then_faster("decided", calls))
    result = tuning.check_prefill(model, check_env, tokens=[T], rounds=6, extra_rounds=extra)
    assert result.groups and result.rounds == 6
    assert all(g.switched is switched and g.rounds == rounds for g in result.groups)
    if extra is None:  # the decided variant and every unsettled group, once more
        assert calls[1] == (["decided"] + [f"group {i}" for i in range(len(result.groups))], 6)
    assert len(calls) == (1 if extra == 0 else 2)
    entry = check_env.lookup(problem).entry
    assert entry["prefill_check"]["rounds"] == rounds
    assert entry["choice"] == ("fast" if switched else "mlx_qmm")
