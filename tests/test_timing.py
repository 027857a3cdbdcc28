"""Paired, event-free timing and the selection rule."""

import math
import time

import mlx.core as mx
import pytest

from mlx_w8a8.tuning import timing


def _arm(log, name, sleep_s=0.0, fail_after=None):
    calls = {"n": 0}

    def run(x):
        calls["n"] += 1
        if fail_after is not None and calls["n"] > fail_after:
            raise RuntimeError(f"{name} broke")
        log.append(name)
        if sleep_s:
            time.sleep(sleep_s)
        return x + 1

    return run


INPUTS = [(mx.full((4,), float(i)),) for i in range(3)]


def test_rounds_alternate_order_and_every_arm_gets_a_sample_per_round():
    log = []
    m = timing.paired_measure([("a", _arm(log, "a")), ("b", _arm(log, "b"))], INPUTS,
                              pairs=4, warmup=1, chain=2)
    timed = log[4:]  # warm-up (1 each) and calibration (1 each) come first
    # chain = 2 launches per sample; order A B, then B A, then A B ...
    assert timed == ["a", "a", "b", "b", "b", "b", "a", "a", "a", "a", "b", "b", "b", "b", "a", "a"]
    assert m.chain == 2 and m.rounds == 4
    assert all(len(t.samples_ns) == 4 and t.ok for t in m.timings.values())
    assert len(m.ratios("a", "b")) == 4


