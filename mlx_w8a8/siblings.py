"""Sibling layers: ``mlx_w8a8.Linear`` layers a model feeds the same input (q/k/v,
gate/up), computed by one kernel launch.

A model written for MLX calls ``q_proj(x)``, ``k_proj(x)``, ``v_proj(x)`` one after the
other. Each call is a launch with its own host cost, and the small ones (k/v of a
grouped-query model: N = 1024) leave most of a GPU idle. Where the kernel chosen for the
siblings' summed shape (``N = sum N_g``) has a multi-weight form
(``registry.Candidate.bind_group``), the first sibling called launches it once for all of
them; the others take their outputs from the group's per-thread memo of its last launch,
keyed by the identity of ``x``. So the result of every call is what the layer alone
computes; only the number of launches changes. A member's new weight (or :func:`clear`)
makes the memoised outputs stale.

Safety: a sibling called with a different ``x`` (a model that does not feed them the same
input) finds nothing in the memo and launches the group itself. Outputs that no sibling
took are counted when the group's next launch replaces them; after :data:`MAX_UNUSED`
such launches the group stops launching together (its siblings run alone from then on),
so a wrong guess costs a few launches, never results.

:func:`link` finds siblings by name (:data:`NAMES`): children of one module with those
names, all ``mlx_w8a8.Linear`` with the same K, weight format, group size and bias
presence. :func:`mlx_w8a8.quantize`, :func:`mlx_w8a8.load` and :func:`mlx_w8a8.shard`
link the model they return.
"""

from __future__ import annotations

import threading
import weakref

import mlx.nn as nn

from .kernels.cuda.launch import MAX_SIBLINGS  # importing it never needs CUDA

# Child names of one module that models feed the same input, in call order.
NAMES = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
# Members of one group: the kernels' multi-weight bodies take 2 or 3 (gemm_ws.cu).
MAX_MEMBERS = MAX_SIBLINGS
# Launches whose outputs some sibling never took, before the group stops launching together.
MAX_UNUSED = 8
# Each group memoises its last launch per thread (input, outputs, members yet to take
# theirs); clear() makes every memoised launch stale at once.
_epoch = 0
# launch_together(False): every member runs alone (to measure what the group launch saves).
_TOGETHER = True


def launch_together(enabled: bool = True) -> None:
    """Let linked siblings run as one launch (the default) or make each run alone, as
    if unlinked, with the kernel decided for its own shape: what the group launches save
    (``python -m mlx_w8a8.bench --model ... --unlinked``). Applies to later calls; the
    layers keep their plans, so switching costs nothing per call."""
    global _TOGETHER
    _TOGETHER = bool(enabled)
    clear()


def together() -> bool:
    """Whether linked siblings run as one launch now (:func:`launch_together`)."""
    return _TOGETHER


def arrays(layers) -> list:
    """The parameter arrays of ``layers`` (weight, scales, biases, bias or ``None``, per
    layer): a bound launch holds them and is bound again when one is replaced
    (:meth:`Siblings.holds` compares against this layout)."""
    out = []
    for layer in layers:
        out += (layer["weight"], layer["scales"], layer["biases"], layer.get("bias"))
    return out


