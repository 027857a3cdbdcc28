"""``python -m mlx_w8a8.bench --model PATH|PRESET``: a whole model, three ways.

Builds the model with mlx-lm's architecture (:mod:`mlx_w8a8.models`: a preset, an
mlx-lm folder or a ``config.json``; random weights when the folder holds none;
``--layers`` keeps the first L transformer blocks) in bfloat16, once, and makes three
variants from the same weights:

- ``bf16``: the model as built;
- ``mlx-lm-8bit``: ``nn.quantize(model, group_size=64, bits=8)`` with the predicate
  ``mlx_lm.convert`` uses (every layer with ``to_quantized`` whose K the group size
  divides: linear layers and the embedding);
- ``mlx_w8a8``: ``mlx_w8a8.quantize(model)`` (linear layers; ``--kernel`` forces one).

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
- **SQNR** of each variant's prefill logits against the bfloat16 model's, in dB
  (``10 log10(sum(ref^2) / sum((x - ref)^2))`` over all positions and the vocabulary).

Output: a readable table on stdout, and with ``--json FILE`` JSON lines (a ``setup``
record, one ``round`` record per timed round, one ``summary`` record per measurement, and
a ``decisions`` record with ``repr`` of every mlx_w8a8 layer: the kernel it ran per M and
why) in FILE (``--json`` alone: on stdout, the table then on stderr).

With ``--tp N``, under a distributed launch of N ranks, the W8A8 model is split over
the ranks and timed against one device instead: :mod:`mlx_w8a8.tpbench` (it reuses
this module's model building, prefill and decode).
"""

from __future__ import annotations

import math
import time

import mlx.core as mx
import mlx.nn as nn

from . import models, siblings
from .tuning import render, table
# The timing primitives, shared with the tuner's model checks; re-exported here.
from .tuning.model_timing import WARMUP, alternate, decode, decode_loop, generate_steps, prefill

VARIANTS = ("bf16", "mlx-lm-8bit", "mlx_w8a8")
# With --unshared: the mlx_w8a8 model again, with the sharing of quantized activations
# between layers fed the same input (q/k/v, gate/up) turned off: what the sharing saves.
UNSHARED = "mlx_w8a8-unshared"
# With --unlinked: the mlx_w8a8 model again, each sibling layer (q/k/v, gate/up) run by
# itself instead of one launch per group (mlx_w8a8.siblings): what the group launch saves.
UNLINKED = "mlx_w8a8-unlinked"
GROUP_SIZE, BITS = 64, 8
# Defaults per device: a CPU runs an 8B-shaped layer slowly (about 7 s for one
# bfloat16 quantized_matmul of a 128256-row lm_head), so it gets short runs.
GPU_DEFAULTS = {"tokens": "1,16,128,512,2048", "decode": 64, "prompt": 128, "rounds": 10}
CPU_DEFAULTS = {"tokens": "1,16", "decode": 4, "prompt": 8, "rounds": 2}


def add_arguments(p) -> None:
    """The model benchmark's options, on ``python -m mlx_w8a8.bench``'s parser."""
    g = p.add_argument_group(
        "model benchmark (--model)",
        "bf16 vs mlx-lm 8-bit vs mlx_w8a8 on a whole mlx-lm model; defaults on a GPU: "
        f"--tokens {GPU_DEFAULTS['tokens']} --decode {GPU_DEFAULTS['decode']} --prompt "
        f"{GPU_DEFAULTS['prompt']} --rounds {GPU_DEFAULTS['rounds']}; on a CPU: --tokens "
        f"{CPU_DEFAULTS['tokens']} --decode {CPU_DEFAULTS['decode']} --prompt "
        f"{CPU_DEFAULTS['prompt']} --rounds {CPU_DEFAULTS['rounds']}",
    )
    g.add_argument("--model", "--preset", dest="model", metavar="PATH|PRESET",
                   help="benchmark a model: llama-3-8b, mistral-7b, qwen2.5-7b, llama-3.2-1b, an mlx-lm "
                   "folder or a config.json (needs mlx-lm)")
    g.add_argument("--layers", type=int, help="keep the first L transformer blocks")
    g.add_argument("--tokens", help="prefill lengths T, comma-separated")
    g.add_argument("--decode", type=int, help="decode steps N (0: no decode measurement)")
    g.add_argument("--prompt", type=int, help="prompt tokens before the decode steps")
    g.add_argument("--rounds", type=int, help="timed rounds per measurement (>= 2)")
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
    g.add_argument("--skip", nargs="+", metavar="PATTERN",
                   help="layers the mlx_w8a8 variant keeps on W8A16 (mlx_w8a8.quantize's "
                   "skip=, e.g. lm_head down_proj): the speed of a mixed model")


