"""``python -m mlx_w8a8.bench --model PATH|PRESET``: a whole model, three ways.

Builds the model with mlx-lm's architecture (:mod:`mlx_w8a8.models`: a preset, an
mlx-lm folder or a ``config.json``; random weights when the folder holds none;
``--layers`` keeps the first L transformer blocks) in bfloat16, once, and makes three
variants from the same weights, as ``--weights`` says (:data:`WEIGHT_FORMATS`):

- ``bf16``: the model as built;
- ``mlx-lm-Nbit``: the mlx-lm N-bit checkpoint of those weights:
  ``nn.quantize(model, group_size, bits)`` with the predicate ``mlx_lm.convert`` uses
  (every layer with ``to_quantized`` whose K the group size divides: linear layers and
  the embedding); 8-bit, group size 64 for ``--weights bf16`` (the default);
- ``mlx_w8a8``: for ``bf16``, ``mlx_w8a8.quantize(model)`` of the float weights
  (symmetric per-channel int8); for ``8bit-gsG``, the mlx-lm checkpoint's 8-bit layers
  converted as ``mlx_w8a8.load`` converts them (group-wise, the stored codes kept);
  ``8bit-gsG-per-channel`` then requantizes them per channel
  (:func:`mlx_w8a8.requantize.per_channel`); for ``4bit-gsG``, the 4-bit layers
  converted where this version of ``mlx_w8a8.quantize`` converts them, else the
  mlx-lm 4-bit model itself (the output says so); ``4bit-gsG-per-channel`` then
  requantizes them per channel (8-bit codes: twice the 4-bit weights' bytes).
  ``--kernel`` forces one kernel;
- with ``--outliers N``, ``mlx_w8a8-outliers``: the mlx_w8a8 model converted again, N
  input channels of every layer kept out of its int8 activations (the accuracy recipe's
  split, channels evenly spaced): the column ``outliers / w8a8`` is what the split costs.

``--weights FOLDER`` (or ``--model FOLDER`` of a quantized mlx-lm checkpoint) starts from
that checkpoint: ``mlx-lm-Nbit`` is the checkpoint as mlx-lm loads it, ``mlx_w8a8`` the
same converted as ``mlx_w8a8.load`` does, ``bf16`` its weights dequantized.
Each variant's parameter bytes (``tree_flatten(model.parameters())``) head the output:
an mlx_w8a8 model converted from a checkpoint holds no second copy of the weights.

Measurements, each paired and alternating (warm-up first, then rounds in the order
A B C, C B A, ...; the spread is p25..p75 of the per-round ratios):

- **prefill** for each ``--tokens`` T: one forward of T random tokens into a fresh KV
  cache, ``mx.eval`` of the logits; tokens/s = T / wall time (graph building included).
  Every variant first runs :data:`WARMUP` untimed prefills at T, so the rounds time the
  steady state of a length met again (mlx-lm's 2048-token prefill chunks).
- **prefill at new lengths** (``--new-lengths``): after the same warm-up at T, each
  timed prefill runs a length nothing in the process has run before (T + 1, T + 2, ...:
  every call its own), as a server meets each prompt's length once. What a variant pays
  per new input shape (mlx_w8a8: deciding, binding and tracing each layer's launches)
  is in its time; tokens/s counts each call's own tokens (its ``round`` records give
  each call's seconds scaled to T tokens, its ``summary`` the lengths run). A length
  that needs a kernel or tile the process has not run compiles it inside its round
  (seconds, ``docs/cuda.md``); ``--warm-up`` runs :func:`mlx_w8a8.warm_up` on the
  mlx_w8a8 variant first, up to the longest prefill the run makes, as a server would
  after loading (a ``warm_up`` record gives its calls and seconds).
- **decode**: ``--decode`` N steps of ``mlx_lm.generate.generate_step`` (greedy, KV
  cache, ``async_eval`` pipelining, exactly as ``mlx_lm.generate`` runs them) after a
  ``--prompt`` P token prompt; tokens/s over the N steps after the first token. Where
  ``mlx_lm.generate`` does not import (it needs ``transformers``), the same loop
  (:func:`generate_steps`) runs instead; the ``setup`` record says which.
- **batched decode** (``--batch B1,B2,...``): B sequences, each after its own
  ``--prompt`` P random tokens, decoding one token each per step with a KV cache, by
  mlx-lm's ``BatchGenerator`` (its server's continuous batching: the prompts' caches
  merged into a ``BatchKVCache``, one ``[B, 1]`` forward per step), or where
  ``mlx_lm.generate`` does not import the same steps by :func:`batch_generate_steps`;
  ``--decode`` N steps timed after the first; tokens/s = B N / time, and the seconds
  per step. By default B = 16 on a GPU, no batched rows on a CPU.
- **SQNR** of each variant's prefill logits against the bfloat16 model's, in dB
  (``10 log10(sum(ref^2) / sum((x - ref)^2))`` over all positions and the vocabulary).
- **working memory** of each variant's first prefill at each T: MLX's peak bytes during
  it above those in use before it (activations, KV cache, temporaries such as the float
  weight a dequantize-then-matmul layer makes per call), a ``working_bytes`` field of the
  prefill summary and a line under the table.

Output: a readable table on stdout, headed by the weights' format, each variant's
parameter bytes and any note (e.g. 4-bit layers this version does not convert), and
with ``--json FILE`` JSON lines (a ``setup`` record: ``weights``, ``bytes``, ``notes``,
``batch``, ...; one ``round`` record per timed round; one ``summary`` record per
measurement, ``measure`` ``"decode-batch"`` with ``batch``, ``steps`` and ``step_s`` for
a batched row; and a ``decisions`` record with ``repr`` of every mlx_w8a8 layer: the
kernel it ran per M and why) in FILE (``--json`` alone: on stdout, the table then on stderr).

With ``--tp N``, under a distributed launch of N ranks, the W8A8 model is split over
the ranks and timed against one device instead: :mod:`mlx_w8a8.tpbench` (it reuses
this module's model building, prefill and decode).
"""

