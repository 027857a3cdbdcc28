"""``python -m mlx_w8a8.bench --model PATH|PRESET --tp N``: the model benchmark split
over N ranks (tensor parallelism, :mod:`mlx_w8a8.distributed`), against one device.

Run with N processes, one per device: ``mlx.launch -n 2 --backend ring -- python -m
mlx_w8a8.bench --model PATH --tp 2`` (CPU or Macs), or ranks started by hand for NCCL
(``docs/distributed.md``). ``--tp`` must equal the number of ranks launched; without a
distributed launch it is an error (exit status 2).

Every rank builds the same model (:func:`mlx_w8a8.models.build`: a preset, an mlx-lm
folder or a ``config.json``, ``--layers``, the same ``--seed``) in ``--dtype``,
quantizes it with :func:`mlx_w8a8.quantize` (``--kernel`` forces one kernel) and
shards it with :func:`mlx_w8a8.shard`. Rank 0 also keeps the unsharded W8A8 model: the
one-device arm, run while the other ranks wait.

Check (``--check``, before timing), on ``--check-tokens`` random tokens with the exact
W8A8 kernel forced everywhere: every rank's logits are identical, and the sharded
logits meet the model-level criterion of ``docs/distributed.md``: RMS(tp - one device)
<= 2 RMS(one device W8A8 - the same weights on W8A16). They are also compared, for the
record, with the one-device model doing the sharded-to-all layers' per-slice
quantization in one process. A check that fails makes the exit status 1.

Measurements, arms ``one-device`` (rank 0), ``tp`` and ``all_sum``, each after a
barrier, paired and alternating (one warm-up round, then ``--rounds`` rounds in the
order A B C, C B A, ...):

- **prefill** for each ``--tokens`` T and **decode** (``--decode`` steps after a
  ``--prompt`` token prompt), exactly as the one-device model benchmark runs them
  (:func:`mlx_w8a8.modelbench.prefill`, :func:`mlx_w8a8.modelbench.decode`). Each rank
  times its own wall time (waits for the other ranks included); decode is per token.
- **all_sum**: the same collectives alone (one per sharded-to-all layer per token
  step, ``[1, T, N]`` in the model dtype, chained), timed the same way; the
  communication share of a rank is its all_sum time over its tensor-parallel time.
  The two are separate measurements (medians of separate arms), so the share estimates
  what the forward spends in collectives; on a loaded machine it can exceed 1.
- speed-up over one device: per round, the one-device time over the slowest rank's.

Output (rank 0): JSON lines like the model benchmark's (``setup``, ``check``, one
``summary`` per measurement with per-rank medians, ``decisions``) and a readable table.

Every wait is bounded: a rank still running after ``--tp-timeout`` seconds (a peer
that died, a launch with too few ranks) prints its Python stack (``Timeout``) and exits
with status 1 (:class:`Deadline`).
"""

from __future__ import annotations

import faulthandler
import io
import math
import sys
import time

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_unflatten

from . import modelbench, models
from .tuning import render, table

OP = "mlx_w8a8.bench"
ARMS = ("one-device", "tp", "all_sum")
DEFAULT_TIMEOUT_S = 900.0


def add_arguments(p) -> None:
    """The tensor-parallel options, on ``python -m mlx_w8a8.bench``'s parser."""
    g = p.add_argument_group(
        "tensor parallel (--model ... --tp N)",
        "run under a distributed launch of N ranks (mlx.launch -n N, or MLX_RANK/"
        "MLX_WORLD_SIZE/NCCL_* for nccl); --dtype sets the model dtype",
    )
    g.add_argument("--tp", type=int, metavar="N",
                   help="split the model over N ranks; N must equal the ranks launched")
    g.add_argument("--backend", default="any",
                   help="mx.distributed backend: ring, nccl, jaccl, mpi or any (default)")
    g.add_argument("--check", action="store_true",
                   help="check the sharded logits against one device first (exit 1 if not met)")
    g.add_argument("--check-tokens", type=int, default=64, help="tokens of the check")
    g.add_argument("--tp-timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                   help=f"a rank still running after S seconds prints its stack and exits with "
                   f"status 1 (default {DEFAULT_TIMEOUT_S:g})")


