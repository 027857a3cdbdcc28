"""The model-level decode check: a tuned M = 1 kernel stays only if it makes the
model's own decode loop faster than the reference kernel."""

import time

import attrs
import mlx.core as mx
import pytest

import mlx_w8a8
from mlx_w8a8 import tuning
from mlx_w8a8.kernels import registry
from mlx_w8a8.kernels.registry import Candidate

pytest.importorskip("mlx_lm.models.llama", reason="mlx-lm is part of the test extra")
import tiny_lm  # noqa: E402

QMM = registry.get("linear", "mlx_qmm")
SLEEP = 0.003  # host seconds per call: larger than a tiny decode step's own cost





def choose_at_m1(tuner, layer, name):
    """Record a table entry choosing ``name`` at M = 1 for ``layer``'s shape (its
    timings measured, its choice set by hand: a per-shape race it 'won')."""
    problem = layer.problem(1, mx.float32)
    tiny_lm.record_choice(tuner, problem, name)
    return problem


def test_a_kernel_that_slows_the_model_is_replaced_by_the_reference(check_env):
    model = tiny_lm.converted()
    registry.register(Candidate(name="host_heavy", backend="any", op="linear",
                                run=tiny_lm.sleeping_qmm(SLEEP), digest="d-host_heavy", w8a8=False))
    gate = model.model.layers[0].mlp.gate_proj  # 256x128: gate, up and lm_head
    problem = choose_at_m1(check_env, gate, "host_heavy")
    result = tuning.check_decode(model, check_env, steps=3, prompt=4, rounds=3)
    # 256x128 measured; 128x128 (q, o) and 128x256 (down) borrow it (N, K within 2x);
    # 64x128 (k, v) is 4x away in N and keeps the fallback.
    assert sorted((g.problem.n, g.problem.k) for g in result.groups) == [
        (128, 128), (128, 256), (256, 128)]
    for g in result.groups:
        assert g.tuned == "host_heavy" and not g.kept and g.ratio < 1.0
        assert g.reference == "mlx_qmm"
    gate_group = next(g for g in result.groups if g.problem == problem)
    assert set(gate_group.layers) >= {
        "model.layers.0.mlp.gate_proj", "model.layers.1.mlp.up_proj", "lm_head"}
    assert result.recorded == 3 and "replaced by mlx_qmm" in result.describe()
    hit = check_env.lookup(problem)
    assert hit.choice == "mlx_qmm" and hit.entry["decode_check"]["tuned"] == "host_heavy"
    assert not hit.entry["decode_check"]["kept"]
    # a borrowed decision gets an entry of its own shape, without another shape's timings
    down = model.model.layers[0].mlp.down_proj
    own = check_env.lookup(down.problem(1, mx.float32))
    assert own.entry["borrowed_from"] == {"n": 256, "k": 128} and own.choice == "mlx_qmm"
    assert "median_ns" not in own.entry["candidates"]["mlx_qmm"]
    # every layer now decides the reference at M = 1 from the table and is not forced
    for _, m in model.named_modules():
        if isinstance(m, mlx_w8a8.Linear):
            assert m.kernel is None and m.decision(1, mx.float32)[0] == "mlx_qmm"
    assert gate.decision(1, mx.float32) == ("mlx_qmm", "table")


def test_a_kernel_that_speeds_the_model_is_kept(check_env):
    # The control: the reference made slow on the host, the tuned kernel plain.
    model = tiny_lm.converted()
    registry.register(Candidate(name="mlx_qmm", backend="any", op="linear",
                                run=tiny_lm.sleeping_qmm(SLEEP), digest=QMM.digest))
    registry.register(Candidate(name="fast", backend="any", op="linear", run=QMM.run,
                                digest="d-fast", w8a8=False))
    down = model.model.layers[0].mlp.down_proj
    problem = choose_at_m1(check_env, down, "fast")
    result = tuning.check_decode(model, check_env, steps=3, prompt=4, rounds=3)
    g = result.groups[0]
    assert g.tuned == "fast" and g.kept and g.ratio > 1.02
    hit = check_env.lookup(problem)
    assert hit.choice == "fast" and hit.entry["decode_check"]["kept"]
    assert down.decision(1, mx.float32)[0] == "fast"


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_nothing_to_check_when_decode_runs_the_reference(check_env, family):
    # qwen2's q/k/v carry a bias; qwen3 has q/k norms and head_dim != hidden / heads
    model, _ = tiny_lm.model(family, dtype=mx.float32)
    mlx_w8a8.quantize(model)
    result = tuning.check_decode(model, check_env, steps=2, prompt=3, rounds=2)
    assert result.groups == () and result.recorded == 0
    assert "nothing to check" in result.describe()


