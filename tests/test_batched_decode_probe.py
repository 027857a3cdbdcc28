"""bench/batched_decode_probe.py on a tiny model on this CPU: every arm timed, the race's
choices at M = B recorded, and the decode check's verdicts printed for the same B."""

import importlib.util
import io
import os
from contextlib import redirect_stdout

import pytest

pytest.importorskip("mlx_lm.models.llama", reason="mlx-lm is part of the test extra")
import tiny_lm  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def load_probe():
    path = os.path.join(HERE, "..", "bench", "batched_decode_probe.py")
    spec = importlib.util.spec_from_file_location("batched_decode_probe", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_probe_times_every_arm_and_runs_the_check(tmp_path, check_env):
    folder = tiny_lm.config_folder(tmp_path / "tiny-llama")
    out = io.StringIO()
    with redirect_stdout(out):
        code = load_probe().main(["--model", str(folder), "--layers", "1", "--batch", "2",
                                  "--steps", "2", "--prompt", "3", "--rounds", "2"])
    text = out.getvalue()
    assert code == 0, text
    # the race at M = 2 for each distinct N x K of the step: lm_head and gate/up, down,
    # q and o, k and v (sibling sums only where a kernel launches groups: not on a CPU)
    races = [ln for ln in text.splitlines() if ln.startswith("B = 2: ") and " -> " in ln]
    assert sorted(ln.split(":")[1].split("->")[0].strip() for ln in races) == [
        "128x64", "256x64", "32x64", "64x128", "64x64"]
    (arms,) = [ln for ln in text.splitlines() if "per step (median of 2 rounds)" in ln]
    timed = [part.split(":")[-1].split()[0] for part in arms.split(",")]
    assert timed == ["qmm", "tuned", "down", "tuned-down", "apart", "apart+down", "qmm-nogc",
                     "tuned-nogc"], arms
    (order,) = [ln for ln in text.splitlines() if "rounds in order (ms per step)" in ln]
    assert all(len(part.split()) == 3 for part in order.split("step): ", 1)[1].split("; ")), order
    (collector,) = [ln for ln in text.splitlines() if "cyclic collector per round" in ln]
    assert "tuned-nogc 0.0 (0)" in collector, collector  # disabled: no collection timed
    assert "(1.00x qmm; rounds " in arms.split(",")[0]
    assert " us per op built" in text.splitlines()[0]
    assert "B = 2: the down projections' gain: added to qmm " in text
    # The check judges what the race chose: its verdicts where a shape left the reference
    # (on a CPU that depends on the race's timing), else nothing to check.
    tuned = [ln for ln in races if not ln.split("->")[1].strip().startswith("mlx_qmm ")]
    if tuned:
        assert "decode check (2 steps x 2 paired rounds" in text
        verdicts = text.split("decode check (", 1)[1]
        assert all(f"{ln.split(':')[1].split('->')[0].strip()} (" in verdicts for ln in tuned), text
    else:
        assert "is the reference; nothing to check" in text, text


def test_collector_clock_times_each_collection_and_counts_full_ones():
    import gc

    clock = load_probe().CollectorClock()
    gc.callbacks.append(clock)
    try:
        gc.collect(0)
        assert clock.full == 0 and clock.seconds > 0
        gc.collect()  # a full collection
        assert clock.full == 1
        clock.reset()
        assert (clock.seconds, clock.full) == (0.0, 0)
    finally:
        gc.callbacks.remove(clock)