class Siblings:
    """Layers fed the same input that may run as one launch.

    Holds its members weakly (each member holds the group: ``layer.siblings``). The plans
    the members make for a group launch live in the members' plan caches; this object
    keeps what they share: the launch bound per input shape and dtype, the last launch's
    outputs per thread (:meth:`put`, :meth:`take`) and the count of launches whose
    outputs went unused.
    """

    def __init__(self, layers):
        self._refs = tuple(weakref.ref(layer) for layer in layers)
        self._all = (1 << len(self._refs)) - 1  # one pending bit per member
        self.bound: dict = {}  # (shape, dtype) -> state shared by the members' plans
        self._memo = threading.local()  # .last: [x, outputs, pending bits, stamp]
        self.generation = 0  # bumped by reset(): outputs memoised before are stale
        self.unused = 0
        self.enabled = True

    def __len__(self) -> int:
        return len(self._refs)

    def members(self):
        """The member layers, or ``None`` when one of them no longer exists."""
        layers = [ref() for ref in self._refs]
        for layer in layers:
            if layer is None:
                return None
        return layers

    def holds(self, held) -> bool:
        """Whether every member exists and holds exactly ``held`` (:func:`arrays` of the
        members), compared in place without building the list."""
        i = 0
        for ref in self._refs:
            layer = ref()
            if (layer is None or layer["weight"] is not held[i]
                    or layer["scales"] is not held[i + 1]
                    or layer["biases"] is not held[i + 2]
                    or layer.get("bias") is not held[i + 3]):
                return False
            i += 4
        return True

    def index(self, layer) -> int:
        for i, ref in enumerate(self._refs):
            if ref() is layer:
                return i
        raise ValueError("[mlx_w8a8.siblings] layer is not a member of this group")

    def reset(self) -> None:
        """Forget the shared launches, the memoised outputs (a member's weight may have
        changed since) and every member's plans (they re-decide)."""
        self.bound.clear()
        self.generation += 1
        for ref in self._refs:
            layer = ref()
            if layer is not None:
                layer._cache.drop()

    def _unused_launch(self) -> None:
        self.unused += 1
        if self.unused >= MAX_UNUSED and self.enabled:
            self.enabled = False
            self.reset()

    def put(self, x, outputs, taken: int) -> None:
        """Memoise ``outputs`` of a launch on ``x`` (this thread); member ``taken`` has
        its own. A previous launch some member never took counts as unused."""
        stamp = (_epoch, self.generation)
        last = getattr(self._memo, "last", None)
        if last is not None and last[2] and last[3] == stamp:
            self._unused_launch()
        # One bit per member, whatever else the launch returned: a bit no member can
        # clear would count every later launch as unused and end the group.
        pending = self._all & ~(1 << taken)
        self._memo.last = [x, outputs, pending, stamp] if pending else None

    def take(self, x, i: int):
        """Member ``i``'s output of the last launch in this thread if it was on this very
        ``x`` and ``i`` has not taken it yet, else ``None``."""
        last = getattr(self._memo, "last", None)
        if (last is None or last[0] is not x or not last[2] >> i & 1
                or last[3] != (_epoch, self.generation)):
            return None
        last[2] &= ~(1 << i)
        if not last[2]:
            self._memo.last = None  # every member took its output: nothing held
        return last[1][i]


def clear() -> None:
    """Make every group's memoised launch stale, in every thread: later lookups miss
    (each group holds at most its last launch per thread until its next one)."""
    global _epoch
    _epoch += 1


def compatible(layers) -> bool:
    """Whether ``layers`` (``mlx_w8a8.Linear``) agree in K, format, code width, group
    size, activation scaling, outlier channels and bias presence, as one launch needs (a
    4-bit layer never runs with 8-bit ones: their codes are packed differently; the
    launch reads one masked input)."""
    first = layers[0]
    key = lambda layer: (layer.input_dims, layer.format, getattr(layer, "bits", 8),  # noqa: E731
                         layer.group_size, getattr(layer, "act_scales", "token"),
                         getattr(layer, "outliers", None), "bias" in layer)
    return all(key(layer) == key(first) for layer in layers)


def member(layer) -> bool:
    """Whether ``layer`` can be linked in a group: its class says so with
    ``SIBLING_MEMBER = True`` (``mlx_w8a8.Linear`` and its subclasses, the sharded
    layers of :mod:`mlx_w8a8.distributed` included). Read from the class, so a child
    module or parameter of that name in an ``nn.Module`` (a dict) never counts, and this
    module needs no import of :mod:`mlx_w8a8.nn` (which imports this module)."""
    return getattr(type(layer), "SIBLING_MEMBER", False) is True


def named_groups(model: nn.Module, names=NAMES):
    """``(path, names, children)`` for every module of ``model`` that has all the children
    of one tuple of ``names`` (whatever their type): the places siblings may be."""
    for path, module in model.named_modules():
        for group in names:
            children = [module.get(name) for name in group]  # an nn.Module is a dict
            if all(child is not None for child in children):
                yield path, group, children


def link(model: nn.Module, names=NAMES) -> int:
    """Make sibling groups of ``model``'s ``mlx_w8a8.Linear`` layers.

    Args:
        model: any module; it is walked, not changed (each member gets a ``siblings``
            attribute, replacing an earlier group).
        names: tuples of child names a module feeds the same input (default
            :data:`NAMES`). Children that are missing, not ``mlx_w8a8.Linear`` or differ
            in K, format, group size or bias presence make no group.

    Returns:
        The number of groups made.
    """
    for group in names:
        if not 2 <= len(group) <= MAX_MEMBERS:
            raise ValueError(f"[mlx_w8a8.siblings.link] a group has 2 to {MAX_MEMBERS} "
                             f"names, got {group!r}")
    made = 0
    for _, _, layers in named_groups(model, names):
        if not all(member(layer) for layer in layers) or not compatible(layers):
            continue
        shared = Siblings(layers)
        for layer in layers:
            layer.siblings = shared
        made += 1
    return made
