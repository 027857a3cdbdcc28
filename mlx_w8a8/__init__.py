"""mlx_w8a8: W8A8 (int8 weight x int8 activation) linear layers for MLX.

Public API (the same on every platform; a missing GPU backend only means fewer kernels):

- ``Linear``: drop-in for ``nn.Linear`` / 8-bit ``nn.QuantizedLinear``.
- ``quantize(model)``, ``save(model, path, config)``, ``load(path)``: whole models;
  ``summary(model)`` / ``decisions(model, m)``: which kernel each layer runs and why.
- ``calibrate(model, batches)``, ``smooth(model, stats, alpha)``, ``sensitivity(model,
  batches)`` / ``policy(report, floor)``, ``perplexity(model, data)``: accuracy
  (SmoothQuant, mixed W8A8/W8A16 models; ``python -m mlx_w8a8.convert`` / ``.eval``).
- ``shard(model, group)``: tensor parallelism over ``mx.distributed``
  (``mlx_w8a8.distributed``: the sharded layers, ``shard_linear``, ``rank_shapes``).
- ``quantize_weight``, ``quantize_activation``, ``int8_matmul``, ``w8a8_linear``: ops.
- ``QuantizedWeight``: the weight format (MLX's affine 8-bit layout).
- ``set_tuning_table``, ``set_online_tuning``, ``TuneConfig``, ``TuningTableWarning``:
  the tuner (importing the package installs it in the kernel registry); ``tune_model``
  measures the linear shapes of a model.
- ``warm_up(model, max_tokens)``: compile every kernel the model's layers would launch
  for inputs of 1 to ``max_tokens`` rows, before the first request.
"""

from ._version import __version__

from .weight import QuantizedWeight
from .ops import int8_matmul, quantize_activation, quantize_weight, w8a8_linear
from .nn import Linear
from .quantizer import quantize
from .checkpoint import load, save
from .calibrate import calibrate
from .smooth import smooth
from .sensitivity import policy, sensitivity
from .evaluation import perplexity
from .summary import decisions, summary
from .distributed import shard
from .warmup import warm_up
from .kernels import registry as _registry
from .tuning import TuneConfig, TuningTableWarning, set_tuning_table, tune_model
from .tuning import set_online as set_online_tuning

__all__ = [
    "Linear",
    "quantize",
    "save",
    "load",
    "summary",
    "decisions",
    "calibrate",
    "smooth",
    "sensitivity",
    "policy",
    "perplexity",
    "shard",
    "QuantizedWeight",
    "quantize_weight",
    "quantize_activation",
    "int8_matmul",
    "w8a8_linear",
    "available_kernels",
    "set_tuning_table",
    "set_online_tuning",
    "tune_model",
    "TuneConfig",
    "TuningTableWarning",
    "warm_up",
]


def available_kernels(op: str = "linear") -> list[str]:
    """Names of the candidates registered for ``op`` that can run on this machine: their
    backend is available and every capability they need is on
    (``mlx_w8a8.kernels.capabilities()``; e.g. the TMA kernels need ``cuda_tma``).

    A backend whose module failed to import offers none; then a ``RuntimeWarning``
    names it and its error (also in ``mlx_w8a8.kernels.unavailable()``).
    """
    if op not in _registry.OPS:
        raise ValueError(f"[mlx_w8a8.available_kernels] op must be one of {_registry.OPS}, got {op!r}")
    from . import kernels

    broken = kernels.unavailable()
    if broken:
        import warnings

        warnings.warn(
            "[mlx_w8a8.available_kernels] backends that failed to import: "
            + "; ".join(f"{b} ({reason})" for b, reason in sorted(broken.items())),
            RuntimeWarning,
            stacklevel=2,
        )
    return sorted({c.name for c in _registry.all_candidates()
                   if c.op == op and _registry.available(c)})


# The command-line modules the package once imported, loaded on first access instead
# (PEP 562): ``mlx_w8a8.convert.main`` keeps working after ``import mlx_w8a8``, while
# ``import mlx_w8a8`` imports no command line (``python -m`` would warn that it runs a
# module already in ``sys.modules``).
_ON_ACCESS = ("convert", "eval")


def __getattr__(name: str):
    if name in _ON_ACCESS:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")  # also binds the attribute
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
