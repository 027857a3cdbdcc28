"""The tuner: per (M, N, K) and device, the fastest numerically acceptable kernel.

Importing this package installs its chooser in the kernel registry, so every op (and
``mlx_w8a8.Linear``) consults the tuning tables. By default a table hit is used and a
miss runs the fallback (``mlx_qmm`` for ``linear``) without measuring; online tuning on
first use is opt-in (:func:`set_online` or ``MLX_W8A8_TUNE=1``).

Public API:

- :func:`set_tuning_table` — name the table read first (and written by tuning).
- :func:`set_online` — measure on a miss, on first use of each shape.
- :func:`tune` — measure one problem now (gate, paired timing, record).
- :func:`tune_model` — measure the distinct linear shapes of a model.
- :func:`lookup` — what the tables say for a problem.
- :func:`reload` — re-read the table files.
- :func:`get_tuner` — the process-wide :class:`Tuner`.

Modules: :mod:`.gate` (numerical gate), :mod:`.timing` (paired timing and selection),
:mod:`.table` (table files and layers), :mod:`.tuner` (lifecycle and chooser),
:mod:`.shapes` (presets, M buckets), :mod:`.active` (the process-wide tuner).
"""

from __future__ import annotations

from ..kernels import registry
from ..kernels.registry import Problem
from .table import TableError, TuningTableWarning
from .tuner import Hit, Outcome, TuneConfig, Tuner
from .active import get_tuner, set_tuning_table, use_tuner
from .batch import tune_model
from .decode_check import DecodeCheck, check_decode
from .sibling_check import SiblingCheck, check_siblings
from .prefill_check import PrefillCheck, check_prefill

__all__ = [
    "Tuner",
    "TuneConfig",
    "Outcome",
    "Hit",
    "TableError",
    "TuningTableWarning",
    "get_tuner",
    "set_tuning_table",
    "set_online",
    "tune",
    "tune_model",
    "check_decode",
    "DecodeCheck",
    "check_siblings",
    "SiblingCheck",
    "check_prefill",
    "PrefillCheck",
    "use_tuner",
    "lookup",
    "reload",
    "install",
]

def set_online(enabled: bool = True, config: TuneConfig | None = None) -> None:
    """Turn online tuning on or off: measure each new shape on first use.

    First use of a shape then blocks while the candidates are gated and timed (seconds
    on a GPU; much longer on a CPU), and the result is recorded in the writable table.

    Args:
        enabled: on or off.
        config: measurement settings (default: :class:`TuneConfig`).
    """
    tuner = get_tuner()
    tuner.online = bool(enabled)
    if config is not None:
        tuner.config = config
    tuner.reload()


def tune(problem: Problem, force: bool = False, weight=None) -> Outcome:
    """Measure ``problem`` now with the process-wide tuner (see :meth:`Tuner.tune`)."""
    return get_tuner().tune(problem, force=force, weight=weight)


def lookup(problem: Problem) -> Hit | None:
    """The usable table entry for ``problem``, or ``None`` (see :meth:`Tuner.lookup`)."""
    return get_tuner().lookup(problem)


def reload() -> None:
    """Re-read every table on the next lookup (after another process tuned)."""
    get_tuner().reload()


def _choose(problem, candidates):
    return get_tuner().choose(problem, candidates)


def install() -> None:
    """Install the tuner's chooser in the kernel registry (done on import)."""
    registry.set_chooser(_choose)


install()
