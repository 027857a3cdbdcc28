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


def test_quant_smem_arm_launches_the_quantize_with_that_shared_memory(monkeypatch):
    """``--quant-smem S``'s arm: the row-sum quantize launched with S bytes of dynamic
    shared memory (nothing else about it changed), its outputs fed to the TMA linear's
    bound apply on the launch's weight copy (launches recorded, no GPU)."""
    import mlx.core as mx
    from kernel_recorder import fake_tensor_maps, record_launches

    from mlx_w8a8.kernels.cuda import launch, quantize as cuda_quantize, tma as cuda_tma
    from mlx_w8a8.kernels import registry
    from mlx_w8a8.weight import QuantizedWeight

    rec = record_launches(monkeypatch)
    for c in (launch.load, launch.requires, launch._kernel):
        c.cache_clear()
    monkeypatch.setattr(launch, "is_sm90", lambda: True)
    fake_tensor_maps(monkeypatch)
    tma = registry.get("linear", "cuda_w8a8_gemm_tma")
    problem = registry.Problem("linear", 16, 64, 128, "bfloat16", "per_channel", 64)
    rng = np.random.default_rng(0)
    qws = [QuantizedWeight.from_float(mx.array(rng.standard_normal((64, 128)).astype(np.float32)),
                                      64, per_channel=True) for _ in range(2)]
    try:
        op = chain_timeline.smem_quantize_arm(tma, problem, qws, 2, 17408)
        shipped = cuda_quantize.quantize_spec(16, 128, mx.bfloat16, row_sum=True)
        op(mx.zeros((16, 128), dtype=mx.bfloat16), 1)
    finally:
        for c in (launch.load, launch.requires, launch._kernel, cuda_tma._tma_prototypes):
            c.cache_clear()
    quantize, gemm = rec.launches
    assert quantize["name"].endswith("quantize_rowsum") and quantize["shared_memory"] == 17408
    assert (quantize["grid"], quantize["threadgroup"]) == (shipped.grid, shipped.threadgroup)
    assert gemm["arrays"][0] is not None and len(gemm["arrays"]) > 3
    assert any(a is qws[1].q for a in gemm["arrays"])  # copy i = 1's weight
    assert not any(a is qws[0].q for a in gemm["arrays"])