from __future__ import annotations

import math
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from . import backends, models, siblings
from .tuning import render, table
# The timing primitives, shared with the tuner's model checks; re-exported here.
from .tuning.model_timing import (WARMUP, alternate, batch_decode, batch_decode_loop,
                                  batch_generate_steps, decode, decode_loop, generate_steps,
                                  prefill)

VARIANTS = ("bf16", "mlx-lm-8bit", "mlx_w8a8")
# With --unshared: the mlx_w8a8 model again, with the sharing of quantized activations
# between layers fed the same input (q/k/v, gate/up) turned off: what the sharing saves.
UNSHARED = "mlx_w8a8-unshared"
# With --unlinked: the mlx_w8a8 model again, each sibling layer (q/k/v, gate/up) run by
# itself instead of one launch per group (mlx_w8a8.siblings): what the group launch saves.
UNLINKED = "mlx_w8a8-unlinked"
# With --outliers N: the mlx_w8a8 model again (the same weights, converted a second time),
# every layer with N outlier channels kept out of its int8 activations: what the split of
# the accuracy recipe costs, paired against the plain mlx_w8a8 arm in the same rounds.
OUTLIERS = "mlx_w8a8-outliers"
GROUP_SIZE, BITS = 64, 8
# Defaults per device: a CPU runs an 8B-shaped layer slowly (about 7 s for one
# bfloat16 quantized_matmul of a 128256-row lm_head), so it gets short runs and no
# batched decode rows.
GPU_DEFAULTS = {"tokens": "1,16,128,512,2048", "decode": 64, "prompt": 128, "rounds": 10,
                "batch": "16"}
CPU_DEFAULTS = {"tokens": "1,16", "decode": 4, "prompt": 8, "rounds": 2, "batch": "0"}
# --weights: the formats a float model is turned into here; an mlx-lm checkpoint folder
# is the other kind of value.
WEIGHT_FORMATS = ("bf16", "8bit-gs32", "8bit-gs64", "8bit-gs128", "8bit-gs32-per-channel",
                  "8bit-gs64-per-channel", "8bit-gs128-per-channel", "4bit-gs32", "4bit-gs64",
                  "4bit-gs128", "4bit-gs32-per-channel", "4bit-gs64-per-channel",
                  "4bit-gs128-per-channel")


def variant_names(bits: int = BITS) -> tuple[str, str, str]:
    """The three variants' names: bf16, the mlx-lm ``bits``-bit baseline, mlx_w8a8."""
    return ("bf16", f"mlx-lm-{bits}bit", "mlx_w8a8")


def add_arguments(p) -> None:
    """The model benchmark's options, on ``python -m mlx_w8a8.bench``'s parser."""
    g = p.add_argument_group(
        "model benchmark (--model)",
        "bf16 vs mlx-lm N-bit vs mlx_w8a8 on a whole mlx-lm model; defaults on a GPU: "
        f"--tokens {GPU_DEFAULTS['tokens']} --decode {GPU_DEFAULTS['decode']} --prompt "
        f"{GPU_DEFAULTS['prompt']} --rounds {GPU_DEFAULTS['rounds']} --batch "
        f"{GPU_DEFAULTS['batch']}; on a CPU: --tokens "
        f"{CPU_DEFAULTS['tokens']} --decode {CPU_DEFAULTS['decode']} --prompt "
        f"{CPU_DEFAULTS['prompt']} --rounds {CPU_DEFAULTS['rounds']} (no batched rows)",
    )
    g.add_argument("--model", "--preset", dest="model", metavar="PATH|PRESET",
                   help="benchmark a model: llama-3-8b, mistral-7b, qwen2.5-7b, llama-3.2-1b, "
                   "phi-3-mini, an mlx-lm folder or a config.json (needs mlx-lm)")
    g.add_argument("--weights", metavar="FORMAT|FOLDER",
                   help="what the quantized variants are built from: bf16 (default: mlx_w8a8 "
                   "quantizes the float weights per channel, against mlx-lm 8-bit group size "
                   "64), 8bit-gs32/64/128 (an mlx-lm 8-bit checkpoint of the same weights, "
                   "converted as mlx_w8a8.load does: group-wise), 8bit-gs32/64/128-per-channel "
                   "(the same, then requantized per channel), 4bit-gs32/64/128 (an mlx-lm 4-bit "
                   "checkpoint; -per-channel as for 8 bits), or an mlx-lm quantized model "
                   "folder (then --model may be left out); the mlx-lm baseline has the "
                   "format's bits and group size")
    g.add_argument("--layers", type=int, help="keep the first L transformer blocks")
    g.add_argument("--tokens", help="prefill lengths T, comma-separated")
    g.add_argument("--decode", type=int, help="decode steps N (0: no decode measurement)")
    g.add_argument("--prompt", type=int, help="prompt tokens before the decode steps")
    g.add_argument("--rounds", type=int, help="timed rounds per measurement (>= 2)")
    g.add_argument("--batch", metavar="B1,B2,...",
                   help="batched decode rows: B sequences decoding together (mlx-lm's "
                   "BatchGenerator), --decode steps after a --prompt token prompt each; "
                   f"0: none (default on a GPU: {GPU_DEFAULTS['batch']}; on a CPU: none)")
    g.add_argument("--kernel", help="force this kernel in every mlx_w8a8 layer")
    g.add_argument("--unshared", action="store_true",
                   help="also time mlx_w8a8 with each layer quantizing its own input (no "
                   "sharing between q/k/v and gate/up): what the sharing saves")
    g.add_argument("--unlinked", action="store_true",
                   help="also time mlx_w8a8 with each sibling layer (q/k/v, gate/up) run by "
                   "itself: what running each group as one launch saves")
    g.add_argument("--new-lengths", action="store_true",
                   help="also time prefills at lengths not run before in the process (T + 1, "
                   "T + 2, ...; one per call), as a server meets each prompt: what each "
                   "variant pays per new input shape")
    g.add_argument("--warm-up", action="store_true",
                   help="run mlx_w8a8.warm_up on the mlx_w8a8 variant before any measurement "
                   "(up to the longest prefill the run makes), as a server would after "
                   "loading: no timed call then compiles a kernel of it; its time is reported")
    g.add_argument("--table", help="tuning table read first by the mlx_w8a8 variant")
    g.add_argument("--act-groups", action="store_true",
                   help="the mlx_w8a8 variant with activation groups (act_scales='group': one "
                   "int8 scale per token and weight group; its layers group-wise, so not "
                   "with a -per-channel --weights)")
    g.add_argument("--outliers", type=int, default=0, metavar="N",
                   help="add the arm mlx_w8a8-outliers: the mlx_w8a8 model again, every layer "
                   "with N outlier channels (at most K / 16; mlx_w8a8.Linear.outliers) evenly "
                   "spaced, timed in the same rounds: the speed of the recipe's split against "
                   "the plain model, not its accuracy (the recipe picks them from calibration "
                   "data)")
    g.add_argument("--skip", nargs="+", metavar="PATTERN",
                   help="layers the mlx_w8a8 variant keeps on W8A16 (mlx_w8a8.quantize's "
                   "skip=, e.g. lm_head down_proj): the speed of a mixed model")
    g.add_argument("--no-progress", action="store_true",
                   help="print no progress lines to stderr (by default a line as the warm-up "
                   "and each row finish, with the row's ratios: a run cut short keeps them)")


