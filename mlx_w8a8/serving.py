"""Models for mlx-lm's own generator and server, loaded with ``mlx_w8a8.Linear`` layers.

``python -m mlx_w8a8.generate`` and ``python -m mlx_w8a8.server`` run mlx-lm's
``mlx_lm.generate.main`` and ``mlx_lm.server.main`` unchanged (their flags, their HTTP
API) with one difference: the models they load are converted to W8A8 right after
mlx-lm builds them. This module owns that conversion and the flags it adds.

The hook: mlx-lm has no plugin point for model loading. Both command lines call the
function ``load(path_or_hf_repo, tokenizer_config, model_config, adapter_path, lazy,
return_config, ...)`` that their module imports from ``mlx_lm.utils``; the server's
``ModelProvider._load`` calls it for every model a request names. :func:`patched`
replaces that one module attribute for the duration of a call, with a wrapper
(:class:`W8A8Loader`) that calls mlx-lm's own ``load`` and then converts the model. If
the attribute is missing or its signature lacks the parameters the wrapper relies on,
it raises a ``RuntimeError`` naming the installed mlx-lm version instead of serving an
unconverted model.

What is converted (the same layers :func:`mlx_w8a8.load` converts):

- a folder written by :func:`mlx_w8a8.save`: the layers its ``config.json`` lists
  (the W8A16 and float layers of a mixed model stay as mlx-lm builds them);
- a stock mlx-lm 8-bit folder: its 8-bit affine ``QuantizedLinear`` layers;
- with ``--quantize``: also the float ``nn.Linear`` layers (a float folder quantized on
  load, symmetric per-channel, ``--q-group-size`` for layers whose K it divides).

With ``--per-channel`` the group-wise layers (an mlx-lm 8-bit or 4-bit folder's) are
then requantized to symmetric per-channel int8 (:func:`mlx_w8a8.requantize.per_channel`:
the fastest W8A8 kernels, at the cost of a second rounding, logged as weight SQNR with
the weights' bytes; 4-bit weights double).

A model with no layer to convert is an error (``--quantize`` is the way to serve a float
folder): serving it unconverted is exactly what these command lines exist to avoid.
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
import time
from contextlib import contextmanager
from typing import Callable, NamedTuple

import mlx.core as mx
import mlx.nn as nn

from . import backends
from .weight import GROUP_SIZES

CONFIG_KEY = "mlx_w8a8"  # the entry mlx_w8a8.save writes into config.json
# Parameters of mlx-lm's ``load`` the wrapper passes or reads by name.
_LOAD_PARAMS = ("path_or_hf_repo", "adapter_path", "return_config")


class ServeOptions(NamedTuple):
    """How :class:`W8A8Loader` converts a model mlx-lm loaded.

    Args:
        quantize: also quantize float ``nn.Linear`` layers (symmetric per-channel int8).
        group_size: the group size of layers quantized from float (32, 64 or 128).
        tuning_table: a tuning table read first, set process-wide by :func:`patched`
            with ``mlx_w8a8.set_tuning_table`` (it stays set after the block), or
            ``None`` for ``$MLX_W8A8_TUNING_TABLE`` / the cache and shipped tables.
        kernel: force this ``linear`` candidate in every converted layer, or ``None``
            (the tuner decides).
        warm_up_tokens: compile the kernels for 1 to this many rows per linear after
            loading (``mlx_w8a8.warm_up``); ``0`` skips the warm-up, ``None`` leaves the
            choice to the command line (:func:`default_warm_up_tokens`).
        act_scales: ``"group"`` gives every converted layer activation groups
            (:attr:`mlx_w8a8.Linear.act_scales`; float layers then quantize group-wise);
            ``None`` keeps what an mlx_w8a8 checkpoint saved (per token otherwise).
        per_channel: requantize the converted group-wise layers (8-bit and 4-bit codes)
            to symmetric per-channel int8 (:func:`mlx_w8a8.requantize.per_channel`); not with
            ``act_scales="group"``.
        backlog: the server's listen backlog (connections waiting to be accepted;
            ``mlx_w8a8.server`` only, :data:`DEFAULT_BACKLOG`), or ``None`` (not a server).
        aside_reads: the server reads each token's log-probability on a stream of its
            own (:mod:`mlx_w8a8.token_reads`; ``mlx_w8a8.server``'s default), or as
            ``mlx_lm.server`` does (``False``: ``--mlx-lm-reads``, and not a server).
    """

    quantize: bool = False
    group_size: int = 64
    tuning_table: str | None = None
    kernel: str | None = None
    warm_up_tokens: int | None = None
    act_scales: str | None = None
    per_channel: bool = False
    backlog: int | None = None
    aside_reads: bool = False


def mlx_lm_version() -> str:
    """The installed mlx-lm's version, or ``"not installed"``."""
    try:
        from mlx_lm._version import __version__
    except ImportError:
        try:
            from importlib.metadata import version

            return version("mlx-lm")
        except Exception:  # noqa: BLE001 - any failure means: no usable mlx-lm
            return "not installed"
    return __version__


def exit_status(prog: str, body: Callable[[], None]) -> int:
    """Runs a command's ``body``: 0 when it returns, 2 (the message on stderr) when it
    raises a ``ValueError`` or ``RuntimeError`` of this package's (its message starts
    with ``[prog]`` or ``[mlx_w8a8``); mlx-lm's and MLX's own errors propagate with their
    tracebacks."""
    try:
        body()
    except (ValueError, RuntimeError) as error:
        if not str(error).startswith((f"[{prog}]", "[mlx_w8a8")):
            raise
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


def mlx_lm_module(prog: str, name: str):
    """mlx-lm's module ``name`` (e.g. ``"mlx_lm.server"``), imported by name: mlx-lm's
    package attributes may shadow its modules (``mlx_lm.generate`` is a function).

    Raises:
        ValueError: naming ``prog`` and how to install mlx-lm, where it is missing.
    """
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError as error:
        raise ValueError(f"[{prog}] needs mlx-lm (pip install 'mlx-w8a8[lm]'): {error}") from None


def default_warm_up_tokens(prefill_step_size: int, prompt_concurrency: int,
                           decode_concurrency: int, device: mx.Device | None = None) -> int:
    """The rows per linear warmed up when ``--warm-up-tokens`` is not given.

    On a GPU: the largest M a server step runs, ``prompt_concurrency`` prompts of one
    ``prefill_step_size`` chunk each (batched prefill) or ``decode_concurrency`` rows
    (batched decode), capped at the tuner's largest M bucket (beyond it every lookup
    snaps to the same bucket). On the CPU: 0, since its reference kernels compile
    nothing and the warm-up would only run the model on zeros.

    Args:
        prefill_step_size: tokens of a prompt processed per step (mlx-lm's
            ``--prefill-step-size``).
        prompt_concurrency: prompts prefilled together (``--prompt-concurrency``).
        decode_concurrency: sequences decoded together (``--decode-concurrency``).
        device: the device the model runs on; default: MLX's default device.
    """
    from .tuning.shapes import M_CAP

    device = device if device is not None else mx.default_device()
    if device.type == mx.DeviceType.cpu:
        return 0
    largest = max(prefill_step_size * max(prompt_concurrency, 1), decode_concurrency, 1)
    return min(largest, M_CAP)


# Connections the server's socket queues before accepting them. mlx-lm's server is a
# ThreadingHTTPServer, whose class default is 5: with 32 clients connecting at once the
# overflowing SYNs are dropped and retried about a second later, or end in a reset
# (docs/serving.md: on this project's CPU, mlx_lm.server on a tiny model gave half the
# output tokens/s at 32 concurrent requests with 5 as with 128, and lost requests).
DEFAULT_BACKLOG = 128


def add_flags(parser: argparse.ArgumentParser, server: bool = False) -> None:
    """Add the flags of :class:`ServeOptions` to ``parser`` (an argument group);
    ``server``: also the server's own (``--backlog``)."""
    group = parser.add_argument_group("mlx_w8a8 (read before mlx-lm's flags)")
    if server:
        group.add_argument("--backlog", type=int, default=DEFAULT_BACKLOG, metavar="N",
                           help=f"connections queued before the server accepts them (default: "
                                f"{DEFAULT_BACKLOG}; mlx_lm.server's is Python's 5, which drops "
                                f"or resets connections when many clients connect at once)")
        group.add_argument("--mlx-lm-reads", action="store_true",
                           help="read each generated token's log-probability on the "
                                "generation stream, as mlx_lm.server does (it then waits for "
                                "the step launched ahead); default: on a stream of its own "
                                "(mlx_w8a8.token_reads, docs/serving.md)")
    group.add_argument("--quantize", action="store_true",
                       help="also quantize float linear layers to W8A8 on load "
                            "(serve a float model folder)")
    group.add_argument("--q-group-size", type=int, default=64, choices=GROUP_SIZES,
                       help="group size of layers quantized with --quantize (default: 64)")
    group.add_argument("--tuning-table", default=None, metavar="PATH",
                       help="a tuning table (JSON) read before the cache and shipped tables")
    group.add_argument("--kernel", default=None, metavar="NAME",
                       help="force this linear kernel in every layer (e.g. exact, mlx_qmm); "
                            "default: the tuner decides")
    group.add_argument("--act-groups", action="store_true",
                       help="one int8 activation scale per token and weight group in every "
                            "W8A8 layer (group-wise weights: an mlx-lm 8-bit or 4-bit folder, "
                            "or --quantize); closer to W8A16 accuracy (docs/accuracy.md)")
    group.add_argument("--per-channel", action="store_true",
                       help="requantize the group-wise layers (an mlx-lm 8-bit or 4-bit "
                            "folder's) to per-channel int8 on load: the fastest W8A8 kernels, "
                            "at the cost of a second rounding and, for 4-bit weights, twice "
                            "their memory (the weight SQNR and bytes are logged; "
                            "docs/serving.md)")
    group.add_argument("--warm-up-tokens", type=int, default=None, metavar="N",
                       help="compile the kernels for 1..N rows per linear before serving; "
                            "0 skips. Default: the server's largest step (prompt "
                            "concurrency x prefill step, at most 8192) on a GPU, 0 on the "
                            "CPU and for mlx_w8a8.generate")


def split_argv(prog: str, argv: list[str],
               server: bool = False) -> tuple[ServeOptions, list[str], bool]:
    """``(options, rest, wants_help)``: the mlx_w8a8 flags of ``argv`` parsed (with the
    server's own where ``server``), the arguments left for mlx-lm's parser, and whether
    ``-h``/``--help`` was given.

    Raises:
        SystemExit: (from argparse, status 2) for a malformed mlx_w8a8 flag.
    """
    # No abbreviations: these flags are spelled in full, and every other argument,
    # shortened or not, is mlx-lm's to resolve (``--q`` would otherwise stop here as
    # an ambiguous --quantize / --q-group-size).
    parser = argparse.ArgumentParser(prog=prog, add_help=False, allow_abbrev=False)
    add_flags(parser, server)
    args, rest = parser.parse_known_args(argv)
    if server and args.backlog < 1:
        parser.error(f"--backlog must be >= 1, got {args.backlog}")
    if args.warm_up_tokens is not None and args.warm_up_tokens < 0:
        parser.error(f"--warm-up-tokens must be >= 0, got {args.warm_up_tokens}")
    if args.per_channel and args.act_groups:
        parser.error("--per-channel (one weight scale per row) and --act-groups (activation "
                     "scales per weight group) exclude each other")
    if args.tuning_table is not None and not os.path.isfile(args.tuning_table):
        # A deployment table that is not there would leave every layer on the prior.
        parser.error(f"--tuning-table {args.tuning_table} is not a file")
    if args.kernel is not None:
        from .kernels import registry

        try:
            registry.get("linear", args.kernel)
        except ValueError as error:
            parser.error(str(error))
    options = ServeOptions(quantize=args.quantize, group_size=args.q_group_size,
                           tuning_table=args.tuning_table, kernel=args.kernel,
                           warm_up_tokens=args.warm_up_tokens,
                           act_scales="group" if args.act_groups else None,
                           per_channel=args.per_channel,
                           backlog=args.backlog if server else None,
                           aside_reads=server and not getattr(args, "mlx_lm_reads", False))
    return options, rest, any(a in ("-h", "--help") for a in argv)


def print_help(prog: str, out=None, server: bool = False) -> None:
    """Print the mlx_w8a8 flags' help (mlx-lm's parser prints its own after it)."""
    parser = argparse.ArgumentParser(prog=prog, add_help=False,
                                     usage=f"{prog} [mlx_w8a8 flags] [mlx-lm flags]")
    add_flags(parser, server)
    parser.print_help(out if out is not None else sys.stdout)
    print(file=out if out is not None else sys.stdout)


def _predicate(config: dict, quantize: bool) -> Callable[[str, nn.Module], bool] | None:
    """Which layers of a model mlx-lm built from ``config`` become W8A8."""
    listed = (config.get(CONFIG_KEY) or {}).get("layers")
    if listed is not None and not quantize:
        return lambda path, m: path in listed
    if quantize:
        return None  # every convertible layer: float, 8-bit and 4-bit affine
    return lambda path, m: isinstance(m, nn.QuantizedLinear)


def convert_loaded(model: nn.Module, config: dict, options: ServeOptions, prog: str,
                   where: str = "the model") -> int:
    """Convert the layers of a model mlx-lm loaded to ``mlx_w8a8.Linear``, in place.

    Args:
        model: the model ``mlx_lm.utils.load`` returned.
        config: its ``config.json`` contents (as ``load(..., return_config=True)``
            returns them).
        options: the :class:`ServeOptions`.
        prog: the command named in errors.
        where: the model's folder or repository, named in errors.

    Returns:
        The number of ``mlx_w8a8.Linear`` layers.

    Raises:
        ValueError: when no layer was converted (a float model without ``quantize``),
            or ``options.act_scales`` is ``"group"`` and a layer holds per-channel weights.
    """
    from .checkpoint import restore_layer_settings
    from .quantizer import kept_by_model, quantize, w8a8_layers

    chosen = _predicate(config, options.quantize)
    if chosen is not None:  # layers the model keeps as they are (an MoE's routers) stay
        kept = kept_by_model(model)
        chosen = lambda path, m, pick=chosen: pick(path, m) and path not in kept  # noqa: E731
    quantize(model, class_predicate=chosen, group_size=options.group_size, kernel=options.kernel,
             act_scales=options.act_scales or "token")
    listed = (config.get(CONFIG_KEY) or {}).get("layers")
    if listed is not None:  # as the checkpoint saved them (an explicit act_scales stays)
        restore_layer_settings(model, listed, act_scales=options.act_scales is None)
    layers = len(w8a8_layers(model))
    if layers == 0:
        hint = ("pass --quantize to quantize its float layers on load"
                if not options.quantize else
                f"none of its linear layers has a K divisible by --q-group-size "
                f"{options.group_size}")
        raise ValueError(
            f"[{prog}] {where} holds no 8-bit or 4-bit affine or W8A8 linear layer, so nothing runs "
            f"W8A8; {hint} (or convert it with python -m mlx_w8a8.convert)"
        )
    return layers


def _grouped_layers(model: nn.Module) -> dict[str, int]:
    """How many of ``model``'s W8A8 layers hold group-wise weights, by code width:
    ``{"8-bit": layers of format "grouped", "4-bit": of format "grouped4"}``, the
    widths with none left out."""
    from .nn import Linear

    formats = [m.format for _, m in model.named_modules() if isinstance(m, Linear)]
    counts = {"8-bit": formats.count("grouped"), "4-bit": formats.count("grouped4")}
    return {width: n for width, n in counts.items() if n}


def _activation_dtype(model: nn.Module) -> mx.Dtype:
    from .nn import Linear

    for _, layer in model.named_modules():
        if isinstance(layer, Linear):
            return layer["scales"].dtype
    return mx.bfloat16


class W8A8Loader:
    """A stand-in for mlx-lm's ``load`` that converts what it loads to W8A8.

    Called like ``mlx_lm.utils.load`` and returning the same tuple, it calls ``load``
    (download, weights, tokenizer: all mlx-lm's), converts the model
    (:func:`convert_loaded`), warms it up when ``options.warm_up_tokens`` > 0 and logs
    one line of :func:`mlx_w8a8.summary` (which kernels run at decode and prefill).

    Args:
        load: mlx-lm's ``load``.
        options: the :class:`ServeOptions`; ``warm_up_tokens=None`` counts as 0. The
            attribute may be replaced before the first call.
        prog: the command named in errors and log lines.
        log: receives each log line (e.g. ``logging.info``, or a print to stderr).
    """

    def __init__(self, load: Callable, options: ServeOptions, prog: str,
                 log: Callable[[str], None]):
        self.load = load
        self.options = options
        self.prog = prog
        self.log = log
        self.signature = inspect.signature(load)

    def __call__(self, *args, **kwargs):
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        where = bound.arguments["path_or_hf_repo"]
        if bound.arguments["adapter_path"] is not None:
            raise ValueError(
                f"[{self.prog}] adapters (--adapter-path {bound.arguments['adapter_path']}) "
                f"are not supported on W8A8 layers; fuse them into the model first "
                f"(mlx_lm.fuse) and serve the fused folder"
            )
        wanted_config = bound.arguments["return_config"]
        bound.arguments["return_config"] = True
        model, tokenizer, config = self.load(*bound.args, **bound.kwargs)
        start = time.perf_counter()
        layers = convert_loaded(model, config, self.options, self.prog, str(where))
        if self.options.per_channel:
            from .requantize import per_channel

            self.log(f"{self.prog}: {where}: {per_channel(model).describe()}")
        elif backends.on_cuda():
            grouped = _grouped_layers(model)
            if grouped:
                which = " and ".join(f"{n} group-wise {width}" for width, n in grouped.items())
                memory = " (4-bit weights: twice their memory)" if "4-bit" in grouped else ""
                self.log(f"{self.prog}: {where}: {which} layers run as stored; on CUDA their "
                         f"prefill GEMM has half the per-channel GEMM's speed or less "
                         f"(docs/cuda.md): --per-channel requantizes them onto it{memory} and "
                         f"reports what that costs in accuracy")
        # Hazard: MLX's streams belong to the thread that made them, and mlx-lm's server
        # runs the model on a generation thread of its own. Arrays the conversion left
        # lazy would be evaluated there on this thread's stream ("There is no Stream(cpu,
        # 0) in current thread"), so every parameter is evaluated here, where it was made.
        mx.eval(model.parameters())
        self.log(f"{self.prog}: {where}: {layers} linear layers converted to W8A8 in "
                 f"{time.perf_counter() - start:.2f} s")
        tokens = self.options.warm_up_tokens or 0
        if tokens > 0:
            from .warmup import warm_up

            report = warm_up(model, max_tokens=tokens, dtype=_activation_dtype(model),
                             progress=False)
            self.log(f"{self.prog}: warm-up for 1..{tokens} rows: {len(report.compiled)} "
                     f"calls in {report.seconds:.2f} s")
            start = time.perf_counter()
            try:
                model_pass(model, self.prog)
            except Exception as error:  # noqa: BLE001 - the first requests compile instead
                self.log(f"{self.prog}: model pass failed ({type(error).__name__}: {error}); "
                         f"the first requests compile the model's own kernels")
            else:
                self.log(f"{self.prog}: model pass (a prefill and a decode step, then two "
                         f"sequences batched) in {time.perf_counter() - start:.2f} s")
        from .summary import summary

        self.log(summary(model).splitlines()[0])
        return (model, tokenizer, config) if wanted_config else (model, tokenizer)


# The model pass's batched generation: two prompts of unequal lengths (the shorter one
# left-padded) and unequal budgets (one sequence leaves the batch before the other).
_PASS_PROMPTS = ([0, 1, 2, 3], [4, 5, 6])
_PASS_TOKENS = (3, 2)


def model_pass(model, prog: str) -> None:
    """Run ``model`` as mlx-lm does, on a few tokens: a prefill of 4 tokens into its KV
    cache (``mlx_lm.models.cache.make_prompt_cache``) and one decode step on the token
    ``mx.argmax`` picks (uint32, as mlx-lm's samplers return it); then, where mlx-lm has
    it, a short generation of two sequences together by ``mlx_lm.generate.BatchGenerator``
    (the server's continuous batching: padded prompts, a sequence leaving the batch).

    MLX compiles a kernel on its first call in a process, and on CUDA it compiles at run
    time (cached on disk after that): besides the linears that :func:`mlx_w8a8.warm_up`
    covers, the model's own ops (the embedding's gathers for int32 and uint32 tokens,
    fused activations, the batch cache's gathers) took seconds each on a fresh NVIDIA
    H100 host, inside the first requests.

    Args:
        model: an mlx-lm model (called as ``model(tokens, cache=cache)``).
        prog: the command named in errors.
    """
    from .warmup import forget_memos

    try:
        _model_pass(model, prog)
    finally:  # a pass that failed half-way left memos too: no request may take them
        forget_memos()


def _model_pass(model, prog: str) -> None:
    cache = mlx_lm_module(prog, "mlx_lm.models.cache").make_prompt_cache(model)
    logits = model(mx.array([_PASS_PROMPTS[0]], dtype=mx.int32), cache=cache)
    token = mx.argmax(logits[:, -1, :], axis=-1)
    mx.eval(model(token[:, None], cache=cache))
    batch_generator = getattr(mlx_lm_module(prog, "mlx_lm.generate"), "BatchGenerator", None)
    if batch_generator is not None:
        n = len(_PASS_PROMPTS)
        gen = batch_generator(model, max_tokens=max(_PASS_TOKENS), completion_batch_size=n,
                              prefill_batch_size=n)
        try:
            gen.insert([list(p) for p in _PASS_PROMPTS], list(_PASS_TOKENS))
            for _ in range(4 * max(_PASS_TOKENS)):  # bounded: it ends after the budgets
                if not gen.next_generated():
                    break
        finally:
            mx.synchronize(gen.stream)
            gen.close()


def _check_hook(module, prog: str) -> Callable:
    """mlx-lm's ``module.load``, after checking it is the function the wrapper expects."""
    load = getattr(module, "load", None)
    params = set()
    if callable(load):
        try:
            params = set(inspect.signature(load).parameters)
        except (TypeError, ValueError):
            params = set()
    missing = [p for p in _LOAD_PARAMS if p not in params]
    if missing:
        raise RuntimeError(
            f"[{prog}] mlx-lm {mlx_lm_version()} has no {module.__name__}.load with the "
            f"parameters {', '.join(_LOAD_PARAMS)} (missing: {', '.join(missing)}), the "
            f"function mlx_w8a8 replaces to load models with W8A8 layers; install an "
            f"mlx-lm whose {module.__name__} loads models through mlx_lm.utils.load "
            f"(0.32 does)"
        )
    return load


@contextmanager
def patched(module, options: ServeOptions, prog: str, log: Callable[[str], None]):
    """Within the block, ``module.load`` (``mlx_lm.generate`` or ``mlx_lm.server``)
    is a :class:`W8A8Loader` around mlx-lm's own; restored on exit.

    Yields:
        The :class:`W8A8Loader`.

    Raises:
        RuntimeError: when ``module`` has no ``load`` of mlx-lm's signature (naming the
            mlx-lm version).
    """
    original = _check_hook(module, prog)
    loader = W8A8Loader(original, options, prog, log)
    if options.tuning_table is not None:
        from .tuning import set_tuning_table

        set_tuning_table(options.tuning_table)
    module.load = loader
    try:
        yield loader
    finally:
        module.load = original


def run_main(module, prog: str, argv: list[str] | None, options: ServeOptions,
             log: Callable[[str], None]) -> None:
    """Run ``module.main()`` (mlx-lm's command line) on ``argv`` with the loader in
    place; ``sys.argv`` is restored afterwards."""
    saved = sys.argv
    sys.argv = [prog, *(argv or [])]
    try:
        with patched(module, options, prog, log):
            module.main()
    finally:
        sys.argv = saved