def test_user_forced_layers_are_left_alone(check_env):
    model = tiny_lm.converted()
    registry.register(Candidate(name="host_heavy", backend="any", op="linear",
                                run=tiny_lm.sleeping_qmm(SLEEP), digest="d-host_heavy", w8a8=False))
    for _, m in model.named_modules():
        if isinstance(m, mlx_w8a8.Linear):
            m.kernel = "host_heavy"
    result = tuning.check_decode(model, check_env, steps=2, prompt=3, rounds=2)
    assert result.groups == ()
    assert model.lm_head.kernel == "host_heavy"


@pytest.mark.parametrize("kw,match", [
    (dict(steps=0), "steps=0"), (dict(rounds=1), "rounds=1"), (dict(prompt=0), "prompt=0"),
    (dict(min_improvement_bps=-1), "min_improvement_bps"),
    (dict(extra_rounds=-1), "extra_rounds=-1"),
])
def test_bad_arguments(check_env, kw, match):
    with pytest.raises(ValueError, match=match):
        tuning.check_decode(tiny_lm.converted(), check_env, **kw)


def test_a_model_without_w8a8_layers_is_refused(check_env):
    model, _ = tiny_lm.model("llama", dtype=mx.float32)
    with pytest.raises(ValueError, match="no mlx_w8a8.Linear"):
        tuning.check_decode(model, check_env)


def test_a_model_without_a_token_embedding_is_refused_by_name(check_env):
    """The prompt's token ids are drawn below the embedding's row count; without an
    embedding the error names this check (not another model check)."""
    import mlx.nn as nn

    import mlx_w8a8

    model = nn.Module()
    model.q_proj, model.k_proj = mlx_w8a8.Linear(64, 32), mlx_w8a8.Linear(64, 32)
    with pytest.raises(ValueError, match=r"^\[mlx_w8a8.check_decode\] the model has no token embedding"):
        tuning.check_decode(model, check_env)


@pytest.mark.parametrize("group_seconds,kept", [
    ([0.90, 0.92, 0.91, 0.93, 0.90, 0.92], True),   # faster in every round
    ([0.70, 0.70, 0.70, 1.30, 1.30, 1.30], False),  # median 1.1x, but slower half the time
])
def test_a_kernel_must_win_most_rounds_not_just_the_median(check_env, monkeypatch, group_seconds, kept):
    from mlx_w8a8.tuning import model_timing

    model = tiny_lm.converted()
    registry.register(Candidate(name="fast", backend="any", op="linear", run=QMM.run,
                                digest="d-fast", w8a8=False))
    choose_at_m1(check_env, model.model.layers[0].mlp.down_proj, "fast")
    # "tuned" takes group_seconds; each group taken off it runs at 1.0
    monkeypatch.setattr(model_timing, "alternate", lambda names, rounds, measure, on_round=None: {
        n: group_seconds if n == "tuned" else [1.0] * 6 for n in names})
    result = tuning.check_decode(model, check_env, steps=2, prompt=3, rounds=6, record=False)
    assert result.groups  # down_proj's shape, and those borrowing its decision
    for g in result.groups:
        assert g.kept is kept and (g.low >= 1.0) is kept and g.ratio > 1.02


def host_and_device_decode(monkeypatch, cost):
    """Make the check's decode step cost the larger of its host and device totals, each
    a sum over the linears of ``cost[kernel] = (host, device)`` for the kernel the layer
    runs (the real loop runs one step first, so every layer meets M = 1 and decides)."""
    from mlx_w8a8.tuning import linears, model_timing

    real = model_timing.decode

    def decode(model, tokens, steps, loop=None):
        real(model, tokens, 1, loop)
        host = device = 0.0
        for _, layer in linears.w8a8_linears(model):
            h, d = cost[layer.kernel or layer.decision(1, mx.float32)[0]]
            host, device = host + h, device + d
        return max(host, device) * 1e-3

    monkeypatch.setattr(model_timing, "decode", decode)


