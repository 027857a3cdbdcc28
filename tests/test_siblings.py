"""mlx_w8a8.siblings: layers fed the same input (q/k/v, gate/up) run as one launch where
the chosen kernel has a multi-weight form, and every layer still returns what it
computes alone."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

import mlx_w8a8 as w8
from mlx_w8a8 import siblings
from mlx_w8a8.kernels import registry
from mlx_w8a8.kernels.registry import Candidate

QMM = registry.get("linear", "mlx_qmm")


class Attention(nn.Module):
    def __init__(self, k=64, ns=(32, 16, 16), bias=False):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(k, n, bias=bias) for n in ns)
        self.o_proj = nn.Linear(ns[0], k, bias=bias)

    def __call__(self, x):
        return self.q_proj(x), self.k_proj(x), self.v_proj(x)


class Block(nn.Module):
    def __init__(self, bias=False):
        super().__init__()
        self.self_attn = Attention(bias=bias)
        self.mlp = nn.Module()
        self.mlp.gate_proj, self.mlp.up_proj = nn.Linear(64, 96), nn.Linear(64, 96)
        self.mlp.down_proj = nn.Linear(96, 64)


@pytest.fixture
def fused(only_written_tables):
    """A candidate with a multi-weight form, chosen for every problem; records the group
    launches (their x shapes) and each member count."""
    launches = []

    def bind_group(problem, members, lead):
        assert problem.n == sum(w.n for w, _ in members)

        def apply(x):
            launches.append((tuple(x.shape), len(members)))
            x2 = x.reshape(-1, problem.k)
            return [QMM.run(x2, w, b).reshape(*lead, w.n) for w, b in members]
        return None, None, apply

    registry.register(Candidate(name="fused", backend="any", op="linear", run=QMM.run,
                                bind_group=bind_group, w8a8=False))
    previous = registry.set_chooser(lambda problem, found: (registry.get("linear", "fused"), "test"))
    siblings.clear()
    yield launches
    registry.set_chooser(previous)
    registry.unregister("linear", "fused")


def _alone(layer, x):
    """What the layer computes by itself (mx.quantized_matmul on its weight)."""
    return QMM.run(x.reshape(-1, layer.input_dims), layer.quantized_weight,
                   layer.get("bias")).reshape(*x.shape[:-1], layer.output_dims)


def test_link_groups_by_name_and_compatibility():
    block = Block()
    w8.quantize(block, group_size=32)
    attn, mlp = block.self_attn, block.mlp
    assert attn.q_proj.siblings is attn.k_proj.siblings is attn.v_proj.siblings is not None
    assert len(attn.q_proj.siblings) == 3
    assert mlp.gate_proj.siblings is mlp.up_proj.siblings is not None
    assert mlp.gate_proj.siblings is not attn.q_proj.siblings
    assert attn.o_proj.siblings is None and mlp.down_proj.siblings is None
    # a member that differs (here: K) makes no group
    other = Block()
    other.self_attn.v_proj = nn.Linear(32, 16)
    w8.quantize(other, group_size=32)
    assert other.self_attn.q_proj.siblings is None
    assert siblings.link(other) == 1  # gate/up only
    with pytest.raises(ValueError, match="2 to 3 names"):
        siblings.link(other, names=(("q_proj",),))
    with pytest.raises(ValueError, match="siblings must be"):
        other.self_attn.q_proj.siblings = "q"


def test_4bit_members_link_only_with_4bit_members():
    # q/k/v in MLX's 4-bit format form a group; one 8-bit member of the same K, group
    # size and bias (its codes packed another way) makes none, and gate/up still link.
    block = Block()
    nn.quantize(block, group_size=32, bits=4)
    w8.quantize(block)
    attn = block.self_attn
    assert attn.q_proj.bits == 4 and len(attn.q_proj.siblings) == 3
    mixed = Block()
    nn.quantize(mixed, group_size=32, bits=4, class_predicate=lambda p, m: p != "self_attn.v_proj")
    w8.quantize(mixed, group_size=32, per_channel=False)
    v = mixed.self_attn.v_proj
    assert v.bits == 8 and v.format == "grouped" and mixed.self_attn.q_proj.bits == 4
    assert not siblings.compatible([mixed.self_attn.q_proj, v])
    assert mixed.self_attn.q_proj.siblings is None and mixed.mlp.gate_proj.siblings is not None


class LooksLikeLinear(nn.Module):
    """Every attribute link and compatible read, but not a mlx_w8a8.Linear."""

    def __init__(self, k=64, n=32):
        super().__init__()
        self.input_dims, self.output_dims, self.format, self.group_size = k, n, "per_channel", 32


def test_only_layers_of_linear_classes_are_linked():
    """Membership is by class (Linear and its subclasses, e.g. the sharded layers), not by
    the attributes a layer happens to have, nor by a child of the marker's name."""
    from mlx_w8a8 import distributed as tp

    block = Block()
    w8.quantize(block, group_size=32)
    attn = block.self_attn
    attn.q_proj = LooksLikeLinear()
    attn.k_proj.siblings = attn.v_proj.siblings = None  # quantize linked them
    assert siblings.link(block) == 1  # gate/up only
    assert attn.k_proj.siblings is None and attn.v_proj.siblings is None
    attn.q_proj = tp.AllToShardedLinear(64, 32, bias=False, group_size=32,
                                        group=mx.distributed.init())
    attn.q_proj.SIBLING_MEMBER = False  # an instance attribute: a child, the class decides
    assert siblings.link(block) == 2
    assert attn.q_proj.siblings is attn.k_proj.siblings is not None
    duck = LooksLikeLinear()
    duck.SIBLING_MEMBER = True  # an nn.Module is a dict: this is a child entry, not the class
    assert not siblings.member(duck) and siblings.member(w8.Linear(64, 32))


