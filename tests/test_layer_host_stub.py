"""``bench/layer_host_stub.py`` runs on a CPU in both of its modes (the CUDA launches
stubbed) and reports every arm. It is run in a subprocess: it replaces
``mx.fast.cuda_kernel`` and re-registers the CUDA candidates for the whole process. A
stub that hands back arrays made outside the layers' compiled calls broke the script
(``_Map_base::at`` in MLX's compiler) without any test noticing; this one would."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "bench", "layer_host_stub.py")


def _run(*args) -> dict:
    proc = subprocess.run([sys.executable, SCRIPT, "--hidden", "64", "--inter", "128",
                           "--kv", "32", "--tokens", "8", *args],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("args,arms", [
    (("--blocks", "2", "--calls", "3"), {"bf16", "w8a8_linked", "w8a8_unlinked"}),
    (("--new-shapes", "2", "--layers", "2"), {"bf16", "w8a8_linked"}),
])
def test_both_modes_report_every_arm(args, arms):
    record = _run(*args)
    assert record["bench"] == "layer_host_stub" and record["real"] is False
    assert set(record["per_layer"]) == arms
    for stats in record["per_layer"].values():
        assert 0 < stats["p25_us"] <= stats["median_us"] <= stats["p75_us"]


def test_bad_new_shape_options_are_refused():
    proc = subprocess.run([sys.executable, SCRIPT, "--new-shapes", "2", "--layers", "0"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and "--layers >= 1" in proc.stderr