def two_groups(check_env, gate_kernel, down_kernel):
    """A tiny model whose table chooses ``gate_kernel`` for gate/up/lm_head (256x128),
    ``down_kernel`` for down (128x256) and the reference for the other shapes."""
    model = tiny_lm.converted()
    for name in (gate_kernel, down_kernel):
        registry.register(Candidate(name=name, backend="any", op="linear", run=QMM.run,
                                    digest=f"d-{name}", w8a8=False))
    mlp, attn = model.model.layers[0].mlp, model.model.layers[0].self_attn
    choose_at_m1(check_env, mlp.gate_proj, gate_kernel)
    choose_at_m1(check_env, mlp.down_proj, down_kernel)
    choose_at_m1(check_env, attn.q_proj, "mlx_qmm")  # 128x128: q, o (no borrowing)
    choose_at_m1(check_env, attn.k_proj, "mlx_qmm")  # 64x128: k, v
    return model, mlp


def test_decisions_that_gain_only_together_are_kept_as_a_whole(check_env, monkeypatch):
    """A step costs the larger of its host and device totals, so one group's gain can
    show only with another's: here gate/up/lm_head's kernel saves host time and
    down_proj's device time; either alone leaves the step at the other bound (1.00x),
    both make it 1.12x faster. Judged by adding each to an all-reference model, both
    would be replaced; the table as a whole beats the reference, so both stay."""
    model, mlp = two_groups(check_env, "host_light", "device_light")
    host_and_device_decode(monkeypatch, {
        "mlx_qmm": (1.0, 1.0), "host_light": (0.2, 1.0), "device_light": (1.0, 0.2)})
    result = tuning.check_decode(model, check_env, steps=2, prompt=3, rounds=4, batches=())
    assert sorted(g.tuned for g in result.groups) == ["device_light", "host_light"]
    for g in result.groups:
        assert g.kept and g.whole and g.ratio == pytest.approx(g.low) and g.ratio > 1.1
    assert "as a whole -> kept" in result.describe()
    assert mlp.gate_proj.decision(1, mx.float32)[0] == "host_light"
    assert mlp.down_proj.decision(1, mx.float32)[0] == "device_light"
    check = check_env.lookup(mlp.down_proj.problem(1, mx.float32)).entry["decode_check"]
    assert check["judged_in"] == "whole" and check["kept"]


def test_a_group_that_helps_is_kept_from_a_table_that_as_a_whole_does_not(check_env,
                                                                         monkeypatch):
    """Device-bound steps: gate/up/lm_head's kernel costs more device time, down_proj's
    less; together they lose to the reference (0.91x), so each is judged by taking it
    off the tuned model alone: gate/up/lm_head's is replaced, down_proj's kept."""
    model, mlp = two_groups(check_env, "device_heavy", "device_light")
    host_and_device_decode(monkeypatch, {
        "mlx_qmm": (1.0, 2.0), "device_heavy": (1.0, 3.0), "device_light": (1.0, 1.0)})
    result = tuning.check_decode(model, check_env, steps=2, prompt=3, rounds=4, batches=())
    verdicts = {g.tuned: g for g in result.groups}
    assert set(verdicts) == {"device_heavy", "device_light"}
    assert not verdicts["device_heavy"].kept and verdicts["device_heavy"].ratio < 1.0
    assert verdicts["device_light"].kept and verdicts["device_light"].ratio > 1.02
    assert not any(g.whole for g in result.groups)
    assert {"every group tuned", "every group on the reference", "tuned"} <= set(result.seconds)
    # The report says what the decisions did as a whole before each group's verdict.
    lines = result.describe().splitlines()
    assert lines[1].startswith("  as a whole: every group tuned 0.") and lines[1].endswith(
        "-> each group judged alone:"), lines
    assert sum("as a whole" in line for line in lines[1:]) == 1
    assert mlp.gate_proj.decision(1, mx.float32)[0] == "mlx_qmm"
    assert mlp.down_proj.decision(1, mx.float32)[0] == "device_light"
    check = check_env.lookup(mlp.down_proj.problem(1, mx.float32)).entry["decode_check"]
    assert check["judged_in"] == "tuned" and check["kept"]


