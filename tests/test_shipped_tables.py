"""What the shipped tables decide, as a device of that kind would see them: for the
Llama-3-8B projections on the H200 table, decode runs mx.quantized_matmul (where the
per-shape race chose a GEMV, the model's decode check overruled it) and prefill a W8A8
GEMM (bench/results/h200_2026-11-30_s3_d_*)."""

import attrs
import pytest

from mlx_w8a8 import tuning
from mlx_w8a8.kernels import registry
from mlx_w8a8.kernels.registry import Problem
from mlx_w8a8.tuning import table
from mlx_w8a8.tuning.tuner import Tuner

LLAMA_3_8B = [(4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336), (128256, 4096)]


@pytest.fixture
def as_h200(monkeypatch):
    paths = [p for p in table.shipped_table_paths() if p.endswith("nvidia-h200.json")]
    assert paths, "the H200 table ships with the package"
    doc = table.read(paths[0])
    key = {f: doc["sections"][0][f] for f in ("backend", "device", "mlx_version", "package_version")}
    monkeypatch.setattr(table, "device_key", lambda device=None: key)
    # The CUDA candidates are registered everywhere but only available with a GPU
    # (and the wgmma ones with a Hopper GPU).
    from mlx_w8a8.kernels import cuda

    monkeypatch.setattr(cuda, "is_sm90", lambda: True)
    saved = [c for c in registry.all_candidates() if c.backend == "cuda"]
    for c in saved:
        registry.register(attrs.evolve(c, available=lambda: True))
    yield Tuner(use_cache=False, use_shipped=True)
    for c in saved:
        registry.register(c)
    tuning._tuner = None
    tuning.install()


def test_the_h200_table_is_fresh_for_the_kernels_in_this_tree(as_h200):
    # A kernel edit without re-tuning stales the shipped entries: this catches it.
    doc = table.read([p for p in table.shipped_table_paths() if p.endswith("nvidia-h200.json")][0])
    entries = doc["sections"][0]["entries"]
    assert entries and all(as_h200._fresh(e, None) for e in entries)


def test_every_m1_entry_that_overrode_its_race_says_why(as_h200):
    # The decode check is the only thing that may set a choice other than the per-shape
    # race's winner, and it leaves its verdict in the entry.
    doc = table.read([p for p in table.shipped_table_paths() if p.endswith("nvidia-h200.json")][0])
    entries = doc["sections"][0]["entries"]
    assert not [e for e in entries if e["m_bucket"] in (2, 4)], "left out: tables/README.md"
    checked = 0
    for e in entries:
        times = {n: c["median_ns"] for n, c in e["candidates"].items() if "median_ns" in c}
        fastest = min(times, key=times.get)
        check = e.get("decode_check")
        if check is not None:
            checked += 1
            assert e["m_bucket"] == 1 and check["tuned"] != e["reference"]
            assert e["choice"] == (check["tuned"] if check["kept"] else e["reference"])
        elif e["choice"] != e["reference"]:
            assert e["choice"] == fastest  # a challenger only wins by being fastest
    assert checked >= 1


@pytest.mark.parametrize("n, k", LLAMA_3_8B)
def test_decode_runs_quantized_matmul_and_prefill_a_w8a8_gemm(as_h200, n, k):
    problem = lambda m: Problem("linear", m, n, k, "bfloat16", "per_channel", 64)  # noqa: E731
    tuning._tuner = as_h200
    decode = registry.decide(problem(1))
    assert decode[0].name == "mlx_qmm", decode
    name, source = as_h200.decide(problem(2048))
    if (n, k) == (128256, 4096):  # lm_head was not measured at 2048: the prior decides
        assert (name, source) == (None, "none")
    else:
        assert source == "table" and name.startswith("cuda_w8a8_gemm"), (name, source)
