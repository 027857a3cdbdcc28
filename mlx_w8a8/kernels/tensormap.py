"""Tensor-map prototypes for the TMA GEMM (``gemm_ws.cu``'s ``tma_*`` bodies).

A Hopper TMA load reads a 128-byte tensor map: the tensor's address, sizes, strides, the
box it copies and the shared-memory swizzle. MLX passes arrays to a custom kernel as
pointers only, so the map cannot be made on the host whole: this module encodes a
*prototype* per operand with the CUDA driver's ``cuTensorMapEncodeTiled`` (reached
through ``cffi``; everything but the address is right) and the kernel writes the real
address in on the device (``shaders/cuda/tma.cuh``).

Importing this module never needs CUDA or ``cffi``: both are loaded on first use, and
:func:`unavailable` says why they cannot be (no ``cffi``, no ``libcuda``, no
``cuTensorMapEncodeTiled``, an encoding error), so the TMA candidates are simply not
offered there.
"""

from __future__ import annotations

import ctypes.util
import functools

MAP_BYTES = 128
BOX_K = 128  # bytes of K per box row: the 128-byte swizzle's span (gemm_ws.cu kBK)
MAX_BOX_ROWS = 256  # the hardware's limit on a box dimension

# cuda.h values (CUDA 12.0+, unchanged since).
_UINT8 = 0  # CU_TENSOR_MAP_DATA_TYPE_UINT8
_INTERLEAVE_NONE = 0
# CU_TENSOR_MAP_SWIZZLE_* by the swizzle's span in bytes (0: none).
_SWIZZLES = {0: 0, 32: 1, 64: 2, 128: 3}
_L2_PROMOTION_256B = 3
_OOB_FILL_ZEROS = 0  # CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE: out-of-bounds elements read 0
# The prototype's address: a placeholder the kernel replaces (aligned as the driver asks).
_PLACEHOLDER_ADDRESS = 1 << 20

_CDEF = """
typedef int CUresult;
typedef struct { uint64_t opaque[16]; } CUtensorMap;
CUresult cuInit(unsigned int flags);
CUresult cuGetErrorString(CUresult error, const char** str);
CUresult cuTensorMapEncodeTiled(CUtensorMap* tensorMap, int tensorDataType,
                                uint32_t tensorRank, void* globalAddress,
                                const uint64_t* globalDim, const uint64_t* globalStrides,
                                const uint32_t* boxDim, const uint32_t* elementStrides,
                                int interleave, int swizzle, int l2Promotion, int oobFill);
"""


@functools.lru_cache(maxsize=None)
def _driver():
    """``(ffi, lib)`` for the CUDA driver, initialised; raises ``ImportError`` /
    ``OSError`` / ``AttributeError`` / ``RuntimeError`` where there is none."""
    import cffi  # here, not at import: the package imports without it

    ffi = cffi.FFI()
    ffi.cdef(_CDEF)
    name = ctypes.util.find_library("cuda") or "libcuda.so.1"
    lib = ffi.dlopen(name)
    lib.cuTensorMapEncodeTiled  # noqa: B018  (an AttributeError here: a driver before 12.0)
    status = lib.cuInit(0)
    if status != 0:
        raise RuntimeError(f"cuInit failed: {_error(ffi, lib, status)}")
    return ffi, lib


def _error(ffi, lib, status: int) -> str:
    text = ffi.new("const char**")
    if lib.cuGetErrorString(status, text) == 0 and text[0] != ffi.NULL:
        return f"{ffi.string(text[0]).decode()} ({status})"
    return f"CUresult {status}"


@functools.lru_cache(maxsize=None)
def unavailable() -> str | None:
    """Why tensor maps cannot be encoded here, or ``None`` when they can (one encoding
    is tried; cached)."""
    try:
        _driver()
        prototype(128, 128, 128)
    except Exception as error:  # no driver, an old one, or a refused encoding
        return f"{type(error).__name__}: {error}"
    return None


def available() -> bool:
    """Whether :func:`prototype` works here (:func:`unavailable` is ``None``)."""
    return unavailable() is None


@functools.lru_cache(maxsize=4096)
def prototype(rows: int, k: int, box_rows: int, box_k: int = BOX_K,
              swizzle: bool | int = True) -> bytes:
    """The tensor map of a row-major ``[rows, k]`` int8 (or uint8) operand read in boxes
    of ``box_rows`` rows x ``box_k`` bytes of K (128, 128-byte swizzled: what wgmma
    reads; 64 or 32 with the swizzle of that span: the dequantizing GEMM's codes; or
    unswizzled, rows one after another: the 4-bit GEMM's packed codes), zeros past its
    end; the address is a placeholder the kernel replaces.

    Args:
        rows: the operand's rows (M for activations, N for weights), ``>= 1``.
        k: its row length in bytes, a positive multiple of 16 (the driver's stride rule).
        box_rows: rows per box, 1 to 256.
        box_k: bytes of K per box row, a multiple of 16 up to 128 (the swizzle's span
            when swizzled).
        swizzle: ``True`` (the 128-byte swizzle), ``False`` or 0 (none), or the span of
            the swizzle in bytes: 128, 64 or 32.

    Raises:
        ValueError: for sizes the map cannot describe, or when the driver refuses them
            (its error named).
    """
    op = "[mlx_w8a8.tensormap]"
    if rows < 1 or k < 16 or k % 16 or not 1 <= box_rows <= MAX_BOX_ROWS:
        raise ValueError(f"{op} needs rows >= 1, K a positive multiple of 16 and 1 <= "
                         f"box_rows <= {MAX_BOX_ROWS}; got rows={rows}, K={k}, "
                         f"box_rows={box_rows}")
    span = BOX_K if swizzle is True else int(swizzle)
    if span not in _SWIZZLES:
        raise ValueError(f"{op} swizzle must be True, False or a span of "
                         f"{sorted(_SWIZZLES)} bytes, got {swizzle!r}")
    if box_k % 16 or not 16 <= box_k <= BOX_K or (span and box_k != span):
        raise ValueError(f"{op} box_k must be a multiple of 16 up to {BOX_K} (the swizzle's "
                         f"span when swizzled), got box_k={box_k}, swizzle={swizzle}")
    ffi, lib = _driver()
    out = ffi.new("CUtensorMap*")
    status = lib.cuTensorMapEncodeTiled(
        out, _UINT8, 2, ffi.cast("void*", _PLACEHOLDER_ADDRESS),
        ffi.new("uint64_t[2]", [k, rows]), ffi.new("uint64_t[1]", [k]),
        ffi.new("uint32_t[2]", [box_k, box_rows]), ffi.new("uint32_t[2]", [1, 1]),
        _INTERLEAVE_NONE, _SWIZZLES[span], _L2_PROMOTION_256B,
        _OOB_FILL_ZEROS)
    if status != 0:
        raise ValueError(f"{op} cuTensorMapEncodeTiled refused rows={rows}, K={k}, "
                         f"box_rows={box_rows}, box_k={box_k}, swizzle={swizzle}: "
                         f"{_error(ffi, lib, status)}")
    return bytes(ffi.buffer(out, MAP_BYTES))