# Sibling launches (q/k/v, gate/up as one launch): decided, judged and rewritten under the
# summed problem; off, the members run alone on their own decisions.
def group_candidate(name, seconds, launches):
    """A linear candidate with a multi-weight form (``bind_group``) whose launch computes
    each member with ``mx.quantized_matmul`` after ``seconds`` of host time, counted."""
    def bind_group(problem, members, lead=None):
        def apply(x):
            launches.append(len(members))
            time.sleep(seconds)
            return [QMM.run(x, w, b) for w, b in members]
        return None, None, apply
    return Candidate(name=name, backend="any", op="linear", run=QMM.run, digest=f"d-{name}",
                     w8a8=False, bind_group=bind_group)


def test_a_sibling_launch_that_slows_decode_is_judged_under_its_summed_problem(check_env):
    model = tiny_lm.converted()
    launches = []
    registry.register(group_candidate("group_slow", SLEEP, launches))
    qkv = model.model.layers[0].self_attn.q_proj.problem(1, mx.float32)
    qkv = attrs.evolve(qkv, n=128 + 64 + 64)  # q + k + v: 256 x 128
    tiny_lm.record_choice(check_env, qkv, "group_slow")
    attn = model.model.layers[0].self_attn
    result = tuning.check_decode(model, check_env, steps=3, prompt=4, rounds=3)
    assert launches, "the group launch never ran"
    # q/k/v summed (256 x 128, measured) and gate/up summed (512 x 128, borrowing it) are
    # judged as groups; o_proj and down_proj (alone) borrow the decision too and are
    # judged under their own shapes. lm_head (256 x 128 alone) is decided, so judged, by
    # the q/k/v sum's entry.
    summed = [g for g in result.groups if g.problem.n in (256, 512)]
    assert sorted((g.problem.n, g.problem.k) for g in summed) == [(256, 128), (512, 128)]
    for g in summed:
        assert g.tuned == "group_slow" and not g.kept and g.ratio < 1.0
        assert not any(path.endswith(("o_proj", "down_proj")) for path in g.layers)
    qkv_group = next(g for g in result.groups if g.problem == qkv)
    assert set(qkv_group.layers) >= {"model.layers.0.self_attn.q_proj",
                                     "model.layers.0.self_attn.k_proj",
                                     "model.layers.1.self_attn.v_proj"}
    hit = check_env.lookup(qkv)
    assert hit.choice == "mlx_qmm" and not hit.entry["decode_check"]["kept"]
    # q/k/v run alone from now on, each on its own shape's decision. q_proj's shape
    # (128 x 128) is o_proj's, judged alone on group_slow, and k/v (64 x 128) borrow from
    # it (256 x 128 is beyond the borrowing ratio): that candidate runs a single layer as
    # fast as mx.quantized_matmul, so that verdict is timing noise, and q/k/v follow
    # whichever it was (a fresh-clone CI run once kept it). A kept verdict is judged
    # again in a second pass with q/k/v alone on it, where k/v (64 x 128) are a group of
    # their own whose verdict is written as their own entry: each layer follows the last
    # verdict on a group it was judged in alone, else the 128 x 128 one.
    alone = [g for g in result.groups if (g.problem.n, g.problem.k) == (128, 128)]
    assert alone and any(path.endswith("o_proj") for path in alone[0].layers)
    for proj in ("q_proj", "k_proj", "v_proj"):
        path = f"model.layers.0.self_attn.{proj}"
        judged = [g for g in result.groups if path in g.layers and g.problem.n not in (256, 512)]
        last = judged[-1] if judged else alone[-1]
        expected = last.tuned if last.kept else "mlx_qmm"
        name, source = getattr(attn, proj).decision(1, mx.float32)
        assert "siblings" not in source and getattr(attn, proj).kernel is None
        assert name == expected, (proj, name, source, [(g.problem.n, g.kept) for g in judged])


