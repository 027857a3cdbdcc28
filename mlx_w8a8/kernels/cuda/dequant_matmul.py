"""Dequantize, then MLX's float GEMM (``dequantize.cu``): MLX's affine 8-bit and 4-bit
weights as stored, written out as a float weight of the activation's dtype by one
memory-bound launch, then multiplied by ``x`` with ``mx.matmul`` (cuBLAS, float32
accumulation). The ``cuda_dequant_matmul`` definition.

Not W8A8: the product ``mx.quantized_matmul`` computes, each weight rounded once to the
activation's dtype (``dequant.cuh``), at the float GEMM's speed plus one pass over the
weight. ``mlx_dequant_matmul`` is the same two steps with ``mx.dequantize``: on an NVIDIA
H100 it took 1.01-1.36x this candidate's time at M = 2048 in the same races (docs/cuda.md).

Hazard: the float weight (``N * K`` values of the activation's dtype, 117 MB for a 14336
x 4096 bfloat16 projection) lives while its matmul runs: memory at the model's peak that
a layer running ``mx.quantized_matmul`` does not take (``MLX_W8A8_DEQUANT_MAX_MB`` bounds
it: ``mlx_w8a8.kernels.dequant_matmul``). No rule or table picks it at decode sizes,
where writing the whole weight per token is slow.
"""

from __future__ import annotations

import mlx.core as mx

from ...weight import dtype_name
from .. import registry
from ..dequant_matmul import product, within_temp_limit
from .gemm_dequant import DEQUANT_DTYPES, DEQUANT_GROUP_SIZES, dequant_refusals, dequant_terms
from .kernel import CudaKernel, linear_problem
from .launch import LaunchSpec, _kernel

DEQUANTIZE_FILE = "dequantize.cu"
DEQUANTIZE_THREADS = 256
DEQUANTIZE_CODES = 16  # codes per thread (dequantize.cu)


def dequantize_spec(weight, dtype: mx.Dtype) -> LaunchSpec:
    """The launch writing ``weight`` ``[N, K]`` as ``dtype`` (bfloat16 or float16): no
    activation inputs, one output.

    Raises:
        ValueError: for another dtype or group size, naming the kernel.
    """
    op = "[mlx_w8a8.cuda_dequant_matmul]"
    name = dtype_name(dtype)
    if name not in DEQUANT_DTYPES:
        raise ValueError(f"{op} the activation dtype must be one of {DEQUANT_DTYPES}, "
                         f"got {name}")
    if weight.group_size not in DEQUANT_GROUP_SIZES:
        raise ValueError(f"{op} the group size must be one of {DEQUANT_GROUP_SIZES}, got "
                         f"{weight.group_size}")
    n, k = weight.n, weight.k
    ws, wb = dequant_terms(weight, dtype)
    kern = _kernel(DEQUANTIZE_FILE, "dequantize", ("w", "ws", "wb"), ("y",))
    chunks = n * (k // DEQUANTIZE_CODES)
    blocks = -(-chunks // DEQUANTIZE_THREADS)
    template = [("T", dtype), ("BITS", weight.bits), ("GS", weight.group_size)]
    return LaunchSpec(kern, (weight.q, ws, wb), template, [(n, k)], [dtype],
                      (blocks * DEQUANTIZE_THREADS, 1, 1), (DEQUANTIZE_THREADS, 1, 1))


def dequantize(weight, dtype: mx.Dtype) -> mx.array:
    """``weight`` ``[N, K]`` as a float array of ``dtype``, each value ``T(s q + b)``
    rounded once (:func:`dequantize_spec`)."""
    return dequantize_spec(weight, dtype).launch()[0]


class DequantMatmul(CudaKernel):
    """``cuda_dequant_matmul`` (``linear``, MLX's group-wise affine 8-bit or 4-bit
    weights as stored, group size 32, 64 or 128, bfloat16 or float16 activations; any
    CUDA GPU): the dequantize launch (:meth:`apply`), then ``mx.matmul`` on ``x`` as it
    is (:meth:`run`, :meth:`bind`). Not W8A8; a float weight per call."""

    name = "cuda_dequant_matmul"
    needs = ()
    # Not the W8A8 math (registry.Candidate.w8a8): held to the user-facing tolerance
    # against mx.quantized_matmul, as mlx_qmm.
    w8a8 = False
    formats = ("grouped", "grouped4")

    def refusals(self, p: registry.Problem):
        yield from dequant_refusals(p, self.formats)
        if p.k < 1 or p.k % p.group_size:  # (a group size of DEQUANT_GROUP_SIZES by now)
            yield f"K must be a positive multiple of the group size {p.group_size}, got {p.k}"
        yield within_temp_limit(p)  # 16-bit activations: 2 bytes a weight

    def variant(self, p: registry.Problem):
        # The dequantize kernel's template; cuBLAS compiles nothing per shape.
        return p.dtype, p.weight_format, p.group_size

    def activations(self, p: registry.Problem, lead=None):
        return None, None

    def apply(self, p: registry.Problem, weight, bias, lead=None) -> LaunchSpec:
        """The weight's dequantize launch (it takes no activations): the first of the
        call's two steps."""
        return dequantize_spec(weight, getattr(mx, p.dtype))

    def run(self, x: mx.array, weight, bias) -> mx.array:
        """``x @ dequantize(weight).T (+ bias)``: ``x`` ``[M, K]`` bfloat16/float16,
        ``[M, N]`` in ``x.dtype``."""
        w = self.apply(linear_problem(x, weight, bias), weight, bias).launch()[0]
        return product(x, w, bias)

    def bind(self, p: registry.Problem, weight, bias, lead=None):
        """``(None, None, f)`` with ``f(x) -> y`` for ``x`` ``[*lead, K]``: the bound
        dequantize launch, then ``dequant_matmul.product`` (``CudaKernel.bind``'s contract)."""
        weight_of = self.apply(p, weight, bias, lead).bound(slice(1))
        return None, None, lambda x: product(x, weight_of()[0], bias)