@pytest.mark.parametrize("lead", [(5,), (2, 3), (1, 1, 4)])
@pytest.mark.parametrize("bias", [False, True])
def test_one_launch_per_input_and_each_member_gets_its_own_output(fused, lead, bias):
    block = Block(bias=bias)
    w8.quantize(block, group_size=32)
    attn = block.self_attn
    x = mx.random.normal((*lead, 64))
    q, k, v = attn(x)
    assert fused == [((*lead, 64), 3)]
    for layer, y in zip((attn.q_proj, attn.k_proj, attn.v_proj), (q, k, v)):
        assert y.shape == (*lead, layer.output_dims)
        np.testing.assert_array_equal(np.array(y), np.array(_alone(layer, x)))
    x2 = mx.random.normal((*lead, 64))  # a new input: a new launch
    mx.eval(attn(x2))
    assert len(fused) == 2
    # the memo holds nothing once every member took its output
    assert getattr(attn.q_proj.siblings._memo, "last", None) is None
    assert attn.q_proj.decision(5, mx.float32) == ("fused", "test+siblings")


def test_the_first_member_at_a_new_shape_plans_the_others(fused, monkeypatch):
    # A new prompt length meets q/k/v (and gate/up) one after another with the same x:
    # the first member decides the group launch and plans it for every member, so the
    # others' first call at the shape checks and decides nothing (one decision per group
    # per new shape, not one per member), and still gets its own output.
    block = Block()
    w8.quantize(block, group_size=32)
    attn = block.self_attn
    decided = []
    real = w8.Linear._group_decision

    def spy(layer, m, dtype):
        decided.append((id(layer), m))
        return real(layer, m, dtype)

    monkeypatch.setattr(w8.Linear, "_group_decision", spy)
    for t in (5, 7):
        x = mx.random.normal((1, t, 64))
        q, k, v = attn(x)
        for layer, y in zip((attn.q_proj, attn.k_proj, attn.v_proj), (q, k, v)):
            np.testing.assert_array_equal(np.array(y), np.array(_alone(layer, x)))
    assert decided == [(id(attn.q_proj), 5), (id(attn.q_proj), 7)]
    assert len(fused) == 2
    members = (attn.q_proj, attn.k_proj, attn.v_proj)
    for layer in members:  # shapes met once: no plan kept, none left waiting
        assert layer._plans == {} and layer._cache.handed == {}
    for layer in (attn.k_proj, attn.v_proj):
        assert "M=7: fused (test+siblings)" in repr(layer)
    x = mx.random.normal((1, 7, 64))  # met again: every member keeps its plan
    attn(x)
    assert decided[2:] == [(id(attn.q_proj), 7)] and len(fused) == 3
    for layer in members:
        assert list(layer._plans) == [((1, 7, 64), mx.float32)] and layer._cache.handed == {}