def test_a_sibling_launch_is_judged_against_its_members_alone_on_their_own_kernels(check_env):
    # q/k/v alone would run a host-heavy kernel (their own shapes' decision), so the one
    # launch is faster than that, though not faster than mx.quantized_matmul alone
    # would be: judged against the reference itself it would be replaced.
    model = tiny_lm.converted()
    launches = []
    registry.register(group_candidate("group_fast", 0.0, launches))
    registry.register(Candidate(name="host_heavy", backend="any", op="linear",
                                run=tiny_lm.sleeping_qmm(SLEEP), digest="d-host_heavy", w8a8=False))
    attn = model.model.layers[0].self_attn
    choose_at_m1(check_env, attn.q_proj, "host_heavy")  # 128 x 128; k/v (64 x 128) borrow it
    for layer in model.model.layers:  # o_proj shares q's shape: left out of the check
        layer.self_attn.o_proj.kernel = "mlx_qmm"
    qkv = attrs.evolve(attn.q_proj.problem(1, mx.float32), n=256)
    tiny_lm.record_choice(check_env, qkv, "group_fast")
    registry.register(group_candidate("group_slow", SLEEP, launches))
    tiny_lm.record_choice(check_env, attrs.evolve(qkv, n=512), "group_slow")  # gate + up
    result = tuning.check_decode(model, check_env, steps=3, prompt=4, rounds=3)
    qkv_results = [g for g in result.groups if g.problem == qkv]
    for g in qkv_results:
        assert g.tuned == "group_fast" and g.kept and g.ratio > 1.02
    # gate+up's one launch (512 x 128) is slower than its members alone on their own
    # shape's kernel (group_fast, 256 x 128: the q/k/v sum's entry), so it is replaced,
    # and a second pass judges that entry again with gate and up on it alone.
    gate_up = [g for g in result.groups if g.problem.n == 512]
    assert len(gate_up) == 1 and not gate_up[0].kept
    assert len(qkv_results) == 2 and "(pass 2)" in " ".join(result.seconds)
    assert check_env.lookup(qkv).entry["decode_check"]["kept"]
    assert attn.q_proj.decision(1, mx.float32) == ("group_fast", "table+siblings")


def test_paired_verdict_is_the_checks_rule():
    from mlx_w8a8.tuning.decode_check import paired_verdict

    ratio, low, wins = paired_verdict([1.0] * 4, [0.9] * 4, 200)
    assert ratio == pytest.approx(1 / 0.9) and low == pytest.approx(1 / 0.9) and wins
    assert not paired_verdict([1.0] * 4, [0.99] * 4, 200)[2]  # 1 % faster, 2 % needed
    # a median win with the lower quartile below 1: slower in too many rounds
    assert not paired_verdict([1.0] * 6, [0.7, 0.7, 0.7, 1.3, 1.3, 1.3], 200)[2]
    assert paired_verdict([1.0, 1.0], [0.0, 0.5], 0)[:2] == (2.0, 2.0)  # no time: skipped


def test_extend_unsettled_adds_rounds_only_where_median_and_quartile_disagree():
    from mlx_w8a8.tuning.decode_check import extend_unsettled, paired_verdict, unsettled

    seconds = {"base": [1.0] * 6, "faster": [0.9] * 6, "unsettled": [0.8] * 4 + [1.05] * 2,
               "slower": [1.1] * 6}
    verdicts = {v: paired_verdict(seconds["base"], seconds[v], 200) for v in seconds}
    assert [v for v in seconds if unsettled(*verdicts[v][:2], 200)] == ["unsettled"]
    assert verdicts["unsettled"][0] > 1.02 and verdicts["unsettled"][1] < 1.0
    measured = []

    def measure(name):
        measured.append(name)
        return {"base": 1.0, "unsettled": 0.8}[name]  # any other variant would raise

    pairs = [("base", v) for v in ("faster", "unsettled", "slower")]
    assert extend_unsettled(seconds, pairs, 0, measure, 200) == [] and measured == []
    assert extend_unsettled(seconds, pairs, 6, measure, 200) == ["base", "unsettled"]
    assert sorted(measured) == ["base"] * 6 + ["unsettled"] * 6
    assert {v: len(s) for v, s in seconds.items()} == {"base": 12, "faster": 6,
                                                       "unsettled": 12, "slower": 6}
    # the others are paired with the base's first rounds, their own: verdicts unchanged
    for v in ("faster", "slower"):
        assert paired_verdict(seconds["base"], seconds[v], 200) == verdicts[v]
    # 10 of 12 rounds faster now: the lower quartile is a faster round
    assert paired_verdict(seconds["base"], seconds["unsettled"], 200)[2]


