"""``mlx_dequant_matmul``: MLX's affine weights dequantized for the call, then MLX's
float matmul (W8A16 or W4A16, on every device MLX has).

``y = x @ mx.dequantize(w).T (+ bias)``: one ``mx.dequantize`` of the stored codes,
scales and biases (8-bit ``grouped`` or 4-bit ``grouped4`` weights, any group size),
then one ``mx.matmul``, the GEMM MLX runs for float weights: in the activation's dtype on a
GPU (whose GEMMs accumulate in float32), in float32 on the CPU (MLX 0.32.4's CPU matmul
in bfloat16 was measured 1.3% off the float64 product at K = 256, far outside the W8A16
bound of ``check.linear_w8a16``). The weights stay as stored; the float weight is a
temporary of the call.

Why it exists: at prefill sizes MLX's ``quantized_matmul`` runs far below MLX's own
float GEMM on CUDA (0.2-0.3x of it at M = 2048 on Llama-3-8B's shapes, MLX 0.32.4) and
on the CPU, while dequantizing a weight costs one pass over it (read the codes, write
``N * K`` floats). So past some M the two ops beat the fused one; where that M lies the
tuner measures (the gate holds it to the user tolerance against float64, as
``mlx_qmm``: it is not W8A8).

Hazard: the dequantized weight is ``N * K`` elements of the scales' dtype, alive while
its matmul runs (e.g. 117 MB for a 14336 x 4096 bfloat16 projection): a model whose
layers run this candidate needs that much more memory at its peak, once per layer that
runs at a time. At decode sizes it is slow (a full weight written per token), which is
why no rule or table picks it there. ``MLX_W8A8_DEQUANT_MAX_MB`` bounds that float weight
for this candidate and ``cuda_dequant_matmul`` (:func:`within_temp_limit`): a layer whose
weight would exceed it is refused, so its decision falls to the next kernel (a table's
choice that cannot run is passed over; a prior rule names the next).
"""

from __future__ import annotations

import os

import mlx.core as mx

from .. import backends
from ..weight import GROUPED4
from . import registry, sources

NAME = "mlx_dequant_matmul"
# Environment variable: the largest float weight, in MiB (2^20 bytes), that a
# dequantize-then-matmul kernel may make for one call; unset: no bound; 0: never.
ENV_MAX_MB = "MLX_W8A8_DEQUANT_MAX_MB"


def temp_limit_bytes() -> int | None:
    """The bound of :data:`ENV_MAX_MB` in bytes, ``None`` where unset.

    Raises:
        ValueError: for a value that is not a non-negative number.
    """
    text = os.environ.get(ENV_MAX_MB, "").strip()
    if not text:
        return None
    try:
        mb = float(text)
    except ValueError:
        mb = -1.0
    if not mb >= 0:
        raise ValueError(f"[mlx_w8a8.dequant_matmul] {ENV_MAX_MB} must be a non-negative "
                         f"number of MiB, got {text!r}")
    return int(mb * (1 << 20))


def within_temp_limit(problem, itemsize: int = 2) -> str | None:
    """Why ``problem``'s float weight (``N * K`` values of ``itemsize`` bytes) exceeds
    :data:`ENV_MAX_MB`, or ``None`` where it does not (read when a layer decides)."""
    limit = temp_limit_bytes()
    need = problem.n * problem.k * itemsize
    if limit is None or need <= limit:
        return None
    return (f"its float weight ({need / (1 << 20):.1f} MiB for N = {problem.n}, "
            f"K = {problem.k}) exceeds {ENV_MAX_MB} = {os.environ[ENV_MAX_MB]}")


def _itemsize(problem) -> int:
    """Bytes per value of the float weight: the matmul's dtype (:func:`_compute_dtype`)."""
    return _compute_dtype(getattr(mx, problem.dtype)).size


def _compute_dtype(dtype: mx.Dtype) -> mx.Dtype:
    """The matmul's dtype for activations of ``dtype``: float32 on the CPU."""
    return mx.float32 if backends.name() == "cpu" else dtype


def supports(problem) -> bool:
    """Group-wise affine weights (``grouped``, ``grouped4``) of any group size; on CUDA
    not where a weight row is one group (``K <= group size``), the shape at which MLX
    0.32.4's CUDA ``quantized_matmul`` was measured wrong (``reference.qmm_supports``):
    ``mx.dequantize`` there has not been measured, so it is not offered."""
    if problem.weight_format not in ("grouped", GROUPED4):
        return False
    if within_temp_limit(problem, _itemsize(problem)) is not None:
        return False
    return not (backends.on_cuda() and problem.k <= (problem.group_size or 0))


def can_implement(problem) -> tuple[bool, str]:
    """``supports`` with the reason a user reads (``registry.refusal``)."""
    if problem.weight_format not in ("grouped", GROUPED4):
        return False, (f"it takes group-wise affine weights (weight_format 'grouped' or "
                       f"'{GROUPED4}'), got {problem.weight_format!r}")
    if (why := within_temp_limit(problem, _itemsize(problem))) is not None:
        return False, f"[mlx_w8a8.{NAME}] {why}"
    if not supports(problem):
        return False, (f"K = {problem.k} is one group of {problem.group_size} per weight "
                       f"row, a shape not measured on CUDA; K must exceed the group size")
    return True, ""


def linear(x: mx.array, weight, bias: mx.array | None) -> mx.array:
    """``x @ weight.dequantize().T (+ bias)``.

    Args:
        x: ``[M, K]`` float16/bfloat16/float32.
        weight: a group-wise :class:`mlx_w8a8.weight.QuantizedWeight` (8 or 4 bits).
        bias: ``[N]`` or ``None``.

    Returns:
        ``[M, N]`` in ``x.dtype``.
    """
    return product(x, weight.dequantize(), bias, _compute_dtype(x.dtype))


def product(x: mx.array, w: mx.array, bias, at: mx.Dtype | None = None) -> mx.array:
    """``x @ w.T (+ bias)`` computed in ``at`` (default ``x.dtype``), returned in
    ``x.dtype``: the second step of both dequantize-then-matmul candidates.

    Args:
        x: ``[..., K]`` float; w: ``[N, K]`` float (any dtype: cast to ``at``);
        bias: ``[N]`` or ``None``.
    """
    at = x.dtype if at is None else at
    if w.dtype != at:
        w = w.astype(at)
    y = mx.matmul(x if x.dtype == at else x.astype(at), w.T)
    if bias is not None:
        y = y + bias
    return y if y.dtype == x.dtype else y.astype(x.dtype)


def bind(layer, problem):
    """``x -> y`` for ``layer`` (an ``mlx_w8a8.Linear``) on ``x`` ``[..., K]``: the same
    two ops as :func:`linear`, the layer's arrays read at call time (``registry``'s
    ``bind`` contract)."""
    group, bits = layer.group_size, problem.bits
    at = _compute_dtype(getattr(mx, problem.dtype))
    has_bias = problem.has_bias

    def run(x):
        w = mx.dequantize(layer["weight"], layer["scales"], layer["biases"], group, bits)
        return product(x, w, layer["bias"] if has_bias else None, at)
    return run


registry.register(
    registry.Candidate(
        name=NAME,
        backend="any",
        op="linear",
        run=linear,
        bind=bind,
        supports=supports,
        can_implement=can_implement,
        digest=sources.closure_digest(
            (linear, bind, supports, _compute_dtype, _itemsize), (__name__,),
            params=f"mx.dequantize + mx.matmul {mx.__version__}"),
        w8a8=False,
    )
)
