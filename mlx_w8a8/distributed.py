"""Tensor parallelism: W8A8 linear layers split over an ``mx.distributed`` group.

Two layers, as in ``mlx.nn.layers.distributed`` (``docs/distributed.md``):

- :class:`AllToShardedLinear`: every rank holds the full input and a slice of the output
  features (rows of the weight, their scales and biases, and the bias). Each output
  element is computed exactly as on one device, so the slice is bit-identical to the
  same rows of the single-device layer.
- :class:`ShardedToAllLinear`: every rank holds a slice of the input features (weight
  columns, cut on group boundaries) and sees only that slice of the activation. It
  quantizes its slice per token with its own scale, dequantizes locally and the float
  partial results are summed with ``mx.distributed.all_sum``; the bias is added once,
  after the sum. The per-shard activation scale is finer than the single-device one, so
  results differ from one device's within the bound of ``docs/distributed.md``.

Both orders give the same model: ``model.shard(group)`` (mlx-lm) then
:func:`mlx_w8a8.quantize` converts MLX's sharded classes (:func:`from_sharded`), and
:func:`mlx_w8a8.quantize` then :func:`shard` splits the W8A8 layers. The layers are for
inference: their parameters are frozen and no gradient is aggregated.
"""

from __future__ import annotations

import attrs
import mlx.core as mx
import mlx.nn as nn
from mlx.nn.layers import distributed as mlx_dist
from mlx.utils import tree_unflatten

from . import siblings
from .converters import register_converter
from .kernels.registry import Problem
from .nn import Linear
from .weight import QuantizedWeight, check_group_size

__all__ = [
    "AllToShardedLinear",
    "ShardedToAllLinear",
    "shard_linear",
    "shard",
    "from_sharded",
    "restore",
    "split_shape",
    "rank_shapes",
]

SHARDINGS = ("all-to-sharded", "sharded-to-all")

# MLX's sharded layer classes, by the W8A8 class each converts to.
_MLX_ALL_TO_SHARDED = (mlx_dist.AllToShardedLinear, mlx_dist.QuantizedAllToShardedLinear)
_MLX_SHARDED_TO_ALL = (mlx_dist.ShardedToAllLinear, mlx_dist.QuantizedShardedToAllLinear)
_MLX_FLOAT = (mlx_dist.AllToShardedLinear, mlx_dist.ShardedToAllLinear)


def _group_or_default(group):
    return group if group is not None else mx.distributed.init()


class _ShardedMixin:
    """What both sharded W8A8 layers add to :class:`mlx_w8a8.Linear`."""

    sharding: str

    def __init__(
        self,
        input_dims: int,
        output_dims: int,
        bias: bool = True,
        group_size: int = 64,
        per_channel: bool = True,
        group: mx.distributed.Group | None = None,
    ):
        """A randomly initialised layer holding this rank's part, as MLX's sharded
        layers are built.

        Args:
            input_dims: K, the full input features.
            output_dims: N, the full output features.
            bias: whether to add a learned bias. Default: ``True``.
            group_size: 32, 64 or 128. Default: ``64``.
            per_channel: symmetric per-channel int8 or group-wise affine. Default: ``True``.
            group: the group. Default: the global group.
        """
        group = _group_or_default(group)
        n, k = split_shape(output_dims, input_dims, self.sharding, group.size(), group_size)
        super().__init__(k, n, bias=bias, group_size=group_size, per_channel=per_channel)
        self.group = group

    @classmethod
    def _from_parts(cls, qw: QuantizedWeight, bias, group, kernel=None, act_scales="token",
                    outliers=None):
        layer = cls.from_weight(qw, bias, act_scales)
        layer.group = group
        layer.kernel = kernel
        layer.outliers = outliers
        return layer

    def _extra_repr(self) -> str:
        # Linear's description (this rank's dims and kernel decisions) and the split.
        return f"{super()._extra_repr()}, {self.sharding} over {self.group.size()} ranks"


class AllToShardedLinear(_ShardedMixin, Linear):
    """A W8A8 linear whose output features are split over ``group``.

    Rank ``r`` of ``R`` holds rows ``[r N/R, (r+1) N/R)`` of the weight (codes, scales,
    biases) and of the bias, takes the full ``[..., K]`` input and returns its
    ``[..., N/R]`` slice of the output: exactly :class:`mlx_w8a8.Linear` on the row
    slice, bit-identical to those columns of the single-device output for the same
    kernel. Usually made by :func:`shard_linear`, :func:`shard` or :func:`from_sharded`;
    the constructor takes the full dimensions (like ``mlx.nn.AllToShardedLinear``).

    Attributes:
        group: the ``mx.distributed.Group``.
    """

    sharding = "all-to-sharded"