class Deadline:
    """A watchdog: after ``seconds``, print every thread's Python stack to stderr
    (``Timeout (h:mm:ss)!``, then where each waited) and end the process with status 1.
    It is ``faulthandler``'s, a C thread that needs no interpreter lock: a rank blocked
    inside a collective or inside ``mx.distributed.init`` holds it, so a Python timer
    would never run. A context manager; leaving it cancels the watchdog.

    Raises:
        ValueError: when ``seconds`` is not positive.
    """

    def __init__(self, seconds: float):
        if not seconds > 0:
            raise ValueError(f"[{OP}] --tp-timeout must be > 0 seconds, got {seconds}")
        self.seconds = seconds

    def __enter__(self) -> "Deadline":
        try:
            faulthandler.dump_traceback_later(self.seconds, exit=True)
        except (AttributeError, ValueError, io.UnsupportedOperation):
            # sys.stderr replaced by an object without a file descriptor: fd 2
            faulthandler.dump_traceback_later(self.seconds, exit=True, file=sys.__stderr__)
        return self

    def __exit__(self, *exc) -> None:
        faulthandler.cancel_dump_traceback_later()


def join(args) -> mx.distributed.Group:
    """The group of this launch, checked against ``--tp``.

    Raises:
        ValueError: when ``--tp`` is below 2, the process was not started by a
            distributed launch, or the launch's size is not ``--tp``.
    """
    tp = args.tp
    if tp < 2:
        raise ValueError(f"[{OP}] --tp must be >= 2 ranks, got {tp}")
    group = mx.distributed.init(backend=args.backend, strict=False)
    size = group.size()
    if size == 1:
        raise ValueError(
            f"[{OP}] --tp {tp} needs {tp} ranks of a distributed launch, but this process is "
            f"not part of one (backend {args.backend!r}): run it under mlx.launch -n {tp} "
            f"--backend ring -- python -m mlx_w8a8.bench ..., or start each rank with "
            f"MLX_RANK, MLX_WORLD_SIZE, NCCL_HOST_IP and NCCL_PORT for nccl"
        )
    if size != tp:
        raise ValueError(
            f"[{OP}] --tp {tp} does not match the launch: {size} ranks were started; "
            f"pass --tp {size} or launch {tp} ranks"
        )
    return group


# --- collectives ------------------------------------------------------------------------


def barrier(group) -> None:
    mx.eval(mx.distributed.all_sum(mx.array(1.0), group=group))


def gather(group, values) -> np.ndarray:
    """Every rank's ``values`` (a list of floats, the same length everywhere) as
    ``[ranks, len(values)]``: an all_sum of one-hot rows, no all_gather needed."""
    rows = np.zeros((group.size(), len(values)), dtype=np.float32)
    rows[group.rank()] = values
    return np.array(mx.distributed.all_sum(mx.array(rows), group=group))


def collectives(model: nn.Module) -> list[int]:
    """The output features N of each sharded-to-all layer of ``model``: one all_sum of
    ``[..., N]`` per layer and token step."""
    from .distributed import ShardedToAllLinear

    return [m.quantized_weight.n for _, m in model.named_modules()
            if isinstance(m, ShardedToAllLinear)]


def all_sums(group, widths: list[int], tokens: int, steps: int, dtype):
    """``() -> seconds`` of the all_sums of ``steps`` forwards of ``tokens`` tokens,
    chained per width (each one's input is the previous one's output, halved), in one
    ``mx.eval``."""
    inputs = {n: mx.random.normal((1, tokens, n), key=mx.random.key(n)).astype(dtype)
              for n in set(widths)}
    mx.eval(list(inputs.values()))

    def run() -> float:
        start = time.perf_counter()
        ys = dict(inputs)
        for _ in range(steps):
            for n in widths:
                ys[n] = mx.distributed.all_sum(ys[n], group=group) * 0.5
        mx.eval(list(ys.values()))
        return time.perf_counter() - start
    return run


# --- models -----------------------------------------------------------------------------


