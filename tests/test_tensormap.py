"""Tensor-map prototypes (``mlx_w8a8.kernels.tensormap``) without a GPU: sizes the map
cannot describe are refused before the driver is touched, a machine without the driver
(or without ``cffi``) gets a reason instead of a failure, and the package imports either
way. The encoding itself runs where the CUDA driver is (tests/test_cuda.py, TMA tiles)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mlx_w8a8.kernels import tensormap


@pytest.mark.parametrize("rows,k,box", [(0, 128, 128), (4, 8, 128), (4, 136, 128),
                                        (4, 128, 0), (4, 128, 257), (-1, 128, 64)])
def test_sizes_the_map_cannot_describe_are_refused(monkeypatch, rows, k, box):
    # K must be a positive multiple of 16 (the driver's stride rule), a box 1..256 rows.
    def no_driver():
        raise AssertionError("the driver was reached with invalid sizes")

    monkeypatch.setattr(tensormap, "_driver", no_driver)
    with pytest.raises(ValueError, match=r"\[mlx_w8a8.tensormap\].*rows=.*K=.*box_rows="):
        tensormap.prototype.__wrapped__(rows, k, box)


def test_no_driver_is_a_reason_not_an_error(monkeypatch):
    def missing():
        raise OSError("cannot load library 'libcuda.so.1'")

    monkeypatch.setattr(tensormap, "_driver", missing)
    tensormap.unavailable.cache_clear()
    tensormap.prototype.cache_clear()
    try:
        reason = tensormap.unavailable()
        assert reason == "OSError: cannot load library 'libcuda.so.1'"
        assert not tensormap.available()
    finally:
        tensormap.unavailable.cache_clear()


def test_the_package_imports_without_cffi():
    # cffi is only needed to reach the driver: without it the TMA candidates are not
    # offered (the reason names cffi) and everything else imports and registers.
    code = ("import sys; sys.modules['cffi'] = None\n"
            "import mlx_w8a8\n"
            "from mlx_w8a8.kernels import registry, tensormap\n"
            "print(tensormap.unavailable())\n"
            "print(sorted(c.name for c in registry.all_candidates() if c.backend == 'cuda'))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    reason, names = out.stdout.splitlines()
    assert "cffi" in reason and reason.split(":")[0] in ("ImportError", "ModuleNotFoundError"), reason
    assert "cuda_w8a8_gemm_tma" in names and "cuda_w8a8_gemm_ws" in names