def test_slower_arm_has_larger_median_and_time_is_per_launch():
    log = []
    m = timing.paired_measure([("fast", _arm(log, "fast")), ("slow", _arm(log, "slow", 0.004))],
                              INPUTS, pairs=5, warmup=0, chain=3)
    slow, fast = m.timings["slow"], m.timings["fast"]
    # divided by the chain: one 4 ms sleep per launch, not 12 ms per sample
    assert 3.5e6 < slow.median_ns < 11.5e6  # undivided it would be >= 12 ms
    assert fast.median_ns < slow.median_ns / 4
    assert slow.p25_ns <= slow.median_ns <= slow.p75_ns and slow.spread_ns >= 0
    # ratios are other / baseline time per pair (> 1: "slow" took longer); a loaded machine can
    # stall one "fast" sample, so the size is asserted on the median, the sign on all
    ratios = m.ratios("fast", "slow")
    assert all(r > 1 for r in ratios) and sorted(ratios)[len(ratios) // 2] > 4


def test_adaptive_chain_targets_a_sample_time_and_is_capped():
    log = []
    quick = timing.paired_measure([("a", _arm(log, "a"))], INPUTS, pairs=1, warmup=1,
                                  max_chain=7, target_sample_s=10.0)
    assert quick.chain == 7  # a tiny op would need thousands of launches: capped
    slow = timing.paired_measure([("s", _arm(log, "s", 0.01))], INPUTS, pairs=1, warmup=0,
                                 target_sample_s=0.002)
    assert slow.chain == 1  # one launch already exceeds the target


def test_inputs_rotate_between_launches():
    seen = []

    def run(x):
        seen.append(float(x[0].item()))
        return x

    timing.paired_measure([("a", run)], INPUTS, pairs=2, warmup=0, chain=3)
    assert set(seen) == {0.0, 1.0, 2.0}


def test_crashing_arm_is_unavailable_and_the_rest_go_on():
    log = []
    m = timing.paired_measure(
        [("ok", _arm(log, "ok")), ("flaky", _arm(log, "flaky", fail_after=4)),
         ("dead", _arm(log, "dead", fail_after=0))],
        INPUTS, pairs=6, warmup=1, chain=1,
    )
    assert m.timings["ok"].ok and len(m.timings["ok"].samples_ns) == 6
    assert m.timings["flaky"].status == "unavailable" and "flaky broke" in m.timings["flaky"].detail
    assert m.timings["dead"].status == "unavailable" and not m.timings["dead"].samples_ns


def test_argument_errors():
    with pytest.raises(ValueError, match="pairs=0"):
        timing.paired_measure([("a", lambda x: x)], INPUTS, pairs=0)
    with pytest.raises(ValueError, match="0 input tuples"):
        timing.paired_measure([("a", lambda x: x)], [], pairs=1)


def test_select_fastest_prefers_within_the_margin_of_the_fastest():
    ref, pick = "mlx_qmm", timing.select_fastest
    times = {ref: 100.0, "alone": 60.0, "group": 61.0, "group_b": 61.1}
    # 61 * 0.98 <= 60: within the 2 % margin of the fastest -> the preferred one
    assert pick(times, ref, 200, prefer={"group", "group_b"}) == "group"
    assert pick(times, ref, 200) == "alone"  # nothing preferred
    # 62 * 0.98 > 60: clearly slower than the fastest -> the fastest stays
    assert pick({ref: 100.0, "alone": 60.0, "group": 62.0}, ref, 200, prefer={"group"}) == "alone"
    # the preferred one must still beat the reference by the margin
    assert pick({ref: 100.0, "alone": 97.0, "group": 98.5}, ref, 200, prefer={"group"}) == "alone"
    assert pick({ref: 100.0, "alone": 99.0, "group": 99.5}, ref, 200, prefer={"group"}) == ref
    # the fastest already preferred: kept; the reference itself is never "preferred" in
    both = {"group", "other"}
    assert pick({ref: 100.0, "group": 50.0, "other": 51.0}, ref, 200, prefer=both) == "group"
    assert pick({ref: 50.5, "alone": 50.0}, ref, 0, prefer={ref}) == "alone"


def test_select_fastest_keeps_the_incumbent_within_the_margin():
    ref, pick = "mlx_qmm", timing.select_fastest
    times = {ref: 100.0, "ws": 80.3, "tma": 80.7}  # the M = 512 o_proj race, 0.5 % apart
    assert pick(times, ref, 200) == "ws"
    assert pick(times, ref, 200, incumbent="tma") == "tma"  # within 2 %: kept
    assert pick(times, ref, 200, incumbent="ws") == "ws"
    # clearly beaten (82 * 0.98 > 80.3): the fastest replaces it
    assert pick({ref: 100.0, "ws": 80.3, "tma": 82.0}, ref, 200, incumbent="tma") == "ws"
    # the reference on record stays unless a challenger beats it by the margin
    assert pick({ref: 100.0, "ws": 99.0}, ref, 200, incumbent=ref) == ref
    assert pick({ref: 100.0, "ws": 90.0}, ref, 200, incumbent=ref) == "ws"
    # an incumbent within the margin of the fastest must still beat the reference by it
    assert pick({ref: 100.0, "ws": 97.0, "tma": 98.5}, ref, 200, incumbent="tma") == "ws"
    # not timed here (failed the gate, no longer registered): no incumbent
    assert pick(times, ref, 200, incumbent="gone") == "ws"
    assert pick({ref: 100.0, "ws": 80.3, "tma": math.nan}, ref, 200, incumbent="tma") == "ws"
    # a preferred fastest (multi-weight form) is not given up for an incumbent without one
    assert pick(times, ref, 200, prefer={"ws"}, incumbent="tma") == "ws"
    assert pick(times, ref, 200, prefer={"ws", "tma"}, incumbent="tma") == "tma"


def test_select_fastest_requires_the_minimum_improvement():
    ref = "mlx_qmm"
    # slower challenger: never chosen
    assert timing.select_fastest({ref: 100.0, "slow": 150.0}, ref, 200) == ref
    # 1 % faster, 2 % (200 bps) required: the reference stays
    assert timing.select_fastest({ref: 100.0, "marginal": 99.0}, ref, 200) == ref
    # exactly at the margin counts; clearly faster wins
    assert timing.select_fastest({ref: 100.0, "edge": 98.0}, ref, 200) == "edge"
    assert timing.select_fastest({ref: 100.0, "fast": 50.0, "faster": 40.0}, ref, 200) == "faster"
    # zero margin: any gain wins; a tie keeps the reference
    assert timing.select_fastest({ref: 100.0, "marginal": 99.0}, ref, 0) == "marginal"
    assert timing.select_fastest({ref: 100.0, "tie": 100.0}, ref, 0) == ref
    # non-finite times are ignored
    assert timing.select_fastest({ref: 100.0, "nan": float("nan")}, ref, 0) == ref
    with pytest.raises(ValueError, match="min_improvement_bps"):
        timing.select_fastest({ref: 1.0}, ref, -1)


def test_an_arm_far_slower_than_the_fastest_is_timed_in_one_round_only():
    # 50 ms vs ~0: past PRUNE_RATIO and PRUNE_MIN_S even on a loaded machine, so "slow"
    # is pruned after the probe; "ref" (as slow, but kept as the tuner's reference) and
    # "fast" are not.
    log = []
    arms = [("fast", _arm(log, "fast")), ("slow", _arm(log, "slow", 0.05)),
            ("ref", _arm(log, "ref", 0.05))]
    m = timing.paired_measure(arms, INPUTS, pairs=3, warmup=0, chain=1, keep=("ref",),
                              prune_ratio=timing.PRUNE_RATIO)
    assert m.pruned == ("slow",)
    assert len(m.timings["slow"].samples_ns) == 1 and m.timings["slow"].ok
    assert len(m.timings["fast"].samples_ns) == 3 and len(m.timings["ref"].samples_ns) == 3
    assert log.count("slow") == 2  # the probe and round 0
    full = timing.paired_measure(arms, INPUTS, pairs=3, warmup=0, chain=1)  # default: none
    assert full.pruned == () and all(len(t.samples_ns) == 3 for t in full.timings.values())


def test_one_slow_probe_launch_does_not_prune_an_arm():
    # The single launch that sizes the chain is one launch: a hiccup there (50 ms here,
    # once) said nothing of the arm. Pruning on it dropped the true winner of a shipped
    # table's entry (timing.py, PRUNE_RATIO); the first round's whole chain decides.
    log = []
    calls = {"n": 0}

    def spiky(x):
        calls["n"] += 1
        log.append("spiky")
        if calls["n"] == 1:
            time.sleep(0.05)
        return x + 1

    arms = [("fast", _arm(log, "fast")), ("spiky", spiky)]
    m = timing.paired_measure(arms, INPUTS, pairs=3, warmup=0, chain=2,
                              prune_ratio=timing.PRUNE_RATIO)
    assert m.pruned == ()
    assert all(len(t.samples_ns) == 3 for t in m.timings.values())
    assert log.count("spiky") == 1 + 3 * 2  # the probe, then 3 rounds of chains of 2


def test_short_arms_are_never_pruned_on_one_noisy_launch(monkeypatch):
    # Both under PRUNE_MIN_S (raised here so machine load cannot matter): however far
    # apart one launch each says they are, both are timed in every round.
    monkeypatch.setattr(timing, "PRUNE_MIN_S", 10.0)
    log = []
    arms = [("a", _arm(log, "a")), ("b", _arm(log, "b", 0.001))]
    m = timing.paired_measure(arms, INPUTS, pairs=3, warmup=0, chain=1, prune_ratio=1.0)
    assert m.pruned == () and all(len(t.samples_ns) == 3 for t in m.timings.values())


def test_prune_ratio_below_one_is_refused():
    with pytest.raises(ValueError, match="prune_ratio"):
        timing.paired_measure([("a", _arm([], "a"))], INPUTS, prune_ratio=0.5)


def test_linear_link_adds_the_previous_outputs_first_column_to_the_next_activation():
    x = mx.arange(6, dtype=mx.bfloat16).reshape(2, 3)
    y = mx.array([[10.0, 20.0], [30.0, 40.0]])  # float32: the link keeps x's dtype
    w, b = object(), None
    x2, w2, b2 = timing.linear_link(y, (x, w, b))
    assert w2 is w and b2 is None and x2.dtype == mx.bfloat16
    assert x2.tolist() == [[10.0, 11.0, 12.0], [33.0, 34.0, 35.0]]
    # A sibling launch returns a list: its first output feeds the chain.
    assert timing.linear_link([y, y * 2], (x, w, b))[0].tolist() == x2.tolist()


@pytest.mark.parametrize("linked", [True, False])
def test_a_linked_chain_feeds_each_launch_from_the_one_before(linked):
    seen = []

    def run(x, w, b):
        seen.append(x)
        return x[..., :2] * 10

    inputs = [(mx.full((2, 3), float(i)), None, None) for i in range(3)]
    timing.paired_measure([("a", run)], inputs, pairs=1, warmup=0, chain=3,
                          link=timing.linear_link if linked else None)
    chain = seen[1:4]  # the calibration launch, then one sample of 3 launches (start 0)
    assert len(chain) == 3 and chain[0] is inputs[0][0]
    for j in (1, 2):
        want = inputs[j][0] + (chain[j - 1][..., :1] * 10 if linked else 0)
        assert mx.array_equal(chain[j], want).item()
        assert (chain[j] is inputs[j][0]) is not linked
    # Linked, the plausibility check then times UNLINKED_SAMPLES pairs of chains, unlinked
    # and linked alternating, rotating on from where the rounds stopped: every launch of
    # an unlinked chain on an input as given, a linked chain's from its second launch on
    # made from the launch before.
    after = seen[4:]
    assert len(after) == (2 * 3 * timing.UNLINKED_SAMPLES if linked else 0)
    for i, x in enumerate(after):
        kind_linked, position = (i // 3) % 2 == 1, i % 3
        assert (x is inputs[(3 + i) % 3][0]) is not (kind_linked and position > 0), i


def _linked_only_fast(log, sleep_s):
    """An arm that sleeps on an activation as given and not on one the link made: its
    linked chains time faster than the same launches unlinked (what a launch that does
    not run, or a stale measurement, looks like)."""
    def run(x, w, b):
        log.append("lazy")
        if any(x is inp[0] for inp in LINKED_INPUTS):
            time.sleep(sleep_s)
        return x[..., :2] * 10
    return run


LINKED_INPUTS = [(mx.full((2, 3), float(i)), None, None) for i in range(3)]


def test_linked_chains_faster_than_the_unlinked_launches_are_implausible():
    log = []

    def honest(x, w, b):
        time.sleep(0.004)
        return x[..., :2] * 10

    arms = [("honest", honest), ("lazy", _linked_only_fast(log, 0.004))]
    m = timing.paired_measure(arms, LINKED_INPUTS, pairs=3, warmup=0, chain=4,
                              link=timing.linear_link)
    lazy, ok = m.timings["lazy"], m.timings["honest"]
    # The lazy arm sleeps on 1 launch of 4 linked (the chain's first), on 4 of 4 unlinked.
    assert lazy.status == "implausible" and not lazy.ok
    assert "unlinked" in lazy.detail and len(lazy.samples_ns) == 3
    assert lazy.unlinked_ns > timing.IMPLAUSIBLE_RATIO * lazy.median_ns
    assert ok.ok and ok.status == "ok" and ok.unlinked_ns is not None
    assert ok.unlinked_ns < timing.IMPLAUSIBLE_RATIO * ok.median_ns
    # Unlinked, nothing is checked: the same arm is timed and kept as it is.
    free = timing.paired_measure(arms, LINKED_INPUTS, pairs=3, warmup=0, chain=4)
    assert all(t.ok and t.unlinked_ns is None for t in free.timings.values())


def test_a_burst_of_host_load_during_the_check_is_not_implausible():
    """Launches that slow down after the rounds (other work on the host) make the
    unlinked chains slower than the rounds' linked median by far more than the ratio;
    the linked chains timed beside them slow down alike, so the arm stays ``ok``
    (compared with the median alone it was marked implausible)."""
    calls = {"n": 0}

    def arm(x, w, b):
        calls["n"] += 1
        time.sleep(0.001 if calls["n"] <= 1 + 3 * 4 else 0.004)  # the probe and 3 rounds of 4
        return x[..., :2] * 10

    m = timing.paired_measure([("a", arm)], LINKED_INPUTS, pairs=3, warmup=0, chain=4,
                              link=timing.linear_link)
    a = m.timings["a"]
    assert a.unlinked_ns > timing.IMPLAUSIBLE_RATIO * a.median_ns
    assert a.ok and a.status == "ok" and calls["n"] == 1 + 3 * 4 + 2 * 4 * timing.UNLINKED_SAMPLES


def test_the_plausibility_check_skips_pruned_and_failed_arms():
    log = []
    calls = {"n": 0}

    def breaks(x, w, b):
        calls["n"] += 1
        if calls["n"] > 4:  # the probe and the first round's chain of 3
            raise RuntimeError("broke")
        return x[..., :2] * 10

    def slow(x, w, b):
        log.append("slow")
        time.sleep(0.05)
        return x[..., :2] * 10

    arms = [("fast", lambda x, w, b: x[..., :2] * 10), ("slow", slow), ("breaks", breaks)]
    m = timing.paired_measure(arms, LINKED_INPUTS, pairs=2, warmup=0, chain=3,
                              link=timing.linear_link, prune_ratio=timing.PRUNE_RATIO)
    assert m.pruned == ("slow",) and m.timings["slow"].unlinked_ns is None
    assert log.count("slow") == 1 + 3  # the probe and round 0: no unlinked chains
    assert m.timings["breaks"].status == "unavailable" and m.timings["breaks"].unlinked_ns is None
    assert m.timings["fast"].unlinked_ns is not None