def build(args, dtype, group, keep_one_device: bool):
    """``(sharded, one_device or None, config, label)``: the same W8A8 model on every
    rank, sharded over ``group``; every parameter evaluated."""
    import mlx_w8a8

    base, config, label = models.build(args.model, layers=args.layers, dtype=dtype, seed=args.seed)
    if models.is_quantized(config):
        raise ValueError(
            f"[{OP}] {label} is a quantized checkpoint; --tp starts from float weights "
            f"(a float folder, a config.json or a preset)"
        )
    mx.eval(base.parameters())
    one = None
    if keep_one_device:
        one = models.clone(base, config)
        mlx_w8a8.quantize(one, kernel=args.kernel)
        mx.eval(one.parameters())
    mlx_w8a8.quantize(base, kernel=args.kernel)
    mlx_w8a8.shard(base, group)
    mx.eval(base.parameters())
    return base, one, config, label


def _set_kernels(model: nn.Module, kernel) -> dict:
    """Force ``kernel`` on every mlx_w8a8 layer (``kernel`` a name or a
    ``{path: name}`` map); returns the previous ``{path: name}``."""
    import mlx_w8a8

    before = {}
    for path, m in model.named_modules():
        if isinstance(m, mlx_w8a8.Linear):
            before[path] = m.kernel
            m.kernel = kernel[path] if isinstance(kernel, dict) else kernel
    return before


class SplitK(nn.Module):
    """One process doing what a sharded-to-all layer does on ``size`` ranks: each
    K-slice quantized with its own per-token scale, the float partials summed in rank
    order, the bias added once."""

    def __init__(self, layer: nn.Module, size: int, kernel: str):
        import mlx_w8a8

        super().__init__()
        qw = layer.quantized_weight
        k, g = qw.k // size, qw.k // size // qw.group_size
        self.k, self.kernel = k, kernel
        self.parts = [
            mlx_w8a8.QuantizedWeight(
                qw.q[:, r * k // 4:(r + 1) * k // 4], qw.scales[:, r * g:(r + 1) * g],
                qw.biases[:, r * g:(r + 1) * g], qw.group_size, qw.per_channel,
            )
            for r in range(size)
        ]
        if "bias" in layer:
            self.bias = layer.bias

    def __call__(self, x):
        import mlx_w8a8

        y = None
        for r, part in enumerate(self.parts):
            p = mlx_w8a8.w8a8_linear(x[..., r * self.k:(r + 1) * self.k], part, kernel=self.kernel)
            y = p if y is None else y + p
        return y + self.bias.astype(y.dtype) if "bias" in self else y


def _rms(a: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(a.astype(np.float64)))))


def check(group, sharded, one, tokens: mx.array, exact: str) -> dict:
    """The correctness check (module docstring); the same ``passed`` on every rank."""
    from .distributed import ShardedToAllLinear

    before = _set_kernels(sharded, exact)
    tp = sharded(tokens).astype(mx.float32)
    mx.eval(tp)
    _set_kernels(sharded, before)
    # rank 0's logits on every rank (an all_sum with zeros elsewhere is exact: the one
    # collective every backend has), compared on each rank, the verdicts summed
    first = mx.distributed.all_sum(tp if group.rank() == 0 else mx.zeros_like(tp), group=group)
    differ = gather(group, [0.0 if mx.array_equal(tp, first).item() else 1.0])
    out = {"kind": "check", "tokens": int(tokens.shape[1]), "kernel": exact,
           "ranks_identical": bool(differ.sum() == 0)}
    met = 0.0
    if one is not None:
        tp_np = np.array(tp)
        before = _set_kernels(one, exact)
        ref = np.array(one(tokens).astype(mx.float32))
        _set_kernels(one, "mlx_qmm")
        w8a16 = np.array(one(tokens).astype(mx.float32))
        # the same model with its sharded-to-all layers' inputs quantized slice by slice
        paths = [p for p, m in sharded.named_modules() if isinstance(m, ShardedToAllLinear)]
        layers = dict(one.named_modules())
        one.update_modules(tree_unflatten(
            [(p, SplitK(layers[p], group.size(), exact)) for p in paths]))
        split_k = np.array(one(tokens).astype(mx.float32))
        one.update_modules(tree_unflatten([(p, layers[p]) for p in paths]))
        _set_kernels(one, before)
        tp_shift, w8a8_shift = _rms(tp_np - ref), _rms(ref - w8a16)
        criterion = bool(0 < tp_shift <= 2 * w8a8_shift)
        out.update(tp_shift_rms=tp_shift, w8a8_shift_rms=w8a8_shift,
                   criterion="0 < tp_shift_rms <= 2 w8a8_shift_rms", criterion_met=criterion,
                   logits_rms=_rms(ref),
                   tp_vs_split_k_max_abs=float(np.max(np.abs(tp_np - split_k))))
        met = 1.0 if criterion else 0.0
    # rank 0's verdict, known to every rank (all exit with the same status)
    met = float(gather(group, [met])[0, 0])
    out["passed"] = bool(out["ranks_identical"] and met == 1.0)
    return out