def test_extend_unsettled_pairs_one_variant_with_several_bases():
    # The decode check's shape: one "tuned" variant against each group taken off it. Only
    # the bases whose pair is unsettled run again, "tuned" once per round beside them.
    from mlx_w8a8.tuning.decode_check import extend_unsettled, paired_verdict

    seconds = {"tuned": [1.0] * 6, "off 0": [1.2] * 6, "off 1": [1.25] * 4 + [0.95] * 2,
               "off 2": [1.3] * 4 + [0.9] * 2}
    measured = []

    def measure(name):
        measured.append(name)
        return {"tuned": 1.0, "off 1": 1.25, "off 2": 1.3}[name]

    pairs = [(f"off {i}", "tuned") for i in range(3)]
    assert extend_unsettled(seconds, pairs, 4, measure, 200) == ["off 1", "tuned", "off 2"]
    assert sorted(measured) == ["off 1"] * 4 + ["off 2"] * 4 + ["tuned"] * 4
    assert {v: len(s) for v, s in seconds.items()} == {"tuned": 10, "off 0": 6, "off 1": 10,
                                                       "off 2": 10}
    assert all(paired_verdict(seconds[b], seconds[v], 200)[2] for b, v in pairs)


@pytest.mark.parametrize("extra,kept,rounds", [(None, True, 12), (3, True, 9), (0, False, 6)])
def test_an_unsettled_verdict_is_judged_again_over_extra_rounds(check_env, monkeypatch, extra,
                                                                kept, rounds):
    from mlx_w8a8.tuning import model_timing

    model = tiny_lm.converted()
    registry.register(Candidate(name="fast", backend="any", op="linear", run=QMM.run,
                                digest="d-fast", w8a8=False))
    problem = choose_at_m1(check_env, model.model.layers[0].mlp.down_proj, "fast")
    calls = []
    whole = ["every group on the reference", "every group tuned"]
    monkeypatch.setattr(model_timing, "alternate",
                        tiny_lm.unsettled_then_faster(None, calls, fast=whole[1]))
    result = tuning.check_decode(model, check_env, steps=2, prompt=3, rounds=6,
                                 extra_rounds=extra)
    assert result.groups and result.rounds == 6
    assert all(g.kept is kept and g.rounds == rounds for g in result.groups)
    if extra == 0:
        # unsettled, so not kept as a whole: each group judged alone (at the reference's
        # speed there, as this stand-in times every other variant)
        assert [names for names, _ in calls] == [whole, ["tuned"] + [
            f"without group {i}" for i in range(len(result.groups))]]
    else:
        # one more call: the whole table's two variants, the extra rounds; kept as a whole
        assert calls[1] == (whole, rounds - 6) and len(calls) == 2
    entry = check_env.lookup(problem).entry
    assert entry["decode_check"]["rounds"] == rounds and entry["decode_check"]["kept"] is kept
    assert (f"{rounds} rounds" in result.describe()) is (rounds != 6)


# Batched decode (issue 49): mlx-lm's server decodes B sequences at once, so its linears
# run at M = B; the measured M = 2 .. 64 entries are judged in the model's batched decode.
def batch_sizes_timed(monkeypatch):
    """Record the batch size of every batched decode the check runs (the real loop)."""
    from mlx_w8a8.tuning import model_timing

    seen = []
    real = model_timing.batch_decode

    def spy(model, prompts, steps, loop=None):
        seen.append(int(prompts.shape[0]))
        return real(model, prompts, steps, loop)

    monkeypatch.setattr(model_timing, "batch_decode", spy)
    return seen


def choose_at(tuner, layer, m, name):
    """:func:`choose_at_m1` at M = ``m`` (an entry of the ``m`` bucket choosing ``name``)."""
    problem = layer.problem(m, mx.float32)
    tiny_lm.record_choice(tuner, problem, name)
    return problem


def test_a_kernel_that_slows_the_batched_step_is_replaced_by_the_reference(check_env, monkeypatch):
    model = tiny_lm.converted()
    registry.register(Candidate(name="host_heavy", backend="any", op="linear",
                                run=tiny_lm.sleeping_qmm(SLEEP), digest="d-host_heavy", w8a8=False))
    gate = model.model.layers[0].mlp.gate_proj
    # M = 1 measured and on the reference: only the M = 4 bucket has a tuned choice, so
    # B = 2 (snapping to M = 1 or 4) and B = 8 .. 64 (snapping to 4) are skipped untimed.
    m1 = choose_at(check_env, gate, 1, "mlx_qmm")
    problem = choose_at(check_env, gate, 4, "host_heavy")
    seen = batch_sizes_timed(monkeypatch)
    result = tuning.check_decode(model, check_env, steps=3, prompt=4, rounds=3, extra_rounds=0)
    assert set(seen) == {4} and result.batches == (4,)
    assert sorted((g.problem.n, g.problem.k) for g in result.groups) == [
        (128, 128), (128, 256), (256, 128)]
    for g in result.groups:
        assert g.problem.m == 4 and g.tuned == "host_heavy" and not g.kept and g.ratio < 1.0
    assert all(name.startswith("B = 4 ") for name in result.seconds)
    assert "B = 4 (batched decode, M = 4): 256x128" in result.describe()
    hit = check_env.lookup(problem)
    assert hit.choice == "mlx_qmm" and hit.entry["m_bucket"] == 4
    check = hit.entry["decode_check"]
    assert check["tuned"] == "host_heavy" and not check["kept"] and check["batch"] == 4
    assert "decode_check" not in check_env.lookup(m1).entry  # B = 1 had nothing to judge
    assert gate.decision(4, mx.float32) == ("mlx_qmm", "table")


