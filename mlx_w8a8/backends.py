"""Which MLX backend a call runs on: the package's one probe.

Tuning tables are keyed by it (``tuning.table.device_key``); the CUDA kernels are offered
only where it says ``"cuda"`` (``kernels.cuda``), and so are the CUDA-only limits of
``mx.quantized_matmul`` (``kernels.reference.qmm_supports``) and the server's CUDA hints
(``serving``). Tests that pretend to be on another backend patch :func:`name` or
:func:`on_cuda` here, and every caller sees it.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx


def device(dev: Any = None) -> mx.Device:
    """``dev`` as an ``mx.Device`` (``mx.gpu`` is a type; ``None``: MLX's default device,
    which ``with mx.stream(s)`` sets to the stream's device)."""
    if dev is None:
        return mx.default_device()
    return mx.Device(dev) if isinstance(dev, mx.DeviceType) else dev


def name(dev: Any = None) -> str:
    """``"cpu"``, ``"metal"``, ``"cuda"`` (or ``"gpu"`` for a GPU of neither kind): what
    ``dev`` runs on (default: MLX's default device)."""
    dev = device(dev)
    if dev.type == mx.DeviceType.cpu:
        return "cpu"
    try:
        if mx.metal.is_available():
            return "metal"
    except Exception:  # an MLX without the metal module
        pass
    try:
        if mx.cuda.is_available():
            return "cuda"
    except Exception:  # an MLX without the cuda module (a CPU-only build)
        pass
    return "gpu"


def on_cuda() -> bool:
    """Whether calls run on MLX's CUDA backend now (the default device is a CUDA GPU)."""
    return name() == "cuda"