def settings(args) -> dict:
    """The run's settings: the options given, device defaults for the others.

    Raises:
        ValueError: for malformed or out-of-range values.
    """
    from .tuning import shapes

    defaults = CPU_DEFAULTS if table.backend() == "cpu" else GPU_DEFAULTS
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
    if args.kernel is not None:  # before the model is built, not after
        from .kernels import registry

        try:
            registry.get("linear", args.kernel)
        except ValueError as error:  # names the known kernels
            raise ValueError(f"[mlx_w8a8.bench] --kernel {args.kernel!r}: {error}") from None
    out["new_lengths"] = bool(getattr(args, "new_lengths", False))
    out["warm_up"] = bool(getattr(args, "warm_up", False))
    return out


# --- variants ---------------------------------------------------------------------------


def _mlx_lm_predicate(path: str, module: nn.Module) -> bool:
    # mlx_lm.utils.quantize_model: layers that can quantize, K divisible by the group
    return hasattr(module, "to_quantized") and module.weight.shape[-1] % GROUP_SIZE == 0


def make_variants(spec, layers: int | None = None, seed: int = 0, kernel: str | None = None,
                  skip: list[str] | None = None):
    """Build the model once and the three variants from its weights (``skip``: layer
    patterns the mlx_w8a8 variant keeps on W8A16, as ``mlx_w8a8.quantize(skip=...)``).

    Returns:
        ``({name: model}, config, label)``; every parameter is evaluated.

    Raises:
        ValueError: for a model that cannot be built, or a checkpoint that is already
            quantized (the bf16 variant needs float weights).
    """
    import mlx_w8a8

    base, config, label = models.build(spec, layers=layers, dtype=mx.bfloat16, seed=seed)
    if models.is_quantized(config):
        raise ValueError(
            f"[mlx_w8a8.bench] {label} is a quantized checkpoint; the model benchmark starts "
            f"from float weights (a float folder, a config.json or a preset)"
        )
    mx.eval(base.parameters())
    q8 = models.clone(base, config)
    nn.quantize(q8, group_size=GROUP_SIZE, bits=BITS, class_predicate=_mlx_lm_predicate)
    w8 = models.clone(base, config)
    mlx_w8a8.quantize(w8, kernel=kernel, skip=skip)
    mx.eval(q8.parameters(), w8.parameters())
    return dict(zip(VARIANTS, (base, q8, w8))), config, label


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
    pairs = {"mlx_w8a8/mlx-lm-8bit": ("mlx_w8a8", "mlx-lm-8bit"),
             "mlx_w8a8/bf16": ("mlx_w8a8", "bf16"),
             "mlx-lm-8bit/bf16": ("mlx-lm-8bit", "bf16")}
    for arm in (UNSHARED, UNLINKED):
        if arm in times:
            pairs[f"mlx_w8a8/{arm}"] = ("mlx_w8a8", arm)
    ratios = {}
    for key, (a, b) in pairs.items():
        per_round = [tb / ta for ta, tb in zip(times[a], times[b])]  # speed a / speed b
        ratios[key] = dict(stats(per_round) or {}, rounds=[round(x, 4) for x in per_round])
    return {"tokens_per_s": speed, "ratio": ratios}


# --- the run ----------------------------------------------------------------------------


