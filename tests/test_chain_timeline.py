"""``bench/chain_timeline.py`` on the CPU, its profiler stubbed: which chains each mode
builds (the timings need a CUDA GPU)."""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))

import chain_timeline  # noqa: E402


def test_chain_timeline_linear_modes_run_each_arm(monkeypatch, capsys):
    """``bench/chain_timeline.py --linear`` builds each arm's chains (here on the CPU, the
    profiler stubbed: CUDA arms are not offered): independent, ``mx.depends`` and, for a
    square weight only, a chain whose outputs feed the next launch, each evaluated."""
    calls = []

    def measure(run_chain, chain, rounds, is_torch):
        run_chain(chain)
        calls.append(chain)
        return {"sum": 1.0, "span": 1.0, "wall": 1.0, "busy": 1.0, "n": chain}

    monkeypatch.setattr(chain_timeline, "measure", measure)
    chain_timeline.linear_chains([4], [(64, 64), (64, 32)], chain=3, rounds=1,
                                 rng=np.random.default_rng(0))
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("M=")]
    square = [ln for ln in lines if "N=    64" in ln]
    other = [ln for ln in lines if "N=    32" in ln]
    arm = lambda ln: ln.split()[6]  # noqa: E731  ("M=", m, "K=", k, "N=", n, arm, mode, ...)
    mode = lambda ln: ln.split()[7]  # noqa: E731
    assert {arm(ln) for ln in square} >= {"bf16", "qmm"}
    for name in ("bf16", "qmm"):
        assert sorted(mode(ln) for ln in square if arm(ln) == name) == ["dep", "feed", "indep"]
        assert sorted(mode(ln) for ln in other if arm(ln) == name) == ["dep", "indep"]
    assert calls and all(c == 3 for c in calls)