def settings(args) -> dict:
    """The run's settings: the options given, device defaults for the others.

    Raises:
        ValueError: for malformed or out-of-range values.
    """
    from .tuning import shapes

    defaults = CPU_DEFAULTS if backends.name() == "cpu" else GPU_DEFAULTS
    tokens = args.tokens if args.tokens is not None else defaults["tokens"]
    try:
        t_values = shapes.parse_m_list(tokens)
    except ValueError:
        raise ValueError(
            f"[mlx_w8a8.bench] --tokens takes positive token counts separated by commas, "
            f"got {tokens!r}"
        ) from None
    out = {"tokens": t_values}
    for key, low in (("decode", 0), ("prompt", 1), ("rounds", 2)):
        value = getattr(args, key)
        value = defaults[key] if value is None else value
        if value < low:
            raise ValueError(f"[mlx_w8a8.bench] --{key} must be >= {low}, got {value}")
        out[key] = value
    if args.layers is not None and args.layers < 1:
        raise ValueError(f"[mlx_w8a8.bench] --layers must be >= 1, got {args.layers}")
    if (getattr(args, "outliers", 0) or 0) < 0:
        raise ValueError(f"[mlx_w8a8.bench] --outliers must be >= 0, got {args.outliers}")
    if args.kernel is not None:  # before the model is built, not after
        from .kernels import registry

        try:
            registry.get("linear", args.kernel)
        except ValueError as error:  # names the known kernels
            raise ValueError(f"[mlx_w8a8.bench] --kernel {args.kernel!r}: {error}") from None
    out["new_lengths"] = bool(getattr(args, "new_lengths", False))
    out["warm_up"] = bool(getattr(args, "warm_up", False))
    return out


def batch_sizes(args, decode: int) -> list[int]:
    """The batch sizes of the batched decode rows: ``--batch``, else the device's
    default; ``[]`` for none (``0``, or ``--decode 0`` with the default).

    Raises:
        ValueError: naming ``--batch`` for a malformed list, or ``--batch`` given with
            ``--decode 0`` (the rows time decode steps).
    """
    from .tuning import shapes

    given = getattr(args, "batch", None)
    defaults = CPU_DEFAULTS if backends.name() == "cpu" else GPU_DEFAULTS
    text = defaults["batch"] if given is None else given
    if str(text).strip() == "0":
        return []
    try:
        values = shapes.parse_m_list(text)
    except ValueError:
        raise ValueError(
            f"[mlx_w8a8.bench] --batch takes positive batch sizes separated by commas "
            f"(0: no batched rows), got {text!r}"
        ) from None
    if decode < 1:
        if given is None:
            return []
        raise ValueError(
            f"[mlx_w8a8.bench] --batch {given} times decode steps: --decode must be >= 1, "
            f"got {decode}"
        )
    return values


@dataclass(frozen=True)
class Weights:
    """What the quantized variants are built from (``--weights``).

    Attributes:
        name: the format (one of :data:`WEIGHT_FORMATS`), or ``"checkpoint"``.
        bits: bits of the mlx-lm baseline (of the checkpoint, for a folder).
        group_size: its group size.
        per_channel: the mlx_w8a8 variant holds symmetric per-channel int8 (quantized
            from float for ``bf16``, requantized for ``8bit-gsG-per-channel`` and
            ``4bit-gsG-per-channel``).
        source: ``"float"`` (mlx_w8a8 quantizes the float weights), ``"quantized"``
            (mlx_w8a8 converts the mlx-lm checkpoint made here from the float weights)
            or ``"checkpoint"`` (a quantized mlx-lm folder).
        path: the checkpoint folder (``source == "checkpoint"``), else ``None``.
    """

    name: str
    bits: int
    group_size: int
    per_channel: bool
    source: str
    path: str | None = None

    def record(self) -> dict:
        """The JSON form (the ``setup`` record's ``weights``)."""
        return {"format": self.name, "bits": self.bits, "group_size": self.group_size,
                "per_channel": self.per_channel, "source": self.source, "path": self.path}

    def describe(self) -> str:
        """One line for the output's header."""
        base = f"mlx-lm {self.bits}-bit, group size {self.group_size}"
        if self.source == "float":
            return f"{self.name}: mlx_w8a8 quantizes the float weights per channel; baseline {base}"
        if self.source == "checkpoint":
            head = (f"the mlx-lm checkpoint {self.path} ({base}); bf16 is its weights "
                    f"dequantized")
        else:
            head = f"{self.name}: an mlx-lm checkpoint of the bf16 weights ({base})"
        text = f"{head}; mlx_w8a8 converts its layers as mlx_w8a8.load does"
        if self.per_channel:
            text += ", then requantizes them per channel (mlx_w8a8.requantize.per_channel)"
        return text