class ShardedToAllLinear(_ShardedMixin, Linear):
    """A W8A8 linear whose input features are split over ``group``.

    Rank ``r`` of ``R`` holds columns ``[r K/R, (r+1) K/R)`` of the weight (``K/R`` a
    multiple of the group size, so scales and biases split with them) and the full
    bias. It takes its ``[..., K/R]`` slice of the activation, quantizes it per token
    with the slice's own scale, multiplies in int8 and dequantizes (the layer's kernel),
    then ``mx.distributed.all_sum`` adds the ``R`` float partial results and the bias is
    added once: every rank returns the same ``[..., N]``. Made like
    :class:`AllToShardedLinear`.

    Attributes:
        group: the ``mx.distributed.Group``.
    """

    sharding = "sharded-to-all"


    @property
    def kernel(self) -> str | None:
        """The forced candidate name, or ``None`` to let the tuner decide."""
        return Linear.kernel.fget(self)

    @kernel.setter
    def kernel(self, name: str | None) -> None:
        Linear.kernel.fset(self, name)
        local = self.__dict__.get("_local")
        if local is not None:
            local.kernel = name

    @property
    def outliers(self) -> tuple[int, ...] | None:
        """This rank's outlier channels, as indices into its input slice."""
        return Linear.outliers.fget(self)

    @outliers.setter
    def outliers(self, channels) -> None:
        Linear.outliers.fset(self, channels)
        local = self.__dict__.get("_local")
        if local is not None:
            local.outliers = self.outliers

    def problem(self, m: int, dtype: mx.Dtype = mx.bfloat16) -> Problem:
        """The per-rank ``linear`` problem: this rank's ``[N, K/R]``, no bias."""
        return attrs.evolve(super().problem(m, dtype), has_bias=False)

    def _product(self) -> Linear:
        """A bias-free :class:`mlx_w8a8.Linear` on this layer's own arrays: the per-rank
        product with its cached kernel plans. Not a child module (the arrays are this
        layer's parameters); rebuilt when they are replaced."""
        local = self.__dict__.get("_local")
        qw = self.quantized_weight
        if local is None or local.quantized_weight is not qw:
            local = Linear.from_weight(qw, act_scales=self.act_scales)
            local.kernel = self.kernel
            local.outliers = self.outliers
            object.__setattr__(self, "_local", local)
        return local

    def __call__(self, x: mx.array) -> mx.array:
        """Args:
            x: ``[..., K/R]`` float16/bfloat16/float32, this rank's slice.

        Returns:
            ``[..., N]`` in ``x.dtype``, the same on every rank.
        """
        y = mx.distributed.all_sum(self._product()(x), group=self.group)
        if "bias" in self:
            y = y + self["bias"].astype(y.dtype)
        return y


_CLASSES = {"all-to-sharded": AllToShardedLinear, "sharded-to-all": ShardedToAllLinear}


def _check_sharding(op: str, sharding) -> None:
    if sharding not in SHARDINGS:
        raise ValueError(f"[{op}] sharding must be one of {SHARDINGS}, got {sharding!r}")


def split_shape(n: int, k: int, sharding: str, tp: int, group_size: int = 64) -> tuple[int, int]:
    """The per-rank ``(N, K)`` of an ``[N, K]`` projection split ``tp`` ways.

    Args:
        n, k: the full output and input features.
        sharding: ``"all-to-sharded"`` (N splits) or ``"sharded-to-all"`` (K splits).
        tp: the number of ranks.
        group_size: the weight's group size; a K split must keep whole groups.

    Raises:
        ValueError: when the split dimension does not divide evenly (for K: into whole
            groups of ``group_size``).
    """
    op = "mlx_w8a8.distributed.split_shape"
    _check_sharding(op, sharding)
    if not isinstance(tp, int) or tp < 1:
        raise ValueError(f"[{op}] tp must be a positive int, got {tp!r}")
    if sharding == "all-to-sharded":
        if n % tp:
            raise ValueError(f"[{op}] N = {n} output features do not split into {tp} equal parts")
        return n // tp, k
    if k % (tp * group_size):
        raise ValueError(
            f"[{op}] K = {k} input features do not split into {tp} parts of whole groups "
            f"of {group_size}; K must be a multiple of tp * group_size = {tp * group_size}"
        )
    return n, k // tp


