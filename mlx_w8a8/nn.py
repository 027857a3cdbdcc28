"""``mlx_w8a8.Linear``: a W8A8 drop-in for ``nn.Linear`` and 8-bit ``nn.QuantizedLinear``."""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn

from . import ops
from .weight import QuantizedWeight, check_group_size


class Linear(nn.Module):
    """Applies ``y = x @ W.T + b`` with ``W`` an 8-bit weight, activations quantized to
    int8 per token where the chosen kernel is a W8A8 one.

    Its parameters are those of an 8-bit ``nn.QuantizedLinear`` (``weight`` ``[N, K //
    4]`` uint32, ``scales``, ``biases`` ``[N, K // group_size]``, optional ``bias``
    ``[N]``), so a model saved with it loads in stock mlx-lm as an 8-bit model and an
    mlx-lm 8-bit checkpoint loads into it.

    Which kernel runs is decided per call by the tuner (a tuning-table hit, else the
    reference ``mx.quantized_matmul``); set ``layer.kernel`` to a candidate name to
    force one (``"reference"`` is the exact W8A8 math on any device).

    Args:
        input_dims: K, the input features.
        output_dims: N, the output features.
        bias: whether to add a learned bias. Default: ``True``.
        group_size: 32, 64 or 128, dividing ``input_dims``. Default: ``64``.
        per_channel: initialise a symmetric per-channel int8 weight (the format int8
            GEMM runs on directly) rather than group-wise affine. Default: ``True``.
    """

    def __init__(
        self,
        input_dims: int,
        output_dims: int,
        bias: bool = True,
        group_size: int = 64,
        per_channel: bool = True,
    ):
        super().__init__()
        for label, value in (("input_dims", input_dims), ("output_dims", output_dims)):
            if not isinstance(value, int) or value <= 0:
                raise ValueError(
                    f"[mlx_w8a8.Linear] {label} must be a positive int, got {value!r}"
                )
        check_group_size("mlx_w8a8.Linear", group_size, input_dims)
        scale = math.sqrt(1.0 / input_dims)
        w = mx.random.uniform(low=-scale, high=scale, shape=(output_dims, input_dims))
        self._set_weight(QuantizedWeight.from_float(w, group_size, per_channel))
        if bias:
            self.bias = mx.zeros((output_dims,))
        self.kernel = None
        self.freeze()

    def _set_weight(self, qw: QuantizedWeight) -> None:
        self.weight, self.scales, self.biases = qw.q, qw.scales, qw.biases
        self.group_size, self.bits, self.mode = qw.group_size, 8, "affine"
        self._quantized = qw

    @property
    def quantized_weight(self) -> QuantizedWeight:
        """The layer's weight as a :class:`QuantizedWeight`.

        Rebuilt (detecting per-channel symmetry once, a host read) only when the
        parameter arrays were replaced, e.g. by ``load_weights`` or ``update``.
        """
        qw = self._quantized
        if qw.q is not self.weight or qw.scales is not self.scales or qw.biases is not self.biases:
            qw = QuantizedWeight(self.weight, self.scales, self.biases, self.group_size)
            self._quantized = qw
        return qw

    def _extra_repr(self) -> str:
        qw = self.quantized_weight
        return (
            f"input_dims={qw.k}, output_dims={qw.n}, bias={'bias' in self}, "
            f"group_size={qw.group_size}, format={qw.format}"
        )

    def __call__(self, x: mx.array) -> mx.array:
        """Args:
            x: ``[..., K]`` float16/bfloat16/float32.

        Returns:
            ``[..., N]`` in ``x.dtype``.
        """
        return ops.w8a8_linear(x, self.quantized_weight, self.get("bias"), kernel=self.kernel)

    @classmethod
    def from_linear(
        cls, layer: nn.Module, group_size: int = 64, per_channel: bool = True
    ) -> "Linear":
        """Convert an ``nn.Linear`` or an 8-bit affine ``nn.QuantizedLinear``.

        Args:
            layer: the layer. An ``nn.Linear`` is quantized (``per_channel`` picks
                symmetric per-channel int8 or group-wise affine); an 8-bit
                ``nn.QuantizedLinear`` keeps its weights exactly (its own group size).
            group_size: for ``nn.Linear`` only: 32, 64 or 128, dividing K.
            per_channel: for ``nn.Linear`` only.

        Raises:
            ValueError: for other layer types, other bit widths or modes.
        """
        op = "mlx_w8a8.Linear.from_linear"
        if isinstance(layer, nn.QuantizedLinear):
            if layer.bits != 8 or getattr(layer, "mode", "affine") != "affine":
                raise ValueError(
                    f"[{op}] only 8-bit affine QuantizedLinear layers convert, got "
                    f"bits={layer.bits}, mode={getattr(layer, 'mode', 'affine')!r}"
                )
            qw = QuantizedWeight(layer.weight, layer.scales, layer.biases, layer.group_size)
        elif isinstance(layer, nn.Linear):
            qw = QuantizedWeight.from_float(layer.weight, group_size, per_channel)
        else:
            raise ValueError(
                f"[{op}] layer must be an nn.Linear or an 8-bit nn.QuantizedLinear, "
                f"got {type(layer).__name__}"
            )
        out = cls.__new__(cls)
        nn.Module.__init__(out)
        out._set_weight(qw)
        if "bias" in layer:
            out.bias = layer.bias
        out.kernel = None
        out.freeze()
        return out