def parse_weights(text: str) -> Weights:
    """``--weights``: a name of :data:`WEIGHT_FORMATS` or a quantized mlx-lm model folder
    (its ``config.json`` read for the bits and group size; no weights loaded).

    Raises:
        ValueError: naming ``--weights``, for an unknown format, a path that is not an
            mlx-lm folder, or a folder whose model is not quantized.
    """
    text = str(text)
    if text in WEIGHT_FORMATS:
        if text == "bf16":
            return Weights("bf16", BITS, GROUP_SIZE, True, "float")
        bits, rest = text.split("bit-gs")
        group, _, per_channel = rest.partition("-")
        return Weights(text, int(bits), int(group), per_channel == "per-channel", "quantized")
    if not Path(text).is_dir():
        raise ValueError(
            f"[mlx_w8a8.bench] --weights takes one of {', '.join(WEIGHT_FORMATS)} or a "
            f"quantized mlx-lm model folder, got {text!r} (no such format or folder)"
        )
    try:
        config, _, _ = models.resolve(text)
    except ValueError as error:
        raise ValueError(f"[mlx_w8a8.bench] --weights {text!r}: {error}") from None
    quant = config.get("quantization") or config.get("quantization_config") or {}
    if not isinstance(quant, dict) or "bits" not in quant or "group_size" not in quant:
        raise ValueError(
            f"[mlx_w8a8.bench] --weights {text!r}: its config.json has no 'quantization' "
            f"entry with bits and group_size, so it is not a quantized mlx-lm checkpoint "
            f"(a float folder is given as --model FOLDER, with --weights FORMAT)"
        )
    return Weights("checkpoint", int(quant["bits"]), int(quant["group_size"]), False,
                   "checkpoint", text)


def source(args) -> tuple[str, Weights]:
    """``(model spec, weights)`` of ``--model`` and ``--weights``, composed: a named
    format quantizes the model's float weights; a folder is both the model and its
    weights (``--model``, if given, must name the same folder); ``--model FOLDER`` of a
    quantized checkpoint without ``--weights`` is ``--weights FOLDER``.

    Raises:
        ValueError: naming the option, before any model is built.
    """
    model, given = getattr(args, "model", None), getattr(args, "weights", None)
    weights = parse_weights("bf16" if given is None else given)
    if weights.source == "checkpoint":
        if model is not None and (not Path(str(model)).is_dir()
                                  or Path(str(model)).resolve() != Path(weights.path).resolve()):
            raise ValueError(
                f"[mlx_w8a8.bench] --weights {given!r} is a checkpoint folder, the model "
                f"itself: leave --model out or give the same folder, got --model {model!r}"
            )
        return weights.path, weights
    if model is None:
        raise ValueError(
            f"[mlx_w8a8.bench] --weights {given} quantizes a model's float weights: give "
            f"--model PATH|PRESET"
        )
    config, folder, label = models.resolve(model)
    if models.is_quantized(config):
        if given is None and folder is not None:
            return str(folder), parse_weights(str(folder))
        raise ValueError(
            f"[mlx_w8a8.bench] --weights {given}: {label} is a quantized checkpoint, and that "
            f"format is made from float weights; leave --weights out to start from the "
            f"checkpoint (a float folder, a config.json or a preset for --weights {given})"
        )
    return model, weights


# --- variants ---------------------------------------------------------------------------


def _mlx_lm_predicate(group_size: int = GROUP_SIZE):
    # mlx_lm.utils.quantize_model: layers that can quantize, K divisible by the group
    return lambda path, module: (hasattr(module, "to_quantized")
                                 and module.weight.shape[-1] % group_size == 0)


def _same_layers(model: nn.Module, config: dict) -> nn.Module:
    """A second instance of ``model`` (float or quantized layers alike) holding the same
    parameter arrays: the architecture instantiated, its quantized layers made as in
    ``model`` (their random weights stay lazy and are never computed), then updated."""
    other = models.instantiate(config)
    layers = {p: {"group_size": m.group_size, "bits": m.bits, "mode": getattr(m, "mode", "affine")}
              for p, m in model.named_modules()
              if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))}
    if layers:
        nn.quantize(other, class_predicate=lambda p, m: layers.get(p, False))
    other.update(model.parameters())
    return other


def _dequantized(model: nn.Module, config: dict, dtype: mx.Dtype) -> nn.Module:
    """``model`` with every quantized linear layer and embedding dequantized to
    ``dtype`` (``mx.dequantize`` of its stored codes): the float model of a checkpoint."""
    from mlx.utils import tree_flatten, tree_unflatten

    params = dict(tree_flatten(model.parameters()))
    for path, m in model.named_modules():
        if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
            prefix = f"{path}." if path else ""
            w = mx.dequantize(m.weight, m.scales, m.get("biases"), group_size=m.group_size,
                              bits=m.bits, mode=getattr(m, "mode", "affine"))
            for key in ("weight", "scales", "biases"):
                params.pop(prefix + key, None)
            params[prefix + "weight"] = w.astype(dtype)
    other = models.instantiate(config)
    other.update(tree_unflatten(list(params.items())))
    return other