@pytest.mark.parametrize("group_seconds,kept", [
    ([0.90, 0.92, 0.91, 0.93, 0.90, 0.92], True),   # faster in every round
    ([1.10, 1.08, 1.12, 1.09, 1.10, 1.11], False),  # slower in every round
    ([0.70, 0.70, 0.70, 1.30, 1.30, 1.30], False),  # median 1.1x, slower half the time
])
def test_batched_verdicts_follow_the_b1_rule(check_env, monkeypatch, group_seconds, kept):
    """Controlled timings: B = 1 and B = 8 both judged, by the same rule, each entry at
    its own bucket; the B = 1 verdict carries no batch size (as before batched checks)."""
    from mlx_w8a8.tuning import model_timing

    model = tiny_lm.converted()
    registry.register(Candidate(name="fast", backend="any", op="linear", run=QMM.run,
                                digest="d-fast", w8a8=False))
    down = model.model.layers[0].mlp.down_proj
    p1 = choose_at(check_env, down, 1, "fast")
    p8 = choose_at(check_env, down, 8, "fast")
    calls = []

    def alternate(names, rounds, measure, on_round=None):
        calls.append(len(names))
        return {n: list(group_seconds) if n in ("tuned", "every group tuned") else [1.0] * 6
                for n in names}

    monkeypatch.setattr(model_timing, "alternate", alternate)
    seen = batch_sizes_timed(monkeypatch)
    result = tuning.check_decode(model, check_env, steps=2, prompt=3, rounds=6, extra_rounds=0)
    # B = 2 and 4 snap to the M = 1 or 8 entries, B = 16 .. 64 to the M = 8 one: skipped
    assert set(seen) == {8} and result.batches == (8,)
    # per M: the whole table's two variants, then (not kept as a whole) each group's
    assert {g.problem.m for g in result.groups} == {1, 8}
    assert calls == ([2, 2] if kept else [2, 1 + len(result.groups) // 2] * 2)
    for g in result.groups:
        assert g.kept is kept and g.whole is kept
    for p, batch in ((p1, None), (p8, 8)):
        entry = check_env.lookup(p).entry
        assert entry["decode_check"]["kept"] is kept
        assert entry["decode_check"].get("batch") == batch
        assert entry["choice"] == ("fast" if kept else "mlx_qmm")
    assert any(name.startswith("B = 8 ") for name in result.seconds)
    assert "every group tuned" in result.seconds  # B = 1's variants keep their names


def test_batched_check_can_be_left_out(check_env, monkeypatch):
    model = tiny_lm.converted()
    registry.register(Candidate(name="host_heavy", backend="any", op="linear",
                                run=tiny_lm.sleeping_qmm(SLEEP), digest="d-host_heavy", w8a8=False))
    gate = model.model.layers[0].mlp.gate_proj
    choose_at(check_env, gate, 1, "mlx_qmm")
    problem = choose_at(check_env, gate, 4, "host_heavy")
    seen = batch_sizes_timed(monkeypatch)
    result = tuning.check_decode(model, check_env, steps=2, prompt=3, rounds=2, batches=())
    assert seen == [] and result.groups == () and result.batches == ()
    assert check_env.lookup(problem).choice == "host_heavy"


@pytest.mark.parametrize("batches", [(1,), (3,), (0,), (True,), (2.0,)])
def test_bad_batch_sizes(check_env, batches):
    with pytest.raises(ValueError, match=r"\[mlx_w8a8.check_decode\] batches must be powers of two"):
        tuning.check_decode(tiny_lm.converted(), check_env, batches=batches)


@pytest.mark.parametrize("flag,want", [("on", (1, 2, 4, 8, 16, 32, 64)), ("auto", (1,)),
                                       ("off", ())])
def test_tune_decode_check_flags_cover_the_batched_check(tmp_path, monkeypatch, flag, want):
    """``tune --decode-check on`` runs the batched check too, every batch size with
    ``--check-rounds`` rounds; ``auto`` (here as on a GPU) batch 1 alone, since the
    batched verdicts disagreed with the model's batched decode timed directly
    (tune.batched_checks)."""
    import io

    import types

    from mlx_w8a8 import tune
    from mlx_w8a8.tuning import decode_check

    # the tune command's backend as a GPU's (the table's device key stays this machine's)
    monkeypatch.setattr(tune, "backends", types.SimpleNamespace(name=lambda *a: "cuda"))

    runs = []

    def check_at(m, run, layers, dtypes, tuner, rounds, *args, **kw):
        runs.append((m, rounds))
        return [], {}, 0

    monkeypatch.setattr(decode_check, "_check_at", check_at)
    folder = tiny_lm.config_folder(tmp_path / "tiny-llama")
    out = io.StringIO()
    code = tune.main(["--model", str(folder), "--m", "1", "--decode-check", flag,
                      "--check-rounds", "4", "--sibling-check", "off", "--prefill-check", "off",
                      "--table", str(tmp_path / "t.json"), "--pairs", "3", "--warmup", "1",
                      "--dtype", "float32", "--group-size", "32", "--no-progress"], out=out)
    assert code == 0, out.getvalue()
    assert runs == [(m, 4) for m in want]


def test_batched_check_with_members_alone_on_a_kernel_of_few_rows(check_env):
    # Off, a sibling group's members run alone on their own M = B decisions. Such a
    # decision may be a kernel of few rows (a GEMV: M <= 16), while the batched loop also
    # prefills the B prompts together (M = B x prompt rows): the members must decide
    # there as usual, not be forced onto the M = B kernel (forced, the prefill raised
    # "cannot run linear for M=28" on a GPU, 4-bit GEMV at B = 4).
    model = tiny_lm.converted()
    registry.register(Candidate(name="spy", backend="any", op="linear", run=QMM.run,
                                supports=lambda p: p.m <= 4, digest="d-spy", w8a8=False))
    launches = []
    registry.register(group_candidate("staged", SLEEP, launches))
    attn = model.model.layers[0].self_attn
    choose_at(check_env, attn.q_proj, 4, "spy")  # k/v (64 x 128) borrow it
    qkv = attrs.evolve(attn.q_proj.problem(4, mx.float32), n=256)
    tiny_lm.record_choice(check_env, qkv, "staged")
    for layer in model.model.layers:  # o_proj shares q's shape: left out of the check
        layer.self_attn.o_proj.kernel = "mlx_qmm"
    result = tuning.check_decode(model, check_env, steps=3, prompt=4, rounds=3,
                                 extra_rounds=0, batches=(4,))
    assert launches, "the group launch never ran"
    judged = [g for g in result.groups if g.problem == qkv]
    assert judged and all(g.tuned == "staged" and not g.kept for g in judged)
    assert all(layer.kernel is None for layer in (attn.q_proj, attn.k_proj, attn.v_proj))
    assert attn.q_proj.siblings.enabled  # the check gives the group back as it found it


def test_prompt_tokens_are_the_checks_fixed_distinct_prompts():
    # Every check (and bench/batched_decode_probe.py) times these tokens: a batch's rows
    # must differ (B distinct prompts, as a server's batch), stay below the vocabulary
    # and 256, and row 0 is the single prompt of the decode, sibling and prefill checks.
    from mlx_w8a8.tuning import model_timing

    one = model_timing.prompt_tokens(1000, 9)
    assert one.shape == (1, 9) and one.dtype == mx.uint32
    assert one[0].tolist() == [(7 * i + 3) % 256 for i in range(9)]
    batch = model_timing.prompt_tokens(100, 9, rows=4)
    assert batch.shape == (4, 9) and max(batch.reshape(-1).tolist()) < 100
    assert batch[0].tolist() == [(7 * i + 3) % 100 for i in range(9)]
    assert len({tuple(r) for r in batch.tolist()}) == 4
