"""``bench/small_m_gpu_time.py`` without a GPU: its arms at M <= 16 and 17-32 (the dp4a
GEMV only where it runs), the tensor-core GEMV at the shipped depth and row tiles, at
four steps, with each other row-tile count the kernel takes and with four and two warps
a block (recorded launches: the template's D, RT and W, the grid and block), and its
refusals of bad arguments."""

import os
import sys

import numpy as np
import pytest

import mlx.core as mx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))

import small_m_gpu_time  # noqa: E402
from kernel_recorder import record_launches  # noqa: E402

from mlx_w8a8.kernels.cuda import gemv as cuda_gemv, launch  # noqa: E402
from mlx_w8a8.weight import QuantizedWeight  # noqa: E402


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("m,n,names", [
    (16, 48, ["bf16", "qmm", "quantize", "gemv", "mma", "mma4", "mma_r2", "mma_r4", "mma_w4",
              "mma_w2"]),
    (17, 48, ["bf16", "qmm", "quantize", "mma", "mma4", "mma_r2", "mma_w4", "mma_w2"]),
    (32, 4096, None),  # shipped: two row tiles at 8 bits, one at 4
    (32, 14336, None),  # 448 (8-bit, two row tiles) or 896 blocks: two warps a block
])
def test_the_arms(monkeypatch, m, n, names, bits):
    """Each code width's arms launch its own bodies (4 bits: the grouped4 ones, which
    read the packed codes) and mx.quantized_matmul at that width."""
    rec = record_launches(monkeypatch)
    launch._kernel.cache_clear()
    try:
        k = 256
        w = mx.array(np.random.default_rng(0).standard_normal((n, k)).astype(np.float32))
        w = w.astype(mx.bfloat16)
        wq, sq, bq = mx.quantize(w, group_size=64, bits=bits)
        weight = QuantizedWeight(wq, sq, bq, 64, per_channel=False, bits=bits)
        x = mx.array(np.random.default_rng(1).standard_normal((m, k)).astype(np.float32))
        x = x.astype(mx.bfloat16)
        calls = small_m_gpu_time.arms(m, x, w, (wq, sq, bq), weight)
        if names is None:
            other = "mma_r1" if bits == 8 else "mma_r2"
            few = n == 14336  # blocks enough for two warps a block (gemv.mma_warps)
            names = ["bf16", "qmm", "quantize", "mma", "mma4", other,
                     *(["mma_w8", "mma_w4"] if few else ["mma_w4", "mma_w2"])]
        assert list(calls) == names
        want = mx.quantized_matmul(x, wq, sq, bq, transpose=True, group_size=64, bits=bits)
        assert mx.array_equal(calls["qmm"](), want).item()
        body = "w8a8_gemv_mma_grouped4" if bits == 4 else "w8a8_gemv_mma_grouped"
        for name in [name for name in names if name.startswith("mma")]:
            start = len(rec.launches)
            assert calls[name]().shape == (m, n)
            (one,) = rec.launches[start:]
            depth = 4 if name == "mma4" else cuda_gemv.MMA_GEMV_DEPTH
            rows = (int(name[len("mma_r"):]) if name.startswith("mma_r")
                    else cuda_gemv.mma_row_tiles(m, n, bits))
            shipped_w = cuda_gemv.mma_warps(m, n, bits, False, cuda_gemv.mma_row_tiles(m, n, bits))
            warps = int(name[len("mma_w"):]) if name.startswith("mma_w") else shipped_w
            tpl = dict(one["template"])
            assert one["name"].startswith(body)
            assert (tpl["D"], tpl["RT"], tpl["W"]) == (depth, rows, warps)
            assert one["grid"] == (-(-n // (16 * rows)) * 32 * warps, 1, 1)
            assert one["threadgroup"] == (32 * warps, 1, 1)
            assert (one["name"].startswith("w8a8_gemv_mma_grouped4")) == (bits == 4)
    finally:
        launch._kernel.cache_clear()


@pytest.mark.parametrize("argv,why", [
    (["--kn", "4096"], "KxN pairs"),
    (["--kn", "4096x0"], "KxN pairs"),
    (["--m", "33"], "token counts in [1, 32]"),
    (["--bits", "2"], "invalid choice"),
])
def test_bad_arguments_are_refused(capsys, argv, why):
    with pytest.raises(SystemExit):
        small_m_gpu_time.main(argv)
    assert why in capsys.readouterr().err


def test_the_depth_is_two_or_four():
    weight = QuantizedWeight(mx.zeros((16, 16), dtype=mx.uint32), mx.ones((16, 1)), mx.zeros((16, 1)),
                             64, per_channel=False)
    with pytest.raises(ValueError, match=r"\[mlx_w8a8.cuda_int8_gemv_mma\] depth must be 2 or 4, got 3"):
        cuda_gemv.gemv_mma_spec(16, weight, None, mx.bfloat16, depth=3)


@pytest.mark.parametrize("warps", [1, 3, 16])
def test_the_warps_are_two_four_or_eight(warps):
    weight = QuantizedWeight(mx.zeros((16, 16), dtype=mx.uint32), mx.ones((16, 1)), mx.zeros((16, 1)),
                             64, per_channel=False)
    with pytest.raises(ValueError, match=rf"\[mlx_w8a8.cuda_int8_gemv_mma\] warps must be 2, 4 "
                                         rf"or 8, got {warps}"):
        cuda_gemv.gemv_mma_spec(16, weight, None, mx.bfloat16, warps=warps)