def _load_converted(model: nn.Module, config: dict, kernel: str | None, skip,
                    act_scales: str = "token") -> None:
    """Convert ``model``'s quantized linear layers as ``mlx_w8a8.load`` converts them, in
    place: a checkpoint written by ``mlx_w8a8.save`` (``config`` lists its W8A8 layers),
    those layers; a stock mlx-lm checkpoint, its quantized linear layers that
    ``mlx_w8a8.quantize`` converts (never its float ones, nor the layers the model keeps
    as they are)."""
    import mlx_w8a8
    from .checkpoint import CONFIG_KEY
    from .quantizer import kept_by_model

    listed = (config.get(CONFIG_KEY) or {}).get("layers")
    kept = kept_by_model(model)

    def predicate(path, m):
        if listed is not None:
            return path in listed
        return isinstance(m, nn.QuantizedLinear) and path not in kept

    with warnings.catch_warnings():
        # layers of other bit widths are left as they are: the benchmark's notes say so
        warnings.filterwarnings("ignore", message=r"\[mlx_w8a8\.quantize\] the model holds",
                                category=UserWarning)
        mlx_w8a8.quantize(model, kernel=kernel, skip=skip, class_predicate=predicate,
                          act_scales=act_scales)


def make_variants(spec, layers: int | None = None, seed: int = 0, kernel: str | None = None,
                  skip: list[str] | None = None, weights: Weights | str = "bf16",
                  dtype: mx.Dtype = mx.bfloat16, act_scales: str = "token",
                  outliers: int = 0):
    """Build the model once and the three variants from its weights (four with
    ``outliers``).

    Args:
        spec: the model (a preset, a folder, a ``config.json``); ``None`` for the
            checkpoint folder of ``weights``.
        layers: keep the first ``layers`` transformer blocks.
        seed: seed of random weights.
        kernel: force this kernel in every mlx_w8a8 layer.
        skip: layer patterns the mlx_w8a8 variant keeps on W8A16, as
            ``mlx_w8a8.quantize(skip=...)``.
        weights: a :class:`Weights` or a ``--weights`` value (:func:`parse_weights`).
        dtype: the float dtype of the model (the bf16 variant; bfloat16 for the
            benchmark, float32 where exact agreement is checked).
        act_scales: the mlx_w8a8 variant's :attr:`mlx_w8a8.Linear.act_scales`
            (``"group"``: group-wise layers, from float weights too).
        outliers: add the variant :data:`OUTLIERS`: the mlx_w8a8 model converted
            again, each of its layers with this many outlier channels (at most
            ``K // 16``), evenly spaced (:func:`spaced_outliers`).

    Returns:
        ``({name: model}, config, label)``, the names :func:`variant_names` of the
        format's bits (then :data:`OUTLIERS`); every parameter is evaluated.

    Raises:
        ValueError: for a model that cannot be built, a named format of an already
            quantized checkpoint (it needs float weights) or a bad ``weights``.
    """
    import mlx_w8a8

    fmt = weights if isinstance(weights, Weights) else parse_weights(weights)
    if act_scales == "group" and fmt.per_channel and fmt.source != "float":
        raise ValueError(f"[mlx_w8a8.bench] --act-groups needs group-wise layers, not "
                         f"--weights {fmt.name} (requantized per channel)")
    if fmt.source == "checkpoint" and spec is None:
        spec = fmt.path
    base, config, label = models.build(spec, layers=layers, dtype=dtype, seed=seed)
    quantized = models.is_quantized(config)
    if quantized and fmt.source != "checkpoint":
        raise ValueError(
            f"[mlx_w8a8.bench] {label} is a quantized checkpoint; --weights {fmt.name} starts "
            f"from float weights (a float folder, a config.json or a preset)"
        )
    if not quantized and fmt.source == "checkpoint":
        raise ValueError(
            f"[mlx_w8a8.bench] --weights {fmt.path!r}: {label} holds no quantized checkpoint"
        )
    mx.eval(base.parameters())
    if fmt.source == "checkpoint":
        baseline = base
        base = _dequantized(baseline, config, dtype)
    else:
        baseline = models.clone(base, config)
        nn.quantize(baseline, group_size=fmt.group_size, bits=fmt.bits,
                    class_predicate=_mlx_lm_predicate(fmt.group_size))

    def converted():
        if fmt.source == "float":
            w8 = models.clone(base, config)
            mlx_w8a8.quantize(w8, kernel=kernel, skip=skip, act_scales=act_scales)
        else:  # shares the checkpoint's arrays (per channel: requantized, a copy)
            w8 = _same_layers(baseline, config)
            _load_converted(w8, config, kernel, skip, act_scales)
            if fmt.per_channel:
                from . import requantize

                requantize.per_channel(w8)
        mx.eval(w8.parameters())
        return w8

    mx.eval(base.parameters(), baseline.parameters())
    variants = dict(zip(variant_names(fmt.bits), (base, baseline, converted())))
    if outliers:
        split = variants[OUTLIERS] = converted()
        for _, layer in split.named_modules():
            if isinstance(layer, mlx_w8a8.Linear):
                layer.outliers = spaced_outliers(layer.input_dims, outliers)
    return variants, config, label


