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


@pytest.mark.parametrize("box_k,swizzle", [(64, True), (8, False), (72, False), (144, False), (0, False),
                                           (32, 64), (64, 32), (128, 64), (64, 48)])
def test_box_widths_the_map_cannot_describe_are_refused(monkeypatch, box_k, swizzle):
    # A box row is a multiple of 16 bytes up to 128, and exactly the swizzle's span when
    # swizzled (128, 64 or 32 bytes; the 4-bit GEMM's packed boxes are 64 bytes,
    # unswizzled); no other span exists.
    def no_driver():
        raise AssertionError("the driver was reached with an invalid box")

    monkeypatch.setattr(tensormap, "_driver", no_driver)
    with pytest.raises(ValueError, match=r"\[mlx_w8a8.tensormap\] (box_k|swizzle) .*got"):
        tensormap.prototype.__wrapped__(256, 512, 128, box_k, swizzle)


def test_an_unswizzled_64_byte_box_reaches_the_driver(monkeypatch):
    calls = []

    class Lib:
        def cuTensorMapEncodeTiled(self, out, dtype, rank, addr, dims, strides, box, elem,
                                   interleave, swizzle, l2, oob):
            calls.append((list(dims), list(box), swizzle))
            return 0

    import cffi
    ffi = cffi.FFI()
    ffi.cdef(tensormap._CDEF)
    monkeypatch.setattr(tensormap, "_driver", lambda: (ffi, Lib()))
    tensormap.prototype.__wrapped__(4096, 2048, 128, 64, False)
    tensormap.prototype.__wrapped__(4096, 4096, 128)
    # The dequantizing GEMM's codes: 64- and 32-byte boxes with the swizzle of that span.
    tensormap.prototype.__wrapped__(4096, 4096, 128, 64, 64)
    tensormap.prototype.__wrapped__(4096, 2048, 128, 32, 32)
    assert calls == [([2048, 4096], [64, 128], 0), ([4096, 4096], [128, 128], 3),
                     ([4096, 4096], [64, 128], 2), ([2048, 4096], [32, 128], 1)]


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
