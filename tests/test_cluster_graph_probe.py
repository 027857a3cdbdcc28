"""bench/cluster_graph_probe.py's chain check on this CPU: ops that compute pass, an op
that leaves a stale output behind after its first graph (what a launch that did not run
looks like) is counted wrong, and without MLX's CUDA backend the probe says so."""

import os
import sys

import mlx.core as mx
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
import cluster_graph_probe as probe  # noqa: E402


def right_ops():
    return (lambda x: x * 2.0, lambda x: x + 1.0)


def test_ops_that_compute_pass(capsys):
    assert probe.probe(right_ops(), [1, 3], rounds=2) == 0
    text = capsys.readouterr().out
    assert text.count("right") == 8 and "WRONG" not in text


def test_a_stale_output_after_the_first_graph_is_counted(capsys):
    calls = {"n": 0}

    def stale_plain(x):
        # Right in the first chain, then a copy of its input: a kernel that did not run.
        calls["n"] += 1
        return x + 1.0 if calls["n"] == 1 else mx.array(x)

    clustered, _ = right_ops()
    wrong = probe.probe((clustered, stale_plain), [1], rounds=3)
    assert wrong == 2
    assert capsys.readouterr().out.count("WRONG (largest error 1)") == 2


def test_the_chain_compares_every_link():
    # A chain whose third output alone is off: the error is that output's.
    n = {"i": 0}

    def third_off(x):
        n["i"] += 1
        return x + (1.5 if n["i"] == 3 else 1.0)

    assert probe.chain(third_off, np.zeros(4, np.float32), 4, lambda r: r + 1.0) == 0.5


def test_without_cuda_it_says_so(capsys):
    assert probe.main(["--lengths", "1"]) == 2
    assert "needs MLX's CUDA backend" in capsys.readouterr().err