def run(args, stream, out, emit) -> int:
    """The model benchmark; returns the exit status (JSON to ``stream``, table to ``out``)."""
    cfg = settings(args)
    if args.table:
        from .tuning import set_tuning_table

        set_tuning_table(args.table)
    seed = args.seed
    share = _share_switch() if args.unshared else None
    variants, config, label = make_variants(args.model, args.layers, seed, args.kernel,
                                            getattr(args, "skip", None))
    vocab = int(config["vocab_size"])
    loop_name, loop = decode_loop()
    names = (list(VARIANTS) + ([UNSHARED] if share else [])
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
        "quantization": {"mlx-lm-8bit": {"group_size": GROUP_SIZE, "bits": BITS},
                         "mlx_w8a8": {"kernel": args.kernel,
                                      "skip": getattr(args, "skip", None)}},
        **cfg, "seed": seed, "decode_loop": loop_name, "mlx_lm": models.mlx_lm_mode(),
    }, stream)
    rows = []
    warmed = None
    if cfg["warm_up"]:
        import mlx_w8a8

        longest = max([_longest(cfg, t, names) for t in cfg["tokens"]]
                      + [cfg["prompt"] if cfg["decode"] else 1])
        start = time.perf_counter()
        report = mlx_w8a8.warm_up(variants["mlx_w8a8"], max_tokens=longest, progress=False)
        warmed = (len(report.compiled), time.perf_counter() - start, longest)
        emit({"kind": "warm_up", "variant": "mlx_w8a8", "max_tokens": longest,
              "calls": warmed[0], "seconds": round(warmed[1], 3)}, stream)

    def record(measure, tokens):
        def on_round(r, order, seconds):
            emit({"kind": "round", "measure": measure, "tokens": tokens, "round": r,
                  "order": order, "seconds": {n: round(s, 6) for n, s in seconds.items()}}, stream)
        return on_round

    for t in cfg["tokens"]:
        pool = mx.random.randint(0, vocab, (1, _longest(cfg, t, names)),
                                 key=mx.random.key(1000 * seed + t)).astype(mx.int32)
        tokens = pool[:, :t]
        # warm-up: the first call's logits give the SQNR
        _, ref = prefill(variants["bf16"], tokens)
        sqnr = {}
        for name in names[1:]:
            _, logits = on(name, lambda m: prefill(m, tokens))
            sqnr[name] = sqnr_db(ref, logits)
            del logits
        del ref
        for _ in range(WARMUP - 1):
            for name in names:
                on(name, lambda m: prefill(m, tokens))
        times = alternate(names, cfg["rounds"], lambda n: on(n, lambda m: prefill(m, tokens))[0],
                          record("prefill", t))
        summary = {"kind": "summary", "measure": "prefill", "tokens": t, **summarize(times, t),
                   "sqnr_db": {n: _finite(v) for n, v in sqnr.items()}}
        emit(summary, stream)
        rows.append((f"prefill T={t}", summary))
        if cfg["new_lengths"]:
            summary = new_lengths(names, cfg["rounds"], t, pool, on, record("prefill-new", t))
            emit(summary, stream)
            rows.append((f"prefill T={t}+, new lengths", summary))
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
        emit(summary, stream)
        rows.append((f"decode N={n} (prompt {cfg['prompt']})", summary))
    emit({"kind": "decisions", "variant": "mlx_w8a8", "layers": decisions(variants["mlx_w8a8"])},
         stream)
    print(f"\n{label}: {config.get('num_hidden_layers')} layer(s), hidden {config.get('hidden_size')}, "
          f"vocab {vocab}, bfloat16; {cfg['rounds']} alternating rounds per row", file=out)
    if warmed is not None:
        print(f"mlx_w8a8.warm_up before the rounds: {warmed[0]} calls, {warmed[1]:.1f} s "
              f"(M = 1 ... {warmed[2]})", file=out)
    print(render_table(rows, names), file=out)
    print("ratios: speed of the first over the second, median (p25..p75) of the per-round "
          "ratios; > 1: the first is faster. SQNR: logits vs bf16 on the same tokens.", file=out)
    return 0


def decisions(model: nn.Module) -> dict[str, str]:
    """``{path: repr(layer)}`` of the model's ``mlx_w8a8.Linear`` layers: after the runs,
    each says which kernel it ran per M and where the decision came from."""
    import mlx_w8a8

    return {path: repr(m) for path, m in model.named_modules() if isinstance(m, mlx_w8a8.Linear)}


def render_table(rows: list[tuple[str, dict]], names=VARIANTS) -> str:
    """The readable table of the summaries (``names``: the arms, in column order)."""
    keys = ["mlx_w8a8/mlx-lm-8bit", "mlx_w8a8/bf16", "mlx-lm-8bit/bf16"]
    titles = ["w8a8 / 8-bit", "w8a8 / bf16", "8-bit / bf16"]
    if UNSHARED in names:
        keys.append(f"mlx_w8a8/{UNSHARED}")
        titles.append("shared / unshared")
    if UNLINKED in names:
        keys.append(f"mlx_w8a8/{UNLINKED}")
        titles.append("linked / unlinked")
    head = ["measure"] + [f"{n} tok/s" for n in names] + titles + ["SQNR 8-bit", "SQNR w8a8"]
    body = []
    for label, s in rows:
        speed = [_fmt_speed(s["tokens_per_s"].get(n)) for n in names]
        ratios = []
        for key in keys:
            r = s["ratio"][key]
            ratios.append("-" if r.get("median") is None else
                          f"{r['median']:.2f}x ({r['p25']:.2f}..{r['p75']:.2f})")
        sq = s.get("sqnr_db") or {}
        body.append([label] + speed + ratios + [_fmt_db(sq.get("mlx-lm-8bit")), _fmt_db(sq.get("mlx_w8a8"))])
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
    import sys

    print("[mlx_w8a8.modelbench] this module has no command of its own; run it as "
          "python -m mlx_w8a8.bench --model PATH|PRESET (--help for the options)",
          file=sys.stderr)
    raise SystemExit(2)