# --- the run ----------------------------------------------------------------------------


def measure(group, rounds: int, fns: dict) -> dict:
    """:data:`.modelbench.WARMUP` warm-up rounds, then ``rounds`` alternating rounds of
    the arms in ``fns`` (``{arm: () -> seconds}``, ``None`` where this rank does not run
    the arm: its time is NaN); each arm starts after a barrier. ``{arm: [seconds per
    round]}``."""

    def timed(arm):
        barrier(group)
        fn = fns[arm]
        return math.nan if fn is None else fn()

    for _ in range(modelbench.WARMUP):
        for arm in ARMS:
            timed(arm)
    return modelbench.alternate(ARMS, rounds, timed)


def summarize(group, times: dict, per: int) -> dict:
    """Per-rank medians (ms per token step for decode), the communication share and
    the per-round speed-up over one device, the same on every rank."""
    tp = gather(group, [t / per for t in times["tp"]]).astype(np.float64)
    comm = gather(group, [t / per for t in times["all_sum"]]).astype(np.float64)
    one = gather(group, [0.0 if math.isnan(t) else t / per for t in times["one-device"]])[0]
    tp_ms = [float(np.median(r)) * 1e3 for r in tp]
    comm_ms = [float(np.median(r)) * 1e3 for r in comm]
    one_ms = float(np.median(one)) * 1e3
    # per round: one device over the slowest rank
    speedup = [float(o) / float(s) for o, s in zip(one, tp.max(axis=0))]
    s = render.spread(speedup)
    return {
        "ranks": group.size(),
        "one_device_ms": one_ms,
        "tp_ms_per_rank": tp_ms,
        "all_sum_ms_per_rank": comm_ms,
        "comm_share_per_rank": [c / t for c, t in zip(comm_ms, tp_ms)],
        "speedup_vs_one_device": None if s is None else {
            "median": s[0], "p25": s[1], "p75": s[2], "rounds": [round(x, 4) for x in speedup]},
    }