def _split_rows(a: mx.array, rank: int, size: int, segments) -> mx.array:
    """Rank's slice of ``a`` along axis 0, taken from each of ``segments`` equal parts
    (a fused QKV weight is 3 segments) and concatenated."""
    parts = [a] if segments == 1 else mx.split(a, segments, axis=0)
    pieces = [mx.split(p, size, axis=0)[rank] for p in parts]
    return mx.contiguous(pieces[0] if len(pieces) == 1 else mx.concatenate(pieces, axis=0))


def shard_linear(
    module: nn.Module,
    sharding: str,
    *,
    segments: int = 1,
    group: mx.distributed.Group | None = None,
) -> nn.Module:
    """``mlx.nn.layers.distributed.shard_linear`` that keeps W8A8 layers W8A8.

    An :class:`mlx_w8a8.Linear` becomes an :class:`AllToShardedLinear` or a
    :class:`ShardedToAllLinear` holding this rank's slice (its ``kernel``, activation
    scaling and code width kept, and its outlier channels: all of them where the rank
    takes the full input, those of its input slice, renumbered, where it takes a slice);
    any other layer goes to MLX's ``shard_linear`` unchanged.

    Args:
        module: the layer (not changed; a new layer is returned).
        sharding: ``"all-to-sharded"`` or ``"sharded-to-all"``.
        segments: equal parts of a fused weight (e.g. 3 for QKV), split each. For
            ``"sharded-to-all"`` only 1. Default: ``1``.
        group: the group. Default: the global group (``mx.distributed.init()``).

    Raises:
        ValueError: on an unknown sharding, or a dimension that does not split (K must
            split into whole groups).
    """
    op = "mlx_w8a8.distributed.shard_linear"
    _check_sharding(op, sharding)
    if not isinstance(module, Linear):
        return mlx_dist.shard_linear(module, sharding, segments=segments, group=group)
    if isinstance(module, _ShardedMixin):
        raise ValueError(f"[{op}] the layer is already sharded ({type(module).__name__})")
    if not isinstance(segments, int) or segments < 1:
        raise ValueError(f"[{op}] segments must be a positive int, got {segments!r}")
    group = _group_or_default(group)
    size, rank = group.size(), group.rank()
    qw = module.quantized_weight
    bias = module.get("bias")
    if sharding == "all-to-sharded":
        split_shape(qw.n // segments, qw.k, sharding, size)
        if qw.n % segments:
            raise ValueError(f"[{op}] N = {qw.n} does not split into {segments} segments")
        rows = lambda a: _split_rows(a, rank, size, segments)  # noqa: E731
        part = QuantizedWeight(
            rows(qw.q), rows(qw.scales), rows(qw.biases), qw.group_size, qw.per_channel,
            bits=qw.bits,
        )
        bias = None if bias is None else rows(bias)
        outliers = module.outliers  # every rank takes the full input
    else:
        if segments != 1:
            raise ValueError(f"[{op}] sharded-to-all takes segments=1, got {segments!r}")
        split_shape(qw.n, qw.k, sharding, size, qw.group_size)
        cols = lambda a: mx.contiguous(mx.split(a, size, axis=1)[rank])  # noqa: E731
        part = QuantizedWeight(
            cols(qw.q), cols(qw.scales), cols(qw.biases), qw.group_size, qw.per_channel,
            bits=qw.bits,
        )
        lo, hi = rank * (qw.k // size), (rank + 1) * (qw.k // size)
        outliers = tuple(c - lo for c in module.outliers or () if lo <= c < hi) or None
    return _CLASSES[sharding]._from_parts(part, bias, group, module.kernel, module.act_scales,
                                          outliers)


def is_mlx_sharded(layer: nn.Module) -> bool:
    """Whether ``layer`` is one of MLX's sharded linear classes."""
    return isinstance(layer, _MLX_ALL_TO_SHARDED + _MLX_SHARDED_TO_ALL)


def convertible(layer: nn.Module, group_size: int) -> bool:
    """Whether :func:`from_sharded` converts ``layer`` with this ``group_size``: an MLX
    float sharded linear whose local K is a multiple of ``group_size``, or an 8-bit
    affine quantized one."""
    if isinstance(layer, _MLX_FLOAT):
        return layer.weight.shape[-1] % group_size == 0
    if is_mlx_sharded(layer):
        return layer.bits == 8 and getattr(layer, "mode", "affine") == "affine"
    return False


def _per_channel_shared_scale(w: mx.array, group_size: int, group) -> QuantizedWeight:
    """Symmetric per-channel int8 of a K-slice ``w`` with each row's scale taken over
    the full row (``all_max`` of the slices' maxima), so the codes and scales equal
    those of the unsplit weight quantized on one device."""
    wf = w.astype(mx.float32)
    row_max = mx.distributed.all_max(mx.max(mx.abs(wf), axis=1), group=group)
    # Evaluated now: left lazy, the collective would run inside some later graph, where
    # ranks need not reach their collectives in the same order.
    mx.eval(row_max)
    scale = (row_max / 127.0).astype(w.dtype)
    sf = scale.astype(mx.float32)[:, None]
    w_i8 = mx.clip(mx.round(wf / mx.where(sf > 0, sf, 1.0)), -127, 127).astype(mx.int8)
    return QuantizedWeight.from_int8(w_i8, scale, group_size)


def from_sharded(layer: nn.Module, group_size: int = 64, per_channel: bool = True) -> nn.Module:
    """Convert one of MLX's sharded linear layers to its W8A8 equivalent.

    ``AllToShardedLinear`` / ``QuantizedAllToShardedLinear`` become
    :class:`AllToShardedLinear`; ``ShardedToAllLinear`` / ``QuantizedShardedToAllLinear``
    become :class:`ShardedToAllLinear`. 8-bit affine layers keep their weights exactly.
    Float layers are quantized like :func:`mlx_w8a8.quantize` does on one device; for a
    float ``ShardedToAllLinear`` with ``per_channel`` each row's scale is the maximum
    over all ranks (one ``all_max``, so every rank must convert its layers in the same
    order), making the result equal to quantizing first and sharding after.

    Args:
        layer: the MLX layer.
        group_size: 32, 64 or 128, for float layers.
        per_channel: symmetric per-channel int8 (default) or group-wise affine, for
            float layers.

    Raises:
        ValueError: for other layers, bit widths or modes, or a group size that does not
            divide the local K.
    """
    op = "mlx_w8a8.distributed.from_sharded"
    if not is_mlx_sharded(layer):
        raise ValueError(
            f"[{op}] layer must be one of MLX's sharded linear layers "
            f"(mlx.nn.layers.distributed), got {type(layer).__name__}"
        )
    cls = AllToShardedLinear if isinstance(layer, _MLX_ALL_TO_SHARDED) else ShardedToAllLinear
    bias = layer.get("bias")
    if isinstance(layer, _MLX_FLOAT):
        w = layer.weight
        check_group_size(op, group_size, w.shape[-1])
        if per_channel and cls is ShardedToAllLinear:
            qw = _per_channel_shared_scale(w, group_size, layer.group)
        else:
            qw = QuantizedWeight.from_float(w, group_size, per_channel)
    else:
        if layer.bits != 8 or getattr(layer, "mode", "affine") != "affine":
            raise ValueError(
                f"[{op}] only 8-bit affine quantized layers convert, got "
                f"bits={layer.bits}, mode={getattr(layer, 'mode', 'affine')!r}"
            )
        qw = QuantizedWeight(layer.weight, layer.scales, layer.biases, layer.group_size)
    return cls._from_parts(qw, bias, layer.group)


# mlx_w8a8.quantize converts MLX's sharded layers through these. The registry lives in
# mlx_w8a8.converters, which never imports this module (this module imports it).
for _cls in _MLX_ALL_TO_SHARDED + _MLX_SHARDED_TO_ALL:
    register_converter(_cls, convertible, from_sharded)
del _cls


def shard(
    model: nn.Module,
    group: mx.distributed.Group | None = None,
    sharding: dict[str, str] | None = None,
) -> nn.Module:
    """Shard a (W8A8-quantized) model over ``group``, in place, keeping W8A8 layers W8A8.

    With ``sharding=None`` the model's own ``shard(group)`` method runs (every mlx-lm
    model family with tensor parallelism has one; it also adjusts head counts). MLX's
    ``shard_linear`` turns each :class:`mlx_w8a8.Linear` into an 8-bit W8A16 sharded
    layer; those are converted back to :class:`AllToShardedLinear` /
    :class:`ShardedToAllLinear` with the same codes, scales and ``kernel``.

    Args:
        model: the model.
        group: the group. Default: the global group.
        sharding: ``{path: "all-to-sharded" | "sharded-to-all"}`` for models without a
            ``shard`` method: each listed linear layer is replaced by
            :func:`shard_linear`. (Head counts are then the caller's business.)

    Returns:
        The model, its sibling layers linked again (:func:`mlx_w8a8.siblings.link`: the
        sharded layers are new objects).

    Raises:
        ValueError: when ``sharding`` is ``None`` and the model has no ``shard`` method,
            or a listed path is not a module of the model.
    """
    op = "mlx_w8a8.shard"
    group = _group_or_default(group)
    modules = dict(model.named_modules())
    if sharding is not None:
        unknown = sorted(set(sharding) - set(modules))
        if unknown:
            raise ValueError(
                f"[{op}] sharding lists paths that are not modules of the model: {unknown}"
            )
        new = [(p, shard_linear(modules[p], s, group=group)) for p, s in sharding.items()]
        model.update_modules(tree_unflatten(new))
        siblings.link(model)  # the new layers: q/k/v, gate/up slices as one launch each
        return model
    if not callable(getattr(model, "shard", None)):
        raise ValueError(
            f"[{op}] {type(model).__name__} has no shard(group) method; pass "
            f"sharding={{path: 'all-to-sharded' | 'sharded-to-all'}}"
        )
    kernels = {p: m.kernel for p, m in modules.items() if isinstance(m, Linear)}
    model.shard(group)
    converted = []
    for path, m in model.named_modules():
        if path in kernels and is_mlx_sharded(m):
            layer = from_sharded(m)
            layer.kernel = kernels[path]
            converted.append((path, layer))
    model.update_modules(tree_unflatten(converted))
    siblings.link(model)  # the new layers: q/k/v, gate/up slices as one launch each
    return model


def restore(model: nn.Module, config: dict) -> nn.Module:
    """Bring back the W8A8 layers of a checkpoint written by :func:`mlx_w8a8.save` in a
    model that ``mlx_lm.utils.sharded_load`` (or ``load``) built from it.

    mlx-lm loads the checkpoint's W8A8 layers as 8-bit ``nn.QuantizedLinear`` and
    shards them (each rank keeps its slices); this converts those listed in
    ``config["mlx_w8a8"]`` to W8A8, sharded or not, without reading anything more.

    Args:
        model: the loaded model.
        config: its ``config.json`` contents (``sharded_load(..., return_config=True)``).

    Raises:
        ValueError: when ``config`` has no ``"mlx_w8a8"`` entry.
    """
    from .checkpoint import CONFIG_KEY
    from .quantizer import quantize

    listed = (config.get(CONFIG_KEY) or {}).get("layers")
    if listed is None:
        raise ValueError(
            f"[mlx_w8a8.distributed.restore] config has no {CONFIG_KEY!r} entry; the "
            f"checkpoint was not written by mlx_w8a8.save"
        )
    return quantize(model, class_predicate=lambda p, m: p in listed)


class _ShapeGroup:
    """Stands in for an ``mx.distributed.Group`` of ``size`` ranks to read shapes:
    MLX's sharding only asks a group for its size and rank."""

    def __init__(self, size: int):
        self._size = size

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return 0


def rank_shapes(model: nn.Module, tp: int) -> list[tuple[int, int]]:
    """The distinct per-rank ``(N, K)`` of the linear layers of ``model`` split ``tp``
    ways by its ``shard`` method: what one rank's kernels see, for the tuner.

    Nothing is evaluated: build the model lazily (e.g.
    ``mlx_lm.utils.load_model(path, lazy=True)``). The model is sharded in place with a
    shape-only group, so pass an instance you discard.

    Args:
        model: a model with a ``shard(group)`` method (float, 8-bit or W8A8 layers).
        tp: the number of ranks.

    Returns:
        ``[(N, K), ...]`` sorted; layers the model does not shard (e.g. the
        output head) keep their full shape.
    """
    op = "mlx_w8a8.distributed.rank_shapes"
    if not isinstance(tp, int) or tp < 1:
        raise ValueError(f"[{op}] tp must be a positive int, got {tp!r}")
    if not callable(getattr(model, "shard", None)):
        raise ValueError(f"[{op}] {type(model).__name__} has no shard(group) method")
    if tp > 1:
        # MLX's sharding of every layer type, W8A8 ones included (as 8-bit layers): it
        # only slices lazy arrays, so nothing is read or computed.
        model.shard(_ShapeGroup(tp))
    shapes: list[tuple[int, int]] = []
    for _, m in model.named_modules():
        shape = _linear_shape(m)
        if shape is not None and shape not in shapes:
            shapes.append(shape)
    return sorted(shapes)


def _linear_shape(m: nn.Module) -> tuple[int, int] | None:
    """``(N, K)`` of a linear layer from its parameter shapes alone, else ``None``."""
    if isinstance(m, (nn.Linear,) + _MLX_FLOAT):
        return tuple(m.weight.shape)
    if isinstance(m, (Linear, nn.QuantizedLinear)) or is_mlx_sharded(m):
        return m.weight.shape[0], m.weight.shape[1] * 32 // m.bits
    return None
