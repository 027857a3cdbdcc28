"""CUDA candidates: one definition per kernel (:class:`.kernel.CudaKernel`), registered
with the tuner. Offered only when ``mx.cuda.is_available()`` and the default device is
the GPU; importing this package never needs CUDA.

Modules, by kernel family: :mod:`.launch` (kernel files, kernel objects, launch specs,
device probes), :mod:`.tiles` (tile shapes and the policies picking them), :mod:`.tma`
(tensor-map prototypes), :mod:`.quantize` (``cuda_quantize`` and the activation
formats), :mod:`.gemm` (``cuda_int8_gemm``, ``cuda_w8a8_gemm``), :mod:`.gemm_ws` (the
warp-specialized and TMA GEMMs: ``cuda_int8_gemm_ws``, ``cuda_int8_gemm_tma``,
``cuda_w8a8_gemm_ws``, ``cuda_w8a8_gemm_tma``), :mod:`.gemm_grouped`
(``cuda_w8a8_gemm_grouped``, ``cuda_w8a8_gemm_grouped_tma``, ``cuda_w4a8_gemm_tma``,
``cuda_act_groups_gemm_tma``, ``cuda_w8a8_gemm_subnormal``, ``cuda_w4a8_gemm_subnormal``),
:mod:`.gemv` (``cuda_int8_gemv``, ``cuda_int8_gemv_mma``, ``cuda_w4a8_gemv``,
``cuda_w4a8_gemv_mma``) and
:mod:`.gemm_dequant` (``cuda_dequant_gemm``: group-wise weights dequantized on chip, the
activations unquantized).
Each definition says what it can run (``can_implement``, with a reason), what it
compiles for a problem (``variant``) and its launches (``activations``, ``apply``,
``apply_group``); ``run``, ``stages``, ``bind_stages``, ``bind_group`` and the
digest of its candidate are derived from it (:mod:`.kernel`).

Measured on an NVIDIA H200 (``docs/cuda.md``); the tuner, not this package, decides where
each candidate runs.
"""

from __future__ import annotations

from .. import registry, tensormap
from . import launch
from .gemm import Int8Gemm, W8A8Gemm
from .dequant_matmul import DequantMatmul
from .gemm_dequant import DequantGemm
from .gemm_grouped import (
    ActGroupsTma,
    W4A8GemmSubnormal,
    W4A8GemmTma,
    W8A8GemmGrouped,
    W8A8GemmGroupedTma,
    W8A8GemmSubnormal,
)
from .gemm_ws import Int8GemmTma, Int8GemmWs, W8A8GemmTma, W8A8GemmWs
from .gemv import Int8Gemv, Int8GemvMma, W4A8Gemv, W4A8GemvMma
from .kernel import CudaKernel, candidate
from .quantize import Quantize

# Every CUDA kernel, in registration order.
KERNELS: tuple[CudaKernel, ...] = (
    Quantize(), Int8Gemm(), Int8GemmWs(), Int8GemmTma(), W8A8Gemm(), W8A8GemmWs(),
    W8A8GemmTma(), W8A8GemmGrouped(), W8A8GemmGroupedTma(), W4A8GemmTma(), ActGroupsTma(),
    W8A8GemmSubnormal(), W4A8GemmSubnormal(), Int8Gemv(), Int8GemvMma(), W4A8Gemv(),
    W4A8GemvMma(), DequantGemm(), DequantMatmul(),
)


def status() -> dict[str, tuple[bool, str]]:
    """``{"cuda_sm90": (on, reason), "cuda_tma": (on, reason)}`` as a user-facing report:
    whether the Hopper kernels (wgmma, warp-specialized) and their TMA form are offered."""
    if not launch.cuda_available():
        return {"cuda_sm90": (False, "no CUDA GPU is MLX's default device"),
                "cuda_tma": (False, "no CUDA GPU is MLX's default device")}
    if not launch.is_sm90():
        return {"cuda_sm90": (False, "the GPU is not compute capability 9.x (sm_90a)"),
                "cuda_tma": (False, "needs sm_90a")}
    why = tensormap.unavailable()
    return {"cuda_sm90": (True, "compute capability 9.x"),
            "cuda_tma": (why is None, why or "tensor maps encodable (CUDA driver through cffi)")}


def register(kernel: CudaKernel) -> registry.Candidate:
    """Register ``kernel``'s candidate, with the capabilities it needs (``status()``)."""
    registry.needs(kernel.name, *kernel.needs)
    return registry.register(candidate(kernel))


for _kernel in KERNELS:
    register(_kernel)