def run(args, group, stream, out, emit) -> int:
    """The tensor-parallel model benchmark on this rank; returns the exit status (rank 0
    writes JSON to ``stream`` and the table to ``out``)."""
    cfg = modelbench.settings(args)
    if args.check_tokens < 1:
        raise ValueError(f"[{OP}] --check-tokens must be >= 1, got {args.check_tokens}")
    if args.table:
        from .tuning import set_tuning_table

        set_tuning_table(args.table)
    rank, size = group.rank(), group.size()
    lead = rank == 0
    report = (lambda record: emit(record, stream)) if lead else (lambda record: None)
    dtype = getattr(mx, args.dtype)
    sharded, one, config, label = build(args, dtype, group, keep_one_device=lead)
    widths = collectives(sharded)
    if not widths:
        raise ValueError(f"[{OP}] {label}: sharding left no sharded-to-all layer; nothing is split")
    vocab = int(config["vocab_size"])
    loop_name, loop = modelbench.decode_loop()
    barrier(group)
    report({
        "kind": "setup", "model": label, "model_type": config.get("model_type"),
        "layers": config.get("num_hidden_layers"), "hidden_size": config.get("hidden_size"),
        "vocab_size": vocab, "dtype": args.dtype, "device": table.device_key(),
        "tp": size, "backend": args.backend, "arms": list(ARMS),
        "all_sums_per_token_step": len(widths), "kernel": args.kernel,
        **cfg, "seed": args.seed, "decode_loop": loop_name, "mlx": mx.__version__,
    })
    status = 0
    if args.check:
        from .kernels import registry

        exact = registry.EXACT
        tokens = mx.random.randint(0, vocab, (1, args.check_tokens),
                                   key=mx.random.key(args.seed + 7)).astype(mx.int32)
        result = check(group, sharded, one, tokens, exact)
        report(result)
        status = 0 if result["passed"] else 1

    rows = []
    for t in cfg["tokens"]:
        key = mx.random.key(1000 * args.seed + t)
        tokens = mx.random.randint(0, vocab, (1, t), key=key).astype(mx.int32)
        fns = {"one-device": None if one is None else (lambda: modelbench.prefill(one, tokens)[0]),
               "tp": lambda: modelbench.prefill(sharded, tokens)[0],
               "all_sum": all_sums(group, widths, t, 1, dtype)}
        s = summarize(group, measure(group, cfg["rounds"], fns), 1)
        summary = {"kind": "summary", "measure": "prefill", "tokens": t, **s}
        report(summary)
        rows.append((f"prefill T={t}", summary))
        mx.clear_cache()
    if cfg["decode"]:
        n = cfg["decode"]
        key = mx.random.key(1000 * args.seed)
        prompt = mx.random.randint(0, vocab, (cfg["prompt"],), key=key).astype(mx.int32)
        fns = {"one-device": None if one is None
               else (lambda: modelbench.decode(one, prompt, n, loop)),
               "tp": lambda: modelbench.decode(sharded, prompt, n, loop),
               "all_sum": all_sums(group, widths, 1, n, dtype)}
        s = summarize(group, measure(group, cfg["rounds"], fns), n)
        summary = {"kind": "summary", "measure": "decode", "tokens": n, "prompt": cfg["prompt"],
                   **s}
        report(summary)
        rows.append((f"decode N={n} (prompt {cfg['prompt']}), per token", summary))
    report({"kind": "decisions", "variant": "tp rank 0", "layers": modelbench.decisions(sharded)})
    if lead:
        report({"kind": "decisions", "variant": "one-device", "layers": modelbench.decisions(one)})
        print(f"\n{label}: {config.get('num_hidden_layers')} layer(s), hidden "
              f"{config.get('hidden_size')}, {args.dtype}, {size} ranks ({args.backend}); "
              f"{cfg['rounds']} alternating rounds per row", file=out)
        print(render_table(rows), file=out)
        print("ms: medians; speed-up: one device over the slowest rank, per round, median "
              "(p25..p75); comm: all_sum time over the rank's tensor-parallel time.", file=out)
    barrier(group)
    return status


def render_table(rows: list[tuple[str, dict]]) -> str:
    """The readable table of the summaries."""
    head = ["measure", "one device ms", "tp ms per rank", "all_sum ms per rank", "comm share",
            "speed-up"]
    body = []
    for label, s in rows:
        sp = s["speedup_vs_one_device"]
        body.append([
            label, f"{s['one_device_ms']:.4g}",
            " / ".join(f"{x:.4g}" for x in s["tp_ms_per_rank"]),
            " / ".join(f"{x:.4g}" for x in s["all_sum_ms_per_rank"]),
            " / ".join(f"{x:.0%}" for x in s["comm_share_per_rank"]),
            "-" if sp is None else f"{sp['median']:.2f}x ({sp['p25']:.2f}..{sp['p75']:.2f})",
        ])
    return render.columns(head, body, right=range(1, len(head)))


if __name__ == "__main__":  # a library module of the bench: say which command runs it
    print("[mlx_w8a8.tpbench] this module has no command of its own; run it as "
          "python -m mlx_w8a8.bench --model PATH|PRESET --tp N (--help for the options)",
          file=sys.stderr)
    raise SystemExit(2)