def test_a_reset_drops_the_plans_handed_to_members(fused):
    # The first member at a new shape hands the group plan to the others; a reset of the
    # group (here: a member's kernel forced) must drop those hand-overs with the plans, or
    # the forced member's next call would run the group launch it no longer belongs to.
    block = Block()
    w8.quantize(block, group_size=32)
    attn = block.self_attn
    x = mx.random.normal((1, 5, 64))
    attn.q_proj(x)
    assert list(attn.k_proj._cache.handed) == [((1, 5, 64), mx.float32)]
    attn.k_proj.kernel = "exact"  # _forget: the group resets every member
    for layer in (attn.q_proj, attn.k_proj, attn.v_proj):
        assert layer._cache.handed == {} and layer._plans == {}
    launches = len(fused)
    y = attn.k_proj(x)
    assert len(fused) == launches  # no group launch for the forced member
    assert "M=5: exact (forced)" in repr(attn.k_proj)
    exact = w8.w8a8_linear(x, attn.k_proj.quantized_weight, kernel="exact")
    np.testing.assert_array_equal(np.array(y), np.array(exact))


def test_an_extra_output_of_the_launch_is_not_waited_for(only_written_tables):
    """A group launch may return more than its members' outputs (the TMA launch's
    tensor-map scratch); the memo waits only for the members, so a model that takes
    every member's output never counts a launch as unused and keeps its group."""
    launches = []

    def bind_group(problem, members, lead):
        def apply(x):
            launches.append(1)
            x2 = x.reshape(-1, problem.k)
            ys = [QMM.run(x2, w, b).reshape(*lead, w.n) for w, b in members]
            return ys + [mx.zeros((16,), dtype=mx.uint8)]
        return None, None, apply

    registry.register(Candidate(name="fused_extra", backend="any", op="linear", run=QMM.run,
                                bind_group=bind_group, w8a8=False))
    previous = registry.set_chooser(
        lambda problem, found: (registry.get("linear", "fused_extra"), "test"))
    try:
        siblings.clear()
        block = Block()
        w8.quantize(block, group_size=32)
        attn = block.self_attn
        group = attn.q_proj.siblings
        for _ in range(2 * siblings.MAX_UNUSED):
            x = mx.random.normal((4, 64))
            q, k, v = attn(x)
            assert getattr(group._memo, "last", None) is None
        assert len(launches) == 2 * siblings.MAX_UNUSED
        assert group.enabled and group.unused == 0
        np.testing.assert_array_equal(np.array(v), np.array(_alone(attn.v_proj, x)))
    finally:
        registry.set_chooser(previous)
        registry.unregister("linear", "fused_extra")


def test_members_called_in_any_order_and_twice(fused):
    block = Block()
    w8.quantize(block, group_size=32)
    attn = block.self_attn
    x = mx.random.normal((4, 64))
    v = attn.v_proj(x)
    q = attn.q_proj(x)
    q_again = attn.q_proj(x)  # q already took its output: a second launch, same values
    k = attn.k_proj(x)
    assert len(fused) == 2
    for layer, y in ((attn.q_proj, q), (attn.q_proj, q_again), (attn.k_proj, k), (attn.v_proj, v)):
        np.testing.assert_array_equal(np.array(y), np.array(_alone(layer, x)))


def test_a_member_fed_another_input_runs_alone_and_unused_launches_end_the_group(fused):
    block = Block()
    w8.quantize(block, group_size=32)
    attn = block.self_attn
    x, other = mx.random.normal((4, 64)), mx.random.normal((4, 64))
    k = attn.k_proj(other)  # nothing memoised for `other` from q's launch on x: launches
    np.testing.assert_array_equal(np.array(k), np.array(_alone(attn.k_proj, other)))
    group = attn.q_proj.siblings
    # A model that never feeds the siblings the same x: each launch leaves outputs no
    # sibling takes; once MAX_UNUSED of them left the memo the group stops launching.
    for _ in range(siblings.MAX_UNUSED + 1):
        mx.eval(attn.q_proj(mx.random.normal((4, 64))))
    assert not group.enabled
    assert f"siblings=off after {siblings.MAX_UNUSED} unused launches" in repr(attn.k_proj)
    before = len(fused)
    y = attn.q_proj(x)
    assert len(fused) == before  # alone now: no group launch
    assert attn.q_proj.decision(4, mx.float32)[1] == "test"
    np.testing.assert_array_equal(np.array(y), np.array(_alone(attn.q_proj, x)))


def test_memoised_outputs_go_stale_when_a_weight_changes_or_on_clear(fused):
    block = Block()
    w8.quantize(block, group_size=32)
    attn = block.self_attn
    x = mx.random.normal((3, 64))
    mx.eval(attn.q_proj(x))  # k and v's outputs memoised, from the old weights
    fresh = w8.Linear.from_linear(nn.Linear(64, 16, bias=False), group_size=32)
    attn.k_proj.update({"weight": fresh.weight, "scales": fresh.scales, "biases": fresh.biases})
    k = attn.k_proj(x)  # not the memoised output: a launch with k's new weight
    assert len(fused) == 2
    np.testing.assert_array_equal(np.array(k), np.array(_alone(fresh, x)))
    siblings.clear()  # v's memoised output (from launch 2) is stale now
    v = attn.v_proj(x)
    assert len(fused) == 3
    np.testing.assert_array_equal(np.array(v), np.array(_alone(attn.v_proj, x)))