def spaced_outliers(k: int, count: int) -> tuple[int, ...] | None:
    """``min(count, k // 16)`` channels evenly spaced over ``k`` (a speed stand-in for
    the recipe's calibrated choice), or ``None`` for none."""
    n = min(int(count), k // 16)
    return tuple(range(0, n * (k // n), k // n)) if n > 0 else None


def notes(variants: dict, fmt: Weights) -> list[str]:
    """What the output must say of the variants: an mlx_w8a8 variant in which no layer
    became an ``mlx_w8a8.Linear`` is the mlx-lm model itself, not a W8A8 one."""
    import mlx_w8a8

    if any(isinstance(m, mlx_w8a8.Linear) for _, m in variants["mlx_w8a8"].named_modules()):
        return []
    return [f"{fmt.bits}-bit layers not converted by this version: the mlx_w8a8 row runs "
            f"the mlx-lm {fmt.bits}-bit model as it is, not W{fmt.bits}A8"]


def w8a8_layers(model: nn.Module) -> dict:
    """``{"layers": n, "formats": {format: n}, "group_sizes": [...], "outliers": n}`` of
    the model's ``mlx_w8a8.Linear`` layers (``outliers``: how many have outlier
    channels)."""
    import mlx_w8a8

    found = [m for _, m in model.named_modules() if isinstance(m, mlx_w8a8.Linear)]
    formats: dict[str, int] = {}
    for m in found:
        formats[m.format] = formats.get(m.format, 0) + 1
    return {"layers": len(found), "formats": formats,
            "group_sizes": sorted({m.group_size for m in found}),
            "outliers": sum(m.outliers is not None for m in found)}


def working_memory(fn, into: dict, name: str):
    """``fn()``, evaluated, with ``into[name]`` set to the peak bytes MLX held during it
    above those in use before it (``mx.get_peak_memory`` after ``mx.reset_peak_memory``):
    activations, KV cache and temporaries such as a dequantized weight, not the
    parameters (resident before)."""
    mx.synchronize()
    before = mx.get_active_memory()
    mx.reset_peak_memory()
    result = fn()
    mx.eval(result)
    mx.synchronize()
    into[name] = max(0, mx.get_peak_memory() - before)
    return result


def nbytes(model: nn.Module) -> int:
    from mlx.utils import tree_flatten

    return sum(v.nbytes for _, v in tree_flatten(model.parameters()))


# --- measurements -----------------------------------------------------------------------


def sqnr_db(reference: mx.array, x: mx.array) -> float:
    """``10 log10(sum(ref^2) / sum((x - ref)^2))`` in float32; ``inf`` when equal."""
    ref = reference.astype(mx.float32)
    noise = mx.sum(mx.square(x.astype(mx.float32) - ref)).item()
    signal = mx.sum(mx.square(ref)).item()
    if noise == 0:
        return math.inf
    return 10.0 * math.log10(signal / noise) if signal > 0 else -math.inf


def new_lengths(names, rounds: int, t: int, pool: mx.array, on, on_round=None) -> dict:
    """Prefills at lengths never run before: in each of ``rounds`` alternating rounds,
    every variant runs its own next length of ``T + 1, T + 2, ...`` (the first ``T + i``
    tokens of ``pool``, ``[1, >= T + rounds * len(names)]``), through ``on(name, fn)``.
    Each time is scaled to ``T`` tokens (``seconds * T / length``), so the summary's
    tokens/s counts each call's own tokens; its ``lengths`` lists them per variant."""
    lengths = {n: [] for n in names}
    nxt = iter(range(t + 1, pool.shape[1] + 1))

    def measure(name):
        length = next(nxt)
        lengths[name].append(length)
        seconds = on(name, lambda m: prefill(m, pool[:, :length]))[0]
        return seconds * t / length

    times = alternate(names, rounds, measure, on_round)
    return {"kind": "summary", "measure": "prefill-new", "tokens": t, **summarize(times, t),
            "lengths": lengths}


def _longest(cfg: dict, t: int, names) -> int:
    """The longest prefill run for ``--tokens`` T: T, or with ``--new-lengths`` the
    last of its new lengths (one per variant and round, :func:`new_lengths`)."""
    return t + (cfg["rounds"] * len(names) if cfg["new_lengths"] else 0)


def summarize(times: dict[str, list[float]], tokens: int) -> dict:
    """tokens/s per variant and the per-round speed ratios with their spread."""

    def stats(values):
        s = render.spread(values)
        return None if s is None else {"median": s[0], "p25": s[1], "p75": s[2]}

    speed = {n: stats([tokens / t for t in ts]) for n, ts in times.items()}
    # the mlx-lm baseline of the run's format (mlx-lm-8bit, mlx-lm-4bit, ...)
    lm = next((n for n in times if n.startswith("mlx-lm-")), "mlx-lm-8bit")
    pairs = {f"mlx_w8a8/{lm}": ("mlx_w8a8", lm),
             "mlx_w8a8/bf16": ("mlx_w8a8", "bf16"),
             f"{lm}/bf16": (lm, "bf16")}
    for arm in (UNSHARED, UNLINKED):
        if arm in times:
            pairs[f"mlx_w8a8/{arm}"] = ("mlx_w8a8", arm)
    if OUTLIERS in times:
        pairs[f"{OUTLIERS}/mlx_w8a8"] = (OUTLIERS, "mlx_w8a8")
        pairs[f"{OUTLIERS}/bf16"] = (OUTLIERS, "bf16")
    ratios = {}
    for key, (a, b) in pairs.items():
        per_round = [tb / ta for ta, tb in zip(times[a], times[b])]  # speed a / speed b
        ratios[key] = dict(stats(per_round) or {}, rounds=[round(x, 4) for x in per_round])
    return {"tokens_per_s": speed, "ratio": ratios}


# --- the run ----------------------------------------------------------------------------


def run(args, stream, out, emit) -> int:
    """The model benchmark; returns the exit status (JSON to ``stream``, table to ``out``)."""
    cfg = settings(args)
    spec, weights = source(args)  # every option checked before a model is built
    batch = batch_sizes(args, cfg["decode"])
    if args.table:
        from .tuning import set_tuning_table

        set_tuning_table(args.table)
    seed = args.seed
    share = _share_switch() if args.unshared else None
    variants, config, label = make_variants(
        spec, args.layers, seed, args.kernel, getattr(args, "skip", None), weights,
        act_scales="group" if getattr(args, "act_groups", False) else "token",
        outliers=getattr(args, "outliers", 0) or 0)
    vocab = int(config["vocab_size"])
    loop_name, loop = decode_loop()
    batch_loop_name, batch_loop = batch_decode_loop()
    lm = variant_names(weights.bits)[1]
    said = notes(variants, weights)
    names = (list(variants) + ([UNSHARED] if share else [])
             + ([UNLINKED] if getattr(args, "unlinked", False) else []))
    switches = {UNSHARED: share, UNLINKED: siblings.launch_together}

    def on(name, fn):
        """``fn(model)`` for arm ``name`` (the unshared / unlinked arm: the mlx_w8a8 model
        with activation sharing / sibling launches off meanwhile)."""
        if name not in switches:
            return fn(variants[name])
        switches[name](False)
        try:
            return fn(variants["mlx_w8a8"])
        finally:
            switches[name](True)

    emit({
        "kind": "setup", "model": label, "model_type": config.get("model_type"),
        "layers": config.get("num_hidden_layers"), "hidden_size": config.get("hidden_size"),
        "vocab_size": vocab, "dtype": "bfloat16", "device": table.device_key(),
        "variants": names, "bytes": {n: nbytes(m) for n, m in variants.items()},
        "weights": weights.record(),
        "quantization": {lm: {"group_size": weights.group_size, "bits": weights.bits},
                         **{n: {"kernel": args.kernel, "skip": getattr(args, "skip", None),
                                **w8a8_layers(variants[n])}
                            for n in ("mlx_w8a8", OUTLIERS) if n in variants}},
        "notes": said,
        **cfg, "batch": batch, "seed": seed, "decode_loop": loop_name,
        "batch_decode_loop": batch_loop_name if batch else None,
        "mlx_lm": models.mlx_lm_mode(),
    }, stream)
    rows = []
    working: dict[int, dict[str, int]] = {}
    warmed = None
    say = ((lambda line: None) if getattr(args, "no_progress", False)
           else (lambda line: print(f"[mlx_w8a8.bench] {line}", file=sys.stderr, flush=True)))
    begun = time.perf_counter()

    def add(label: str, summary: dict) -> None:
        """A finished row: its JSON line, kept for the table and said at once
        (progress_line)."""
        emit(summary, stream)
        rows.append((label, summary))
        say(progress_line(label, summary, lm, time.perf_counter() - begun))
    if cfg["warm_up"]:
        import mlx_w8a8

        longest = max([_longest(cfg, t, names) for t in cfg["tokens"]]
                      + [cfg["prompt"] if cfg["decode"] else 1] + batch)
        start = time.perf_counter()
        calls = sum(len(mlx_w8a8.warm_up(variants[n], max_tokens=longest, progress=False).compiled)
                    for n in ("mlx_w8a8", OUTLIERS) if n in variants)
        warmed = (calls, time.perf_counter() - start, longest)
        say(f"mlx_w8a8.warm_up: {calls} calls, {warmed[1]:.1f} s (M = 1 ... {longest})")
        emit({"kind": "warm_up", "variant": "mlx_w8a8", "max_tokens": longest,
              "calls": warmed[0], "seconds": round(warmed[1], 3)}, stream)

    def record(measure, tokens, **extra):
        def on_round(r, order, seconds):
            emit({"kind": "round", "measure": measure, "tokens": tokens, **extra, "round": r,
                  "order": order, "seconds": {n: round(s, 6) for n, s in seconds.items()}}, stream)
        return on_round

    for t in cfg["tokens"]:
        pool = mx.random.randint(0, vocab, (1, _longest(cfg, t, names)),
                                 key=mx.random.key(1000 * seed + t)).astype(mx.int32)
        tokens = pool[:, :t]
        # warm-up: the first call's logits give the SQNR, its peak the working memory
        work = {}
        ref = working_memory(lambda: prefill(variants["bf16"], tokens)[1], work, "bf16")
        sqnr = {}
        for name in names[1:]:
            logits = working_memory(lambda: on(name, lambda m: prefill(m, tokens))[1], work, name)
            sqnr[name] = sqnr_db(ref, logits)
            del logits
        del ref
        working[t] = work
        for _ in range(WARMUP - 1):
            for name in names:
                on(name, lambda m: prefill(m, tokens))
        times = alternate(names, cfg["rounds"], lambda n: on(n, lambda m: prefill(m, tokens))[0],
                          record("prefill", t))
        summary = {"kind": "summary", "measure": "prefill", "tokens": t, **summarize(times, t),
                   "sqnr_db": {n: _finite(v) for n, v in sqnr.items()},
                   "working_bytes": working[t]}
        add(f"prefill T={t}", summary)
        if cfg["new_lengths"]:
            summary = new_lengths(names, cfg["rounds"], t, pool, on, record("prefill-new", t))
            add(f"prefill T={t}+, new lengths", summary)
        mx.clear_cache()
    if cfg["decode"]:
        n = cfg["decode"]
        prompt = mx.random.randint(0, vocab, (cfg["prompt"],), key=mx.random.key(1000 * seed)).astype(mx.int32)
        for name in names:  # warm-up
            on(name, lambda m: decode(m, prompt, min(n, 2), loop))
        times = alternate(names, cfg["rounds"], lambda v: on(v, lambda m: decode(m, prompt, n, loop)),
                          record("decode", n))
        summary = {"kind": "summary", "measure": "decode", "tokens": n, "prompt": cfg["prompt"],
                   **summarize(times, n)}
        add(f"decode N={n} (prompt {cfg['prompt']})", summary)
    steps = {}
    for b in batch:
        n = cfg["decode"]
        prompts = mx.random.randint(0, vocab, (b, cfg["prompt"]),
                                    key=mx.random.key(1000 * seed + 500 + b)).astype(mx.int32)
        for name in names:  # warm-up
            on(name, lambda m: batch_decode(m, prompts, min(n, 2), batch_loop))
        times = alternate(names, cfg["rounds"],
                          lambda v: on(v, lambda m: batch_decode(m, prompts, n, batch_loop)),
                          record("decode-batch", b * n, batch=b, steps=n))
        summary = {"kind": "summary", "measure": "decode-batch", "batch": b, "steps": n,
                   "tokens": b * n, "prompt": cfg["prompt"], **summarize(times, b * n),
                   "step_s": {v: round(render.spread([t / n for t in ts])[0], 6)
                              for v, ts in times.items()}}
        label_b = f"decode B={b} N={n} (prompt {cfg['prompt']})"
        add(label_b, summary)
        steps[label_b] = summary["step_s"]
    for n in ("mlx_w8a8", OUTLIERS):
        if n in variants:
            emit({"kind": "decisions", "variant": n, "layers": decisions(variants[n])}, stream)
    print(f"\n{label}: {config.get('num_hidden_layers')} layer(s), hidden {config.get('hidden_size')}, "
          f"vocab {vocab}, bfloat16; {cfg['rounds']} alternating rounds per row", file=out)
    print(f"weights: {weights.describe()}", file=out)
    bf16_bytes = nbytes(variants["bf16"])
    print("parameters: " + ", ".join(
        f"{n} {render.fmt_bytes(nbytes(m))} ({nbytes(m) / bf16_bytes:.2f}x bf16)" if n != "bf16"
        else f"{n} {render.fmt_bytes(nbytes(m))}" for n, m in variants.items()), file=out)
    for line in said:
        print(f"note: {line}", file=out)
    if warmed is not None:
        print(f"mlx_w8a8.warm_up before the rounds: {warmed[0]} calls, {warmed[1]:.1f} s "
              f"(M = 1 ... {warmed[2]})", file=out)
    print(render_table(rows, names), file=out)
    for t, work in working.items():
        print(f"prefill T={t}, working memory (peak above the memory in use before its first "
              "call): " + ", ".join(f"{n} {render.fmt_bytes(b)}" for n, b in work.items()),
              file=out)
    for row, per_step in steps.items():
        print(f"{row}, seconds per step (median): " + ", ".join(
            f"{n} {1000 * t:.3g} ms" for n, t in per_step.items()), file=out)
    print("ratios: speed of the first over the second, median (p25..p75) of the per-round "
          "ratios; > 1: the first is faster. SQNR: logits vs bf16 on the same tokens.", file=out)
    if steps:
        print(f"decode B=...: B sequences decoding together by {batch_loop_name}; tok/s = "
              "B x steps / time", file=out)
    return 0


def progress_line(label: str, summary: dict, lm: str, seconds: float) -> str:
    """One finished row as a progress line: its medians of ``mlx_w8a8`` over bf16 and
    over the mlx-lm baseline ``lm`` (the table's first two ratio columns) and the seconds
    since the variants were built (a warm-up included)."""
    def ratio(key):
        median = summary["ratio"].get(key, {}).get("median")
        return "-" if median is None else f"{median:.2f}x"
    return (f"{label}: w8a8 / bf16 {ratio('mlx_w8a8/bf16')}, w8a8 / {lm} "
            f"{ratio(f'mlx_w8a8/{lm}')} ({seconds:.0f} s)")


def decisions(model: nn.Module) -> dict[str, str]:
    """``{path: repr(layer)}`` of the model's ``mlx_w8a8.Linear`` layers: after the runs,
    each says which kernel it ran per M and where the decision came from."""
    import mlx_w8a8

    return {path: repr(m) for path, m in model.named_modules() if isinstance(m, mlx_w8a8.Linear)}


def render_table(rows: list[tuple[str, dict]], names=VARIANTS) -> str:
    """The readable table of the summaries (``names``: the arms, in column order, the
    mlx-lm baseline second)."""
    lm = names[1]
    short = lm[len("mlx-lm-"):].replace("bit", "-bit")  # "mlx-lm-8bit" -> "8-bit"
    keys = [f"mlx_w8a8/{lm}", "mlx_w8a8/bf16", f"{lm}/bf16"]
    titles = [f"w8a8 / {short}", "w8a8 / bf16", f"{short} / bf16"]
    if UNSHARED in names:
        keys.append(f"mlx_w8a8/{UNSHARED}")
        titles.append("shared / unshared")
    if UNLINKED in names:
        keys.append(f"mlx_w8a8/{UNLINKED}")
        titles.append("linked / unlinked")
    if OUTLIERS in names:
        keys += [f"{OUTLIERS}/mlx_w8a8", f"{OUTLIERS}/bf16"]
        titles += ["outliers / w8a8", "outliers / bf16"]
    sqnr_names = [lm, "mlx_w8a8"] + ([OUTLIERS] if OUTLIERS in names else [])
    head = (["measure"] + [f"{n} tok/s" for n in names] + titles + [f"SQNR {short}", "SQNR w8a8"]
            + (["SQNR outliers"] if OUTLIERS in names else []))
    body = []
    for label, s in rows:
        speed = [_fmt_speed(s["tokens_per_s"].get(n)) for n in names]
        ratios = []
        for key in keys:
            r = s["ratio"][key]
            ratios.append("-" if r.get("median") is None else
                          f"{r['median']:.2f}x ({r['p25']:.2f}..{r['p75']:.2f})")
        sq = s.get("sqnr_db") or {}
        body.append([label] + speed + ratios + [_fmt_db(sq.get(n)) for n in sqnr_names])
    return render.columns(head, body, right=range(1, len(head)))


def _share_switch():
    """``share_activations(enabled)`` of :mod:`mlx_w8a8.nn`, for ``--unshared``."""
    from . import nn as w8a8_nn

    switch = getattr(w8a8_nn, "share_activations", None)
    if switch is None:
        raise ValueError(
            "[mlx_w8a8.bench] --unshared needs mlx_w8a8.nn.share_activations, which this "
            "version does not have"
        )
    return switch


def _fmt_speed(stats) -> str:
    return "-" if not stats else f"{stats['median']:.4g}"


def _fmt_db(value) -> str:
    return "-" if value is None else f"{value:.1f} dB"


def _finite(x: float):
    return round(x, 3) if math.isfinite(x) else None


if __name__ == "__main__":  # a library module of the bench: say which command runs it
    print("[mlx_w8a8.modelbench] this module has no command of its own; run it as "
          "python -m mlx_w8a8.bench --model PATH|PRESET (--help for the options)",
          file=sys.stderr)
    raise SystemExit(2)