def test_a_member_gone_makes_the_others_run_alone(fused):
    """A member deleted after the group launched once: the next launch finds it gone,
    forgets the group's plans and runs the remaining members alone."""
    import gc

    block = Block()
    w8.quantize(block, group_size=32)
    attn = block.self_attn
    mx.eval(attn(mx.random.normal((3, 64))))
    assert len(fused) == 1
    q_layer = attn.q_proj
    del attn["k_proj"]
    gc.collect()
    assert q_layer.siblings.members() is None
    x = mx.random.normal((3, 64))
    q = q_layer(x)
    assert len(fused) == 1  # alone now: no group launch
    np.testing.assert_array_equal(np.array(q), np.array(_alone(q_layer, x)))


def test_replaced_weights_rebind_and_forced_kernels_opt_out(fused, rng):
    block = Block()
    w8.quantize(block, group_size=32)
    attn = block.self_attn
    x = mx.random.normal((3, 64))
    mx.eval(attn(x))
    # new weights for k (same format): the next group launch uses them
    fresh = w8.Linear.from_linear(nn.Linear(64, 16), group_size=32)
    attn.k_proj.update({"weight": fresh.weight, "scales": fresh.scales, "biases": fresh.biases})
    x2 = mx.random.normal((3, 64))
    q, k, v = attn(x2)
    np.testing.assert_array_equal(np.array(k), np.array(_alone(attn.k_proj, x2)))
    assert len(fused) == 2
    # arrays swapped without __setitem__ (as mx.compile(inputs=model.state) does): the
    # group's bound launch notices the new identity and binds again
    other = w8.Linear.from_linear(nn.Linear(64, 16, bias=False), group_size=32)
    for name in ("weight", "scales", "biases"):
        dict.__setitem__(attn.v_proj, name, other[name])
    x3 = mx.random.normal((3, 64))
    q, k, v = attn(x3)
    assert len(fused) == 3
    np.testing.assert_array_equal(np.array(v), np.array(_alone(attn.v_proj, x3)))
    np.testing.assert_array_equal(np.array(v), np.array(_alone(other, x3)))
    # a forced kernel on one member: every member runs alone
    attn.v_proj.kernel = "mlx_qmm"
    q, k, v = attn(mx.random.normal((3, 64)))
    assert len(fused) == 3
    assert attn.q_proj.decision(3, mx.float32)[1] == "test"


def test_no_group_where_the_kernel_has_no_multi_weight_form(only_written_tables):
    block = Block()
    w8.quantize(block, group_size=32)
    attn = block.self_attn
    x = mx.random.normal((2, 64))
    q, k, v = attn(x)
    assert "+siblings" not in attn.q_proj.decision(2, mx.float32)[1]
    for layer, y in zip((attn.q_proj, attn.k_proj, attn.v_proj), (q, k, v)):
        alone = w8.Linear.from_weight(layer.quantized_weight, layer.get("bias"))
        np.testing.assert_array_equal(np.array(y), np.array(alone(x)))


def test_launch_together_off_runs_each_member_alone_without_replanning(fused, monkeypatch):
    block = Block()
    w8.quantize(block, group_size=32)
    attn = block.self_attn
    x = mx.random.normal((3, 64))
    mx.eval(attn(x))
    assert len(fused) == 1
    decided = []
    real = registry.decide
    monkeypatch.setattr(registry, "decide", lambda *a: decided.append(a) or real(*a))
    siblings.launch_together(False)
    try:
        for _ in range(2):
            x = mx.random.normal((3, 64))
            outs = attn(x)
            for layer, y in zip((attn.q_proj, attn.k_proj, attn.v_proj), outs):
                np.testing.assert_array_equal(np.array(y), np.array(_alone(layer, x)))
        assert len(fused) == 1  # no group launch while off
        # The shape's second meeting plans the group again (the first call's plans were
        # not kept: plans.PlanCache.keep); each member then decided its own shape once, and
        # the second loop reused every plan.
        assert sorted(a[0].n for a in decided) == [16, 16, 32, 64], decided
    finally:
        siblings.launch_together(True)
    mx.eval(attn(mx.random.normal((3, 64))))
    assert len(fused) == 2 and len(decided) == 4
